//! `moat scan` as a drop-in for gitleaks: the `dir`/`git`/`stdin` commands, gitleaks'
//! report formats, `.gitleaksignore`, baselines, redaction, exit codes, symlinks and
//! ignore files, on real files and a real git repository made by the test.
// Test and benchmark code: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

const GH: &str = "ghp_N5N1aE6PwZPf1Qh6yYTWmE4lBYOvfZ8UzDzV";
const AWS: &str = "AKIAQYLPMN5HHHFPZAM2";

fn moat_in(dir: &Path, args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_moat"))
        .current_dir(dir)
        .arg("scan")
        .args(args)
        .env_remove("GITLEAKS_CONFIG")
        .env_remove("GITLEAKS_CONFIG_TOML")
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

fn json(out: &Output) -> Vec<serde_json::Value> {
    serde_json::from_slice::<Vec<serde_json::Value>>(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not a JSON array ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn write(dir: &Path, rel: &str, content: &str) {
    let p = dir.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, content).unwrap();
}

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .env("GIT_AUTHOR_DATE", "2024-03-04T05:06:07+02:00")
        .env("GIT_COMMITTER_DATE", "2024-03-04T05:06:07+02:00")
        .output()
        .expect("git runs");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn have_git() -> bool {
    Command::new("git").arg("--version").output().is_ok()
}

/// A repository: commit 1 adds a token on line 2 of a.txt, commit 2 adds a key on
/// line 3 of sub/b.env and removes the token (still in history).
fn repo() -> (tempfile::TempDir, String, String) {
    let d = tempfile::tempdir().unwrap();
    let r = d.path();
    git(r, &["init", "-q"]);
    git(r, &["config", "user.name", "Ann Example"]);
    git(r, &["config", "user.email", "ann@example.org"]);
    git(r, &["config", "commit.gpgsign", "false"]);
    write(r, "a.txt", &format!("hello\ntoken = \"{GH}\"\n"));
    git(r, &["add", "."]);
    git(r, &["commit", "-q", "-m", "first"]);
    let c1 = git(r, &["rev-parse", "HEAD"]);
    write(r, "a.txt", "hello\n");
    write(r, "sub/b.env", &format!("x\n\naws_key={AWS}\n"));
    git(r, &["add", "."]);
    git(r, &["commit", "-q", "-m", "second\n\nwith a body"]);
    let c2 = git(r, &["rev-parse", "HEAD"]);
    (d, c1, c2)
}

#[test]
fn git_history_reports_commit_metadata_as_gitleaks() {
    if !have_git() {
        eprintln!("skipped: no git on PATH");
        return;
    }
    let (d, c1, c2) = repo();
    let r = d.path();
    let out = moat_in(r, &["git", "-f", "json", "."], None);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = json(&out);
    assert_eq!(v.len(), 2, "{v:?}");
    let tok = v
        .iter()
        .find(|f| f["File"] == "a.txt")
        .expect("a.txt finding");
    assert_eq!(tok["Commit"], c1.as_str());
    assert_eq!(tok["StartLine"], 2);
    // a.txt is new in commit 1: its hunk starts at line 1, so line 2 gets gitleaks'
    // "one more" column.
    assert_eq!(tok["StartColumn"], 11);
    assert_eq!(tok["Author"], "Ann Example");
    assert_eq!(tok["Email"], "ann@example.org");
    assert_eq!(
        tok["Date"], "2024-03-04T03:06:07Z",
        "author date in UTC, RFC 3339"
    );
    assert_eq!(tok["Message"], "first");
    assert_eq!(tok["Fingerprint"], format!("{c1}:a.txt:github-token:2"));
    let key = v
        .iter()
        .find(|f| f["File"] == "sub/b.env")
        .expect("b.env finding");
    assert_eq!(key["Commit"], c2.as_str());
    assert_eq!(key["StartLine"], 3);
    assert_eq!(key["Message"], "second\n\nwith a body");

    // --log-opts: only the last commit.
    let last = moat_in(r, &["git", "-f", "json", "--log-opts=-1", "."], None);
    let v = json(&last);
    assert_eq!(v.len(), 1);
    assert_eq!(v[0]["Commit"], c2.as_str());

    // .gitleaksignore in the repository: a commit fingerprint and a global one.
    write(
        r,
        ".gitleaksignore",
        &format!("# known\n{c1}:a.txt:github-token:2\nsub/b.env:aws-access-key-id:3\n"),
    );
    let ignored = moat_in(r, &["git", "."], None);
    assert_eq!(
        ignored.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&ignored.stdout)
    );

    // A commit allowlist (gitleaks' [allowlist] commits) drops what that commit added.
    std::fs::remove_file(r.join(".gitleaksignore")).unwrap();
    let rules = tempfile::tempdir().unwrap();
    let cfg = rules.path().join("rules.toml");
    std::fs::write(
        &cfg,
        format!(
            "[extend]\nuseDefault = true\n[allowlist]\ncommits = [\"{}\"]\n",
            c1.to_uppercase()
        ),
    )
    .unwrap();
    let v = json(&moat_in(
        r,
        &["git", "-c", cfg.to_str().unwrap(), "-f", "json", "."],
        None,
    ));
    assert_eq!(v.len(), 1, "{v:?}");
    assert_eq!(v[0]["Commit"], c2.as_str());
    write(r, ".gitleaksignore", "");

    // A directory scan of the work tree sees only the file as it is now.
    std::fs::remove_file(r.join(".gitleaksignore")).unwrap();
    let v = json(&moat_in(r, &["dir", "-f", "json"], None));
    assert_eq!(v.len(), 1);
    assert_eq!(v[0]["File"], "sub/b.env");
    assert_eq!(v[0]["Commit"], "");

    // Staged changes (the pre-commit hook).
    write(r, "c.txt", &format!("new {GH}\n"));
    git(r, &["add", "c.txt"]);
    let staged = moat_in(r, &["git", "--staged", "-f", "json", "."], None);
    let v = json(&staged);
    assert_eq!(v.len(), 1);
    assert_eq!(
        (v[0]["File"].as_str(), v[0]["StartLine"].as_u64()),
        (Some("c.txt"), Some(1))
    );

    // Not a repository: an input error.
    let plain = tempfile::tempdir().unwrap();
    let bad = moat_in(plain.path(), &["git", "."], None);
    assert_eq!(bad.status.code(), Some(2));
}

#[test]
fn baseline_redaction_exit_code_and_report_files() {
    let d = tempfile::tempdir().unwrap();
    let r = d.path();
    write(r, "src/config.txt", &format!("one\ntoken={GH}\n"));
    // -r infers the format from the extension; the report is gitleaks' JSON.
    let first = moat_in(r, &["dir", ".", "-r", "report.json"], None);
    assert_eq!(first.status.code(), Some(1));
    assert!(first.stdout.is_empty());
    let report: Vec<serde_json::Value> =
        serde_json::from_slice(&std::fs::read(r.join("report.json")).unwrap()).unwrap();
    assert_eq!(report.len(), 1);
    assert_eq!(report[0]["File"], "src/config.txt");
    // The baseline makes the same finding old; the report file itself is no finding.
    let again = moat_in(r, &["dir", ".", "-b", "report.json", "-f", "json"], None);
    assert_eq!(
        again.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&again.stdout)
    );
    // --exit-code.
    let code = moat_in(r, &["dir", "src", "--exit-code", "7"], None);
    assert_eq!(code.status.code(), Some(7));
    // --redact and --redact=PERCENT.
    let full = json(&moat_in(r, &["dir", "src", "-f", "json", "--redact"], None));
    assert_eq!(full[0]["Secret"], "REDACTED");
    assert_eq!(full[0]["Match"], "REDACTED");
    let part = json(&moat_in(
        r,
        &["dir", "src", "-f", "json", "--redact=75"],
        None,
    ));
    assert_eq!(part[0]["Secret"], "ghp_N5N1aE...");
    // SARIF: rules, tool version, partialFingerprints, region.
    let sarif = moat_in(r, &["dir", "src", "-f", "sarif", "-r", "-"], None);
    let s: serde_json::Value = serde_json::from_slice(&sarif.stdout).unwrap();
    assert_eq!(s["version"], "2.1.0");
    let driver = &s["runs"][0]["tool"]["driver"];
    assert_eq!(driver["name"], "moat");
    assert_eq!(driver["semanticVersion"], env!("CARGO_PKG_VERSION"));
    assert!(driver["rules"].as_array().unwrap().len() > 10);
    let res = &s["runs"][0]["results"][0];
    assert_eq!(res["ruleId"], "github-token");
    assert_eq!(
        res["partialFingerprints"]["fingerprint"],
        "src/config.txt:github-token:2"
    );
    assert!(res["partialFingerprints"]["commitSha"].is_string());
    let region = &res["locations"][0]["physicalLocation"]["region"];
    assert_eq!(
        (region["startLine"].as_u64(), region["startColumn"].as_u64()),
        (Some(2), Some(8))
    );
    // CSV and JUnit.
    let csv = String::from_utf8(moat_in(r, &["dir", "src", "-f", "csv"], None).stdout).unwrap();
    assert!(
        csv.starts_with("RuleID,Commit,File,SymlinkFile,Secret,Match,StartLine"),
        "{csv}"
    );
    assert!(csv.contains("github-token,,src/config.txt,"), "{csv}");
    let junit = String::from_utf8(moat_in(r, &["dir", "src", "-f", "junit"], None).stdout).unwrap();
    assert!(junit.contains("<testsuite failures=\"1\""), "{junit}");
    // A template.
    write(
        r,
        "t.tmpl",
        "{{ range . }}{{ .File }}:{{ .StartLine }} {{ .RuleID }}\n{{ end }}",
    );
    let t = moat_in(r, &["dir", "src", "--report-template", "t.tmpl"], None);
    assert_eq!(
        String::from_utf8_lossy(&t.stdout),
        "src/config.txt:2 github-token\n"
    );
}

