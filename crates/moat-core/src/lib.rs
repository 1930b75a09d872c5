//! The request model and phase traits shared by moat's engines and its proxy.
//!
//! moat handles a request as a sequence of named phases (pingora style):
//!
//! | phase | trait | typical engine |
//! |---|---|---|
//! | connection (TLS handshake done) | [`ConnectionPhase`] | TLS audit (in the proxy) |
//! | request headers | [`RequestHeadersPhase`] | access control, WAF on URL/headers |
//! | request body | [`RequestBodyPhase`] | WAF on body, secret detection |
//! | upstream | (proxy) | |
//! | response (head and buffered body) | [`ResponseBodyPhase`] | secret detection on responses |
//! | after response | [`AfterResponsePhase`] | API discovery |
//!
//! Engines know nothing of sockets: they see borrowed request data
//! ([`http::request::Parts`], a [`Body`]) and a [`RequestCtx`], and return a
//! [`Verdict`]. The proxy crate owns the I/O and calls them in order. An engine that
//! runs in several phases keeps what it computed about the request in its typed slot,
//! [`RequestCtx::slots`] (pingora's per-request `CTX`), instead of recomputing it.

#![warn(missing_docs)]

pub mod body;
pub mod clock;
pub mod event;
pub mod fields;
pub mod reply;
pub mod slots;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

pub use body::{shown_by_nuls, starts_binary, Body, DecodeError, DecodeLimits, WideText};
pub use event::{new_event_id, EventAction, SecurityEvent};
pub use reply::{Reply, ReplyFormat};
pub use slots::{ArrivedHead, EngineSlots, RouteMode};

/// Identity of a TLS peer taken from its client certificate.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerIdentity {
    /// Istio-style principal: the SPIFFE URI SAN without `spiffe://`, e.g. `td/ns/N/sa/S`.
    pub principal: Option<String>,
    /// Namespace `N` from a `spiffe://td/ns/N/sa/S` URI SAN.
    pub namespace: Option<String>,
    /// Every URI SAN of the certificate.
    pub uri_sans: Vec<String>,
    /// Certificate subject in RFC 4514 form.
    pub subject: String,
    /// SHA-256 fingerprint of the DER certificate, lowercase hex.
    pub fingerprint_sha256: String,
}

impl PeerIdentity {
    /// Derives principal and namespace from a SPIFFE URI (`spiffe://td/ns/N/sa/S`).
    pub fn from_spiffe_uri(uri: &str) -> (Option<String>, Option<String>) {
        let Some(rest) = uri.strip_prefix("spiffe://") else {
            return (None, None);
        };
        let parts: Vec<&str> = rest.split('/').collect();
        let namespace = parts
            .windows(2)
            .find(|w| w[0] == "ns")
            .map(|w| w[1].to_string());
        (Some(rest.to_string()), namespace)
    }
}

/// What the TLS handshake of a downstream connection established.
#[derive(Debug, Clone, Default)]
pub struct TlsSession {
    /// SNI sent by the client.
    pub sni: Option<String>,
    /// Negotiated ALPN protocol (e.g. `h2`).
    pub alpn: Option<String>,
    /// Negotiated protocol version, e.g. `TLSv1.3`.
    pub version: String,
    /// Negotiated cipher suite, IANA name.
    pub cipher_suite: String,
    /// Verified client certificate identity, when the client presented one.
    pub peer: Option<PeerIdentity>,
}

/// A downstream connection, shared by every request it carries.
#[derive(Debug, Clone)]
pub struct Connection {
    /// Address of the TCP peer (the direct client; see `RequestCtx::client_ip` for XFF).
    pub remote_addr: SocketAddr,
    /// Local address the connection arrived on (its port is `destination.port`).
    pub local_addr: SocketAddr,
    /// TLS details, `None` for plaintext.
    pub tls: Option<TlsSession>,
}

/// Authentication established by request authentication (JWT).
#[derive(Debug, Clone, Default)]
pub struct RequestAuth {
    /// `iss/sub` of a verified token.
    pub principal: String,
    /// The token's `aud` values.
    pub audiences: Vec<String>,
    /// The token's `azp`.
    pub presenter: Option<String>,
    /// All claims of the verified token.
    pub claims: Arc<serde_json::Value>,
}

