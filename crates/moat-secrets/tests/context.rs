//! Direction and context (docs/secrets.md): credentials in their designated
//! places are not findings, provider-specific secrets pasted into content are
//! blocked, generic rules only monitor requests unless a route opts in, and
//! responses are redacted.
// Test and benchmark code: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;

use base64::Engine as _;
use bytes::Bytes;
use moat_core::{
    Body, DecodeLimits, EventAction, RequestBodyPhase, RequestCtx, ResponseBodyPhase,
    SecurityEvent, Verdict,
};
use moat_secrets::{
    classify, Confidence, RouteSecrets, RuleSet, SecretsAction, SecretsConfig, SecretsEngine,
};

const AWS: &str = "AKIAZ7Q4T2MXW6VBN3RK";
const STRIPE: &str = "sk_live_rc5XlrWi0B26R08qzjI6GKFSufrdZSlB";
const GH_REFRESH: &str = "ghr_N5N1aE6PwZPf1Qh6yYTWmE4lBYOvfZ8UzDzV";
const JWT: &str = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwiaWF0IjoxNTE2MjM5MDIyfQ.OY32nfr5pyzPCB9t2039bicBTW5ZE9LFaez7770H2DC";
/// High entropy, matched by `generic-secret-assignment` after a secret-like name.
const PASSWORD: &str = "oiADN5RpVI2XQWhX1ssrKrxq";
const PEM: &str = "-----BEGIN RSA PRIVATE KEY-----\r\nFnCttn6kfaqDeMqG3omjMyXHCabM6JOF8EFd0Nhcy/1kGD2VD/eR1UYzaLiA/zNyD7CH\r\nLn/xC+1hsYgBds1ghxY5OokvQyx7eNWVQ4vnakJkS1pAWTN3lg8zV5yPU8d0FZfWe7ih\r\n-----END RSA PRIVATE KEY-----\r\n";

/// The quickstart's settings: block on requests, responses scanned.
fn engine(f: impl FnOnce(&mut SecretsConfig)) -> Arc<SecretsEngine> {
    let mut c = SecretsConfig {
        enabled: true,
        scan_responses: true,
        // Debug builds on a shared machine: the 50 ms default is for release.
        scan_timeout: std::time::Duration::from_secs(10),
        ..SecretsConfig::default()
    };
    f(&mut c);
    SecretsEngine::build(&c, Path::new(".")).expect("engine")
}

fn req(path: &str, ctype: &str) -> http::request::Parts {
    http::Request::builder()
        .method("POST")
        .uri(path)
        .header("content-type", ctype)
        .body(())
        .unwrap()
        .into_parts()
        .0
}

fn body(data: &str) -> Body {
    Body::new(
        Bytes::copy_from_slice(data.as_bytes()),
        None,
        false,
        DecodeLimits::default(),
    )
}

/// Runs the request phase; returns whether it was blocked, the events and the
/// body as forwarded.
fn send(
    e: &SecretsEngine,
    route: &str,
    path: &str,
    ctype: &str,
    data: &str,
) -> (bool, Vec<SecurityEvent>, String) {
    let mut ctx = RequestCtx::for_test(route);
    let mut r = req(path, ctype);
    let mut b = body(data);
    let v = e.on_request_body(&mut ctx, &mut r, &mut b);
    if let Verdict::Respond(reply) = &v {
        let text = String::from_utf8_lossy(&reply.body);
        for s in [AWS, STRIPE, PASSWORD, JWT, "PRIVATE KEY-----\r\nFn"] {
            assert!(!text.contains(s), "the block reply leaks a secret: {text}");
        }
    }
    (
        matches!(v, Verdict::Respond(_)),
        ctx.events,
        String::from_utf8_lossy(b.raw()).into_owned(),
    )
}

fn detail<'a>(ev: &'a SecurityEvent, key: &str) -> &'a str {
    ev.details[key].as_str().unwrap_or("")
}