#[test]
fn stdin_legacy_paths_and_config_lookup() {
    let d = tempfile::tempdir().unwrap();
    let r = d.path();
    let out = moat_in(r, &["stdin", "-f", "json"], Some(&format!("k={AWS}\n")));
    let v = json(&out);
    assert_eq!(v[0]["RuleID"], "aws-access-key-id");
    assert_eq!(v[0]["File"], "");
    // The older form and `dir` agree.
    write(r, "x/a.txt", &format!("{GH}\n"));
    let old = moat_in(r, &["-f", "json", "x"], None);
    let new = moat_in(r, &["dir", "x", "-f", "json"], None);
    assert_eq!(json(&old), json(&new));
    // Flags before the subcommand work too.
    let before = moat_in(r, &["-f", "json", "dir", "x"], None);
    assert_eq!(json(&before), json(&new));
    // <source>/.gitleaks.toml is the ruleset when -c is not given.
    write(
        r,
        "x/.gitleaks.toml",
        "[[rules]]\nid = \"only-this\"\nregex = '''ghp_[0-9a-zA-Z]{36}'''\n",
    );
    let local = json(&moat_in(r, &["dir", "x", "-f", "json"], None));
    assert_eq!(local[0]["RuleID"], "only-this");
    // --enable-rule with an unknown rule is an error.
    let bad = moat_in(r, &["dir", "x", "--enable-rule", "nope"], None);
    assert_eq!(bad.status.code(), Some(2));
}

