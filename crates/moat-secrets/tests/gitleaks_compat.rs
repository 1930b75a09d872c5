//! gitleaks v8.30.1 semantics that go beyond single rules: recursive decoding
//! (`--max-decode-depth`), composite rules (`[[rules.required]]`) and `[extend]`.
//!
//! Every expected finding below was checked by hand against the gitleaks
//! v8.30.1 binary (`gitleaks dir --no-banner -r out.json -f json --config
//! rules.toml in.txt`, with the same rules and input). gitleaks counts columns
//! on lines after the first from the newline before the line, so its
//! `StartColumn` there is moat's `column` + 1; the comments quote gitleaks'.
// Test and benchmark code: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use moat_secrets::{DecodeLimits, Finding, RuleSet, RulesError, Scanner, DEFAULT_RULES};

fn scanner(toml: &str) -> Scanner {
    Scanner::from_toml(toml, "test.toml").expect("rules compile")
}

fn ids(fs: &[Finding]) -> Vec<&str> {
    fs.iter().map(|f| &*f.rule_id).collect()
}

const TOKEN: &str = r#"
[[rules]]
id = "tok"
description = "test token"
regex = '''tok_[a-z0-9]{16}'''
keywords = ["tok_"]
tags = ["t"]
"#;

/// The input of the decoding tests: the token `tok_a1b2c3d4e5f6g7h8` plain and
/// encoded seven ways.
const ENCODED: &str = "plain tok_a1b2c3d4e5f6g7h8\n\
b64: dG9rX2ExYjJjM2Q0ZTVmNmc3aDg=\n\
hex = 746f6b5f61316232633364346535663667376838\n\
url=%74%6f%6b%5fa1b2c3d4e5f6g7h8\n\
uni \"\\u0074\\u006f\\u006b\\u005fa1b2c3d4e5f6g7h8\"\n\
nested ZEc5clgyRXhZakpqTTJRMFpUVm1ObWMzYURnPQ==\n\
hexb64 6447397258324578596a4a6a4d3251305a54566d4e6d63336144673d\n";

/// (line, column, original text, tags) of each finding.
fn summary<'a>(data: &'a str, fs: &[Finding]) -> Vec<(usize, usize, &'a str, Vec<String>)> {
    fs.iter()
        .map(|f| {
            (
                f.line,
                f.column,
                &data[f.start..f.end],
                f.decoded.as_ref().map(|d| d.tags()).unwrap_or_default(),
            )
        })
        .collect()
}

#[test]
fn decoding_finds_encoded_secrets_at_their_encoded_location() {
    let mut s = scanner(TOKEN);
    s.set_max_decode_depth(5);
    let got = summary(ENCODED, &s.scan(ENCODED.as_bytes(), None));
    let t = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    // gitleaks --max-decode-depth 5: (StartLine, StartColumn, EndColumn, Tags)
    // 1 7 26 [t]; 2 7 34 [t decoded:base64 decode-depth:1]; 3 8 47 [t decoded:hex
    // decode-depth:1]; 4 6 33 [t decoded:percent decode-depth:1]; 5 7 46 [t
    // decoded:unicode decode-depth:1]; 6 9 48 [t decoded:base64 decode-depth:2];
    // 7 9 64 [t decoded:hex decoded:base64 decode-depth:2]. Each secret is
    // tok_a1b2c3d4e5f6g7h8.
    let want = vec![
        (1, 7, "tok_a1b2c3d4e5f6g7h8", t(&[])),
        (
            2,
            6,
            "dG9rX2ExYjJjM2Q0ZTVmNmc3aDg=",
            t(&["decoded:base64", "decode-depth:1"]),
        ),
        (
            3,
            7,
            "746f6b5f61316232633364346535663667376838",
            t(&["decoded:hex", "decode-depth:1"]),
        ),
        // The percent segment is `%74%6f%6b%5f`; the match runs past it, and the
        // location grows by as much.
        (
            4,
            5,
            "%74%6f%6b%5fa1b2c3d4e5f6g7h8",
            t(&["decoded:percent", "decode-depth:1"]),
        ),
        (
            5,
            6,
            "\\u0074\\u006f\\u006b\\u005fa1b2c3d4e5f6g7h8",
            t(&["decoded:unicode", "decode-depth:1"]),
        ),
        (
            6,
            8,
            "ZEc5clgyRXhZakpqTTJRMFpUVm1ObWMzYURnPQ==",
            t(&["decoded:base64", "decode-depth:2"]),
        ),
        (
            7,
            8,
            "6447397258324578596a4a6a4d3251305a54566d4e6d63336144673d",
            t(&["decoded:hex", "decoded:base64", "decode-depth:2"]),
        ),
    ];
    assert_eq!(got, want);
    // The windowed scan and the whole-payload reference agree on decoded passes too.
    assert_eq!(
        s.scan(ENCODED.as_bytes(), None),
        s.scan_reference(ENCODED.as_bytes(), None)
    );
}