/// Per-request state that phases read and add to.
#[derive(Debug, Clone)]
pub struct RequestCtx {
    /// The request id (`x-request-id`, propagated or generated).
    pub request_id: String,
    /// Name of the matched route.
    pub route: Arc<str>,
    /// Labels of the matched route and its cluster (Istio `selector.matchLabels` match these).
    pub labels: Arc<BTreeMap<String, String>>,
    /// Namespace of the workload behind the route (Istio `metadata.namespace`).
    pub namespace: Arc<str>,
    /// The downstream connection.
    pub conn: Arc<Connection>,
    /// Original client IP (from X-Forwarded-For with the configured trusted hops, else the TCP peer).
    pub client_ip: std::net::IpAddr,
    /// Verified JWT, set by request authentication.
    pub auth: Option<RequestAuth>,
    /// Security events raised so far; the proxy enqueues them after the response.
    pub events: Vec<SecurityEvent>,
    /// Whether the route runs engines in monitor-only mode (engines may also have their own mode).
    pub monitor_only: bool,
    /// The external authorizer an Istio `action: CUSTOM` policy sends this request to
    /// (its `provider.name`), set by access control; the proxy makes the call.
    pub ext_authz: Option<Arc<str>>,
    /// The path (and query) access control matched, normalized, when it is not the
    /// request's own: the proxy forwards it once the head phases ran, as Envoy forwards
    /// the `:path` its `normalize_path` wrote. The head phases read the path as the
    /// client sent it (the WAF finds `/static/../../etc/passwd` there, not in
    /// `/etc/passwd`).
    pub forward_path: Option<http::uri::PathAndQuery>,
    /// What each engine computed about this request in an earlier phase (see [`slots`]).
    pub slots: EngineSlots,
}

impl RequestCtx {
    /// A context for tests and CLIs: no TLS, loopback peer.
    pub fn for_test(route: &str) -> Self {
        let addr: SocketAddr = ([127, 0, 0, 1], 40000).into();
        RequestCtx {
            request_id: "test".into(),
            route: route.into(),
            labels: Arc::new(BTreeMap::new()),
            namespace: "default".into(),
            conn: Arc::new(Connection {
                remote_addr: addr,
                local_addr: ([127, 0, 0, 1], 8080).into(),
                tls: None,
            }),
            client_ip: addr.ip(),
            auth: None,
            events: Vec::new(),
            monitor_only: false,
            ext_authz: None,
            forward_path: None,
            slots: EngineSlots::default(),
        }
    }
}

/// Host addressed by a request (the authority for HTTP/2 and absolute-form targets,
/// else `Host`), without its port.
pub fn request_host(parts: &http::request::Parts) -> &str {
    let raw = parts
        .uri
        .authority()
        .map(|a| a.host())
        .or_else(|| {
            parts
                .headers
                .get(http::header::HOST)
                .and_then(|h| h.to_str().ok())
        })
        .unwrap_or("");
    strip_port(raw)
}

/// A host without its `:port` (an IPv6 literal keeps its brackets).
pub fn strip_port(h: &str) -> &str {
    if h.starts_with('[') {
        return h.find(']').map_or(h, |i| &h[..=i]);
    }
    // A byte loop: hosts are short, and `rfind(':')`'s searcher cost about 160
    // instructions a request.
    match h.bytes().rposition(|b| b == b':') {
        Some(i) if h[i + 1..].bytes().all(|b| b.is_ascii_digit()) => &h[..i],
        _ => h,
    }
}

/// The last segment of a path that is not empty, ignoring trailing slashes (`b` for
/// `/a/b//`; empty for `/` or an empty path). Found on bytes: `/` is ASCII, so both
/// ends are char boundaries, and the per-request callers skip a char searcher.
pub fn last_path_segment(path: &str) -> &str {
    let end = path.bytes().rposition(|b| b != b'/').map_or(0, |i| i + 1);
    let start = path.as_bytes()[..end]
        .iter()
        .rposition(|&b| b == b'/')
        .map_or(0, |i| i + 1);
    path.get(start..end).unwrap_or("")
}

/// What a phase decided.
#[derive(Debug)]
pub enum Verdict {
    /// Go on to the next phase.
    Continue,
    /// Stop here and answer the client with this reply (the upstream is not called,
    /// or its response is replaced).
    Respond(Reply),
}

