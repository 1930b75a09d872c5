//! `moat waf test` and `moat waf eval` end to end (the real binary).
// Test and benchmark code: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

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
    // per half (A, B): [blocked, total]
    let fp = &v["gotestwaf"]["false_pos"];
    assert_eq!(fp[0][0], 0, "gotestwaf false-positive texts blocked (A)");
    assert_eq!(fp[1][0], 0, "gotestwaf false-positive texts blocked (B)");
    let total = fp[0][1].as_u64().unwrap_or(0) + fp[1][1].as_u64().unwrap_or(0);
    assert!(total > 100);
}

/// `moat waf exclude`: a blocked request's stored event becomes an exclusion
/// snippet; with the snippet as config, `moat waf test` lets the request through.
#[test]
fn waf_exclude_round_trip_through_the_event_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    let url = "/cms/articles/7/save?body=%3Cimg%20src%3Dx%20onerror%3Dalert(1)%3E";
    let blocked = moat()
        .args(["waf", "test", "--route", "cms", "--json", "--url", url])
        .output()
        .expect("run moat");
    assert_eq!(blocked.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&blocked.stdout).expect("json");
    let finding = &v["findings"][0];
    // the event the proxy would store for this decision
    let details = serde_json::json!({
        "detector": finding["attack"],
        "location": finding["location"],
        "field": "body",
        "fragment": finding["fragment"],
        "confidence": finding["confidence"],
    });
    let ev = moat_core::SecurityEvent::new(
        "waf",
        finding["attack"].as_str().unwrap_or_default(),
        moat_core::EventAction::Block,
        "xss detected".to_string(),
    )
    .at(finding["location"].as_str().unwrap_or_default().to_string())
    .with_details(details);
    let id = ev.id.clone();
    let db = dir.path().join("events.db");
    {
        let store = moat_events::EventStore::open(&db).expect("store");
        let rec = moat_events::Record::Security(moat_events::SecurityRecord {
            ts: moat_events::now_ms(),
            request_id: "r1".into(),
            route: "cms".into(),
            client_ip: "192.0.2.1".into(),
            method: "GET".into(),
            path: "/cms/articles/7/save".into(),
            event: ev,
            request: None,
        });
        store.insert(&[rec]).expect("insert");
    }
    let out = moat()
        .args(["waf", "exclude", "--event", &id, "--db"])
        .arg(&db)
        .output()
        .expect("run moat");
    let snippet = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{snippet} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        snippet.contains("path_prefix: \"/cms/articles/7/save\""),
        "{snippet}"
    );
    assert!(snippet.contains("field: \"body\""), "{snippet}");
    let cfg = dir.path().join("waf.yaml");
    std::fs::write(&cfg, &snippet).expect("write");
    let passed = moat()
        .args(["waf", "test", "--route", "cms", "--url", url, "--config"])
        .arg(&cfg)
        .output()
        .expect("run moat");
    assert_eq!(
        passed.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&passed.stdout)
    );
    // from flags, same snippet body
    let out = moat()
        .args([
            "waf",
            "exclude",
            "--route",
            "cms",
            "--path",
            "/cms/articles/7/save?x=1",
            "--detector",
            "xss",
            "--location",
            "query:body",
        ])
        .output()
        .expect("run moat");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("location: \"query:body\"") && text.contains("detector: \"xss\""),
        "{text}"
    );
    let bad = moat()
        .args(["waf", "exclude", "--detector", "sqlx"])
        .output()
        .expect("run moat");
    assert_eq!(bad.status.code(), Some(2));
}