#[test]
fn decode_depth_limits_the_passes() {
    let mut s = scanner(TOKEN);
    // Default: no decoding. gitleaks --max-decode-depth 0: line 1 only.
    assert_eq!(s.scan(ENCODED.as_bytes(), None).len(), 1);
    // gitleaks --max-decode-depth 1: lines 1 to 5 (the depth-2 ones are missing).
    s.set_max_decode_depth(1);
    let lines: Vec<usize> = s
        .scan(ENCODED.as_bytes(), None)
        .iter()
        .map(|f| f.line)
        .collect();
    assert_eq!(lines, [1, 2, 3, 4, 5]);
}

#[test]
fn decoded_findings_redact_the_encoded_text() {
    let mut s = scanner(TOKEN);
    s.set_max_decode_depth(5);
    let d = "x dG9rX2ExYjJjM2Q0ZTVmNmc3aDg= y";
    let f = s.scan(d.as_bytes(), None);
    assert_eq!(f.len(), 1);
    assert_eq!(f[0].redacted(d.as_bytes()), "*****");
    assert_eq!(
        moat_secrets::redact(d.as_bytes(), &f),
        b"x [REDACTED:tok] y".to_vec()
    );
}

#[test]
fn decoded_allowlists_see_the_decoded_line_and_gitleaks_allow_the_original() {
    // gitleaks: no finding for either line (the first is allowed by the decoded
    // line `ctx tok_...`, the second by the marker on the original line).
    let rules = format!(
        "{TOKEN}[[rules.allowlists]]\nregexTarget = \"line\"\nregexes = ['''^ctx tok_''']\n"
    );
    let mut s = scanner(&rules);
    s.set_max_decode_depth(5);
    let d = "ctx dG9rX2ExYjJjM2Q0ZTVmNmc3aDg=\nz dG9rX2ExYjJjM2Q0ZTVmNmc3aDg= # gitleaks:allow\n";
    assert!(s.scan(d.as_bytes(), None).is_empty());
    let d = "other dG9rX2ExYjJjM2Q0ZTVmNmc3aDg=\n";
    assert_eq!(s.scan(d.as_bytes(), None).len(), 1);
}

