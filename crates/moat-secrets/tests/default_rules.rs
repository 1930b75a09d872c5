//! moat's embedded default ruleset: a realistic secret for every rule is found
//! (by that rule), and documented false-positive shapes are not reported.
//! The secrets below are random strings in the providers' formats, not live keys.
// Test and benchmark code: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use moat_secrets::Scanner;

const TPS: &[(&str, &str, &str)] = &[
    ("aws-access-key-id", "aws.access_key_id = AKIAZ7Q4T2MXW6VBN3RK\n", "AKIAZ7Q4T2MXW6VBN3RK"),
    (
        "aws-secret-access-key",
        "aws_secret_access_key = \"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\"\n",
        "hYgCfrL1spNxnyVmihA+2O76UMFxFkM+R5Kjp1vR",
    ),
    ("gcp-api-key", "{\"key\": \"AIzau8jzPde0IgxLd6GncfBAepfJBd0Kh8oOOL8\"}", "AIzau8jzPde0IgxLd6GncfBAepfJBd0Kh8oOOL8"),
    ("gcp-service-account", "{\n  \"type\": \"service_account\",\n  \"project_id\": \"shop\"\n}", "\"type\": \"service_account\""),
    (
        "azure-storage-key",
        "DefaultEndpointsProtocol=https;AccountName=shop;AccountKey=t+1fjORS/6ilI8ihN5KXSc7Tvo/hBKqFYY/kv5ZJr3J1TWDtkwtDDb+xHKas1VOqg6YYZYn9ZhyiA4uoRgnatm==;EndpointSuffix=core.windows.net",
        "t+1fjORS/6ilI8ihN5KXSc7Tvo/hBKqFYY/kv5ZJr3J1TWDtkwtDDb+xHKas1VOqg6YYZYn9ZhyiA4uoRgnatm==",
    ),
    (
        "digitalocean-token",
        "export DO_TOKEN=dop_v1_b026c48bbf33feff9243a8f506b40928b5b7a767c76fb008f86bebb2737f6a6f\n",
        "dop_v1_b026c48bbf33feff9243a8f506b40928b5b7a767c76fb008f86bebb2737f6a6f",
    ),
    ("github-token", "git clone https://x:ghp_N5N1aE6PwZPf1Qh6yYTWmE4lBYOvfZ8UzDzV@github.com/o/r", "ghp_N5N1aE6PwZPf1Qh6yYTWmE4lBYOvfZ8UzDzV"),
    (
        "github-fine-grained-pat",
        "GH=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\n",
        "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",
    ),
    ("gitlab-token", "CI_TOKEN: glpat-lMaXZjljENUhJduRHHJE\n", "glpat-lMaXZjljENUhJduRHHJE"),
    ("bitbucket-app-password", "bb: ATBBYXg4JdpmrcXgGCJbW56eCuNGMGmSrCGI\n", "ATBBYXg4JdpmrcXgGCJbW56eCuNGMGmSrCGI"),
    ("slack-token", "SLACK=xoxb-2837465019-8364519027-Qm7Zt2Lx9Rv4Kp8Wn3Hs6Jd1\n", "xoxb-2837465019-8364519027-Qm7Zt2Lx9Rv4Kp8Wn3Hs6Jd1"),
    (
        "slack-webhook-url",
        "url: https://hooks.slack.com/services/ZEG8pSH4487q7J58m1CiAhzCueQpBenQtYh5Xj8TPQxj\n",
        "https://hooks.slack.com/services/ZEG8pSH4487q7J58m1CiAhzCueQpBenQtYh5Xj8TPQxj",
    ),
    (
        "discord-bot-token",
        "discord_token = \"MTk4NjIyNDgzNDcxOTI1MjQ4.Cl2FMQ.ZnCjm1XVW7vRze4b7Cq4se7kKWs\"",
        "MTk4NjIyNDgzNDcxOTI1MjQ4.Cl2FMQ.ZnCjm1XVW7vRze4b7Cq4se7kKWs",
    ),
    ("telegram-bot-token", "bot = Bot(\"7364519027:AAGr7CmY_uCu3ZR1zTOlUcR64cXQLioDnkH\")", "7364519027:AAGr7CmY_uCu3ZR1zTOlUcR64cXQLioDnkH"),
    ("stripe-secret-key", "stripe.api_key = 'sk_live_rc5XlrWi0B26R08qzjI6GKFSufrdZSlB'", "sk_live_rc5XlrWi0B26R08qzjI6GKFSufrdZSlB"),
    ("square-access-token", "SQUARE=EAAA5er8bOfZqfM2oeq3hDavJA76rNicHTp8hkqdlm7t\n", "EAAA5er8bOfZqfM2oeq3hDavJA76rNicHTp8hkqdlm7t"),
    (
        "paypal-braintree-token",
        "BT=access_token$production$t7ns26lrwbqcab69$6f7e3dfc967a64cb14028d512c9791e5\n",
        "access_token$production$t7ns26lrwbqcab69$6f7e3dfc967a64cb14028d512c9791e5",
    ),
    (
        "sendgrid-api-key",
        "SENDGRID=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\n",
        "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",
    ),
    ("twilio-api-key", "TWILIO_SID=SK41d4072014b3ce107f80e222f828767e\n", "SK41d4072014b3ce107f80e222f828767e"),
    ("npm-access-token", "//registry.npmjs.org/:_authToken=npm_F2yeE6RsXcNOPmeMjvqPVStNKiaEdFrRgSnR\n", "npm_F2yeE6RsXcNOPmeMjvqPVStNKiaEdFrRgSnR"),
    (
        "pypi-upload-token",
        "password = pypi-AgEIcHlwaS5vcmcFsTHsDDDXh5Jmtf7EbsDe0G9Cryn687neLfjVHq8xiM0OGr4hTxoF54Fzbka\n",
        "pypi-AgEIcHlwaS5vcmcFsTHsDDDXh5Jmtf7EbsDe0G9Cryn687neLfjVHq8xiM0OGr4hTxoF54Fzbka",
    ),
    (
        "openai-api-key",
        "OPENAI_API_KEY=sk-proj-8FRCztUjAwyuh1vauWv1zh87mTa5Vsqxezy3Lex7T3BlbkFJBWr2drgd1QsO7jprBGumXxY9B4bZWOz648JJnUfd\n",
        "sk-proj-8FRCztUjAwyuh1vauWv1zh87mTa5Vsqxezy3Lex7T3BlbkFJBWr2drgd1QsO7jprBGumXxY9B4bZWOz648JJnUfd",
    ),
    (
        "anthropic-api-key",
        "key: sk-ant-api03-7UACNWiP3sFd67JikEAvstqVVPqzPptEJQzhkPkenG5ZFJoC6vWCBiJmpflvJfupxqZKm4bV3AyAVHnyrvWdFrK9xiRGH\n",
        "sk-ant-api03-7UACNWiP3sFd67JikEAvstqVVPqzPptEJQzhkPkenG5ZFJoC6vWCBiJmpflvJfupxqZKm4bV3AyAVHnyrvWdFrK9xiRGH",
    ),
    (
        "private-key",
        "-----BEGIN RSA PRIVATE KEY-----\nFnCttn6kfaqDeMqG3omjMyXHCabM6JOF8EFd0Nhcy/1kGD2VD/eR1UYzaLiA/zNyD7CH\nLn/xC+1hsYgBds1ghxY5OokvQyx7eNWVQ4vnakJkS1pAWTN3lg8zV5yPU8d0FZfWe7ih\n-----END RSA PRIVATE KEY-----\n",
        "-----BEGIN RSA PRIVATE KEY-----\nFnCttn6kfaqDeMqG3omjMyXHCabM6JOF8EFd0Nhcy/1kGD2VD/eR1UYzaLiA/zNyD7CH\nLn/xC+1hsYgBds1ghxY5OokvQyx7eNWVQ4vnakJkS1pAWTN3lg8zV5yPU8d0FZfWe7ih\n-----END RSA PRIVATE KEY-----",
    ),
    (
        "jwt",
        "Authorization: Bearer eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwiaWF0IjoxNTE2MjM5MDIyfQ.OY32nfr5pyzPCB9t2039bicBTW5ZE9LFaez7770H2DC\n",
        "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwiaWF0IjoxNTE2MjM5MDIyfQ.OY32nfr5pyzPCB9t2039bicBTW5ZE9LFaez7770H2DC",
    ),
    ("basic-auth-url", "DATABASE_URL=postgres://shop:Xq7vR2mK9pLz4T@db.internal:5432/shop\n", "Xq7vR2mK9pLz4T"),
    ("generic-secret-assignment", "client_secret = \"oiADN5RpVI2XQWhX1ssrKrxq\"\n", "oiADN5RpVI2XQWhX1ssrKrxq"),
];

