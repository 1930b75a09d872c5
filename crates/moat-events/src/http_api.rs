//! The admin endpoint `GET /v1/events?since=1h&type=waf&route=api&limit=100`,
//! as a pure function the proxy's admin router calls.

use crate::record::now_ms;
use crate::store::{EventQuery, EventStore};

/// Answers `GET /v1/events` with `query_string` (the part after `?`, possibly empty).
///
/// Returns `(200, {"count":N,"events":[...]})` with events newest first,
/// `(400, {"error":"..."})` for a bad parameter, `(500, {"error":"..."})` when the store fails.
pub fn events_endpoint(store: &EventStore, query_string: &str) -> (u16, String) {
    let q = match EventQuery::from_query_string(query_string, now_ms()) {
        Ok(q) => q,
        Err(e) => return (400, error_json(&e.to_string())),
    };
    match store.query(&q) {
        Ok(events) => (
            200,
            serde_json::json!({ "count": events.len(), "events": events }).to_string(),
        ),
        Err(e) => (500, error_json(&e.to_string())),
    }
}

fn error_json(msg: &str) -> String {
    serde_json::json!({ "error": msg }).to_string()
}