/// base64 of `s`, as Go's StdEncoding.
fn b64(s: &[u8]) -> String {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in s.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for k in 0..4 {
            if k <= c.len() {
                out.push(A[(n >> (18 - 6 * k) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[test]
fn deeply_nested_base64_is_bounded_by_the_depth() {
    let mut v = b"tok_a1b2c3d4e5f6g7h8".to_vec();
    for _ in 0..30 {
        v = b64(&v).into_bytes();
    }
    let mut s = scanner(TOKEN);
    s.set_max_decode_depth(5);
    let out = s.scan_with_deadline(&v, None, None);
    assert!(out.findings.is_empty() && !out.timed_out && !out.decode_truncated);
    s.set_max_decode_depth(30);
    let f = s.scan(&v, None);
    assert_eq!(f.len(), 1);
    assert_eq!((f[0].start, f[0].end), (0, v.len()));
    assert_eq!(f[0].decoded.as_ref().map(|d| d.depth), Some(30));
    // Depths past the cap are capped.
    s.set_max_decode_depth(usize::MAX);
    assert_eq!(s.decode_limits().max_depth, moat_secrets::MAX_DECODE_DEPTH);
}

#[test]
fn huge_hex_runs_respect_the_decoded_bytes_budget() {
    // 2 MB of hex decoding to 1 MB of printable text, twice over ("3431" is "41", "A").
    let v = "3431".repeat(1 << 19);
    let mut s = scanner(TOKEN);
    s.set_decode_limits(DecodeLimits {
        max_depth: 5,
        max_decoded_bytes: 1 << 20,
    });
    let out = s.scan_with_deadline(v.as_bytes(), None, None);
    assert!(out.findings.is_empty());
    // Pass 1 makes 1 MiB ("4141..."), pass 2 would make 512 KiB more: over budget.
    assert!(out.decode_truncated);
    s.set_decode_limits(DecodeLimits {
        max_depth: 5,
        max_decoded_bytes: 4 << 20,
    });
    let out = s.scan_with_deadline(v.as_bytes(), None, None);
    assert!(out.findings.is_empty() && !out.decode_truncated);
}

#[test]
fn hostile_encoded_noise_never_panics_and_stays_in_bounds() {
    let mut s = scanner(TOKEN);
    s.set_max_decode_depth(8);
    let alphabet = b"%0123456789abcdefABCDEF\\uU+ =/_-\ntok_\xff\xc3";
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for round in 0..300 {
        let len = 1 + (round * 37) % 900;
        let mut v = Vec::with_capacity(len);
        for _ in 0..len {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            v.push(alphabet[(x % alphabet.len() as u64) as usize]);
        }
        if round % 3 == 0 {
            let b = b64(&v);
            v.extend_from_slice(b.as_bytes());
        }
        let f = s.scan(&v, None);
        for f in &f {
            assert!(f.start <= f.end && f.end <= v.len());
            assert!(f.secret_start <= f.secret_end && f.secret_end <= v.len());
        }
        assert_eq!(f, s.scan_reference(&v, None));
    }
}

const COMPOSITE: &str = r#"
[[rules]]
id = "user"
regex = '''user=([a-z]{4,})'''
keywords = ["user="]
skipReport = true

[[rules]]
id = "host"
regex = '''host=([a-z.]{4,})'''
keywords = ["host="]

[[rules]]
id = "pass"
regex = '''pass=([A-Za-z0-9]{8,})'''
keywords = ["pass="]
[[rules.required]]
id = "user"
withinLines = 1
[[rules.required]]
id = "host"
withinLines = 2
withinColumns = 10
"#;

const COMPOSITE_INPUT: &str = "user=alice pass=Secr3tPassw0rd1\nhost=db.example\n\n\npass=Other1Passw0rd9\n\nuser=bob\n  host=cache.internal pass=Th1rdPassw0rdX\n";

#[test]
fn composite_rules_need_every_required_rule_nearby() {
    let s = scanner(COMPOSITE);
    let f = s.scan(COMPOSITE_INPUT.as_bytes(), None);
    // gitleaks: host 2:2, host 8:4, pass 1:12 with Required user:1 and host:2.
    // `user` (skipReport) is never reported on its own; line 5's `pass` has no
    // `user` within one line; line 8's has its `host` 20 columns away.
    let got: Vec<(&str, usize, usize)> =
        f.iter().map(|f| (&*f.rule_id, f.line, f.column)).collect();
    assert_eq!(got, [("pass", 1, 12), ("host", 2, 1), ("host", 8, 3)]);
    let req: Vec<(&str, usize)> = f[0]
        .required
        .iter()
        .map(|r| (&*r.rule_id, r.line))
        .collect();
    assert_eq!(req, [("user", 1), ("host", 2)]);
    assert!(f[1].required.is_empty());
}

#[test]
fn composite_columns_are_gitleaks_columns() {
    // gitleaks' columns for `pass` (line 1) and `host` (line 2) are 12 and 2:
    // withinColumns = 10 keeps the finding, 9 drops it (checked with gitleaks),
    // although moat's own columns (12 and 1) are 11 apart.
    let s = scanner(&COMPOSITE.replace("withinColumns = 10", "withinColumns = 9"));
    let f = s.scan(COMPOSITE_INPUT.as_bytes(), None);
    assert_eq!(ids(&f), ["host", "host"]);
}

#[test]
fn composite_rule_errors_and_unrunnable_requirements() {
    let err = Scanner::from_toml(
        "[[rules]]\nid = \"a\"\nregex = 'a'\n[[rules.required]]\nid = \"nope\"\n",
        "c.toml",
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("a: [[rules.required]] rule ID 'nope' does not exist"),
        "{err}"
    );
    let err = Scanner::from_toml(
        "[[rules]]\nid = \"a\"\nregex = 'a'\n[[rules.required]]\nwithinLines = 1\n",
        "c.toml",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("rule ID is empty"), "{err}");
    // A required rule moat cannot run makes the composite rule unrunnable too.
    let s = scanner(
        "[[rules]]\nid = \"look\"\nregex = '''x(?=y)'''\n[[rules]]\nid = \"a\"\nregex = 'a'\n[[rules.required]]\nid = \"look\"\n",
    );
    let skipped: Vec<&str> = s.skipped().iter().map(|x| x.rule_id.as_str()).collect();
    assert_eq!(skipped, ["look", "a"]);
    assert!(s.scan(b"a xy", None).is_empty());
}

#[test]
fn composite_rules_work_on_decoded_text() {
    let mut s = scanner(COMPOSITE);
    s.set_max_decode_depth(5);
    // gitleaks --max-decode-depth 5: `host` 2:2 only. The required `host` is
    // outside the decoded segment, so the decoded pass does not find it again
    // and the decoded `pass` lacks it.
    let d = "dXNlcj1hbGljZSBwYXNzPVNlY3IzdFBhc3N3MHJkMQ==\nhost=db.example\n";
    assert_eq!(ids(&s.scan(d.as_bytes(), None)), ["host"]);
    // base64 of "user=alice pass=Secr3tPassw0rd1\nhost=db.example": gitleaks
    // --max-decode-depth 5 reports `host` and `pass`, both 1:3-66 (the whole
    // segment), tags decoded:base64 decode-depth:1; depth 0 reports nothing.
    let d = "x dXNlcj1hbGljZSBwYXNzPVNlY3IzdFBhc3N3MHJkMQpob3N0PWRiLmV4YW1wbGU=\n";
    let f = s.scan(d.as_bytes(), None);
    let got: Vec<(&str, usize, usize, usize)> = f
        .iter()
        .map(|f| (&*f.rule_id, f.line, f.column, f.end - f.start))
        .collect();
    assert_eq!(got, [("host", 1, 3, 64), ("pass", 1, 3, 64)]);
    assert_eq!(f[1].required.len(), 2);
    assert!(scanner(COMPOSITE).scan(d.as_bytes(), None).is_empty());
}

/// A fresh directory under the system temp dir.
fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("moat-secrets-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(d.join("base")).expect("temp dir");
    d
}

const BASE: &str = r#"
[[rules]]
id = "tok"
description = "base token"
regex = '''tok_[a-z0-9]{16}'''
keywords = ["tok_"]
tags = ["base"]
[[rules.allowlists]]
regexes = ['''^tok_0+$''']

[[rules]]
id = "key"
regex = '''key_[a-z0-9]{16}'''
keywords = ["key_"]

[[rules]]
id = "old"
regex = '''old_[a-z0-9]{16}'''
keywords = ["old_"]

[[allowlists]]
stopwords = ["deadbeef"]
"#;

const TOP: &str = r#"
[extend]
path = "base/base.toml"
disabledRules = ["old"]

[[rules]]
id = "tok"
regex = '''tok_[a-z0-9]{12}'''
tags = ["top"]
[[rules.allowlists]]
regexes = ['''^tok_1+$''']

[[rules]]
id = "mine"
regex = '''mine_[a-z0-9]{8}'''
keywords = ["mine_"]
"#;

#[test]
fn extend_path_merges_rules_allowlists_and_disabled_rules() {
    let d = temp_dir("extend");
    std::fs::write(d.join("base/base.toml"), BASE).expect("write");
    std::fs::write(d.join("top.toml"), TOP).expect("write");
    let s = Scanner::from_file(&d.join("top.toml")).expect("loads");
    let input = "a tok_abcdefgh1234zzzz\nb tok_000000000000\nc tok_111111111111\nd key_abcdefgh12345678\ne old_abcdefgh12345678\nf mine_abcd1234\ng tok_deadbeef1234\n";
    let f = s.scan(input.as_bytes(), None);
    // gitleaks (run from the directory of top.toml): tok "base token" 1:3
    // tok_abcdefgh1234 tags [base top]; key 4:4; mine 6:4. Line 2 is allowed
    // by the base rule's allowlist, line 3 by the extending one's, line 5's rule
    // is disabled, line 7 is allowed by the base's global stopword.
    let got: Vec<(&str, usize, &str)> = f
        .iter()
        .map(|f| (&*f.rule_id, f.line, &input[f.start..f.end]))
        .collect();
    assert_eq!(
        got,
        [
            ("tok", 1, "tok_abcdefgh1234"),
            ("key", 4, "key_abcdefgh12345678"),
            ("mine", 6, "mine_abcd1234")
        ]
    );
    let tok = s.rules().iter().find(|r| &*r.id == "tok").expect("tok");
    assert_eq!(&*tok.description, "base token");
    assert_eq!(tok.tags, ["base", "top"]);
    assert_eq!(tok.allowlists.len(), 2);
    assert!(s.rules().iter().all(|r| &*r.id != "old"));
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn extend_use_default_is_moats_default_ruleset() {
    let own = "[extend]\nuseDefault = true\ndisabledRules = [\"aws-access-key-id\"]\n\n[[rules]]\nid = \"mine\"\nregex = '''mine_[a-z0-9]{8}'''\n";
    let s = scanner(own);
    let default = RuleSet::from_toml(DEFAULT_RULES, "d").expect("default");
    assert_eq!(s.rules().len(), default.rules.len());
    assert!(s.rules().iter().any(|r| &*r.id == "mine"));
    assert!(s.rules().iter().all(|r| &*r.id != "aws-access-key-id"));
    let s = scanner("[extend]\nuseDefault = true\n");
    assert_eq!(s.rules().len(), default.rules.len());
    let err = Scanner::from_toml(
        "[extend]\nuseDefault = true\npath = \"x.toml\"\n",
        "both.toml",
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("both.toml") && err.contains("extend.path and extend.useDefault"),
        "{err}"
    );
}

#[test]
fn extend_cycles_and_deep_chains_are_errors_naming_the_file() {
    let d = temp_dir("extend-chain");
    std::fs::write(d.join("a.toml"), "[extend]\npath = \"base/b.toml\"\n").expect("write");
    std::fs::write(d.join("base/b.toml"), "[extend]\npath = \"../a.toml\"\n").expect("write");
    match Scanner::from_file(&d.join("a.toml")) {
        Err(RulesError::Invalid { origin, message }) => {
            assert!(origin.ends_with("b.toml"), "{origin}");
            assert!(message.contains("cycle"), "{message}");
        }
        other => panic!("expected a cycle error, got {other:?}"),
    }
    // top -> mid -> leaf is as deep as gitleaks goes; a leaf that extends again
    // (gitleaks would ignore its [extend]) is refused.
    std::fs::write(d.join("top.toml"), "[extend]\npath = \"base/mid.toml\"\n").expect("write");
    std::fs::write(d.join("base/mid.toml"), "[extend]\npath = \"leaf.toml\"\n").expect("write");
    std::fs::write(
        d.join("base/leaf.toml"),
        "[extend]\nuseDefault = true\n[[rules]]\nid = \"x\"\nregex = 'x'\n",
    )
    .expect("write");
    match Scanner::from_file(&d.join("top.toml")) {
        Err(RulesError::Invalid { origin, message }) => {
            assert!(origin.ends_with("leaf.toml"), "{origin}");
            assert!(message.contains("deeper than 2"), "{message}");
        }
        other => panic!("expected a depth error, got {other:?}"),
    }
    std::fs::write(
        d.join("base/leaf.toml"),
        "[[rules]]\nid = \"x\"\nregex = 'x_[0-9]{4}'\n",
    )
    .expect("write");
    let s = Scanner::from_file(&d.join("top.toml")).expect("two levels load");
    assert_eq!(ids(&s.scan(b"x_1234", None)), ["x"]);
    // A missing base is an I/O error naming it and the file extending it.
    std::fs::write(d.join("gone.toml"), "[extend]\npath = \"nothere.toml\"\n").expect("write");
    let err = Scanner::from_file(&d.join("gone.toml"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("nothere.toml") && err.contains("gone.toml"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn extend_merge_keeps_base_fields_left_empty_and_validates_after_merging() {
    // The extending rule has neither regex nor path: valid, because the merged
    // rule has the base's regex (gitleaks validates after merging).
    let d = temp_dir("extend-merge");
    std::fs::write(d.join("base/base.toml"), BASE).expect("write");
    std::fs::write(
        d.join("top.toml"),
        "[extend]\npath = \"base/base.toml\"\n[[rules]]\nid = \"key\"\ndescription = \"mine now\"\nentropy = 3.5\n",
    )
    .expect("write");
    let s = Scanner::from_file(&d.join("top.toml")).expect("loads");
    let key = s.rules().iter().find(|r| &*r.id == "key").expect("key");
    assert_eq!(&*key.description, "mine now");
    assert_eq!(key.entropy, 3.5);
    assert!(key.regex.is_some());
    // Without a base, the same rule is invalid.
    let err = Scanner::from_toml("[[rules]]\nid = \"key\"\nentropy = 3.5\n", "t.toml")
        .unwrap_err()
        .to_string();
    assert!(err.contains("both |regex| and |path| are empty"), "{err}");
    let _ = std::fs::remove_dir_all(&d);
}

/// A match that starts at a newline (the rule's boundary group accepts `\s`):
/// gitleaks trims the newline from `Match` but still locates the match from the
/// newline, over the trimmed length. gitleaks v8.30.1 on these three files with
/// gitleaks.toml's `azure-ad-client-secret` reports line 2, 2 and 3, columns
/// 1-40 each; before moat reported 2-41.
#[test]
fn a_match_starting_at_a_newline_is_located_as_gitleaks_does() {
    use moat_secrets::report::{report_finding, Lines, Origin};
    let s = scanner(
        r#"
[[rules]]
id = "azure-ad-client-secret"
regex = '''(?:^|[\\'"\x60\s>=:(,)])([a-zA-Z0-9_~.]{3}\dQ~[a-zA-Z0-9_~.-]{31,34})(?:$|[\\'"\x60\s<),])'''
keywords = ["q~"]
"#,
    );
    let secret = "QtT8Q~9C-_Ij~RouHVpD2Tuf3oHWGh.DQ3kcjbAn";
    for (text, line) in [
        (format!("lorem ipsum\n{secret}"), 2),
        (format!("lorem ipsum\n{secret}\nmore\n"), 2),
        (format!("x = 1\n\n{secret}\n"), 3),
    ] {
        let data = text.as_bytes();
        let fs = s.scan(data, None);
        assert_eq!(fs.len(), 1, "{text:?}");
        let origin = Origin {
            file: "f.txt",
            symlink: "",
            first_line: 1,
            commit: None,
        };
        let r = report_finding(&fs[0], data, &Lines::new(data), origin, &[]);
        assert_eq!(
            (r.start_line, r.end_line, r.start_column, r.end_column),
            (line, line, 1, 40),
            "{text:?}"
        );
        assert_eq!((r.match_text.as_str(), r.secret.as_str()), (secret, secret));
    }
}