/// Runs when a downstream TLS handshake completes.
pub trait ConnectionPhase: Send + Sync {
    /// Name used in metrics (`phase="connection"`, `engine=...`).
    fn name(&self) -> &'static str;
    /// Observes the established connection. Must not block.
    fn on_connection(&self, conn: &Connection, handshake: &HandshakeRecord);
}

/// Crypto parameters of one completed TLS handshake, in the crypto-auditing vocabulary.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct HandshakeRecord {
    /// `tls::role` in crypto-auditing terms, i.e. our own side: `server` for a
    /// connection we accepted, `client` for one we opened to an upstream.
    pub role: &'static str,
    /// `tls::protocol_version`, e.g. 0x0304.
    pub protocol_version: u16,
    /// `tls::ciphersuite`, IANA code point.
    pub ciphersuite: u16,
    /// Human name of the cipher suite.
    pub ciphersuite_name: String,
    /// `tls::key_exchange_group` name, e.g. `X25519`.
    pub key_exchange_group: Option<String>,
    /// `tls::signature_algorithm` name, when known.
    pub signature_algorithm: Option<String>,
    /// Negotiated ALPN.
    pub alpn: Option<String>,
    /// Server name indication.
    pub sni: Option<String>,
    /// Whether the session was resumed.
    pub resumed: bool,
    /// The other side's leaf certificate when one was presented: the client
    /// certificate on accept (mTLS), the server certificate on upstream connect.
    pub peer: Option<PeerIdentitySummary>,
    /// Our own leaf certificate as presented: on accept, the one the listener served
    /// for the SNI. Absent on resumed handshakes (no certificate is sent) and on
    /// upstream connections.
    pub certificate: Option<PeerIdentitySummary>,
    /// Handshake duration in microseconds.
    pub handshake_us: u64,
    /// Peer address.
    pub peer_addr: Option<SocketAddr>,
}

/// Serializable summary of a certificate of a handshake (the peer's or our own).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct PeerIdentitySummary {
    /// Subject (RFC 4514).
    pub subject: String,
    /// URI and DNS SANs.
    pub sans: Vec<String>,
    /// SHA-256 of the DER certificate, hex.
    pub fingerprint_sha256: String,
    /// End of the validity period (X.509 `notAfter`), unix seconds; absent when the
    /// certificate could not be parsed.
    pub not_after: Option<i64>,
}

/// Inspects request headers (method, URI, headers) before any body is read.
pub trait RequestHeadersPhase: Send + Sync {
    /// Engine name for metrics and events.
    fn name(&self) -> &'static str;
    /// May modify headers (e.g. add claim headers) or answer directly.
    fn on_request_headers(&self, ctx: &mut RequestCtx, req: &mut http::request::Parts) -> Verdict;
    /// The request header fields this phase decides on or writes, by name (a policy's
    /// `request.headers[x-user]`, a token's field, a rate limit's key). The gateway
    /// removes their CGI twins (`x_user` for `x-user`) from every request before any
    /// phase reads the head ([`fields::CgiTwins`]). Asked once per configuration.
    fn fields_decided_on(&self) -> Vec<http::HeaderName> {
        Vec::new()
    }
}

/// How much of a body a phase wants to see.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyNeed {
    /// The phase does not need this body; it is streamed through.
    None,
    /// Buffer up to this many bytes before calling the phase.
    Buffer(usize),
    /// Buffer up to this many bytes when the body is text, stream it when its first
    /// bytes say it is binary ([`body::starts_binary`]): what a phase that reads
    /// documents needs of a body declared binary, without holding back real uploads.
    BufferText(usize),
}

impl BodyNeed {
    /// The two needs together: the larger buffer, unconditional if either is.
    pub fn max(self, other: BodyNeed) -> BodyNeed {
        use BodyNeed::*;
        match (self, other) {
            (None, x) | (x, None) => x,
            (BufferText(a), BufferText(b)) => BufferText(a.max(b)),
            (Buffer(a) | BufferText(a), Buffer(b) | BufferText(b)) => Buffer(a.max(b)),
        }
    }
}