/// Every event is an exemption (`monitor` action, decision `exempt`) whose
/// reason contains `why`.
fn all_exempt(events: &[SecurityEvent], why: &str) {
    assert!(!events.is_empty(), "expected exempt findings");
    for ev in events {
        assert_eq!(ev.action, EventAction::Monitor, "{ev:?}");
        assert_eq!(detail(ev, "decision"), "exempt", "{ev:?}");
        assert!(detail(ev, "reason").contains(why), "{ev:?}");
        assert!(ev.message.contains(why), "{ev:?}");
    }
}

/// Routes opting in to blocking generic rules: designated places stay exempt.
fn strict() -> Arc<SecretsEngine> {
    engine(|c| {
        c.routes.insert(
            "strict".into(),
            RouteSecrets {
                generic_action: Some(SecretsAction::Block),
                ..Default::default()
            },
        );
    })
}

#[test]
fn login_form_password_is_not_a_finding() {
    let e = strict();
    for route in ["r", "strict"] {
        let data = format!("username=ann&password={PASSWORD}&remember=1");
        let (blocked, events, fwd) = send(
            &e,
            route,
            "/login",
            "application/x-www-form-urlencoded",
            &data,
        );
        assert!(!blocked);
        assert_eq!(fwd, data);
        all_exempt(
            &events,
            "credential in designated field password of a login form",
        );
        assert_eq!(detail(&events[0], "field"), "password");
        assert_eq!(events[0].rule, "generic-secret-assignment");
    }
    // A sign-up form (`user[password]`-style names are classified the same
    // way, see the unit tests in context.rs; gitleaks-style rules do not match
    // them).
    let data = format!("email=a%40b.c&new_password={PASSWORD}");
    let (blocked, events, _) = send(
        &e,
        "strict",
        "/users/sign_up",
        "application/x-www-form-urlencoded",
        &data,
    );
    assert!(!blocked);
    all_exempt(&events, "field new_password of a sign-up form");
}

