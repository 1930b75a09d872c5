//! Field mappings: moat's own records, Elastic Common Schema and OCSF.
//!
//! docs/sinks.md lists every field of each mapping. The mappings are built as
//! `serde_json` values on the event writer's thread (never on the request path),
//! then serialized once into the message body.

use moat_events::{AccessRecord, Counted, Record, SecurityRecord, TcpRecord, TlsRecord};
use serde_json::{json, Value};

use crate::config::Format;

/// The ECS version the mapping follows.
pub const ECS_VERSION: &str = "8.11.0";
/// The OCSF schema version the mapping follows.
pub const OCSF_VERSION: &str = "1.3.0";

/// What the event writer offers a sink: a record, or a record that stands for
/// the repeats of one flood-control window ([`moat_events::aggregate`]).
#[derive(Debug, Clone, Copy)]
pub enum Entry<'a> {
    /// One occurrence.
    One(&'a Record),
    /// `count` occurrences from the record's `ts` to `last_ts`.
    Counted(&'a Counted),
}

impl<'a> Entry<'a> {
    /// The record (of the first occurrence, for a counted one).
    pub fn record(self) -> &'a Record {
        match self {
            Entry::One(r) => r,
            Entry::Counted(c) => &c.record,
        }
    }
}

/// Serializes `entry` in `format` into `out` (appended; one JSON object, no newline).
///
/// A counted entry carries its count and its first and last times in every format:
/// `count` and `last_ts` beside the record's fields in moat's own (as the JSON-lines
/// sink and the store write it), `event.start`, `event.end` and `moat.count` in ECS
/// (which has no count field), `count`, `start_time` and `end_time` in OCSF (its base
/// event's attributes for an aggregate).
pub fn encode(
    format: Format,
    entry: Entry<'_>,
    out: &mut Vec<u8>,
) -> Result<(), serde_json::Error> {
    let rec = entry.record();
    let counted = match entry {
        Entry::One(_) => None,
        Entry::Counted(c) => Some(c),
    };
    match format {
        Format::Moat => match counted {
            None => serde_json::to_writer(out, rec),
            Some(c) => serde_json::to_writer(out, c),
        },
        Format::Ecs => {
            let mut v = ecs(rec);
            if let (Some(c), Some(m)) = (counted, v.as_object_mut()) {
                let event = m.entry("event").or_insert_with(|| json!({}));
                if let Some(e) = event.as_object_mut() {
                    e.insert("start".into(), rfc3339(rec.ts()).into());
                    e.insert("end".into(), rfc3339(c.last_ts).into());
                }
                let moat = m.entry("moat").or_insert_with(|| json!({}));
                if let Some(o) = moat.as_object_mut() {
                    o.insert("count".into(), c.count.into());
                }
            }
            serde_json::to_writer(out, &v)
        }
        Format::Ocsf => {
            let mut v = ocsf(rec);
            if let (Some(c), Some(m)) = (counted, v.as_object_mut()) {
                m.insert("count".into(), c.count.into());
                m.insert("start_time".into(), rec.ts().into());
                m.insert("end_time".into(), c.last_ts.into());
            }
            serde_json::to_writer(out, &v)
        }
    }
}

fn rfc3339(ms: u64) -> String {
    moat_events::text::format_ts(ms)
}

/// ECS/OCSF `tls.version` of a protocol version code point (`1.3`).
fn tls_version_name(v: u16) -> &'static str {
    match v {
        0x0304 => "1.3",
        0x0303 => "1.2",
        0x0302 => "1.1",
        0x0301 => "1.0",
        _ => "unknown",
    }
}

/// The ECS `event.outcome` and `event.type` of a decision or action.
fn ecs_outcome(action: &str) -> (&'static str, &'static str) {
    match action {
        "block" => ("failure", "denied"),
        "error" => ("failure", "error"),
        "allow" => ("success", "allowed"),
        _ => ("success", "info"),
    }
}

/// The record in Elastic Common Schema.
pub fn ecs(rec: &Record) -> Value {
    let mut v = match rec {
        Record::Access(a) => ecs_access(a),
        Record::Security(s) => ecs_security(s),
        Record::Tls(t) => ecs_tls(t),
        Record::Tcp(c) => ecs_tcp(c),
    };
    if let Some(m) = v.as_object_mut() {
        m.insert("@timestamp".into(), rfc3339(rec.ts()).into());
        m.insert("ecs".into(), json!({ "version": ECS_VERSION }));
        m.insert(
            "observer".into(),
            json!({ "vendor": "moat", "product": "moat", "type": "proxy" }),
        );
        m.insert("labels".into(), json!({ "moat_type": rec.kind() }));
    }
    prune_nulls(&mut v);
    v
}

