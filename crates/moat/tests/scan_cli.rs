//! `moat scan` run as a real binary: exit codes, formats, directories, path rules.
// Test and benchmark code: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

const GH: &str = "ghp_N5N1aE6PwZPf1Qh6yYTWmE4lBYOvfZ8UzDzV";

fn moat(args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_moat"))
        .arg("scan")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn moat");
    {
        let mut input = child.stdin.take().expect("stdin");
        if let Some(s) = stdin {
            input.write_all(s.as_bytes()).expect("write stdin");
        }
    }
    child.wait_with_output().expect("moat output")
}

/// gitleaks.toml of the shared corpus: `$MOAT_SHARED_DIR` or `../shared` beside the checkout.
fn shared_gitleaks_toml() -> std::path::PathBuf {
    let shared = std::env::var_os("MOAT_SHARED_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared"));
    shared.join("datasets/gitleaks/gitleaks.toml")
}

fn write(dir: &Path, rel: &str, content: &str) {
    let p = dir.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, content).unwrap();
}

#[test]
fn exit_codes() {
    let clean = moat(&["-"], Some("nothing here\n"));
    assert_eq!(clean.status.code(), Some(0));
    assert!(clean.stdout.is_empty());
    let found = moat(&["-"], Some(&format!("token: {GH}\n")));
    assert_eq!(found.status.code(), Some(1));
    let text = String::from_utf8(found.stdout).unwrap();
    assert!(text.starts_with("-:1:8: github-token:"), "{text}");
    assert!(!text.contains(GH), "secret printed: {text}");
    let missing = moat(&["/nonexistent/moat-scan-path"], None);
    assert_eq!(missing.status.code(), Some(2));
    let bad_rules = moat(&["--rules", "/nonexistent/rules.toml", "-"], Some(""));
    assert_eq!(bad_rules.status.code(), Some(2));
    let usage = moat(&[], None);
    assert_eq!(usage.status.code(), Some(2));
}

#[test]
fn json_over_a_directory_with_path_rules() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    write(
        root,
        "app/config.yaml",
        &format!("github:\n  token: {GH}\n"),
    );
    write(root, "app/readme.txt", "no secrets\n");
    write(root, "certs/client.p12", "binary");
    write(root, "infra/main.tf", "password = \"Zx81Qv72Lm40Pw\"\n");
    write(root, "infra/notes.txt", "password = \"Zx81Qv72Lm40Pw\"\n");
    write(root, ".git/config", &format!("token={GH}\n"));
    let rules = root.join("rules.toml");
    std::fs::write(
        &rules,
        r#"[[rules]]
id = "p12"
description = "PKCS#12 file"
path = '''\.p12$'''
[[rules]]
id = "tf-password"
description = "Terraform password"
regex = '''password\s*=\s*"([^"]+)"'''
path = '''\.tf$'''
keywords = ["password"]
[[rules]]
id = "gh"
description = "GitHub token"
regex = '''ghp_[0-9a-zA-Z]{36}'''
keywords = ["ghp_"]
"#,
    )
    .unwrap();
    let out = moat(
        &[
            "--rules",
            rules.to_str().unwrap(),
            "--format",
            "json",
            root.to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // gitleaks' report schema.
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON array");
    let arr = v.as_array().unwrap();
    let got: Vec<(String, String)> = arr
        .iter()
        .map(|f| {
            let p = f["File"].as_str().unwrap();
            let rel = p
                .strip_prefix(root.to_str().unwrap())
                .unwrap()
                .trim_start_matches('/');
            (rel.to_string(), f["RuleID"].as_str().unwrap().to_string())
        })
        .collect();
    assert_eq!(
        got,
        [
            ("app/config.yaml".to_string(), "gh".to_string()),
            ("certs/client.p12".to_string(), "p12".to_string()),
            ("infra/main.tf".to_string(), "tf-password".to_string()),
        ]
    );
    let gh = &arr[0];
    assert_eq!(gh["StartLine"], 2);
    // gitleaks' columns: on lines after the first, one more than the byte column.
    assert_eq!(gh["StartColumn"], 11);
    assert_eq!(gh["EndColumn"], 50);
    assert_eq!(gh["Secret"], GH);
    // --redact hides it.
    let redacted = moat(
        &[
            "--rules",
            rules.to_str().unwrap(),
            "--format",
            "json",
            "--redact",
            root.to_str().unwrap(),
        ],
        None,
    );
    assert!(!String::from_utf8_lossy(&redacted.stdout).contains(GH));
}

#[test]
fn gitleaks_config_and_sarif() {
    let path = shared_gitleaks_toml();
    if !path.is_file() {
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), "skipped: {} is missing (the shared gitleaks corpus beside the checkout, or MOAT_SHARED_DIR)",
            path.display());
        return;
    }
    let gitleaks = path.to_str().unwrap();
    let out = moat(
        &["--rules", gitleaks, "--format", "sarif", "-"],
        Some(&format!("export GITHUB_TOKEN={GH}\n")),
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("SARIF is JSON");
    assert_eq!(v["version"], "2.1.0");
    assert_eq!(v["runs"][0]["results"][0]["ruleId"], "github-pat");
    let region = &v["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["region"];
    assert_eq!(region["startLine"], 1);
}

#[test]
fn unsupported_rules_are_reported_not_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.toml");
    std::fs::write(
        &rules,
        "[[rules]]\nid = \"ahead\"\nregex = '''key(?=[0-9])'''\n[[rules]]\nid = \"ok\"\nregex = '''KEY-[0-9]{4}'''\n",
    )
    .unwrap();
    let out = moat(&["--rules", rules.to_str().unwrap(), "-"], Some("KEY-1234"));
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("`ahead`") && err.contains("lookahead"),
        "{err}"
    );
}

#[test]
fn encoded_secrets_are_decoded_unless_max_decode_depth_is_0() {
    // The token base64-encoded, as gitleaks (default depth 5) finds it.
    let encoded = "Z2hwX041TjFhRTZQd1pQZjFRaDZ5WVRXbUU0bEJZT3ZmWjhVekR6Vg==";
    let input = format!("config: {encoded}\n");
    let found = moat(&["--format", "json", "-"], Some(&input));
    assert_eq!(found.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&found.stdout).unwrap();
    assert_eq!(v[0]["RuleID"], "github-token");
    // Reported at the encoded text, the secret decoded (as gitleaks), with the rule's
    // tags then gitleaks' decoding tags.
    assert_eq!(v[0]["StartColumn"], 9);
    assert_eq!(v[0]["Secret"], GH);
    assert_eq!(v[0]["Match"], GH);
    assert_eq!(
        v[0]["Tags"],
        serde_json::json!(["vcs", "github", "decoded:base64", "decode-depth:1"])
    );
    let off = moat(&["--max-decode-depth", "0", "-"], Some(&input));
    assert_eq!(off.status.code(), Some(0));
    let too_deep = moat(&["--max-decode-depth", "65", "-"], Some(&input));
    assert_eq!(too_deep.status.code(), Some(2));
}
