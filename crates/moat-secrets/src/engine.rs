//! The gateway phases: scan request (and optionally response) bodies.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::{HeaderValue, StatusCode};
use moat_core::{
    Body, BodyNeed, DecodeError, EventAction, Reply, RequestBodyPhase, RequestCtx,
    ResponseBodyPhase, SecurityEvent, Verdict,
};

use crate::config::{LimitOutcome, SecretsAction, SecretsConfig};
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
        Ok(Arc::new(SecretsEngine {
            config: config.clone(),
            status,
            scanner,
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
        action: SecretsAction,
        side: Side,
        form: bool,
    ) -> Verdict {
        if body.truncated() {
            return self.limit(
                ctx,
                side,
                &format!("body exceeds {} bytes", self.config.max_body_bytes),
            );
        }
        let data: Bytes = match body.decoded() {
            Ok(d) => d.clone(),
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
        let deadline = Instant::now() + self.config.scan_timeout;
        let outcome = self.scanner.scan_with_deadline(&data, None, Some(deadline));
        if outcome.timed_out {
            return self.limit(ctx, side, "scan time limit reached");
        }
        if outcome.decode_truncated {
            return self.limit(ctx, side, "decoded text limit reached");
        }
        if outcome.findings.is_empty() {
            return Verdict::Continue;
        }
        let action = if ctx.monitor_only {
            SecretsAction::Monitor
        } else {
            action
        };
        let ev_action = match action {
            SecretsAction::Block => EventAction::Block,
            SecretsAction::Redact => EventAction::Redact,
            SecretsAction::Monitor => EventAction::Monitor,
        };
        let mut event_ids = Vec::with_capacity(outcome.findings.len());
        for f in &outcome.findings {
            let ev = finding_event(f, &data, ev_action, side);
            event_ids.push(ev.id.clone());
            ctx.events.push(ev);
        }
        match action {
            SecretsAction::Monitor => Verdict::Continue,
            SecretsAction::Redact => {
                let redacted = if form {
                    redact_with(&data, &outcome.findings, |id| {
                        format!("%5BREDACTED%3A{id}%5D")
                    })
                } else {
                    redact_with(&data, &outcome.findings, |id| format!("[REDACTED:{id}]"))
                };
                body.replace(Bytes::from(redacted));
                Verdict::Continue
            }
            SecretsAction::Block => {
                let status = match side {
                    Side::Request => self.status,
                    Side::Response => StatusCode::BAD_GATEWAY,
                };
                let findings: Vec<serde_json::Value> = outcome
                    .findings
                    .iter()
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
                    "event_id": event_ids.first(),
                    "findings": findings,
                });
                Verdict::Respond(json_reply(status, &body))
            }
        }
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

fn finding_event(f: &Finding, data: &[u8], action: EventAction, side: Side) -> SecurityEvent {
    SecurityEvent::new(
        "secrets",
        f.rule_id.to_string(),
        action,
        format!("{} ({})", f.description, f.rule_id),
    )
    .at(format!("{}:{}:{}", side.location(), f.line, f.column))
    .with_details(serde_json::json!({
        "line": f.line,
        "column": f.column,
        "start": f.start,
        "end": f.end,
        "secret_length": f.secret_end - f.secret_start,
        "entropy": (f.entropy * 100.0).round() / 100.0,
        "redacted": f.redacted(data),
    }))
}

fn is_form(headers: &http::HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.trim()
                .to_ascii_lowercase()
                .starts_with("application/x-www-form-urlencoded")
        })
}

impl RequestBodyPhase for SecretsEngine {
    fn name(&self) -> &'static str {
        "secrets"
    }

    fn body_need(&self, ctx: &RequestCtx, _req: &http::request::Parts) -> BodyNeed {
        self.need(self.config.for_route(&ctx.route).0)
    }

    fn on_request_body(
        &self,
        ctx: &mut RequestCtx,
        req: &mut http::request::Parts,
        body: &mut Body,
    ) -> Verdict {
        let (enabled, action, _) = self.config.for_route(&ctx.route);
        if !enabled {
            return Verdict::Continue;
        }
        let form = is_form(&req.headers);
        self.inspect(ctx, body, action, Side::Request, form)
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
        let (enabled, _, responses) = self.config.for_route(&ctx.route);
        self.need(enabled && responses)
    }

    fn on_response_body(
        &self,
        ctx: &mut RequestCtx,
        _req: &http::request::Parts,
        resp: &mut http::response::Parts,
        body: &mut Body,
    ) -> Verdict {
        let (enabled, action, responses) = self.config.for_route(&ctx.route);
        if !(enabled && responses) {
            return Verdict::Continue;
        }
        let form = is_form(&resp.headers);
        self.inspect(ctx, body, action, Side::Response, form)
    }
}