fn ecs_access(a: &AccessRecord) -> Value {
    let (outcome, typ) = ecs_outcome(&a.decision);
    json!({
        "event": {
            "kind": "event",
            "category": ["web", "network"],
            "type": ["access", typ],
            "action": a.decision,
            "outcome": outcome,
            "duration": a.duration_us.saturating_mul(1000),
        },
        "http": {
            "request": { "id": a.request_id, "method": a.method, "bytes": a.bytes_in },
            "response": { "status_code": a.status, "bytes": a.bytes_out },
        },
        "url": { "path": a.path },
        "source": { "ip": a.client_ip },
        "destination": { "address": a.upstream },
        "rule": { "ruleset": a.route },
    })
}

fn ecs_security(s: &SecurityRecord) -> Value {
    let e = &s.event;
    let action = moat_events::record::action_name(e.action);
    let (outcome, typ) = ecs_outcome(action);
    json!({
        "event": {
            "kind": "alert",
            "category": ["intrusion_detection", "web"],
            "type": [typ],
            "action": action,
            "outcome": outcome,
            "id": e.id,
            "module": e.engine,
            "reason": e.message,
        },
        "rule": { "id": e.rule, "name": e.rule, "ruleset": e.engine },
        "message": e.message,
        "http": { "request": { "id": s.request_id, "method": s.method } },
        "url": { "path": s.path },
        "source": { "ip": s.client_ip },
        "moat": { "route": s.route, "location": e.location, "details": e.details },
    })
}

fn ecs_tls(t: &TlsRecord) -> Value {
    let h = &t.handshake;
    let (ip, port) = h
        .peer_addr
        .map_or((None, None), |a| (Some(a.ip().to_string()), Some(a.port())));
    json!({
        "event": { "kind": "event", "category": ["network"], "type": ["connection", "protocol"], "action": "tls_handshake", "duration": h.handshake_us.saturating_mul(1000) },
        "tls": {
            "version_protocol": "tls",
            "version": tls_version_name(h.protocol_version),
            "cipher": h.ciphersuite_name,
            "curve": h.key_exchange_group,
            "resumed": h.resumed,
            "next_protocol": h.alpn,
            "client": {
                "server_name": h.sni,
                "x509": h.peer.as_ref().map(|p| json!({ "subject": { "distinguished_name": p.subject }, "alternative_names": p.sans })),
                "hash": h.peer.as_ref().map(|p| json!({ "sha256": p.fingerprint_sha256 })),
            },
        },
        "source": { "ip": ip, "port": port },
        // The crypto-auditing vocabulary of docs/tls.md, unchanged.
        "moat": { "tls": h },
    })
}

fn ecs_tcp(c: &TcpRecord) -> Value {
    let (outcome, typ) = ecs_outcome(&c.decision);
    json!({
        "event": {
            "kind": "event",
            "category": ["network"],
            "type": ["connection", typ],
            "action": c.decision,
            "outcome": outcome,
            "reason": c.reason,
            "duration": c.duration_us.saturating_mul(1000),
        },
        "source": { "ip": c.client_ip, "port": c.client_port, "bytes": c.bytes_in },
        "destination": { "port": c.port, "address": c.upstream, "bytes": c.bytes_out },
        "network": { "transport": "tcp" },
        "tls": { "client": { "server_name": c.sni } },
        "rule": { "name": c.rule, "ruleset": c.listener },
        "moat": { "listener": c.listener, "tls_mode": c.tls, "principal": c.principal, "cluster": c.cluster },
    })
}

/// OCSF `status_id`, `status` and `action_id` of a decision: 1 allowed, 2 denied.
fn ocsf_disposition(action: &str) -> (u8, &'static str, u8, &'static str) {
    match action {
        "block" => (2, "Failure", 2, "Denied"),
        "error" => (2, "Failure", 99, "Other"),
        "allow" => (1, "Success", 1, "Allowed"),
        _ => (1, "Success", 3, "Observed"),
    }
}

