//! The gateway phases: scan request (and optionally response) bodies.

use moat_core::clock::CoarseInstant;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderValue, StatusCode};
use moat_core::{
    Body, BodyNeed, DecodeError, EventAction, Reply, RequestBodyPhase, RequestCtx,
    ResponseBodyPhase, SecurityEvent, Verdict,
};

use crate::config::{LimitOutcome, RoutePolicy, SecretsAction, SecretsConfig};
use crate::context::{classify, BodyContext, Classification, Confidence, Direction};
use crate::rules::RulesError;
use crate::scanner::{redact_with, Finding, Scanner};

/// Why the engine could not be built.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The ruleset could not be loaded.
    #[error(transparent)]
    Rules(#[from] RulesError),
    /// A configuration value is out of range.
    #[error("secrets.{field}: {message}")]
    Config {
        /// The field.
        field: &'static str,
        /// What is wrong.
        message: String,
    },
}

/// Inline secret detection; implements [`RequestBodyPhase`] and [`ResponseBodyPhase`].
#[derive(Debug)]
pub struct SecretsEngine {
    config: SecretsConfig,
    status: StatusCode,
    scanner: Scanner,
    /// Each rule's confidence (config overrides applied), by rule id.
    classes: HashMap<Arc<str>, Classification>,
}

/// Findings of one body past this many are counted without a field lookup
/// (as if outside any designated place), so hostile bodies stay linear.
const MAX_PLACED_FINDINGS: usize = 256;

/// What the engine decided about one finding.
struct Decision {
    /// `None`: exempt (a credential in its designated place).
    action: Option<SecretsAction>,
    confidence: Confidence,
    field: Option<String>,
    reason: String,
}

/// Where a body came from, for locations and replies.
#[derive(Clone, Copy)]
enum Side {
    Request,
    Response,
}

impl Side {
    fn location(self) -> &'static str {
        match self {
            Side::Request => "body",
            Side::Response => "response_body",
        }
    }
}

impl SecretsEngine {
    /// Builds the engine; `base_dir` resolves a relative `rules` path. Rules that
    /// cannot run are logged (rule id and reason) and listed by [`SecretsEngine::scanner`].
    pub fn build(config: &SecretsConfig, base_dir: &Path) -> Result<Arc<Self>, EngineError> {
        let status = StatusCode::from_u16(config.status)
            .ok()
            .filter(|s| s.as_u16() >= 400)
            .ok_or(EngineError::Config {
                field: "status",
                message: format!("{} is not an HTTP error status (400-599)", config.status),
            })?;
        if config.max_body_bytes == 0 || config.max_body_bytes > (1 << 30) {
            return Err(EngineError::Config {
                field: "max_body_bytes",
                message: "must be between 1 byte and 1 GiB".into(),
            });
        }
        if config.scan_timeout.is_zero() {
            return Err(EngineError::Config {
                field: "scan_timeout",
                message: "must be greater than zero".into(),
            });
        }
        if config.max_decode_depth > crate::MAX_DECODE_DEPTH {
            return Err(EngineError::Config {
                field: "max_decode_depth",
                message: format!("must be at most {}", crate::MAX_DECODE_DEPTH),
            });
        }
        let mut scanner = match &config.rules {
            Some(p) => Scanner::from_file(&base_dir.join(p))?,
            None => Scanner::builtin()?,
        };
        scanner.set_max_decode_depth(config.max_decode_depth);
        for s in scanner.skipped() {
            tracing::warn!(rule = %s.rule_id, reason = %s.reason, "secrets: rule cannot run");
        }
        let classes = rule_classes(config, &scanner)?;
        Ok(Arc::new(SecretsEngine {
            config: config.clone(),
            status,
            scanner,
            classes,
        }))
    }

    /// The compiled scanner (also used by the scan API).
    pub fn scanner(&self) -> &Scanner {
        &self.scanner
    }

    /// The configuration in force.
    pub fn config(&self) -> &SecretsConfig {
        &self.config
    }

    /// How a rule is classified for requests (`None` for an unknown id).
    pub fn classification(&self, rule_id: &str) -> Option<&Classification> {
        self.classes.get(rule_id)
    }

