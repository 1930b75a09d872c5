//! Prints the findings for raw HTTP request files:
//! `cargo run -p moat-waf --example inspect -- FILE...`.
fn main() {
    let engine = match moat_waf::WafEngine::build(&moat_waf::WafConfig::default()) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    for path in std::env::args().skip(1) {
        let data = match std::fs::read(&path) {
            Ok(d) => d,
            Err(e) => {
                eprintln!("{path}: {e}");
                continue;
            }
        };
        match moat_waf::rawhttp::RawRequest::parse(&data) {
            Ok(req) => {
                let (blocked, _) = moat_waf::eval::judge_raw(&engine, &req);
                let body = req
                    .decoded_body(moat_core::DecodeLimits::default())
                    .unwrap_or_default();
                let f = engine.inspect(
                    "test",
                    &req.view(),
                    Some(moat_waf::BodyView {
                        data: &body,
                        truncated: false,
                    }),
                );
                println!("{path}: {}", if blocked { "BLOCK" } else { "pass" });
                for x in &f.findings {
                    println!(
                        "  {} {} {} {:?}",
                        x.attack, x.confidence, x.location, x.fragment
                    );
                }
            }
            Err(e) => eprintln!("{path}: {e}"),
        }
    }
}
