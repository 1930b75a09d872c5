//! The records the proxy enqueues: one JSON object each, tagged by `type`.

use moat_core::{EventAction, HandshakeRecord, SecurityEvent};
use serde::Serialize;

/// Current time as unix milliseconds (the records' timestamps).
pub use moat_core::clock::unix_millis as now_ms;

/// One event record. Serialized as a JSON object with `"type":"access"|"security"|"tls"|"tcp"`
/// followed by the fields of the variant.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum Record {
    /// One finished request.
    Access(AccessRecord),
    /// One security event raised by an engine during a request.
    Security(SecurityRecord),
    /// One completed TLS handshake.
    Tls(TlsRecord),
    /// One closed connection of a `protocol: tcp` listener.
    Tcp(TcpRecord),
}

/// An access-log record: one per finished request.
#[derive(Debug, Clone, Default, Serialize)]
pub struct AccessRecord {
    /// Time of the request, unix milliseconds.
    pub ts: u64,
    /// The request id.
    pub request_id: String,
    /// Name of the matched route.
    pub route: String,
    /// HTTP method.
    pub method: String,
    /// Request path (without the query string).
    pub path: String,
    /// Response status sent to the client.
    pub status: u16,
    /// `allow`, `block`, `monitor` or `error`.
    pub decision: String,
    /// Original client IP.
    pub client_ip: String,
    /// Time from request head to response end, microseconds.
    pub duration_us: u64,
    /// Request body bytes received.
    pub bytes_in: u64,
    /// Response body bytes sent.
    pub bytes_out: u64,
    /// Upstream address, when one was called.
    pub upstream: Option<String>,
}

/// A security event with the request it belongs to.
#[derive(Debug, Clone, Serialize)]
pub struct SecurityRecord {
    /// Time of the request, unix milliseconds.
    pub ts: u64,
    /// The request id.
    pub request_id: String,
    /// Name of the matched route.
    pub route: String,
    /// Original client IP.
    pub client_ip: String,
    /// HTTP method.
    pub method: String,
    /// Request path.
    pub path: String,
    /// What the engine found and did.
    pub event: SecurityEvent,
    /// The request target and headers, secrets redacted (absent in records written
    /// before it existed, and from sinks that do not see the request head).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<RequestSummary>,
}

/// Most headers kept in a [`RequestSummary`].
pub const MAX_SUMMARY_HEADERS: usize = 64;
/// Longest header value or request target kept (longer ones are cut, marked `…`).
pub const MAX_SUMMARY_VALUE: usize = 512;

/// The request line and headers of a security record, for triage: values that may be
/// credentials are replaced by `<redacted>`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RequestSummary {
    /// Path and query, sensitive query values redacted.
    pub target: String,
    /// Headers in order, sensitive values redacted.
    pub headers: Vec<(String, String)>,
}

/// Names (of headers and query parameters) whose values are credentials by convention.
const SENSITIVE_NAME_PARTS: &[&str] = &[
    "auth",
    "cookie",
    "token",
    "secret",
    "key",
    "pass",
    "session",
    "csrf",
    "signature",
    "credential",
];

fn sensitive(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    SENSITIVE_NAME_PARTS.iter().any(|p| n.contains(p))
}

fn cut(s: &str) -> String {
    if s.len() <= MAX_SUMMARY_VALUE {
        return s.to_string();
    }
    let mut end = MAX_SUMMARY_VALUE;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

const REDACTED: &str = "<redacted>";

impl RequestSummary {
    /// Summarizes a request head. With `all_values` (an event about a leaked secret,
    /// which may sit in any header or parameter) every header and query value is redacted.
    pub fn redacted<'a>(
        target: &str,
        headers: impl Iterator<Item = (&'a str, &'a [u8])>,
        all_values: bool,
    ) -> RequestSummary {
        let target = match target.split_once('?') {
            None => cut(target),
            Some((path, query)) => {
                let q: Vec<String> = query
                    .split('&')
                    .map(|pair| match pair.split_once('=') {
                        Some((k, _)) if all_values || sensitive(k) => format!("{k}={REDACTED}"),
                        _ => pair.to_string(),
                    })
                    .collect();
                cut(&format!("{path}?{}", q.join("&")))
            }
        };
        let headers = headers
            .take(MAX_SUMMARY_HEADERS)
            .map(|(name, value)| {
                let v = if all_values || sensitive(name) {
                    REDACTED.to_string()
                } else {
                    cut(&String::from_utf8_lossy(value))
                };
                (name.to_string(), v)
            })
            .collect();
        RequestSummary { target, headers }
    }
}

