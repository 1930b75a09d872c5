//! `moat waf test` and `moat waf eval` end to end (the real binary).

use std::process::Command;

fn moat() -> Command {
    Command::new(env!("CARGO_BIN_EXE_moat"))
}

#[test]
fn waf_test_url_reports_finding_and_exit_code() {
    let out = moat()
        .args([
            "waf",
            "test",
            "--url",
            "/items?id=1%27%20OR%20%271%27=%271&page=2",
        ])
        .output()
        .expect("run moat");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("block (403)"), "{text}");
    assert!(text.contains("sqli") && text.contains("query:id"), "{text}");

    let out = moat()
        .args(["waf", "test", "--url", "/items?q=O%27Reilly+books"])
        .output()
        .expect("run moat");
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("no findings"));
}

#[test]
fn waf_test_raw_file_json_and_exclusion_config() {
    let dir = tempfile::tempdir().expect("tempdir");
    let req = dir.path().join("req.http");
    std::fs::write(
        &req,
        "# a comment line\nPOST /api/comments HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\r\n{\"body\":\"<script>alert(1)</script>\"}",
    )
    .expect("write");
    let out = moat()
        .args(["waf", "test", "--json"])
        .arg(&req)
        .output()
        .expect("run moat");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json output");
    assert_eq!(v["verdict"], "block");
    assert_eq!(v["findings"][0]["attack"], "xss");
    assert_eq!(v["findings"][0]["location"], "json:/body");

    let cfg = dir.path().join("waf.yaml");
    std::fs::write(
        &cfg,
        "exclusions:\n  - route: blog\n    location: \"json:/body\"\n    detector: xss\n",
    )
    .expect("write");
    let out = moat()
        .args(["waf", "test", "--route", "blog", "--config"])
        .arg(&cfg)
        .arg(&req)
        .output()
        .expect("run moat");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    std::fs::write(&cfg, "mode: block\nbogus: 1\n").expect("write");
    let out = moat()
        .args(["waf", "test", "--config"])
        .arg(&cfg)
        .arg(&req)
        .output()
        .expect("run moat");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("bogus"));
}

#[test]
fn waf_eval_meets_quality_targets_on_shared_corpora() {
    let datasets = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/datasets");
    if !std::path::Path::new(datasets)
        .join("blazehttp/dev.jsonl.gz")
        .exists()
    {
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), "skipped: {datasets}/blazehttp/dev.jsonl.gz is missing (the shared datasets beside the checkout)");
        return;
    }
    let out = moat()
        .args(["waf", "eval", "--json", "--datasets", datasets])
        .output()
        .expect("run moat");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let t = &v["blazehttp"]["total"];
    let (tp, fn_, tn, fp) = (
        t["tp"].as_f64().unwrap_or(0.0),
        t["fn_"].as_f64().unwrap_or(0.0),
        t["tn"].as_f64().unwrap_or(0.0),
        t["fp"].as_f64().unwrap_or(0.0),
    );
    let detection = tp * 100.0 / (tp + fn_);
    let fp_rate = fp * 100.0 / (fp + tn);
    assert!(detection >= 85.0, "detection {detection:.2}%");
    assert!(fp_rate <= 0.05, "false positives {fp_rate:.3}%");
    assert_eq!(
        v["gotestwaf"]["false_pos"][0], 0,
        "gotestwaf false-positive texts blocked"
    );
    assert!(v["gotestwaf"]["false_pos"][1].as_u64().unwrap_or(0) > 100);
}