/// The record in OCSF: access as HTTP Activity (4002), security as Detection
/// Finding (2004), TLS and tcp as Network Activity (4001).
pub fn ocsf(rec: &Record) -> Value {
    let mut v = match rec {
        Record::Access(a) => ocsf_access(a),
        Record::Security(s) => ocsf_security(s),
        Record::Tls(t) => ocsf_tls(t),
        Record::Tcp(c) => ocsf_tcp(c),
    };
    if let Some(m) = v.as_object_mut() {
        let class_uid = m.get("class_uid").and_then(Value::as_u64).unwrap_or(0);
        let activity_id = m.get("activity_id").and_then(Value::as_u64).unwrap_or(0);
        m.insert("time".into(), rec.ts().into());
        m.insert("type_uid".into(), (class_uid * 100 + activity_id).into());
        m.insert(
            "metadata".into(),
            json!({ "version": OCSF_VERSION, "product": { "name": "moat", "vendor_name": "moat" }, "log_name": rec.kind() }),
        );
        m.insert("severity_id".into(), ocsf_severity(rec).into());
    }
    prune_nulls(&mut v);
    v
}

/// OCSF severity: blocks are Medium (3), other findings Low (2), activity Informational (1).
fn ocsf_severity(rec: &Record) -> u8 {
    match rec {
        Record::Security(s) => match s.event.action {
            moat_core::EventAction::Block => 3,
            _ => 2,
        },
        _ => 1,
    }
}

fn ocsf_access(a: &AccessRecord) -> Value {
    let (status_id, status, action_id, action) = ocsf_disposition(&a.decision);
    json!({
        "category_uid": 4, "category_name": "Network Activity",
        "class_uid": 4002, "class_name": "HTTP Activity",
        "activity_id": ocsf_http_activity(&a.method), "activity_name": a.method,
        "status_id": status_id, "status": status,
        "action_id": action_id, "action": action,
        "duration": a.duration_us / 1000,
        "http_request": { "uid": a.request_id, "http_method": a.method, "url": { "path": a.path }, "length": a.bytes_in },
        "http_response": { "code": a.status, "length": a.bytes_out },
        "src_endpoint": { "ip": a.client_ip },
        "dst_endpoint": { "name": a.upstream },
        "unmapped": { "route": a.route, "decision": a.decision },
    })
}

/// OCSF HTTP Activity `activity_id` of a method.
fn ocsf_http_activity(method: &str) -> u8 {
    match method {
        "CONNECT" => 1,
        "DELETE" => 2,
        "GET" => 3,
        "HEAD" => 4,
        "OPTIONS" => 5,
        "POST" => 6,
        "PUT" => 7,
        "TRACE" => 8,
        "PATCH" => 9,
        _ => 99,
    }
}

fn ocsf_security(s: &SecurityRecord) -> Value {
    let e = &s.event;
    let name = moat_events::record::action_name(e.action);
    let (_, _, action_id, action) = ocsf_disposition(name);
    let confidence = e.details.get("confidence").cloned().unwrap_or(Value::Null);
    json!({
        "category_uid": 2, "category_name": "Findings",
        "class_uid": 2004, "class_name": "Detection Finding",
        "activity_id": 1, "activity_name": "Create",
        "status_id": 1, "status": "New",
        "action_id": action_id, "action": action,
        "disposition": name,
        "message": e.message,
        "confidence": confidence,
        "finding_info": {
            "uid": e.id,
            "title": e.message,
            "analytic": { "uid": e.rule, "name": e.rule, "type_id": 1, "type": "Rule", "category": e.engine },
            "src_url": null,
        },
        "evidences": [{
            "http_request": { "uid": s.request_id, "http_method": s.method, "url": { "path": s.path } },
            "src_endpoint": { "ip": s.client_ip },
            "data": { "location": e.location, "details": e.details },
        }],
        "unmapped": { "route": s.route, "engine": e.engine },
    })
}