    /// Whether finding `f` of `data` is the key id of a SigV4 credential scope:
    /// the text before the secret (decoded text for a decoded finding) ends
    /// with `X-Amz-Credential=` or `AWS4-HMAC-SHA256 Credential=`.
    fn signed_url_scope(&self, f: &Finding, data: &[u8]) -> bool {
        match &f.decoded {
            Some(d) => {
                let at = memchr::memmem::find(&d.matched, &d.secret).unwrap_or(0);
                let mut before = d.preceding.clone();
                before.extend_from_slice(&d.matched[..at]);
                crate::context::in_signed_url_scope(&before)
            }
            None => {
                let start = f.secret_start.min(data.len());
                crate::context::in_signed_url_scope(&data[start.saturating_sub(64)..start])
            }
        }
    }

    /// Decides one finding: its action (or exemption) and why.
    fn decide(
        &self,
        f: &Finding,
        placed: bool,
        cx: &mut BodyContext<'_>,
        policy: &RoutePolicy,
        side: Side,
    ) -> Decision {
        let (confidence, class_why) = match self.classes.get(&*f.rule_id) {
            Some(c) => (c.confidence, c.why.as_str()),
            None => (Confidence::Specific, "rule not classified"),
        };
        let secret = if f.secret_end > f.secret_start {
            f.secret_start..f.secret_end
        } else {
            f.start..f.end
        };
        let field = if placed && !f.path_only {
            cx.field_at(secret.start)
        } else {
            None
        };
        let field_name = field.as_ref().map(|f| f.name.display());
        let whereabouts = match (&field_name, field.as_ref().is_some_and(|f| f.file)) {
            (Some(n), true) => format!("in uploaded file field {n}"),
            (Some(n), false) => format!("in field {n} of a {} body", cx.kind().as_str()),
            (None, _) => format!("in a {} body, outside any named field", cx.kind().as_str()),
        };
        if policy.context && self.signed_url_scope(f, cx.data()) {
            return Decision {
                action: None,
                confidence,
                field: field_name,
                reason: "AWS access key id in the credential scope of a SigV4 signature \
                         (X-Amz-Credential): public by design, the secret key is not sent"
                    .to_string(),
            };
        }
        if policy.context {
            if let Some(ex) = field
                .as_ref()
                .and_then(|fl| cx.exemption(fl, secret.clone()))
            {
                return Decision {
                    action: None,
                    confidence,
                    field: field_name,
                    reason: ex.reason,
                };
            }
        }
        let (action, reason) = match side {
            Side::Response => (
                policy.response_action,
                format!("leak in a response body {whereabouts}"),
            ),
            Side::Request => match confidence {
                Confidence::Specific => (
                    policy.action,
                    format!("provider-specific rule ({class_why}) {whereabouts}"),
                ),
                Confidence::Generic => (
                    policy.generic_action,
                    format!(
                        "generic rule ({class_why}) {whereabouts}: {} on requests (secrets.generic_action)",
                        action_word(policy.generic_action)
                    ),
                ),
            },
        };
        Decision {
            action: Some(action),
            confidence,
            field: field_name,
            reason,
        }
    }

    fn need(&self, enabled: bool) -> BodyNeed {
        if enabled {
            BodyNeed::Buffer(usize::try_from(self.config.max_body_bytes).unwrap_or(usize::MAX))
        } else {
            BodyNeed::None
        }
    }

    fn limit(&self, ctx: &mut RequestCtx, side: Side, why: &str) -> Verdict {
        let block = self.config.on_limit == LimitOutcome::Block && !ctx.monitor_only;
        let action = if block {
            EventAction::Block
        } else {
            EventAction::Bypass
        };
        let ev = SecurityEvent::new(
            "secrets",
            "secrets-limit",
            action,
            format!("secret scan skipped: {why}"),
        )
        .at(side.location());
        let id = ev.id.clone();
        ctx.events.push(ev);
        if !block {
            return Verdict::Continue;
        }
        let status = match side {
            Side::Request => StatusCode::PAYLOAD_TOO_LARGE,
            Side::Response => StatusCode::BAD_GATEWAY,
        };
        let body = serde_json::json!({
            "status": status.as_u16(),
            "error": format!("body could not be inspected for secrets: {why}"),
            "request_id": ctx.request_id,
            "event_id": id,
        });
        Verdict::Respond(json_reply(status, &body))
    }

