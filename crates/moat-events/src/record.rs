//! The records the proxy enqueues: one JSON object each, tagged by `type`.

use moat_core::{EventAction, HandshakeRecord, SecurityEvent};
use serde::Serialize;

/// Current time as unix milliseconds.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

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

    /// The request id, if the record belongs to a request.
    pub fn request_id(&self) -> Option<&str> {
        match self {
            Record::Access(r) => Some(&r.request_id),
            Record::Security(r) => Some(&r.request_id),
            Record::Tls(_) | Record::Tcp(_) => None,
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