fn ocsf_tls(t: &TlsRecord) -> Value {
    let h = &t.handshake;
    let (ip, port) = h
        .peer_addr
        .map_or((None, None), |a| (Some(a.ip().to_string()), Some(a.port())));
    json!({
        "category_uid": 4, "category_name": "Network Activity",
        "class_uid": 4001, "class_name": "Network Activity",
        "activity_id": 6, "activity_name": "Traffic",
        "src_endpoint": { "ip": ip, "port": port },
        "tls": {
            "version": tls_version_name(h.protocol_version),
            "cipher": h.ciphersuite_name,
            "sni": h.sni,
            "alpn_list": h.alpn.as_ref().map(|a| vec![a]),
            "certificate": h.peer.as_ref().map(|p| json!({ "subject": p.subject, "fingerprints": [{ "algorithm_id": 3, "algorithm": "SHA-256", "value": p.fingerprint_sha256 }] })),
        },
        // The crypto-auditing vocabulary of docs/tls.md, unchanged.
        "unmapped": { "tls": h },
    })
}

fn ocsf_tcp(c: &TcpRecord) -> Value {
    let (status_id, status, action_id, action) = ocsf_disposition(&c.decision);
    json!({
        "category_uid": 4, "category_name": "Network Activity",
        "class_uid": 4001, "class_name": "Network Activity",
        "activity_id": 2, "activity_name": "Close",
        "status_id": status_id, "status": status, "status_detail": c.reason,
        "action_id": action_id, "action": action,
        "duration": c.duration_us / 1000,
        "src_endpoint": { "ip": c.client_ip, "port": c.client_port },
        "dst_endpoint": { "port": c.port, "name": c.upstream },
        "traffic": { "bytes_out": c.bytes_in, "bytes_in": c.bytes_out },
        "tls": c.sni.as_ref().map(|s| json!({ "sni": s })),
        "unmapped": { "listener": c.listener, "tls_mode": c.tls, "principal": c.principal, "cluster": c.cluster, "rule": c.rule },
    })
}

/// Drops `null` members of `v`'s objects, recursively (a mapping leaves out what a record lacks).
pub fn prune_nulls(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.retain(|_, x| !x.is_null());
            for x in m.values_mut() {
                prune_nulls(x);
            }
            m.retain(|_, x| !matches!(x, Value::Object(o) if o.is_empty()));
        }
        Value::Array(a) => a.iter_mut().for_each(prune_nulls),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use moat_core::{EventAction, SecurityEvent};

    fn encoded(format: Format, entry: Entry<'_>) -> Value {
        let mut out = Vec::new();
        encode(format, entry, &mut out).unwrap();
        serde_json::from_slice(&out).unwrap()
    }

    #[test]
    fn a_counted_record_carries_its_count_and_times_in_every_format() {
        let record = Record::Security(SecurityRecord {
            ts: 1_700_000_000_000,
            request_id: "r1".into(),
            route: "api".into(),
            client_ip: "10.0.0.1".into(),
            method: "GET".into(),
            path: "/search".into(),
            event: SecurityEvent::new("waf", "sqli", EventAction::Block, "SQL injection"),
            request: None,
        });
        let c = Counted {
            record: record.clone(),
            count: 41,
            last_ts: 1_700_000_009_500,
        };
        let moat = encoded(Format::Moat, Entry::Counted(&c));
        assert_eq!(
            (moat["count"].as_u64(), moat["last_ts"].as_u64()),
            (Some(41), Some(1_700_000_009_500))
        );
        assert_eq!(moat["ts"], 1_700_000_000_000u64);
        let ecs = encoded(Format::Ecs, Entry::Counted(&c));
        assert_eq!(ecs["moat"]["count"], 41);
        assert_eq!(ecs["event"]["start"], "2023-11-14T22:13:20.000Z");
        assert_eq!(ecs["event"]["end"], "2023-11-14T22:13:29.500Z");
        assert_eq!(ecs["event"]["kind"], "alert", "the mapping is kept");
        let ocsf = encoded(Format::Ocsf, Entry::Counted(&c));
        assert_eq!(ocsf["count"], 41);
        assert_eq!(ocsf["start_time"], 1_700_000_000_000u64);
        assert_eq!(ocsf["end_time"], 1_700_000_009_500u64);
        assert_eq!(ocsf["class_uid"], 2004);
        // A single record has none of these.
        for f in [Format::Moat, Format::Ecs, Format::Ocsf] {
            let v = encoded(f, Entry::One(&record));
            assert!(
                v.get("count").is_none() && v.get("start_time").is_none(),
                "{v}"
            );
            assert!(
                v["moat"].get("count").is_none() && v["event"].get("start").is_none(),
                "{v}"
            );
        }
    }
}
