//! Events: a filtered, paginated timeline of the event store, and one event's detail.

use http::StatusCode;
use maud::{html, Markup};
use moat_events::EventQuery;
use moat_proxy::AdminResponse;
use serde_json::Value;

use crate::chart;
use crate::ctx::{Console, Req};
use crate::layout;
use crate::web;

/// Events per page.
pub const PAGE_SIZE: usize = 50;
/// Slices of the timeline chart (one more when the range is not aligned on them).
const TIMELINE_SLICES: usize = 60;

/// The filters of the listing: query parameter, label.
const FILTERS: [(&str, &str); 8] = [
    ("since", "since"),
    ("until", "until"),
    ("rule", "rule"),
    ("action", "action"),
    ("route", "route"),
    ("client_ip", "client IP"),
    ("request_id", "request id"),
    ("event_id", "event id"),
];

/// Choices of the type/engine filter (`any`: every record type).
const TYPES: [&str; 9] = [
    "security", "waf", "authz", "authn", "secrets", "limits", "access", "tls", "any",
];

fn s<'a>(v: &'a Value, path: &[&str]) -> &'a str {
    let mut cur = v;
    for p in path {
        cur = &cur[*p];
    }
    cur.as_str().unwrap_or("")
}

/// The link to the listing filtered on one field.
fn filter_link(key: &str, value: &str) -> String {
    format!(
        "/console/events?type=any&since=7d&{key}={}",
        web::encode(value)
    )
}

/// `GET /console/events`.
pub fn list(c: &Console, req: &Req) -> AdminResponse {
    let now = moat_events::now_ms();
    let mut q = EventQuery {
        limit: PAGE_SIZE,
        ..EventQuery::default()
    };
    let mut errors = Vec::new();
    let ty = req.q("type").unwrap_or("security");
    if ty != "any" {
        if let Err(e) = q.set("type", ty, now) {
            errors.push(e.to_string());
        }
    }
    let since = req.q("since").unwrap_or("1h");
    for (key, value) in std::iter::once(("since", Some(since)))
        .chain(FILTERS[1..].iter().map(|(k, _)| (*k, req.q(k))))
        .chain(std::iter::once(("before", req.q("before"))))
    {
        if let Some(v) = value {
            if let Err(e) = q.set(key, v, now) {
                errors.push(e.to_string());
            }
        }
    }
    let result = if errors.is_empty() {
        let from = q.since.unwrap_or(0);
        let to = q.until.unwrap_or(now).max(from + 1);
        c.with_events(|s| Ok((s.query(&q)?, s.timeline(&q, from, to, TIMELINE_SLICES)?)))
    } else {
        Err(errors.join("; "))
    };
    let next = |last: i64| {
        let mut link = String::from("/console/events?");
        for (k, v) in &req.query {
            if k != "before" && !v.is_empty() {
                link.push_str(&format!("{}={}&", web::encode(k), web::encode(v)));
            }
        }
        link.push_str(&format!("before={last}"));
        link
    };
    let body = html! {
        form.filters method="get" action="/console/events" {
            label { "type / engine"
                select name="type" {
                    @for t in TYPES { option value=(t) selected[t == ty] { (t) } }
                }
            }
            @for (key, label) in FILTERS {
                label { (label)
                    input type="text" name=(key) id={"f-" (key)}
                        value=(if key == "since" { since } else { req.q(key).unwrap_or("") });
                }
            }
            button type="submit" id="filter" { "Filter" }
        }
        @match &result {
            Err(e) => (layout::notice("error", e)),
            Ok((rows, timeline)) => {
                (chart::columns("timeline", &timeline.counts, &layout::time(timeline.start), &layout::time(timeline.end())))
                table #events {
                    thead { tr { th { "time (UTC)" } th { "type" } th { "engine" } th { "rule" } th { "action" } th { "route" } th { "client" } th { "request" } } }
                    tbody {
                        @for r in rows { (row(r)) }
                    }
                }
                @if rows.is_empty() { p.muted { "No events match." } }
                @if rows.len() == PAGE_SIZE {
                    @if let Some(last) = rows.last().and_then(|r| r["id"].as_i64()) {
                        p { a #older href=(next(last)) { "Older events →" } }
                    }
                }
            }
        }
    };
    web::html(
        StatusCode::OK,
        layout::page("Events", "/console/events", &req.csrf, body),
    )
}

fn row(r: &Value) -> Markup {
    let id = r["id"].as_i64().unwrap_or(0);
    let kind = s(r, &["type"]);
    let (engine, rule, action) = match kind {
        "security" => (
            s(r, &["event", "engine"]),
            s(r, &["event", "rule"]),
            s(r, &["event", "action"]),
        ),
        "access" | "tcp" => ("", s(r, &["rule"]), s(r, &["decision"])),
        _ => ("", "", ""),
    };
    let line = match kind {
        "access" | "security" => format!("{} {}", s(r, &["method"]), s(r, &["path"])),
        "tls" => s(r, &["handshake", "ciphersuite_name"]).to_string(),
        _ => String::new(),
    };
    html! {
        tr {
            td { a.event href={"/console/event?id=" (id)} { (layout::time(r["ts"].as_u64().unwrap_or(0))) } }
            td { (kind) } td { (engine) } td { (rule) }
            td class=(action) { (action) }
            td { (s(r, &["route"])) } td { (s(r, &["client_ip"])) }
            td.mono { (line) }
        }
    }
}

