//! `POST /v1/scan`, shaped after the secret detection services CI and code
//! hosts call.
//!
//! Request: `{"payloads":[{"id":"a","data":"..."}], "exclusions":[{"type":"rule",
//! "value":"jwt"}|{"type":"raw_value","value":"..."}], "timeout_ms":N}`.
//! Response: `{"status":"FOUND"|"NOT_FOUND"|"TIMEOUT"|"INPUT_ERROR", "results":[...]}`.

use moat_core::clock::CoarseInstant;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::engine::SecretsEngine;
use crate::scanner::Scanner;

/// Bounds of one API request.
#[derive(Debug, Clone, Copy)]
pub struct ApiLimits {
    /// Largest request body (default 4 MB, as the reference service).
    pub max_request_bytes: usize,
    /// Most payloads per request (default 1000).
    pub max_payloads: usize,
    /// Most exclusions per request (default 1000).
    pub max_exclusions: usize,
    /// Largest accepted `timeout_ms` (default 600 s, as the reference service).
    pub max_timeout: Duration,
    /// Timeout when the request gives none (default 10 s).
    pub default_timeout: Duration,
    /// Most results returned (default 999, as the reference service).
    pub max_results: usize,
}

impl Default for ApiLimits {
    fn default() -> Self {
        ApiLimits {
            max_request_bytes: 4_000_000,
            max_payloads: 1000,
            max_exclusions: 1000,
            max_timeout: Duration::from_secs(600),
            default_timeout: Duration::from_secs(10),
            max_results: 999,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Request {
    payloads: Vec<Payload>,
    #[serde(default)]
    exclusions: Vec<Exclusion>,
    #[serde(default)]
    timeout_ms: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Payload {
    id: String,
    data: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Exclusion {
    #[serde(rename = "type")]
    kind: ExclusionKind,
    value: String,
}

#[derive(Deserialize, PartialEq, Eq, Clone, Copy)]
#[serde(rename_all = "snake_case")]
enum ExclusionKind {
    Rule,
    RawValue,
}

#[derive(Serialize)]
struct Response {
    status: &'static str,
    results: Vec<ApiResult>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

#[derive(Serialize)]
struct ApiResult {
    payload_id: String,
    rule_id: String,
    description: String,
    line: usize,
    column: usize,
    start: usize,
    end: usize,
    redacted: String,
}

fn reply(code: u16, r: &Response) -> (u16, Vec<u8>) {
    let body = serde_json::to_vec(r).unwrap_or_else(|_| b"{\"status\":\"SCAN_ERROR\"}".to_vec());
    (code, body)
}

fn input_error(msg: String) -> (u16, Vec<u8>) {
    reply(
        400,
        &Response {
            status: "INPUT_ERROR",
            results: Vec::new(),
            error: Some(msg),
        },
    )
}

/// Serves one `POST /v1/scan` body with the engine's ruleset and default limits.
/// Returns the HTTP status and the JSON response body.
pub fn scan_api(engine: &SecretsEngine, body: &[u8]) -> (u16, Vec<u8>) {
    scan_api_with(engine.scanner(), body, &ApiLimits::default())
}

/// [`scan_api`] over any scanner, with explicit limits.
pub fn scan_api_with(scanner: &Scanner, body: &[u8], limits: &ApiLimits) -> (u16, Vec<u8>) {
    if body.len() > limits.max_request_bytes {
        return reply(
            413,
            &Response {
                status: "INPUT_ERROR",
                results: Vec::new(),
                error: Some(format!(
                    "request exceeds {} bytes",
                    limits.max_request_bytes
                )),
            },
        );
    }
    let req: Request = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(e) => return input_error(format!("invalid request: {e}")),
    };
    if req.payloads.len() > limits.max_payloads {
        return input_error(format!("more than {} payloads", limits.max_payloads));
    }
    if req.exclusions.len() > limits.max_exclusions {
        return input_error(format!("more than {} exclusions", limits.max_exclusions));
    }
    if let Some(p) = req.payloads.iter().find(|p| p.id.is_empty()) {
        let _ = p;
        return input_error("payload id must not be empty".into());
    }
    if req.exclusions.iter().any(|e| e.value.is_empty()) {
        return input_error("exclusion value must not be empty".into());
    }
    let timeout = match req.timeout_ms {
        Some(0) => return input_error("timeout_ms must be positive".into()),
        Some(ms) if Duration::from_millis(ms) > limits.max_timeout => {
            return input_error(format!(
                "timeout_ms exceeds {} ms",
                limits.max_timeout.as_millis()
            ))
        }
        Some(ms) => Duration::from_millis(ms),
        None => limits.default_timeout,
    };
    let deadline = CoarseInstant::now() + timeout;
    let excluded_rules: Vec<&str> = req
        .exclusions
        .iter()
        .filter(|e| e.kind == ExclusionKind::Rule)
        .map(|e| e.value.as_str())
        .collect();
    let raw_values: Vec<&[u8]> = req
        .exclusions
        .iter()
        .filter(|e| e.kind == ExclusionKind::RawValue)
        .map(|e| e.value.as_bytes())
        .collect();
    let mut results = Vec::new();
    let mut timed_out = false;
    'payloads: for p in &req.payloads {
        if CoarseInstant::now() >= deadline {
            timed_out = true;
            break;
        }
        let data = p.data.as_bytes();
        let outcome = scanner.scan_with_deadline(data, None, Some(deadline));
        for f in &outcome.findings {
            if excluded_rules.contains(&&*f.rule_id) {
                continue;
            }
            let secret = &data[f.secret_start..f.secret_end];
            if raw_values
                .iter()
                .any(|v| *v == secret || memchr::memmem::find(&data[f.start..f.end], v).is_some())
            {
                continue;
            }
            if results.len() >= limits.max_results {
                break 'payloads;
            }
            results.push(ApiResult {
                payload_id: p.id.clone(),
                rule_id: f.rule_id.to_string(),
                description: f.description.to_string(),
                line: f.line,
                column: f.column,
                start: f.start,
                end: f.end,
                redacted: f.redacted(data),
            });
        }
        if outcome.timed_out {
            timed_out = true;
            break;
        }
    }
    let status = if timed_out {
        "TIMEOUT"
    } else if results.is_empty() {
        "NOT_FOUND"
    } else {
        "FOUND"
    };
    reply(
        200,
        &Response {
            status,
            results,
            error: None,
        },
    )
}