/// Inspects (and may rewrite) a buffered request body.
pub trait RequestBodyPhase: Send + Sync {
    /// Engine name for metrics and events.
    fn name(&self) -> &'static str;
    /// Whether to buffer this request's body, decided from the headers.
    fn body_need(&self, ctx: &RequestCtx, req: &http::request::Parts) -> BodyNeed;
    /// Called once with the buffered body (possibly truncated at the limit: see [`Body::truncated`]).
    fn on_request_body(
        &self,
        ctx: &mut RequestCtx,
        req: &mut http::request::Parts,
        body: &mut Body,
    ) -> Verdict;
    /// Whether this phase reads the trailer fields of this request's body. Trailers
    /// come after the body; of a body moat streams, they arrive when the rest is
    /// forwarded already, too late to be inspected, and moat drops them when a phase
    /// says true here.
    fn inspects_trailers(&self, _ctx: &RequestCtx) -> bool {
        false
    }
    /// Called with the trailers of a body moat read whole (after
    /// [`on_request_body`](Self::on_request_body) when the body was buffered), before
    /// anything of the body is forwarded.
    fn on_request_trailers(
        &self,
        _ctx: &mut RequestCtx,
        _req: &mut http::request::Parts,
        _trailers: &http::HeaderMap,
    ) -> Verdict {
        Verdict::Continue
    }
}

/// Inspects (and may rewrite) a buffered response body.
pub trait ResponseBodyPhase: Send + Sync {
    /// Engine name.
    fn name(&self) -> &'static str;
    /// Whether to buffer this response's body.
    fn body_need(
        &self,
        ctx: &RequestCtx,
        req: &http::request::Parts,
        resp: &http::response::Parts,
    ) -> BodyNeed;
    /// Called with the buffered response body.
    fn on_response_body(
        &self,
        ctx: &mut RequestCtx,
        req: &http::request::Parts,
        resp: &mut http::response::Parts,
        body: &mut Body,
    ) -> Verdict;
}

/// A completed exchange handed to after-response work.
///
/// Bodies are present only when some phase buffered them (or an after-response
/// phase asked for them through [`AfterResponsePhase::wants_bodies`]).
#[derive(Debug, Clone)]
pub struct Exchange {
    /// Request context as it stood at the end of the request.
    pub ctx: RequestCtx,
    /// Request head.
    pub request: http::request::Parts,
    /// Buffered request body, if any (decoded form available through [`Body::decoded`]).
    pub request_body: Option<bytes::Bytes>,
    /// Response status.
    pub status: http::StatusCode,
    /// Response headers.
    pub response_headers: http::HeaderMap,
    /// Buffered response body, if any.
    pub response_body: Option<bytes::Bytes>,
    /// Time from the request head to the response head, microseconds (the response
    /// body may still be streaming when after-response phases run).
    pub duration_us: u64,
}

/// A finished exchange as after-response phases see it: borrowed from the
/// request's own state, so a phase that skips a request (most are not sampled)
/// costs no copy. [`Finished::exchange`] makes the owned [`Exchange`] a phase
/// keeps, once per request however many phases ask.
#[derive(Debug)]
pub struct Finished<'a> {
    /// Request context as it stood at the end of the request.
    pub ctx: &'a RequestCtx,
    /// Request head.
    pub request: &'a http::request::Parts,
    /// Buffered request body, if any.
    pub request_body: Option<&'a bytes::Bytes>,
    /// Response status.
    pub status: http::StatusCode,
    /// Response headers.
    pub response_headers: &'a http::HeaderMap,
    /// Buffered response body, if any.
    pub response_body: Option<&'a bytes::Bytes>,
    /// Time from the request head to the response head, microseconds.
    pub duration_us: u64,
    owned: std::cell::OnceCell<Arc<Exchange>>,
    after_sent: std::cell::RefCell<AfterSent>,
}

/// Work after-response phases registered with [`Finished::after_sent`]: the proxy
/// runs it once the response body has been sent (or the client went away).
#[derive(Default)]
pub struct AfterSent(Vec<Box<dyn FnOnce() + Send>>);

impl AfterSent {
    /// True when nothing was registered.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Runs the registered work, in registration order.
    pub fn run(self) {
        for f in self.0 {
            f();
        }
    }
}

impl std::fmt::Debug for AfterSent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AfterSent({} pending)", self.0.len())
    }
}

impl<'a> Finished<'a> {
    /// A view of a finished exchange.
    pub fn new(
        ctx: &'a RequestCtx,
        request: &'a http::request::Parts,
        status: http::StatusCode,
        response_headers: &'a http::HeaderMap,
    ) -> Self {
        Finished {
            ctx,
            request,
            request_body: None,
            status,
            response_headers,
            response_body: None,
            duration_us: 0,
            owned: std::cell::OnceCell::new(),
            after_sent: Default::default(),
        }
    }