    fn inspect(
        &self,
        ctx: &mut RequestCtx,
        body: &mut Body,
        policy: &RoutePolicy,
        side: Side,
        content_type: Option<&str>,
        path: &str,
    ) -> Verdict {
        if body.truncated() {
            return self.limit(
                ctx,
                side,
                &format!("body exceeds {} bytes", self.config.max_body_bytes),
            );
        }
        // Borrowed: the body is only written (redaction) after the last read.
        let data: &[u8] = match body.decoded() {
            Ok(d) => d,
            Err(e) => {
                let why = match e {
                    DecodeError::TooLarge { .. } => "decoded body exceeds the limit".to_string(),
                    other => other.to_string(),
                };
                return self.limit(ctx, side, &why);
            }
        };
        if data.len() as u64 > self.config.max_body_bytes {
            return self.limit(
                ctx,
                side,
                &format!("decoded body exceeds {} bytes", self.config.max_body_bytes),
            );
        }
        // the coarse clock: a 50 ms budget does not need the TSC (moat_core::clock)
        let deadline = CoarseInstant::now() + self.config.scan_timeout;
        let outcome = self.scanner.scan_with_deadline(data, None, Some(deadline));
        if outcome.timed_out {
            return self.limit(ctx, side, "scan time limit reached");
        }
        if outcome.decode_truncated {
            return self.limit(ctx, side, "decoded text limit reached");
        }
        if outcome.findings.is_empty() {
            return Verdict::Continue;
        }
        let direction = match side {
            Side::Request => Direction::Request,
            Side::Response => Direction::Response,
        };
        let mut cx = BodyContext::new(data, content_type, path, direction);
        let form = cx.kind() == crate::context::BodyKind::Form;
        let mut blocked: Vec<(usize, String)> = Vec::new();
        let mut redacted: Vec<Finding> = Vec::new();
        for (i, f) in outcome.findings.iter().enumerate() {
            let mut d = self.decide(f, i < MAX_PLACED_FINDINGS, &mut cx, policy, side);
            if ctx.monitor_only && d.action.is_some() {
                d.action = Some(SecretsAction::Monitor);
                d.reason.push_str("; route in monitor-only mode");
            }
            let ev_action = match d.action {
                Some(SecretsAction::Block) => EventAction::Block,
                Some(SecretsAction::Redact) => EventAction::Redact,
                Some(SecretsAction::Monitor) => EventAction::Monitor,
                None if self.config.report_exempt => EventAction::Monitor,
                None => continue,
            };
            let ev = finding_event(f, data, ev_action, side, &d);
            match d.action {
                Some(SecretsAction::Block) => blocked.push((i, ev.id.clone())),
                Some(SecretsAction::Redact) => redacted.push(f.clone()),
                _ => {}
            }
            ctx.events.push(ev);
        }
        if !blocked.is_empty() {
            let status = match side {
                Side::Request => self.status,
                Side::Response => StatusCode::BAD_GATEWAY,
            };
            let findings: Vec<serde_json::Value> = blocked
                .iter()
                .filter_map(|(i, _)| outcome.findings.get(*i))
                .map(|f| {
                    serde_json::json!({
                        "rule_id": &*f.rule_id,
                        "line": f.line,
                        "column": f.column,
                    })
                })
                .collect();
            let body = serde_json::json!({
                "status": status.as_u16(),
                "error": "secret detected",
                "request_id": ctx.request_id,
                "event_id": blocked.first().map(|(_, id)| id),
                "findings": findings,
            });
            return Verdict::Respond(json_reply(status, &body));
        }
        if !redacted.is_empty() {
            let out = if form {
                redact_with(data, &redacted, |id| format!("%5BREDACTED%3A{id}%5D"))
            } else {
                redact_with(data, &redacted, |id| format!("[REDACTED:{id}]"))
            };
            body.replace(Bytes::from(out));
        }
        Verdict::Continue
    }
}