#[cfg(unix)]
#[test]
fn symlinks_are_not_followed_unless_asked_and_gitignore_is_opt_in() {
    let d = tempfile::tempdir().unwrap();
    let r = d.path();
    let outside = tempfile::tempdir().unwrap();
    write(outside.path(), "secret.txt", &format!("{GH}\n"));
    write(r, "scan/plain.txt", "nothing\n");
    std::os::unix::fs::symlink(outside.path().join("secret.txt"), r.join("scan/link.txt")).unwrap();
    std::os::unix::fs::symlink(outside.path(), r.join("scan/linkdir")).unwrap();
    let default = moat_in(r, &["dir", "scan"], None);
    assert_eq!(
        default.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&default.stdout)
    );
    let followed = json(&moat_in(
        r,
        &["dir", "scan", "--follow-symlinks", "-f", "json"],
        None,
    ));
    assert_eq!(
        followed.len(),
        1,
        "links to directories are not followed: {followed:?}"
    );
    assert_eq!(followed[0]["SymlinkFile"], "scan/link.txt");
    assert!(followed[0]["File"]
        .as_str()
        .unwrap()
        .ends_with("secret.txt"));

    write(r, "ign/.gitignore", "ignored.txt\n");
    write(r, "ign/ignored.txt", &format!("{GH}\n"));
    let all = moat_in(r, &["dir", "ign"], None);
    assert_eq!(
        all.status.code(),
        Some(1),
        "gitleaks scans ignored files too"
    );
    let honoured = moat_in(r, &["dir", "ign", "--gitignore"], None);
    assert_eq!(honoured.status.code(), Some(0));
}

/// Rules both tools read the same way: a provider-like token with tags, and a rule
/// whose secret group holds the characters Go's JSON encoder escapes (`<`, `>`, `&`).
const CMP_RULES: &str = r#"title = "moat vs gitleaks"
[[rules]]
id = "test-pat"
description = "Test personal access token"
regex = '''ghp_[0-9a-zA-Z]{36}'''
keywords = ["ghp_"]
tags = ["test", "token"]

[[rules]]
id = "angle-token"
description = "Token in <angle> & brackets"
regex = '''tok<([a-z0-9&<>]{12})>'''
secretGroup = 1
keywords = ["tok<"]
"#;

/// A directory and a repository with findings of both rules: plain, in quotes, in
/// a later line of a file (gitleaks' column convention), base64-encoded (found by
/// decoding), and in a commit with a multi-line message.
fn compare_fixture() -> (tempfile::TempDir, String) {
    let d = tempfile::tempdir().unwrap();
    let r = d.path();
    write(r, "rules.toml", CMP_RULES);
    write(
        r,
        "files/app.env",
        &format!("# settings\nTOKEN=\"{GH}\"\nother=tok<a&b<c>d0123e>\n"),
    );
    // base64 of `token=ghp_...` (found only when decoding)
    write(
        r,
        "files/blob.txt",
        "payload: dG9rZW49Z2hwX041TjFhRTZQd1pQZjFRaDZ5WVRXbUU0bEJZT3ZmWjhVekR6Vg==\n",
    );
    let repo = r.join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    git(&repo, &["init", "-q"]);
    git(&repo, &["config", "user.name", "Zoë \"Z\" Example"]);
    git(&repo, &["config", "user.email", "zoe@example.org"]);
    git(&repo, &["config", "commit.gpgsign", "false"]);
    write(&repo, "README", "hello\n");
    git(&repo, &["add", "."]);
    git(&repo, &["commit", "-q", "-m", "init"]);
    write(&repo, "conf/app.yaml", &format!("a: 1\nkey: {GH}\n"));
    git(&repo, &["add", "."]);
    git(
        &repo,
        &[
            "commit",
            "-q",
            "-m",
            "add config\n\nwith <details> & \"quotes\"",
        ],
    );
    let head = git(&repo, &["rev-parse", "HEAD"]);
    (d, head)
}