const FPS: &[&str] = &[
    // AWS documentation example key (stopword).
    "aws_access_key_id = AKIAIOSFODNN7EXAMPLE",
    "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    // Placeholders and templating.
    "api_key = \"${API_KEY}\"",
    "token: \"{{ .Values.token }}\"",
    "password = \"your_password_here\"",
    "client_secret = \"xxxxxxxxxxxxxxxxxxxxxxxx\"",
    "secret_key = \"changeme-changeme-changeme\"",
    "api_token = \"<your-api-token>\"",
    "stripe_key = 'sk_test_xxxxxxxxxxxxxxxxxxxxxxxx'",
    // Low-entropy look-alikes.
    "ghp_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "SK00000000000000000000000000000000",
    "npm_111111111111111111111111111111111111",
    // Identifiers, not values.
    "auth_header_name = \"authorization_bearer_token\"",
    "token_env = \"GITHUB_TOKEN_FOR_RELEASES\"",
    "secret_path = \"/etc/shop/secrets/db.json\"",
    "key = \"sessionCookieName\"",
    "postgres://user:password@localhost/db",
    // Ordinary prose mentioning secrets.
    "Rotate the API key every 90 days and never commit a token to the repository.",
];

#[test]
fn every_default_rule_finds_its_secret() {
    let s = Scanner::builtin().expect("default rules");
    assert!(s.skipped().is_empty(), "{:?}", s.skipped());
    let covered: std::collections::BTreeSet<&str> = TPS.iter().map(|t| t.0).collect();
    for r in s.rules() {
        assert!(
            covered.contains(&*r.id),
            "no sample for default rule {}",
            r.id
        );
    }
    for (id, text, secret) in TPS {
        let f = s.scan(text.as_bytes(), None);
        let hit = f.iter().find(|f| &*f.rule_id == *id);
        let Some(hit) = hit else {
            panic!("{id} not found in {text:?}: {f:?}");
        };
        assert_eq!(&text[hit.secret_start..hit.secret_end], *secret, "{id}");
    }
}