/// Each rule's classification, with `generic_rules` and `specific_rules` applied.
fn rule_classes(
    config: &SecretsConfig,
    scanner: &Scanner,
) -> Result<HashMap<Arc<str>, Classification>, EngineError> {
    let mut classes: HashMap<Arc<str>, Classification> = scanner
        .rules()
        .iter()
        .map(|r| (r.id.clone(), classify(r)))
        .collect();
    for (field, ids, confidence) in [
        ("generic_rules", &config.generic_rules, Confidence::Generic),
        (
            "specific_rules",
            &config.specific_rules,
            Confidence::Specific,
        ),
    ] {
        for id in ids {
            let other = match confidence {
                Confidence::Generic => &config.specific_rules,
                Confidence::Specific => &config.generic_rules,
            };
            if other.contains(id) {
                return Err(EngineError::Config {
                    field,
                    message: format!("rule `{id}` is in both generic_rules and specific_rules"),
                });
            }
            let Some(c) = classes.get_mut(id.as_str()) else {
                return Err(EngineError::Config {
                    field,
                    message: format!("no rule `{id}` in the ruleset"),
                });
            };
            *c = Classification {
                confidence,
                why: format!("secrets.{field} lists it"),
            };
        }
    }
    Ok(classes)
}

fn action_word(a: SecretsAction) -> &'static str {
    match a {
        SecretsAction::Block => "blocked",
        SecretsAction::Redact => "redacted",
        SecretsAction::Monitor => "monitor-only",
    }
}

fn json_reply(status: StatusCode, body: &serde_json::Value) -> Reply {
    Reply {
        status,
        headers: vec![(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body: Bytes::from(body.to_string()),
    }
}

fn finding_event(
    f: &Finding,
    data: &[u8],
    action: EventAction,
    side: Side,
    d: &Decision,
) -> SecurityEvent {
    let decision = match d.action {
        None => "exempt",
        Some(SecretsAction::Block) => "block",
        Some(SecretsAction::Redact) => "redact",
        Some(SecretsAction::Monitor) => "monitor",
    };
    SecurityEvent::new(
        "secrets",
        f.rule_id.to_string(),
        action,
        format!(
            "{} ({}): {decision}: {}",
            f.description, f.rule_id, d.reason
        ),
    )
    .at(format!("{}:{}:{}", side.location(), f.line, f.column))
    .with_details(serde_json::json!({
        "decision": decision,
        "reason": d.reason,
        "confidence": d.confidence.as_str(),
        "field": d.field,
        "line": f.line,
        "column": f.column,
        "start": f.start,
        "end": f.end,
        "secret_length": f.secret_end - f.secret_start,
        "entropy": (f.entropy * 100.0).round() / 100.0,
        "redacted": f.redacted(data),
    }))
}

fn content_type(headers: &http::HeaderMap) -> Option<&str> {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
}

impl RequestBodyPhase for SecretsEngine {
    fn name(&self) -> &'static str {
        "secrets"
    }

    fn body_need(&self, ctx: &RequestCtx, _req: &http::request::Parts) -> BodyNeed {
        self.need(self.config.policy(&ctx.route).enabled)
    }

    fn on_request_body(
        &self,
        ctx: &mut RequestCtx,
        req: &mut http::request::Parts,
        body: &mut Body,
    ) -> Verdict {
        let policy = self.config.policy(&ctx.route);
        if !policy.enabled {
            return Verdict::Continue;
        }
        let ct = content_type(&req.headers);
        self.inspect(ctx, body, &policy, Side::Request, ct, req.uri.path())
    }
}

impl ResponseBodyPhase for SecretsEngine {
    fn name(&self) -> &'static str {
        "secrets"
    }

    fn body_need(
        &self,
        ctx: &RequestCtx,
        _req: &http::request::Parts,
        _resp: &http::response::Parts,
    ) -> BodyNeed {
        let p = self.config.policy(&ctx.route);
        self.need(p.enabled && p.scan_responses)
    }

    fn on_response_body(
        &self,
        ctx: &mut RequestCtx,
        req: &http::request::Parts,
        resp: &mut http::response::Parts,
        body: &mut Body,
    ) -> Verdict {
        let policy = self.config.policy(&ctx.route);
        if !(policy.enabled && policy.scan_responses) {
            return Verdict::Continue;
        }
        let ct = content_type(&resp.headers);
        self.inspect(ctx, body, &policy, Side::Response, ct, req.uri.path())
    }
}