/// gitleaks' own report structs read moat's JSON reports:
/// `tests/gitleaks-report` is a Go program that decodes a report into
/// `[]report.Finding` (gitleaks v8.30.1, unknown fields rejected), checks what
/// gitleaks' tools rely on (lines, columns, secret within match, commit metadata,
/// fingerprints as gitleaks makes them) and writes the findings back with gitleaks'
/// `JsonReporter`, which must reproduce moat's report byte for byte.
#[test]
fn json_reports_parse_with_gitleaks_report_structs() {
    let Some(go) = moat_testkit::real_part("go", "install Go from https://go.dev/dl") else {
        return;
    };
    if !have_git() {
        eprintln!("skipped: no git on PATH");
        return;
    }
    let tools = moat_testkit::tools_dir();
    std::fs::create_dir_all(&tools).unwrap();
    let checker = tools.join("gitleaks-report");
    let build = Command::new(&go)
        .args(["build", "-o"])
        .arg(&checker)
        .arg(".")
        .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/gitleaks-report"))
        .output()
        .unwrap();
    assert!(
        build.status.success(),
        "go build tests/gitleaks-report (needs the Go module proxy or cache): {}",
        String::from_utf8_lossy(&build.stderr)
    );
    let (d, _) = compare_fixture();
    let r = d.path();
    let reports: [(&str, &[&str]); 5] = [
        ("dir", &["dir", "files", "-c", "rules.toml"]),
        ("git", &["git", "repo", "-c", "rules.toml"]),
        (
            "redacted",
            &["dir", "files", "-c", "rules.toml", "--redact=40"],
        ),
        (
            "default rules",
            &["dir", "files", "--max-decode-depth", "0"],
        ),
        (
            "none",
            &[
                "dir",
                "repo/conf",
                "-c",
                "rules.toml",
                "--enable-rule",
                "angle-token",
            ],
        ),
    ];
    for (name, args) in reports {
        let path = r.join(format!("{}.json", name.replace(' ', "-")));
        let mut all: Vec<&str> = args.to_vec();
        let path_arg = path.to_str().unwrap();
        all.extend(["-f", "json", "-r", path_arg]);
        let out = moat_in(r, &all, None);
        assert!(
            matches!(out.status.code(), Some(0 | 1)),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let ours = std::fs::read_to_string(&path).unwrap();
        let theirs = Command::new(&checker).arg(&path).output().unwrap();
        assert!(
            theirs.status.success(),
            "{name}: gitleaks' structs reject moat's report: {}\n{ours}",
            String::from_utf8_lossy(&theirs.stderr)
        );
        assert_eq!(
            String::from_utf8_lossy(&theirs.stdout),
            ours,
            "{name}: gitleaks' JsonReporter writes the findings it read differently"
        );
        let n = serde_json::from_str::<Vec<serde_json::Value>>(&ours)
            .unwrap()
            .len();
        let want = match name {
            "dir" | "redacted" => 3,
            "git" => 1,
            "none" => 0,
            _ => 1,
        };
        assert_eq!(n, want, "{name}: {ours}");
    }
}

/// Runs `gitleaks ARGS -r <file>` and `moat scan ARGS -r <file>` in `dir`; returns
/// both reports (gitleaks', moat's).
fn both(gitleaks: &Path, dir: &Path, args: &[&str]) -> (String, String) {
    let g_path = dir.join("g.report");
    let m_path = dir.join("m.report");
    let g = Command::new(gitleaks)
        .current_dir(dir)
        .env("TZ", "UTC")
        .args(args)
        .args(["--no-banner", "--log-level", "error", "-r"])
        .arg(&g_path)
        .output()
        .unwrap();
    assert!(
        matches!(g.status.code(), Some(0 | 1)),
        "gitleaks {args:?}: {}",
        String::from_utf8_lossy(&g.stderr)
    );
    let mut m_args = args.to_vec();
    m_args.extend(["-r", m_path.to_str().unwrap()]);
    let m = moat_in(dir, &m_args, None);
    assert_eq!(
        m.status.code(),
        g.status.code(),
        "moat scan {args:?} exits as gitleaks: {}",
        String::from_utf8_lossy(&m.stderr)
    );
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    (read(&g_path), read(&m_path))
}

/// Replaces every `Jan 02, 2006 15:04:05 UTC` date (gitleaks' templates print `now`)
/// by `<now>`.
fn mask_now(s: &str) -> String {
    let b = s.as_bytes();
    let shape = b"Aaa 00, 0000 00:00:00 UTC";
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    while i < b.len() {
        let fits = b.len() - i >= shape.len()
            && shape.iter().zip(&b[i..]).all(|(&k, &c)| match k {
                b'A' => c.is_ascii_uppercase(),
                b'a' => c.is_ascii_lowercase(),
                b'0' => c.is_ascii_digit(),
                _ => k == c,
            });
        if fits {
            out.push_str("<now>");
            i += shape.len();
        } else {
            let ch = s[i..].chars().next().unwrap();
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    out
}

/// JSON findings in a stable order (gitleaks reports in the order its workers finish).
fn sorted(report: &str) -> Vec<serde_json::Value> {
    let mut v: Vec<serde_json::Value> = serde_json::from_str(report)
        .unwrap_or_else(|e| panic!("not a JSON report ({e}): {report}"));
    v.sort_by_key(|f| f.to_string());
    v
}

/// SARIF with the tool's own name, version and URI set aside (they differ by
/// design), and moat's extra `partialFingerprints.fingerprint` (the
/// `.gitleaksignore` form) checked and removed.
fn sarif_without_driver(report: &str) -> serde_json::Value {
    let mut s: serde_json::Value = serde_json::from_str(report).unwrap();
    let driver = &mut s["runs"][0]["tool"]["driver"];
    for k in ["name", "semanticVersion", "informationUri"] {
        driver[k] = serde_json::Value::Null;
    }
    for r in s["runs"][0]["results"].as_array_mut().unwrap() {
        if let Some(p) = r["partialFingerprints"].as_object_mut() {
            if let Some(fp) = p.remove("fingerprint") {
                assert!(fp.as_str().unwrap().ends_with(":test-pat:2"), "{fp}");
            }
        }
    }
    s
}

/// `moat scan` against the gitleaks binary (v8.30.1, built by scripts/test-deps) on
/// the same files, repository and rules: every report format, `--redact=PERCENT`,
/// `--baseline-path` both ways, `.gitleaksignore`, `--max-decode-depth` and
/// `--log-opts` give the same reports (SARIF up to the tool's name and version).
#[test]
fn reports_and_options_match_the_gitleaks_binary() {
    let Some(gitleaks) = moat_testkit::real_part(
        "gitleaks",
        "scripts/ensure-go-tool gitleaks github.com/zricethezav/gitleaks/v8@v8.30.1",
    ) else {
        return;
    };
    if !have_git() {
        eprintln!("skipped: no git on PATH");
        return;
    }
    let (d, head) = compare_fixture();
    let r = d.path();
    let cfg = ["-c", "rules.toml"];
    let with = |extra: &[&'static str]| -> Vec<&'static str> {
        let mut v: Vec<&str> = cfg.to_vec();
        v.extend_from_slice(extra);
        v
    };

    // JSON: directory (default decode depth 5: the base64 token is found), history,
    // decoding off, redaction, --log-opts.
    for args in [
        with(&["dir", "files", "-f", "json"]),
        with(&["git", "repo", "-f", "json"]),
        with(&["dir", "files", "-f", "json", "--max-decode-depth", "0"]),
        with(&["dir", "files", "-f", "json", "--max-decode-depth", "1"]),
        with(&["dir", "files", "-f", "json", "--redact"]),
        with(&["dir", "files", "-f", "json", "--redact=60"]),
        with(&["git", "repo", "-f", "json", "--log-opts=HEAD~1..HEAD"]),
        with(&[
            "git",
            "repo",
            "-f",
            "json",
            "--log-opts=--all --author=nobody",
        ]),
    ] {
        let (g, m) = both(&gitleaks, r, &args);
        assert_eq!(sorted(&m), sorted(&g), "{args:?}");
    }

    // Byte for byte on a one-finding report: JSON, CSV, JUnit, a template; SARIF up
    // to the driver.
    let one = ["git", "repo"];
    for format in ["json", "csv", "junit"] {
        let mut args = with(&one);
        args.extend(["-f", format]);
        let (g, m) = both(&gitleaks, r, &args);
        // the JUnit suite is named after the tool
        let m = m.replace("name=\"moat\"", "name=\"gitleaks\"");
        assert_eq!(m, g, "{format}");
    }
    let mut args = with(&one);
    args.extend(["-f", "sarif"]);
    let (g, m) = both(&gitleaks, r, &args);
    assert_eq!(sarif_without_driver(&m), sarif_without_driver(&g));

    // Templates: gitleaks' own (its report_templates/ and test templates, from the
    // Go module cache `go install` filled), rendered by both; `now` is masked.
    let gitleaks_src = Command::new("go")
        .args(["env", "GOMODCACHE"])
        .output()
        .ok()
        .map(|o| {
            Path::new(String::from_utf8_lossy(&o.stdout).trim())
                .join("github.com/zricethezav/gitleaks/v8@v8.30.1")
        })
        .filter(|p| p.is_dir());
    let mut templates: Vec<std::path::PathBuf> = Vec::new();
    match &gitleaks_src {
        Some(src) => {
            for dir in ["report_templates", "testdata/report"] {
                for e in std::fs::read_dir(src.join(dir)).unwrap() {
                    let p = e.unwrap().path();
                    if p.extension().is_some_and(|x| x == "tmpl") {
                        templates.push(p);
                    }
                }
            }
            assert!(templates.len() >= 7, "{templates:?}");
        }
        None => {
            assert!(
                !moat_testkit::required(),
                "gitleaks' sources are not in the Go module cache"
            );
            eprintln!("templates skipped: gitleaks v8.30.1 sources not in `go env GOMODCACHE`");
        }
    }
    for t in &templates {
        for src in [["git", "repo"], ["dir", "files/blob.txt"]] {
            let mut args = with(&src);
            args.extend(["-f", "template", "--report-template", t.to_str().unwrap()]);
            let (g, m) = both(&gitleaks, r, &args);
            assert!(!g.is_empty(), "{t:?}");
            assert_eq!(mask_now(&m), mask_now(&g), "{t:?} {src:?}");
        }
    }

    // Baselines both ways: each tool's report makes the other report nothing new.
    let (g, m) = both(&gitleaks, r, &with(&["dir", "files", "-f", "json"]));
    std::fs::write(r.join("gitleaks-baseline.json"), &g).unwrap();
    std::fs::write(r.join("moat-baseline.json"), &m).unwrap();
    for base in ["gitleaks-baseline.json", "moat-baseline.json"] {
        let (g, m) = both(
            &gitleaks,
            r,
            &with(&["dir", "files", "-f", "json", "-b", base]),
        );
        assert_eq!(
            sorted(&g),
            Vec::<serde_json::Value>::new(),
            "gitleaks -b {base}"
        );
        assert_eq!(
            sorted(&m),
            Vec::<serde_json::Value>::new(),
            "moat -b {base}"
        );
    }

    // .gitleaksignore: a global fingerprint and a commit fingerprint.
    write(
        r,
        "ignores/.gitleaksignore",
        &format!("files/app.env:test-pat:2\n{head}:conf/app.yaml:test-pat:2\n"),
    );
    for src in [["dir", "files"], ["git", "repo"]] {
        let mut args = with(&src);
        args.extend(["-f", "json", "-i", "ignores"]);
        let (g, m) = both(&gitleaks, r, &args);
        assert_eq!(sorted(&m), sorted(&g), "{args:?}");
    }
}

/// The hooks of `.pre-commit-hooks.yaml`, run by the real pre-commit (`pre-commit
/// try-repo` on this checkout, `moat` on PATH): a staged secret fails `moat-scan`
/// and is reported redacted; staged changes without one pass; `moat-scan-dir`
/// scans the files pre-commit hands it.
/// Go reads text rune by rune: `.`, `\S`, `\W` and negated classes take a whole
/// UTF-8 character (an invalid byte counts as one, U+FFFD), `.{0,10}` counts
/// characters, and a match that ends on `[^a-z]` before `é` ends after it. The
/// same rules and files through `gitleaks dir` and `moat scan dir` give the same
/// JSON report (before moat read bytes: five of these findings were missing and
/// one ended inside `é`).
#[test]
fn non_ascii_text_is_read_as_gitleaks_reads_it() {
    let Some(gitleaks) = moat_testkit::real_part(
        "gitleaks",
        "scripts/ensure-go-tool gitleaks github.com/zricethezav/gitleaks/v8@v8.30.1",
    ) else {
        return;
    };
    let d = tempfile::tempdir().unwrap();
    let r = d.path();
    write(
        r,
        "rules.toml",
        r#"
[[rules]]
id = "dot-window"
regex = '''pass.{0,10}=([a-z]{6})'''
[[rules]]
id = "negated-count"
regex = '''tok_([^"]{4,6})"'''
[[rules]]
id = "dot-s-flag"
regex = '''(?s:begin.{0,5}end)'''
[[rules]]
id = "nonspace-class"
regex = '''key_([\S]{3})x'''
[[rules]]
id = "nonword"
regex = '''v=(\W{2})z'''
[[rules]]
id = "ends-after-char"
regex = '''end_[a-z]+[^a-z]'''
[[rules]]
id = "invalid-bytes"
regex = '''bad_(.{2})!'''
[[rules]]
id = "allowlisted"
regex = '''sec_[a-z0-9]{8}'''
[[rules.allowlists]]
regexTarget = "line"
regexes = ['''ok.{0,3}sec_''']
"#,
    );
    let files: [&[u8]; 8] = [
        "pass日本語日本語=secret\n".as_bytes(),
        "tok_日本語日\"\n".as_bytes(),
        "begin\né\nend\n".as_bytes(),
        "key_éé€x\n".as_bytes(),
        "v=€€z\n".as_bytes(),
        "end_abcé tail\n".as_bytes(),
        b"bad_\xff\xfe!\n",
        "ok日本語sec_abcd1234\nno sec_abcd5678\n".as_bytes(),
    ];
    std::fs::create_dir_all(r.join("files")).unwrap();
    for (i, data) in files.iter().enumerate() {
        std::fs::write(r.join(format!("files/{i}.txt")), data).unwrap();
    }
    let args = [
        "dir",
        "files",
        "-c",
        "rules.toml",
        "-f",
        "json",
        "--max-decode-depth",
        "0",
    ];
    let (g, m) = both(&gitleaks, r, &args);
    assert_eq!(sorted(&m), sorted(&g));
    assert_eq!(sorted(&g).len(), 8, "{g}");
}

/// `text` in the shapes a secret takes in real files, for the comparison with the
/// gitleaks binary: other line endings and case, long lines before it, twice in
/// one file, encoded (base64, percent, hex: gitleaks' decoding), inside a JSON
/// string, beside non-ASCII text and an invalid UTF-8 byte (`i` picks where).
/// Left out on purpose: U+017F and U+212A, which Go's `(?i)` folds into `s` and
/// `k` and moat's byte-mode patterns do not (docs/secrets.md).
fn variants(text: &str, i: usize) -> Vec<(&'static str, Vec<u8>)> {
    use base64::Engine as _;
    const NON_ASCII: [&str; 8] = ["é", "—", "\u{a0}", "ß", "日本", "\u{200b}", "ǅ", "İ"];
    let mut at = (i * 7919) % (text.len() + 1);
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    let c = NON_ASCII[i % NON_ASCII.len()];
    let pct: String = text.bytes().map(|b| format!("%{b:02X}")).collect();
    let hex: String = text.bytes().map(|b| format!("{b:02x}")).collect();
    let mut bad = text.as_bytes().to_vec();
    bad.insert(at, [0xff, 0xc3, 0x80][i % 3]);
    vec![
        ("crlf", text.replace('\n', "\r\n").into_bytes()),
        ("upper", text.to_uppercase().into_bytes()),
        ("lower", text.to_lowercase().into_bytes()),
        (
            "after-lines",
            format!("{}\n{text}", "lorem ipsum ".repeat(10 + i % 500)).into_bytes(),
        ),
        (
            "after-text",
            format!("{} {text}", "x".repeat(100 + i % 5000)).into_bytes(),
        ),
        ("twice", format!("{text}\n{text}").into_bytes()),
        (
            "base64",
            format!(
                "data: {}\n",
                base64::engine::general_purpose::STANDARD.encode(text)
            )
            .into_bytes(),
        ),
        ("percent", format!("q={pct}\n").into_bytes()),
        ("hex", format!("h={hex}\n").into_bytes()),
        (
            "non-ascii",
            format!("{}{c}{}", &text[..at], &text[at..]).into_bytes(),
        ),
        ("non-ascii-around", format!("{c}{text}{c}").into_bytes()),
        ("invalid-utf8", bad),
        ("tabs", text.replace(' ', "\t").into_bytes()),
        (
            "json",
            serde_json::to_vec(&serde_json::json!({ "v": text })).unwrap(),
        ),
    ]
}

/// Samples nobody has seen, as files: gitleaks' own sample generator run again by
/// `scripts/gitleaks-fresh-samples` (seed `MOAT_GITLEAKS_FILE_SEED`, default 4: about
/// 6,800 samples with secrets drawn anew from each rule's pattern), each sample
/// written to its own file, every seventh also in 14 [`variants`], then
/// `gitleaks dir` and `moat scan dir` with the
/// config the generator writes and gitleaks' default decode depth: the same JSON
/// report, every field of every finding.
#[test]
fn fresh_generator_samples_report_as_the_gitleaks_binary() {
    let Some(gitleaks) = moat_testkit::real_part(
        "gitleaks",
        "scripts/ensure-go-tool gitleaks github.com/zricethezav/gitleaks/v8@v8.30.1",
    ) else {
        return;
    };
    let Some(go) = moat_testkit::real_part("go", "install Go from https://go.dev/dl") else {
        return;
    };
    let d = tempfile::tempdir().unwrap();
    let gen = d.path().join("gen");
    let seed = std::env::var("MOAT_GITLEAKS_FILE_SEED").unwrap_or_else(|_| "4".into());
    let run = Command::new(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/gitleaks-fresh-samples"),
    )
    .arg(&gen)
    .arg(&seed)
    .env("PATH", moat_testkit::path_with_dir_of(&go))
    .output()
    .unwrap();
    assert!(
        run.status.success(),
        "scripts/gitleaks-fresh-samples (needs the Go module proxy or cache the first time): {}",
        String::from_utf8_lossy(&run.stderr)
    );
    let files = d.path().join("files");
    let samples = std::fs::read_to_string(gen.join("samples.jsonl")).unwrap();
    let mut n = 0;
    for (i, line) in samples.lines().enumerate() {
        let s: serde_json::Value = serde_json::from_str(line).unwrap();
        let text = s["text"].as_str().unwrap();
        let Some(rel) = s["path"].as_str() else {
            write(&files.join(format!("{i:05}")), "sample.txt", text);
            // Every seventh sample also in the shapes text takes around a secret.
            if i % 7 == 0 {
                for (name, variant) in variants(text, i) {
                    let p = files.join(format!("{i:05}-{name}"));
                    std::fs::create_dir_all(&p).unwrap();
                    std::fs::write(p.join("sample.txt"), variant).unwrap();
                    n += 1;
                }
            }
            n += 1;
            continue;
        };
        write(
            &files.join(format!("{i:05}")),
            rel.trim_start_matches('/'),
            text,
        );
        n += 1;
    }
    assert!(n > 12000, "{n} files");
    let cfg = gen.join("gitleaks.toml");
    // Run from the parent directory: the reports are written there, outside the
    // scanned files.
    let (g, m) = both(
        &gitleaks,
        d.path(),
        &["dir", "files", "-c", cfg.to_str().unwrap(), "-f", "json"],
    );
    // Compared as sets of one-line JSON texts: a report holds about 20,000 findings.
    let texts = |report: &str| -> std::collections::BTreeSet<String> {
        let v: Vec<serde_json::Value> = serde_json::from_str(report)
            .unwrap_or_else(|e| panic!("not a JSON report ({e}): {report:.200}"));
        v.iter().map(|f| f.to_string()).collect()
    };
    let (g_count, m_count) = (
        g.matches("\"RuleID\"").count(),
        m.matches("\"RuleID\"").count(),
    );
    let (g, m) = (texts(&g), texts(&m));
    assert!(g.len() > 6000, "{} gitleaks findings", g.len());
    let only_g: Vec<&String> = g.difference(&m).take(10).collect();
    let only_m: Vec<&String> = m.difference(&g).take(10).collect();
    assert!(
        only_g.is_empty() && only_m.is_empty() && g_count == m_count,
        "seed {seed}: gitleaks {g_count} findings, moat {m_count}\nonly gitleaks: {only_g:#?}\nonly moat: {only_m:#?}"
    );
}

#[test]
fn pre_commit_hooks_run_under_pre_commit() {
    let Some(pc) = moat_testkit::real_part("pre-commit", "scripts/ensure-apt pre-commit") else {
        return;
    };
    if !have_git() {
        eprintln!("skipped: no git on PATH");
        return;
    }
    let home = tempfile::tempdir().unwrap();
    let bin = Path::new(env!("CARGO_BIN_EXE_moat")).parent().unwrap();
    let path = std::env::join_paths(std::iter::once(bin.to_path_buf()).chain(
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
    ))
    .unwrap();
    let d = tempfile::tempdir().unwrap();
    let r = d.path();
    git(r, &["init", "-q"]);
    git(r, &["config", "user.name", "Ann Example"]);
    git(r, &["config", "user.email", "ann@example.org"]);
    let hook = |args: &[&str]| {
        Command::new(&pc)
            .current_dir(r)
            .arg("try-repo")
            .arg(moat_testkit::workspace_root())
            .args(args)
            .env("PATH", &path)
            .env("PRE_COMMIT_HOME", home.path())
            .output()
            .unwrap()
    };
    write(r, "app.cfg", &format!("name = demo\ntoken = \"{GH}\"\n"));
    git(r, &["add", "app.cfg"]);
    let out = hook(&["moat-scan"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        !out.status.success(),
        "a staged secret fails the hook: {text}"
    );
    assert!(
        text.contains("app.cfg:2:") && text.contains("github-token"),
        "{text}"
    );
    assert!(!text.contains(GH), "the secret is redacted: {text}");
    let files = hook(&["moat-scan-dir", "--files", "app.cfg"]);
    assert!(
        !files.status.success(),
        "{}",
        String::from_utf8_lossy(&files.stdout)
    );

    write(r, "app.cfg", "name = demo\ntoken = \"${TOKEN}\"\n");
    git(r, &["add", "app.cfg"]);
    let clean = hook(&["moat-scan"]);
    assert!(
        clean.status.success(),
        "{}{}",
        String::from_utf8_lossy(&clean.stdout),
        String::from_utf8_lossy(&clean.stderr)
    );
    assert!(hook(&["moat-scan-dir", "--files", "app.cfg"])
        .status
        .success());
}