#[test]
fn default_rules_ignore_false_positive_shapes() {
    let s = Scanner::builtin().expect("default rules");
    for text in FPS {
        let f = s.scan(text.as_bytes(), None);
        assert!(
            f.is_empty(),
            "{text:?} -> {:?}",
            f.iter().map(|f| &f.rule_id).collect::<Vec<_>>()
        );
    }
}

/// Largest counted repetition Go's regexp (and so gitleaks) accepts.
const GO_MAX_REPEAT: u32 = 1000;

fn max_repeat(hir: &regex_syntax::hir::Hir) -> u32 {
    use regex_syntax::hir::HirKind;
    match hir.kind() {
        HirKind::Repetition(r) => r.min.max(r.max.unwrap_or(0)).max(max_repeat(&r.sub)),
        HirKind::Capture(c) => max_repeat(&c.sub),
        HirKind::Concat(hs) | HirKind::Alternation(hs) => {
            hs.iter().map(max_repeat).max().unwrap_or(0)
        }
        _ => 0,
    }
}

#[test]
fn default_rules_load_in_gitleaks_too() {
    // The same file must work with gitleaks itself: Go's regexp refuses counted
    // repetitions above 1000 and would reject the whole ruleset.
    let doc: toml::Value = toml::from_str(moat_secrets::DEFAULT_RULES).unwrap();
    let rules = doc["rules"].as_array().unwrap();
    for rule in rules {
        for key in ["regex", "path"] {
            let Some(re) = rule.get(key).and_then(|v| v.as_str()) else {
                continue;
            };
            let hir = regex_syntax::Parser::new().parse(re).unwrap();
            assert!(
                max_repeat(&hir) <= GO_MAX_REPEAT,
                "rule {}: {key} repeats more than {GO_MAX_REPEAT} times",
                rule["id"]
            );
        }
    }
}

/// The scan that runs rules only around keyword hits (anchored at the hits'
/// starts for rules whose matches start with a keyword) reports exactly what the
/// whole-text reference reports, on payloads dense in hits: every sample back to
/// back, each secret with its keyword repeated in front (`SKSK41d4…`, where the
/// first hit starts no match and the second does), cut short, and upper- and
/// lower-cased.
#[test]
fn keyword_anchored_scans_equal_the_whole_text_scan() {
    let s = Scanner::builtin().expect("default rules");
    let mut pieces: Vec<String> = Vec::new();
    for (_, text, secret) in TPS {
        pieces.push(text.to_string());
        let head: String = secret.chars().take(4).collect();
        pieces.push(format!("{head}{secret}"));
        pieces.push(format!("{head}{}", &secret[..secret.len() / 2]));
    }
    pieces.extend(FPS.iter().map(|f| f.to_string()));
    let mut checked = 0;
    for sep in ["", " ", "\n", "-"] {
        let joined = pieces.join(sep);
        for payload in [
            joined.clone(),
            joined.to_ascii_uppercase(),
            joined.to_ascii_lowercase(),
        ] {
            let a = s.scan(payload.as_bytes(), None);
            assert_eq!(a, s.scan_reference(payload.as_bytes(), None), "{payload:?}");
            checked += a.len();
        }
    }
    assert!(checked > 50, "{checked} findings");
}
