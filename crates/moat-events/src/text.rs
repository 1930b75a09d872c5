//! Human-readable rendering of stored events (`moat events` without `--json`).

use serde_json::Value;

/// Formats unix milliseconds as an RFC 3339 UTC time with milliseconds.
pub fn format_ts(ms: u64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
    humantime::format_rfc3339_millis(t).to_string()
}

/// One row per event: time, type, engine/rule, action, route, client, request id,
/// count (how many occurrences an aggregated record stands for), detail.
pub fn render_table(events: &[Value]) -> String {
    let header = [
        "TIME",
        "TYPE",
        "ENGINE/RULE",
        "ACTION",
        "ROUTE",
        "CLIENT",
        "REQUEST",
        "COUNT",
        "DETAIL",
    ];
    let rows: Vec<[String; 9]> = events.iter().map(row).collect();
    let mut widths = header.map(str::len);
    for r in &rows {
        for (w, cell) in widths.iter_mut().zip(r.iter()) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &[&str]| {
        let n = cells.len();
        for (i, (cell, w)) in cells.iter().zip(widths.iter()).enumerate() {
            out.push_str(cell);
            if i + 1 < n {
                let pad = w.saturating_sub(cell.chars().count()) + 2;
                out.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push('\n');
    };
    line(&header);
    for r in &rows {
        let cells: Vec<&str> = r.iter().map(String::as_str).collect();
        line(&cells);
    }
    out
}

fn s(v: &Value) -> String {
    match v {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn row(e: &Value) -> [String; 9] {
    let [ts, kind, rule, action, route, client, request, mut detail] = fields(e);
    // An aggregated record: `count` occurrences from `ts` to `last_ts`.
    let count = e["count"].as_u64().unwrap_or(1);
    if let Some(last) = e["last_ts"].as_u64().filter(|_| count > 1) {
        detail = format!("{detail} (last {})", format_ts(last));
    }
    let count = count.to_string();
    [
        ts, kind, rule, action, route, client, request, count, detail,
    ]
}

fn fields(e: &Value) -> [String; 8] {
    let ts = e["ts"].as_u64().map(format_ts).unwrap_or_default();
    let kind = s(&e["type"]);
    match kind.as_str() {
        "security" => {
            let ev = &e["event"];
            let mut detail = s(&ev["message"]);
            if let Some(loc) = ev["location"].as_str() {
                detail = format!("{detail} at {loc}");
            }
            [
                ts,
                kind,
                format!("{}/{}", s(&ev["engine"]), s(&ev["rule"])),
                s(&ev["action"]),
                s(&e["route"]),
                s(&e["client_ip"]),
                s(&e["request_id"]),
                format!("{} {}: {detail}", s(&e["method"]), s(&e["path"])),
            ]
        }
        "tls" => {
            let h = &e["handshake"];
            [
                ts,
                kind,
                "tls".into(),
                String::new(),
                s(&h["sni"]),
                s(&h["peer_addr"]),
                String::new(),
                format!(
                    "{} {} {}",
                    s(&h["role"]),
                    s(&h["ciphersuite_name"]),
                    s(&h["key_exchange_group"])
                ),
            ]
        }
        _ => [
            ts,
            kind,
            String::new(),
            s(&e["decision"]),
            s(&e["route"]),
            s(&e["client_ip"]),
            s(&e["request_id"]),
            format!(
                "{} {} -> {} ({} us)",
                s(&e["method"]),
                s(&e["path"]),
                s(&e["status"]),
                s(&e["duration_us"])
            ),
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_has_header_and_rows() {
        let ev = serde_json::json!([
            {"type":"security","ts":0,"route":"api","client_ip":"1.2.3.4","request_id":"r",
             "method":"GET","path":"/x","event":{"engine":"waf","rule":"sqli","action":"block",
             "message":"SQL injection","location":"query:id"}},
            {"type":"access","ts":1000,"route":"api","decision":"allow","method":"GET","path":"/",
             "status":200,"duration_us":5},
            {"type":"security","ts":0,"count":40,"last_ts":2000,"event":{"engine":"waf","rule":"xss"}}
        ]);
        let t = render_table(ev.as_array().unwrap());
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 4);
        assert!(lines[0].contains("COUNT"));
        assert!(
            lines[3].contains(" 40 ") && lines[3].ends_with("(last 1970-01-01T00:00:02.000Z)"),
            "{}",
            lines[3]
        );
        assert!(lines[0].starts_with("TIME"));
        assert!(lines[1].starts_with("1970-01-01T00:00:00.000Z  security  waf/sqli"));
        assert!(lines[1].ends_with("GET /x: SQL injection at query:id"));
        assert!(lines[2].contains("GET / -> 200 (5 us)"));
    }
}
