//! One typed slot per engine in the request context (pingora's per-request `CTX`).
//!
//! An engine that runs in several phases (the WAF on the head and on the body) fills its slot the first time it
//! looks at a request and reads it in later phases instead of recomputing. The phase
//! traits stay object-safe (the pipeline holds `Arc<dyn Phase>`), so the slots are not an
//! associated type of each trait but fields of one struct the pipeline owns in every
//! [`RequestCtx`](crate::RequestCtx): plain data, no downcast, and no allocation but
//! access control's copy of a head it decides again with the body ([`ArrivedHead`]).
//!
//! A slot belongs to its engine: only that engine writes it, nobody else reads it. An
//! engine that needs a slot adds a field here with a type from this crate.

use http::StatusCode;

/// What an engine does on this request's route, decided once per request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteMode {
    /// The engine is off for this request (disabled on the route, or the client is allowed).
    Off,
    /// Findings are recorded, the request goes on.
    Monitor,
    /// Findings at the blocking threshold answer with this status.
    Enforce(StatusCode),
}

/// A request head as it arrived, before any phase rewrote it (access control's token
/// outputs, the normalized path).
#[derive(Debug, Clone)]
pub struct ArrivedHead {
    /// The request target.
    pub uri: http::Uri,
    /// The header fields, when a phase may rewrite them; `None` when the request's own
    /// are still as they arrived.
    pub headers: Option<http::HeaderMap>,
    /// The head's decision named a CUSTOM provider: it is asked about the request once,
    /// whatever the body names.
    pub custom_asked: bool,
}

/// The engines' slots of one request; all `None` when the request starts.
#[derive(Debug, Clone, Default)]
pub struct EngineSlots {
    /// The WAF's mode on this request (route, allow list, monitor-only), decided with the
    /// head and reused when the body arrives.
    pub waf: Option<RouteMode>,
    /// API discovery's keyed hash of (method, path template), computed when the body
    /// need is asked and reused after the response instead of walking the path again.
    pub discovery: Option<u64>,
    /// Access control's copy of the head of a request it allowed whose body may name
    /// another method (a `_method` field of a POST form): it decides again with the
    /// body, on the head as the first decision read it. Made only for such requests.
    pub authz: Option<Box<ArrivedHead>>,
}