/// `GET /console/event?id=N`.
pub fn detail(c: &Console, req: &Req) -> AdminResponse {
    let Some(id) = req.q("id").and_then(|v| v.parse::<i64>().ok()) else {
        return web::plain(StatusCode::BAD_REQUEST, "id: expected an event id\n");
    };
    let rec = match c.with_events(|s| s.get(id)) {
        Ok(Some(r)) => r,
        Ok(None) => {
            let body = layout::notice(
                "error",
                "No such event (it may have been deleted by retention).",
            );
            return web::html(
                StatusCode::NOT_FOUND,
                layout::page("Event", "/console/events", &req.csrf, body),
            );
        }
        Err(e) => {
            let body = layout::notice("error", &e);
            return web::html(
                StatusCode::SERVICE_UNAVAILABLE,
                layout::page("Event", "/console/events", &req.csrf, body),
            );
        }
    };
    let ev = &rec["event"];
    let security = s(&rec, &["type"]) == "security";
    let waf_finding = security
        && s(ev, &["engine"]) == "waf"
        && moat_waf::triage::request_from_record(&rec).is_some();
    let fields: Vec<(&str, String)> = [
        ("time (UTC)", layout::time(rec["ts"].as_u64().unwrap_or(0))),
        ("type", s(&rec, &["type"]).into()),
        ("engine", s(ev, &["engine"]).into()),
        ("rule", s(ev, &["rule"]).into()),
        (
            "decision",
            {
                let a = s(ev, &["action"]);
                if a.is_empty() {
                    s(&rec, &["decision"])
                } else {
                    a
                }
            }
            .into(),
        ),
        ("location", s(ev, &["location"]).into()),
        ("matched fragment", s(ev, &["details", "fragment"]).into()),
        ("message", s(ev, &["message"]).into()),
        ("event id", s(ev, &["id"]).into()),
        ("route", s(&rec, &["route"]).into()),
        ("client IP", s(&rec, &["client_ip"]).into()),
        ("request id", s(&rec, &["request_id"]).into()),
    ]
    .into_iter()
    .filter(|(_, v)| !v.is_empty())
    .collect();
    // The redacted target when the record has it (the query too), else the path.
    let target = match s(&rec, &["request", "target"]) {
        "" => s(&rec, &["path"]),
        t => t,
    };
    let request_line = format!("{} {}", s(&rec, &["method"]), target);
    let headers: Vec<(&str, &str)> = rec["request"]["headers"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|h| (h[0].as_str().unwrap_or(""), h[1].as_str().unwrap_or("")))
                .collect()
        })
        .unwrap_or_default();
    let mut raw = rec.clone();
    moat_proxy::admin::redact(&mut raw);
    let raw = serde_json::to_string_pretty(&raw).unwrap_or_default();
    let body = html! {
        table #detail { tbody {
            @for (k, v) in &fields { tr { th { (k) } td.mono { (v) } } }
            @if !request_line.trim().is_empty() {
                tr { th { "request line" } td.mono #request-line { (request_line) } }
            }
        } }
        @if !headers.is_empty() {
            h2 { "Request headers" }
            table #headers { tbody {
                @for (k, v) in &headers { tr { th.mono { (k) } td.mono { (v) } } }
            } }
        }
        p.note { "Values that may be credentials (by header or parameter name, and every value of a leaked-secret event) were replaced by <redacted> before the event was stored." }
        p.links {
            @if !s(&rec, &["client_ip"]).is_empty() { a href=(filter_link("client_ip", s(&rec, &["client_ip"]))) { "Same client IP" } " · " }
            @if !s(ev, &["rule"]).is_empty() { a href=(filter_link("rule", s(ev, &["rule"]))) { "Same rule" } " · " }
            @if !s(&rec, &["route"]).is_empty() { a href=(filter_link("route", s(&rec, &["route"]))) { "Same route" } " · " }
            @if !s(&rec, &["request_id"]).is_empty() { a href=(filter_link("request_id", s(&rec, &["request_id"]))) { "Same request" } }
        }
        @if waf_finding {
            p { a.button #exclude href={"/console/exclude?id=" (rec["id"].as_i64().unwrap_or(0))} { "False positive? Exclude…" } }
        }
        details { summary { "Stored record" } pre { (raw) } }
    };
    web::html(
        StatusCode::OK,
        layout::page("Event", "/console/events", &req.csrf, body),
    )
}