    /// With the buffered bodies.
    pub fn with_bodies(
        mut self,
        request_body: Option<&'a bytes::Bytes>,
        response_body: Option<&'a bytes::Bytes>,
    ) -> Self {
        self.request_body = request_body;
        self.response_body = response_body;
        self
    }

    /// With the exchange's duration.
    pub fn with_duration_us(mut self, duration_us: u64) -> Self {
        self.duration_us = duration_us;
        self
    }

    /// A view of an owned exchange (its [`exchange`](Self::exchange) is a copy).
    pub fn of(ex: &'a Exchange) -> Self {
        Finished::new(&ex.ctx, &ex.request, ex.status, &ex.response_headers)
            .with_bodies(ex.request_body.as_ref(), ex.response_body.as_ref())
            .with_duration_us(ex.duration_us)
    }

    /// Registers work to run once the response has been sent: a phase decides
    /// here, on the request thread, and hands the work it keeps (e.g. queueing a
    /// sample for a worker) to the proxy, which runs it after the last byte of
    /// the response body (see [`AfterSent`]).
    pub fn after_sent(&self, f: impl FnOnce() + Send + 'static) {
        self.after_sent.borrow_mut().0.push(Box::new(f));
    }

    /// The work registered with [`after_sent`](Self::after_sent); the caller runs
    /// it once the response has been sent.
    pub fn into_after_sent(self) -> AfterSent {
        self.after_sent.into_inner()
    }

    /// The exchange as an owned value a phase may keep or send to a worker
    /// (copied on the first call, shared after).
    pub fn exchange(&self) -> Arc<Exchange> {
        self.owned
            .get_or_init(|| {
                Arc::new(Exchange {
                    ctx: self.ctx.clone(),
                    request: self.request.clone(),
                    request_body: self.request_body.cloned(),
                    status: self.status,
                    response_headers: self.response_headers.clone(),
                    response_body: self.response_body.cloned(),
                    duration_us: self.duration_us,
                })
            })
            .clone()
    }
}

/// Work done after the response has been sent (API discovery, analytics).
///
/// [`after_response`](Self::after_response) runs on the request thread once the
/// response head is ready. Implementations must return quickly: decide on the
/// borrowed [`Finished`] view, and register what they keep with
/// [`Finished::after_sent`] (e.g. a push into a bounded background queue,
/// dropping when full), which the proxy runs after the response body.
pub trait AfterResponsePhase: Send + Sync {
    /// Engine name.
    fn name(&self) -> &'static str;
    /// Whether this request's bodies should be kept for [`after_response`](Self::after_response)
    /// (e.g. the request is sampled), and up to what size. The phase may note in its
    /// slot of `ctx` what [`after_response`](Self::after_response) can reuse.
    fn wants_bodies(&self, ctx: &mut RequestCtx, req: &http::request::Parts) -> BodyNeed;
    /// Sees the finished exchange.
    fn after_response(&self, done: &Finished<'_>);
}

#[cfg(test)]
mod tests {
    use super::{last_path_segment, strip_port};

    #[test]
    fn last_path_segment_skips_trailing_slashes() {
        assert_eq!(last_path_segment("/uploads/shell.php.jpg"), "shell.php.jpg");
        assert_eq!(last_path_segment("/a/b//"), "b");
        assert_eq!(last_path_segment("b"), "b");
        assert_eq!(last_path_segment("/"), "");
        assert_eq!(last_path_segment("//"), "");
        assert_eq!(last_path_segment(""), "");
        assert_eq!(last_path_segment("/ü/ß/"), "ß");
    }

    #[test]
    fn strip_port_drops_only_a_numeric_port() {
        assert_eq!(strip_port("example.com:8080"), "example.com");
        assert_eq!(strip_port("example.com:"), "example.com");
        assert_eq!(strip_port("example.com"), "example.com");
        assert_eq!(strip_port("example.com:http"), "example.com:http");
        assert_eq!(strip_port("[::1]:443"), "[::1]");
        assert_eq!(strip_port("[::1]"), "[::1]");
        assert_eq!(strip_port("a:b:80"), "a:b");
        assert_eq!(strip_port("bücher.example:80"), "bücher.example");
        assert_eq!(strip_port(""), "");
    }
}