/// A TLS handshake record (crypto-auditing vocabulary).
#[derive(Debug, Clone, Serialize)]
pub struct TlsRecord {
    /// Time the handshake completed, unix milliseconds.
    pub ts: u64,
    /// The negotiated parameters.
    pub handshake: HandshakeRecord,
}

/// A connection of a `protocol: tcp` listener, written when it closes.
#[derive(Debug, Clone, Default, Serialize)]
pub struct TcpRecord {
    /// Time the connection was accepted, unix milliseconds.
    pub ts: u64,
    /// Listener name.
    pub listener: String,
    /// TCP peer address.
    pub client_ip: String,
    /// TCP peer port.
    pub client_port: u16,
    /// Listener port (`destination.port`).
    pub port: u16,
    /// `plain`, `terminate` (TLS ended by moat) or `passthrough` (TLS routed by SNI).
    pub tls: String,
    /// SNI of the ClientHello, if any.
    pub sni: Option<String>,
    /// Verified client certificate principal (`td/ns/N/sa/S`), TLS termination only.
    pub principal: Option<String>,
    /// Cluster the connection was (or would have been) sent to.
    pub cluster: Option<String>,
    /// Upstream endpoint, once connected.
    pub upstream: Option<String>,
    /// `allow`, `block` (access control closed it) or `error`.
    pub decision: String,
    /// Deciding policy (`namespace/name[rule i]`), when one decided.
    pub rule: Option<String>,
    /// Why a connection was refused or how it ended (`closed`, `idle_timeout`,
    /// `max_duration`, `shutdown`, an I/O error).
    pub reason: String,
    /// Time from accept to close, microseconds.
    pub duration_us: u64,
    /// Bytes from the client delivered to the upstream.
    pub bytes_in: u64,
    /// Bytes from the upstream delivered to the client.
    pub bytes_out: u64,
}

impl Record {
    /// Time of the record, unix milliseconds.
    pub fn ts(&self) -> u64 {
        match self {
            Record::Access(r) => r.ts,
            Record::Security(r) => r.ts,
            Record::Tls(r) => r.ts,
            Record::Tcp(r) => r.ts,
        }
    }

    /// `access`, `security`, `tls` or `tcp` (the `type` field).
    pub fn kind(&self) -> &'static str {
        match self {
            Record::Access(_) => "access",
            Record::Security(_) => "security",
            Record::Tls(_) => "tls",
            Record::Tcp(_) => "tcp",
        }
    }

    /// Engine of a security record (`waf`, `authz`, ...), `tls` for TLS records, none for access.
    pub fn engine(&self) -> Option<&str> {
        match self {
            Record::Access(_) | Record::Tcp(_) => None,
            Record::Security(r) => Some(r.event.engine),
            Record::Tls(_) => Some("tls"),
        }
    }

    /// Route of the request, if the record belongs to one; the listener of a tcp record.
    pub fn route(&self) -> Option<&str> {
        match self {
            Record::Access(r) => Some(&r.route),
            Record::Security(r) => Some(&r.route),
            Record::Tcp(r) => Some(&r.listener),
            Record::Tls(_) => None,
        }
    }

    /// The decision (access, tcp) or the action (security): `allow`, `block`, `monitor`,
    /// `error`, `redact`, `bypass`.
    pub fn action(&self) -> Option<&str> {
        match self {
            Record::Access(r) => Some(&r.decision),
            Record::Tcp(r) => Some(&r.decision),
            Record::Security(r) => Some(action_name(r.event.action)),
            Record::Tls(_) => None,
        }
    }

    /// Rule, detector or policy of a security event; the deciding policy of a tcp record.
    pub fn rule(&self) -> Option<&str> {
        match self {
            Record::Security(r) => Some(&r.event.rule),
            Record::Tcp(r) => r.rule.as_deref(),
            Record::Access(_) | Record::Tls(_) => None,
        }
    }

    /// The client IP, if the record has one.
    pub fn client_ip(&self) -> Option<&str> {
        match self {
            Record::Access(r) => Some(&r.client_ip),
            Record::Security(r) => Some(&r.client_ip),
            Record::Tcp(r) => Some(&r.client_ip),
            Record::Tls(_) => None,
        }
    }

    /// The request id, if the record belongs to a request.
    pub fn request_id(&self) -> Option<&str> {
        match self {
            Record::Access(r) => Some(&r.request_id),
            Record::Security(r) => Some(&r.request_id),
            Record::Tls(_) | Record::Tcp(_) => None,
        }
    }

    /// The event id of a security record.
    pub fn event_id(&self) -> Option<&str> {
        match self {
            Record::Security(r) => Some(&r.event.id),
            Record::Access(_) | Record::Tls(_) | Record::Tcp(_) => None,
        }
    }
}