#[test]
fn json_login_password_is_not_a_finding() {
    let e = strict();
    let data = format!(r#"{{"username": "ann", "password": "{PASSWORD}"}}"#);
    let (blocked, events, _) = send(&e, "strict", "/api/v1/login", "application/json", &data);
    assert!(!blocked);
    all_exempt(
        &events,
        "credential in designated field password of a login form (json body",
    );
    let data = format!(r#"{{"currentPassword":"x","newPassword":"{PASSWORD}"}}"#);
    let (blocked, events, _) = send(&e, "strict", "/account/password", "application/json", &data);
    assert!(!blocked);
    all_exempt(&events, "field newPassword of a password change form");
}

#[test]
fn bearer_tokens_and_authorization_are_not_findings() {
    let e = strict();
    // The Authorization header is where a bearer token goes: headers are not
    // scanned, only bodies.
    let mut ctx = RequestCtx::for_test("strict");
    let mut r = http::Request::builder()
        .method("POST")
        .uri("/api/orders")
        .header("authorization", format!("Bearer {JWT}"))
        .header("content-type", "application/json")
        .body(())
        .unwrap()
        .into_parts()
        .0;
    let mut b = body(r#"{"item": 42}"#);
    assert!(matches!(
        e.on_request_body(&mut ctx, &mut r, &mut b),
        Verdict::Continue
    ));
    assert!(ctx.events.is_empty());
    // A body carrying an Authorization value (a batch or a beacon).
    let data = format!(r#"{{"headers": {{"Authorization": "Bearer {JWT}"}}}}"#);
    let (blocked, events, _) = send(&e, "strict", "/batch", "application/json", &data);
    assert!(!blocked);
    all_exempt(&events, "bearer credential in field Authorization");
    assert_eq!(events[0].rule, "jwt");
    // Tokens in their parameter, in a form and in a text/plain beacon of JSON.
    let (blocked, events, _) = send(
        &e,
        "strict",
        "/collect",
        "application/x-www-form-urlencoded",
        &format!("v=1&access_token={JWT}"),
    );
    assert!(!blocked);
    all_exempt(&events, "API key as the API's own parameter access_token");
    let (blocked, events, _) = send(
        &e,
        "strict",
        "/beacon",
        "text/plain;charset=UTF-8",
        &format!(r#"{{"event":"view","token":"{JWT}"}}"#),
    );
    assert!(!blocked);
    all_exempt(&events, "API key as the API's own parameter token");
}

#[test]
fn oauth_token_request_is_not_a_finding() {
    let e = strict();
    // A provider-specific refresh token and a client secret, in their fields.
    let data = format!(
        "grant_type=refresh_token&refresh_token={GH_REFRESH}&client_id=app&client_secret={PASSWORD}"
    );
    let (blocked, events, fwd) = send(
        &e,
        "strict",
        "/oauth/token",
        "application/x-www-form-urlencoded",
        &data,
    );
    assert!(!blocked, "{events:?}");
    assert_eq!(fwd, data);
    all_exempt(&events, "of an OAuth token request to /oauth/token");
    let fields: Vec<&str> = events.iter().map(|e| detail(e, "field")).collect();
    assert!(fields.contains(&"refresh_token") && fields.contains(&"client_secret"));
    // The same refresh token sent elsewhere in a field that is not its place
    // counts: it is a provider-specific secret.
    let (blocked, _, _) = send(
        &e,
        "r",
        "/profile",
        "application/x-www-form-urlencoded",
        &format!("bio={GH_REFRESH}"),
    );
    assert!(blocked);
}

#[test]
fn api_key_as_the_apis_own_parameter_is_not_a_finding() {
    let e = engine(|_| {});
    for (ctype, data) in [
        (
            "application/x-www-form-urlencoded",
            format!("amount=100&api_key={STRIPE}"),
        ),
        (
            "application/json",
            format!(r#"{{"amount": 100, "apiKey": "{STRIPE}"}}"#),
        ),
    ] {
        let (blocked, events, _) = send(&e, "r", "/v1/charges", ctype, &data);
        assert!(!blocked, "{events:?}");
        all_exempt(&events, "API key as the API's own parameter");
        assert_eq!(events[0].rule, "stripe-secret-key");
    }
    // Only when the key is the whole value: a key inside a longer text counts.
    let (blocked, events, _) = send(
        &e,
        "r",
        "/v1/charges",
        "application/json",
        &format!(r#"{{"key": "mine is {STRIPE}"}}"#),
    );
    assert!(blocked);
    assert_eq!(detail(&events[0], "decision"), "block");
}

#[test]
fn aws_key_in_a_comment_field_is_blocked() {
    let e = engine(|_| {});
    for (ctype, data) in [
        (
            "application/x-www-form-urlencoded",
            format!("name=ann&comment=my+key+is+{AWS}+thanks"),
        ),
        (
            "application/json",
            format!(r#"{{"name": "ann", "comment": "my key is {AWS}"}}"#),
        ),
        ("text/plain", format!("my key is {AWS}")),
    ] {
        let (blocked, events, _) = send(&e, "r", "/tickets", ctype, &data);
        assert!(blocked, "{ctype}");
        let ev = &events[0];
        assert_eq!(ev.rule, "aws-access-key-id");
        assert_eq!(ev.action, EventAction::Block);
        assert_eq!(detail(ev, "decision"), "block");
        assert_eq!(detail(ev, "confidence"), "specific");
        assert!(
            detail(ev, "reason").starts_with("provider-specific rule"),
            "{ev:?}"
        );
        if ctype != "text/plain" {
            assert_eq!(detail(ev, "field"), "comment");
            assert!(detail(ev, "reason").contains("in field comment"), "{ev:?}");
        }
    }
}

#[test]
fn private_key_in_an_upload_is_blocked() {
    let e = strict();
    let data = format!(
        "--b0undary\r\nContent-Disposition: form-data; name=\"title\"\r\n\r\nmy keys\r\n--b0undary\r\nContent-Disposition: form-data; name=\"file\"; filename=\"id_rsa\"\r\nContent-Type: application/octet-stream\r\n\r\n{PEM}\r\n--b0undary--\r\n"
    );
    let (blocked, events, _) = send(
        &e,
        "r",
        "/upload",
        "multipart/form-data; boundary=b0undary",
        &data,
    );
    assert!(blocked);
    assert_eq!(events[0].rule, "private-key");
    assert_eq!(detail(&events[0], "field"), "file");
    assert!(detail(&events[0], "reason").contains("in uploaded file field file"));
    // Even under a name that designates a key parameter: a PEM block is not a
    // token (it has spaces), so it is never the API's own parameter.
    let (blocked, _, _) = send(
        &e,
        "r",
        "/upload",
        "application/json",
        &format!(r#"{{"key": "{}"}}"#, PEM.replace("\r\n", "\\n")),
    );
    assert!(blocked);
}

#[test]
fn key_in_a_response_is_redacted() {
    let e = engine(|_| {});
    let r = req("/api/config", "application/json");
    let mut resp = http::Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .body(())
        .unwrap()
        .into_parts()
        .0;
    let mut ctx = RequestCtx::for_test("r");
    let mut b = body(&format!(
        r#"{{"aws_access_key_id": "{AWS}", "token": "{JWT}"}}"#
    ));
    assert!(matches!(
        e.on_response_body(&mut ctx, &r, &mut resp, &mut b),
        Verdict::Continue
    ));
    let out = String::from_utf8_lossy(b.raw()).into_owned();
    assert!(out.contains("\"[REDACTED:aws-access-key-id]\""), "{out}");
    assert!(out.contains("\"[REDACTED:jwt]\""), "{out}");
    assert!(ctx.events.iter().all(|e| e.action == EventAction::Redact));
    assert!(detail(&ctx.events[0], "reason").starts_with("leak in a response body"));
    // A token endpoint issuing a token: the credential is where it belongs.
    let r = req("/oauth/token", "application/x-www-form-urlencoded");
    let mut ctx = RequestCtx::for_test("r");
    let doc = format!(r#"{{"access_token": "{JWT}", "token_type": "Bearer"}}"#);
    let mut b = body(&doc);
    e.on_response_body(&mut ctx, &r, &mut resp, &mut b);
    assert_eq!(String::from_utf8_lossy(b.raw()), doc);
    all_exempt(&ctx.events, "credential issued in field access_token");
    // `response_action: block` keeps the old behaviour (502).
    let e = engine(|c| c.response_action = Some(SecretsAction::Block));
    let mut ctx = RequestCtx::for_test("r");
    let mut b = body(&format!(r#"{{"k": "{AWS}"}}"#));
    let r = req("/api/config", "application/json");
    match e.on_response_body(&mut ctx, &r, &mut resp, &mut b) {
        Verdict::Respond(reply) => assert_eq!(reply.status.as_u16(), 502),
        v => panic!("{v:?}"),
    }
}

#[test]
fn generic_rule_on_a_request_is_only_monitored() {
    let e = engine(|_| {});
    let text = format!("db_password = {PASSWORD}\nsession = {JWT}\n");
    let (blocked, events, fwd) = send(&e, "r", "/notes", "text/plain", &text);
    assert!(!blocked);
    assert_eq!(fwd, text);
    let rules: Vec<&str> = events.iter().map(|e| e.rule.as_str()).collect();
    assert!(rules.contains(&"generic-secret-assignment") && rules.contains(&"jwt"));
    for ev in &events {
        assert_eq!(ev.action, EventAction::Monitor);
        assert_eq!(detail(ev, "decision"), "monitor");
        assert_eq!(detail(ev, "confidence"), "generic");
        assert!(detail(ev, "reason").contains("monitor-only on requests"));
    }
    // With a provider-specific secret in the same body the body is blocked;
    // the generic finding is still only monitored.
    let (blocked, events, _) = send(
        &e,
        "r",
        "/notes",
        "text/plain",
        &format!("{text}aws = {AWS}\n"),
    );
    assert!(blocked);
    assert!(events
        .iter()
        .any(|e| e.rule == "aws-access-key-id" && e.action == EventAction::Block));
    assert!(events
        .iter()
        .any(|e| e.rule == "jwt" && e.action == EventAction::Monitor));
}

#[test]
fn per_route_opt_in_makes_generic_rules_block() {
    let e = strict();
    let text = format!("db_password = {PASSWORD}\n");
    let (blocked, events, _) = send(&e, "strict", "/notes", "text/plain", &text);
    assert!(blocked);
    assert_eq!(events[0].action, EventAction::Block);
    assert!(detail(&events[0], "reason").contains("blocked on requests"));
    // Other routes keep the default.
    assert!(!send(&e, "r", "/notes", "text/plain", &text).0);
    // `context: false` on a route turns the exemptions off.
    let e = engine(|c| {
        c.routes.insert(
            "raw".into(),
            RouteSecrets {
                context: Some(false),
                ..Default::default()
            },
        );
    });
    let data = format!("amount=100&api_key={STRIPE}");
    let form = "application/x-www-form-urlencoded";
    assert!(!send(&e, "r", "/v1/charges", form, &data).0);
    assert!(send(&e, "raw", "/v1/charges", form, &data).0);
    // A route in monitor-only mode never blocks.
    let mut ctx = RequestCtx::for_test("r");
    ctx.monitor_only = true;
    let mut b = body(&format!("comment={AWS}"));
    assert!(matches!(
        e.on_request_body(&mut ctx, &mut req("/x", form), &mut b),
        Verdict::Continue
    ));
    assert_eq!(ctx.events[0].action, EventAction::Monitor);
}

#[test]
fn exempt_findings_can_be_left_out_of_the_events() {
    let e = engine(|c| c.report_exempt = false);
    let data = format!("username=ann&password={PASSWORD}");
    let (blocked, events, _) = send(
        &e,
        "r",
        "/login",
        "application/x-www-form-urlencoded",
        &data,
    );
    assert!(!blocked && events.is_empty());
}

#[test]
fn config_keys_parse_and_overrides_are_checked() {
    let c: SecretsConfig = moat_config::from_str(
        Path::new("moat.yaml"),
        "enabled: true\naction: block\nresponse_action: redact\ngeneric_action: monitor\ncontext: true\nreport_exempt: false\ngeneric_rules: [gcp-api-key]\nspecific_rules: [jwt]\nroutes:\n  api: { generic_action: block, context: false, response_action: block }\n",
    )
    .expect("config parses");
    let p = c.policy("api");
    assert_eq!(
        (p.generic_action, p.context, p.response_action),
        (SecretsAction::Block, false, SecretsAction::Block)
    );
    let p = c.policy("other");
    assert_eq!(
        (p.action, p.generic_action, p.context, p.response_action),
        (
            SecretsAction::Block,
            SecretsAction::Monitor,
            true,
            SecretsAction::Redact
        )
    );
    let e = SecretsEngine::build(&c, Path::new(".")).unwrap();
    assert_eq!(
        e.classification("jwt").unwrap().confidence,
        Confidence::Specific
    );
    assert_eq!(
        e.classification("gcp-api-key").unwrap().confidence,
        Confidence::Generic
    );
    // Defaults: monitor responses follow a monitor action.
    let c = SecretsConfig {
        action: SecretsAction::Monitor,
        ..SecretsConfig::default()
    };
    assert_eq!(c.policy("x").response_action, SecretsAction::Monitor);
    for (g, s, msg) in [
        (vec!["nope"], vec![], "no rule `nope`"),
        (vec!["jwt"], vec!["jwt"], "both"),
    ] {
        let c = SecretsConfig {
            enabled: true,
            generic_rules: g.into_iter().map(String::from).collect(),
            specific_rules: s.into_iter().map(String::from).collect(),
            ..SecretsConfig::default()
        };
        let err = SecretsEngine::build(&c, Path::new("."))
            .unwrap_err()
            .to_string();
        assert!(err.contains(msg), "{err}");
    }
}

#[test]
fn classification_of_the_rulesets() {
    let e = engine(|_| {});
    for (id, want) in [
        ("generic-secret-assignment", Confidence::Generic),
        ("jwt", Confidence::Generic),
        ("twilio-api-key", Confidence::Generic),
        ("aws-access-key-id", Confidence::Specific),
        ("aws-secret-access-key", Confidence::Specific),
        ("private-key", Confidence::Specific),
        ("github-token", Confidence::Specific),
        ("basic-auth-url", Confidence::Specific),
    ] {
        assert_eq!(e.classification(id).unwrap().confidence, want, "{id}");
    }
    let mut generic: Vec<&str> = e
        .scanner()
        .rules()
        .iter()
        .filter(|r| e.classification(&r.id).unwrap().confidence == Confidence::Generic)
        .map(|r| &*r.id)
        .collect();
    generic.sort_unstable();
    assert_eq!(
        generic,
        ["generic-secret-assignment", "jwt", "twilio-api-key"]
    );
    // gitleaks' own file: the same principles, no per-rule list.
    let path = std::env::var_os("MOAT_SHARED_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared"))
        .join("datasets/gitleaks/gitleaks.toml");
    let Ok(set) = RuleSet::from_file(&path) else {
        use std::io::Write as _;
        let _ = writeln!(
            std::io::stderr(),
            "skipped: {} not readable",
            path.display()
        );
        return;
    };
    let class = |id: &str| {
        let r = set.rules.iter().find(|r| &*r.id == id).unwrap();
        classify(r).confidence
    };
    for id in [
        "generic-api-key",
        "jwt",
        "hashicorp-tf-password",
        "kubernetes-secret-yaml",
    ] {
        assert_eq!(class(id), Confidence::Generic, "{id}");
    }
    for id in [
        "aws-access-token",
        "private-key",
        "github-pat",
        "stripe-access-token",
        "slack-bot-token",
        "adafruit-api-key",
        "1password-secret-key",
    ] {
        assert_eq!(class(id), Confidence::Specific, "{id}");
    }
    let generic = set
        .rules
        .iter()
        .filter(|r| classify(r).confidence == Confidence::Generic)
        .count();
    eprintln!(
        "gitleaks.toml: {generic} of {} rules generic",
        set.rules.len()
    );
}

/// A SigV4 presigned URL carries the access key id in `X-Amz-Credential`:
/// public by design (the secret key never travels), in requests and in
/// responses alike, plain or base64-encoded; the same key id elsewhere is a leak.
#[test]
fn presigned_url_credential_is_not_a_finding() {
    let e = engine(|_| {});
    let url = format!(
        "https://bucket.s3.eu-north-1.amazonaws.com/o.bin?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential={AWS}%2F20230703%2Feu-north-1%2Fs3%2Faws4_request&X-Amz-Date=20230703T101016Z&X-Amz-Expires=600&X-Amz-Signature=0f3a"
    );
    let why = "credential scope of a SigV4 signature";
    // a request body holding the URL (an upload form, a beacon)
    let (blocked, events, _) = send(&e, "r", "/v1/hints", "application/x-protobuf", &url);
    assert!(!blocked, "{events:?}");
    all_exempt(&events, why);
    // the URL base64-encoded inside the body (found by the decoding pass)
    let b64 = base64::engine::general_purpose::STANDARD.encode(url.as_bytes());
    let (blocked, events, _) = send(&e, "r", "/v1/hints", "text/plain", &format!("blob={b64}"));
    assert!(!blocked, "{events:?}");
    all_exempt(&events, why);
    // a SigV4 Authorization header value in a body
    let auth = format!("AWS4-HMAC-SHA256 Credential={AWS}/20230703/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=0f3a");
    let (blocked, events, _) = send(&e, "r", "/debug", "text/plain", &auth);
    assert!(!blocked, "{events:?}");
    all_exempt(&events, why);
    // a response returning a download link keeps it intact
    let r = req("/api/files/1", "application/json");
    let mut resp = http::Response::builder()
        .status(200)
        .body(())
        .unwrap()
        .into_parts()
        .0;
    let mut ctx = RequestCtx::for_test("r");
    let doc = format!(r#"{{"download": "{url}"}}"#);
    let mut b = body(&doc);
    e.on_response_body(&mut ctx, &r, &mut resp, &mut b);
    assert_eq!(String::from_utf8_lossy(b.raw()), doc);
    all_exempt(&ctx.events, why);
    // the same key id in another parameter or as text is still blocked
    for leaked in [
        format!("https://example.com/?access={AWS}%2F20230703"),
        format!("note: our key is {AWS}"),
    ] {
        let (blocked, _, _) = send(&e, "r", "/notes", "text/plain", &leaked);
        assert!(blocked, "{leaked}");
    }
}
