//! The web console's parsing of request input, on arbitrary bytes: form and query
//! decoding (bounded field count), the event filters of the console and of
//! `GET /v1/events` (bounded limit and values), the session cookie, Host and Origin
//! checks, the redacted request summary of security events. No panic; bounds hold.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let s = String::from_utf8_lossy(data);
    if let Some(pairs) = moat_console::web::decode_pairs(&s) {
        assert!(pairs.len() <= moat_console::web::MAX_FIELDS);
    }
    if let Ok(q) = moat_events::EventQuery::from_query_string(&s, 1_800_000_000_000) {
        assert!((1..=moat_events::store::MAX_QUERY_LIMIT).contains(&q.limit));
        for v in [&q.rule, &q.client_ip, &q.request_id, &q.event_id].into_iter().flatten() {
            assert!(!v.is_empty() && v.len() <= 256);
        }
    }
    let mut headers = http::HeaderMap::new();
    if let Ok(v) = http::HeaderValue::from_bytes(data) {
        headers.insert(http::header::COOKIE, v.clone());
        headers.insert(http::header::HOST, v.clone());
        headers.insert(http::header::ORIGIN, v);
    }
    let _ = moat_console::session::session_cookie(&headers);
    let _ = moat_console::web::host_is_local_name(&headers);
    let _ = moat_console::web::same_origin(&headers);
    let (name, value) = data.split_at(data.len() / 2);
    let name = String::from_utf8_lossy(name);
    let summary = moat_events::RequestSummary::redacted(
        &s,
        std::iter::repeat_n((name.as_ref(), value), 100),
        data.first().is_some_and(|b| b & 1 == 1),
    );
    assert!(summary.headers.len() <= moat_events::record::MAX_SUMMARY_HEADERS);
    for (_, v) in &summary.headers {
        assert!(v.len() <= moat_events::record::MAX_SUMMARY_VALUE + '…'.len_utf8());
    }
});
