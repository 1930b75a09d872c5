//! Security events raised by engines.

use serde::Serialize;

/// What the engine did about a finding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EventAction {
    /// The request or response was refused.
    Block,
    /// Logged only (monitor mode, or an AUDIT policy).
    Monitor,
    /// Content was rewritten (secret redaction).
    Redact,
    /// A limit was hit and the content was forwarded uninspected.
    Bypass,
}

/// One security event (an attack, a denial, a secret, a limit).
///
/// The proxy adds request id, route, client IP and time when it enqueues it.
#[derive(Debug, Clone, Serialize)]
pub struct SecurityEvent {
    /// Unique event id, shown on the block page.
    pub id: String,
    /// Engine that raised it: `waf`, `authz`, `authn`, `secrets`, `limits`.
    pub engine: &'static str,
    /// Rule, detector or policy that fired, e.g. `sqli`, `aws-access-token`, `ns/policy[rule 2]`.
    pub rule: String,
    /// What was done.
    pub action: EventAction,
    /// Where in the request or response, e.g. `query:id`, `json:/user/name`, `body`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    /// Human-readable explanation. Never contains a secret value.
    pub message: String,
    /// Engine-specific details (matched fragment, confidence, ...).
    #[serde(skip_serializing_if = "serde_json::Value::is_null")]
    pub details: serde_json::Value,
}

impl SecurityEvent {
    /// A new event with a fresh id and no details.
    pub fn new(
        engine: &'static str,
        rule: impl Into<String>,
        action: EventAction,
        message: impl Into<String>,
    ) -> Self {
        SecurityEvent {
            id: new_event_id(),
            engine,
            rule: rule.into(),
            action,
            location: None,
            message: message.into(),
            details: serde_json::Value::Null,
        }
    }

    /// Sets the location.
    pub fn at(mut self, location: impl Into<String>) -> Self {
        self.location = Some(location.into());
        self
    }

    /// Sets details.
    pub fn with_details(mut self, details: serde_json::Value) -> Self {
        self.details = details;
        self
    }
}

/// Checks that the operating system's random number generator, which event and
/// request ids come from, answers. A server calls it once at startup: where it
/// does not (a seccomp filter refusing `getrandom` and no readable
/// `/dev/urandom`), the first id would panic on the request path; this names the
/// cause instead.
pub fn check_os_random() -> Result<(), String> {
    use rand::TryRngCore;
    rand::rngs::OsRng.try_next_u64().map(drop).map_err(|e| {
        format!(
            "the operating system's random number generator is unavailable ({e}): \
             moat needs the getrandom system call or a readable /dev/urandom"
        )
    })
}

/// A 16-hex-digit random id, cheap enough for the request path.
pub fn new_event_id() -> String {
    format!("{:016x}", rand::random::<u64>())
}