/// Lowercase name of an action, as serialized.
pub fn action_name(a: EventAction) -> &'static str {
    match a {
        EventAction::Block => "block",
        EventAction::Monitor => "monitor",
        EventAction::Redact => "redact",
        EventAction::Bypass => "bypass",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries_redact_credentials_and_stay_bounded() {
        let long = "v".repeat(MAX_SUMMARY_VALUE * 2);
        let many: Vec<(String, Vec<u8>)> = (0..MAX_SUMMARY_HEADERS + 10)
            .map(|i| (format!("x-h{i}"), b"1".to_vec()))
            .collect();
        let mut headers: Vec<(&str, &[u8])> = vec![
            ("authorization", b"Bearer abc"),
            ("cookie", b"sid=1"),
            ("x-api-key", b"k"),
            ("user-agent", long.as_bytes()),
            ("x-bad", b"\xff\xfe"),
        ];
        headers.extend(many.iter().map(|(k, v)| (k.as_str(), v.as_slice())));
        let s = RequestSummary::redacted(
            "/search?q=1%27&api_key=AKIA&token=t",
            headers.into_iter(),
            false,
        );
        assert_eq!(
            s.target,
            "/search?q=1%27&api_key=<redacted>&token=<redacted>"
        );
        assert_eq!(s.headers.len(), MAX_SUMMARY_HEADERS);
        assert_eq!(s.headers[0].1, "<redacted>");
        assert_eq!(s.headers[1].1, "<redacted>");
        assert_eq!(s.headers[2].1, "<redacted>");
        assert!(s.headers[3].1.len() <= MAX_SUMMARY_VALUE + 3);
        assert_eq!(s.headers[4].1, "\u{fffd}\u{fffd}");
        let all = RequestSummary::redacted("/u?q=x", [("x-h", &b"AKIA"[..])].into_iter(), true);
        assert_eq!(all.target, "/u?q=<redacted>");
        assert_eq!(all.headers[0].1, "<redacted>");
    }

    #[test]
    fn serializes_with_type_tag() {
        let r = Record::Security(SecurityRecord {
            ts: 5,
            request_id: "r1".into(),
            route: "api".into(),
            client_ip: "10.0.0.1".into(),
            method: "GET".into(),
            path: "/x".into(),
            event: SecurityEvent::new("waf", "sqli", EventAction::Block, "SQL injection")
                .at("query:id"),
            request: None,
        });
        let v: serde_json::Value = serde_json::to_value(&r).unwrap();
        assert_eq!(v["type"], "security");
        assert_eq!(v["event"]["engine"], "waf");
        assert_eq!(v["event"]["action"], "block");
        assert_eq!(v["event"]["location"], "query:id");
        assert_eq!(r.action(), Some("block"));
        assert_eq!(r.engine(), Some("waf"));

        let a = Record::Access(AccessRecord {
            ts: 1,
            decision: "allow".into(),
            status: 200,
            ..AccessRecord::default()
        });
        let v = serde_json::to_value(&a).unwrap();
        assert_eq!(v["type"], "access");
        assert_eq!(v["status"], 200);
        assert!(v["upstream"].is_null());

        let t = Record::Tls(TlsRecord {
            ts: 2,
            handshake: HandshakeRecord {
                role: "client",
                protocol_version: 0x0304,
                ..HandshakeRecord::default()
            },
        });
        let v = serde_json::to_value(&t).unwrap();
        assert_eq!(v["type"], "tls");
        assert_eq!(v["handshake"]["protocol_version"], 0x0304);
        assert_eq!(t.engine(), Some("tls"));

        let c = Record::Tcp(TcpRecord {
            ts: 3,
            listener: "pg".into(),
            decision: "block".into(),
            bytes_in: 7,
            ..TcpRecord::default()
        });
        let v = serde_json::to_value(&c).unwrap();
        assert_eq!(v["type"], "tcp");
        assert_eq!(v["bytes_in"], 7);
        assert_eq!(
            (c.kind(), c.route(), c.action()),
            ("tcp", Some("pg"), Some("block"))
        );
    }
}
