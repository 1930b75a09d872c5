//! External authorizers for `action: CUSTOM` policies, declared as in Istio's MeshConfig
//! `extensionProviders` (`envoyExtAuthzGrpc`, `envoyExtAuthzHttp`; field names as
//! Istio spells them).
//!
//! The engine only decides which provider a request goes to (it sets
//! [`moat_core::RequestCtx::ext_authz`]); the proxy makes the call. These types are the
//! configuration both read.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Istio's default provider timeout (MeshConfig: 600s).
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// Largest `includeRequestBodyInCheck.maxRequestBytes` moat accepts: the body is held in
/// memory for the call (Envoy's own buffer limit is typically 1 MiB per request).
pub const MAX_BODY_IN_CHECK: u32 = 16 << 20;

fn default_timeout() -> Duration {
    DEFAULT_TIMEOUT
}

/// One `authz.extension_providers[]` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ExtensionProvider {
    /// The name CUSTOM policies use in `provider.name`.
    pub name: String,
    /// An Envoy ext_authz gRPC service (`envoy.service.auth.v3.Authorization/Check`).
    #[serde(default)]
    pub envoy_ext_authz_grpc: Option<ExtAuthzGrpc>,
    /// An Envoy ext_authz HTTP service.
    #[serde(default)]
    pub envoy_ext_authz_http: Option<ExtAuthzHttp>,
}

/// `envoyExtAuthzGrpc`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ExtAuthzGrpc {
    /// Host name or IP of the service.
    pub service: String,
    /// Its port.
    pub port: u16,
    /// Longest wait for an answer (default 600s, as Istio); then the call failed.
    #[serde(default = "default_timeout", with = "moat_config::duration")]
    pub timeout: Duration,
    /// A failed call (unreachable, timeout, malformed answer) allows the request.
    #[serde(default)]
    pub fail_open: bool,
    /// Status of the denial when the call failed and `failOpen` is false (default 403).
    #[serde(default)]
    pub status_on_error: Option<String>,
    /// Send the request body (up to a limit) with the check.
    #[serde(default)]
    pub include_request_body_in_check: Option<RequestBodyInCheck>,
    /// moat extension: TLS to the service (Istio configures it with a DestinationRule,
    /// which moat does not read). Same fields as a cluster's upstream `tls`.
    #[serde(default)]
    pub tls: Option<moat_tls::UpstreamTlsConfig>,
}

/// `envoyExtAuthzHttp`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ExtAuthzHttp {
    /// Host name or IP of the service.
    pub service: String,
    /// Its port.
    pub port: u16,
    /// Longest wait for an answer (default 600s, as Istio); then the call failed.
    #[serde(default = "default_timeout", with = "moat_config::duration")]
    pub timeout: Duration,
    /// A failed call allows the request.
    #[serde(default)]
    pub fail_open: bool,
    /// Status of the denial when the call failed and `failOpen` is false (default 403).
    #[serde(default)]
    pub status_on_error: Option<String>,
    /// Send the request body (up to a limit) with the check.
    #[serde(default)]
    pub include_request_body_in_check: Option<RequestBodyInCheck>,
    /// moat extension: TLS to the service (Istio configures it with a DestinationRule,
    /// which moat does not read). Same fields as a cluster's upstream `tls`.
    #[serde(default)]
    pub tls: Option<moat_tls::UpstreamTlsConfig>,
    /// Prefix of the check request's path (the original path follows it).
    #[serde(default)]
    pub path_prefix: String,
    /// Request headers sent to the service (besides `host`, the method and the path,
    /// which always are).
    #[serde(default)]
    pub include_request_headers_in_check: Vec<String>,
    /// Headers added to the check request.
    #[serde(default)]
    pub include_additional_headers_in_check: BTreeMap<String, String>,
    /// Headers of an allowing answer copied onto the request sent upstream.
    #[serde(default)]
    pub headers_to_upstream_on_allow: Vec<String>,
    /// Headers of a denying answer sent to the client (all of them when empty).
    #[serde(default)]
    pub headers_to_downstream_on_deny: Vec<String>,
}

/// `includeRequestBodyInCheck` (Istio's `EnvoyExternalAuthorizationRequestBody`, Envoy's
/// `with_request_body`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RequestBodyInCheck {
    /// Most body bytes sent (1 to [`MAX_BODY_IN_CHECK`]). A longer body is refused with
    /// 413 unless `allowPartialMessage`.
    pub max_request_bytes: u32,
    /// A longer body is sent cut at `maxRequestBytes` (with `x-envoy-auth-partial-body:
    /// true`) instead of being refused.
    #[serde(default)]
    pub allow_partial_message: bool,
    /// gRPC: the body goes in `raw_body` (bytes) rather than `body` (UTF-8 text). No
    /// effect on HTTP providers, as in Istio.
    #[serde(default)]
    pub pack_as_bytes: bool,
}

/// The fields both provider kinds share, by reference.
#[derive(Debug, Clone, Copy)]
pub struct Common<'a> {
    /// `service`.
    pub service: &'a str,
    /// `port`.
    pub port: u16,
    /// `timeout`.
    pub timeout: Duration,
    /// `failOpen`.
    pub fail_open: bool,
    /// `statusOnError`.
    pub status_on_error: Option<&'a str>,
    /// `includeRequestBodyInCheck`.
    pub body: Option<RequestBodyInCheck>,
    /// `tls` (a moat extension).
    pub tls: Option<&'a moat_tls::UpstreamTlsConfig>,
}

macro_rules! common {
    ($p:expr) => {
        Common {
            service: &$p.service,
            port: $p.port,
            timeout: $p.timeout,
            fail_open: $p.fail_open,
            status_on_error: $p.status_on_error.as_deref(),
            body: $p.include_request_body_in_check,
            tls: $p.tls.as_ref(),
        }
    };
}

impl ExtensionProvider {
    /// The shared fields of the one kind given; `None` unless exactly one is.
    pub fn common(&self) -> Option<Common<'_>> {
        match (&self.envoy_ext_authz_grpc, &self.envoy_ext_authz_http) {
            (Some(g), None) => Some(common!(g)),
            (None, Some(h)) => Some(common!(h)),
            _ => None,
        }
    }

    /// Checks one entry: exactly one kind, a service, a status code for errors, a body
    /// limit within bounds.
    pub fn validate(&self) -> Result<(), String> {
        let Some(c) = self.common() else {
            return Err(format!(
                "provider `{}`: give exactly one of envoyExtAuthzGrpc, envoyExtAuthzHttp",
                self.name
            ));
        };
        if c.service.is_empty() || c.service.contains(['/', ' ']) {
            return Err(format!(
                "provider `{}`: `service` must be a host name or IP",
                self.name
            ));
        }
        if let Some(s) = c.status_on_error {
            parse_status(s).ok_or_else(|| {
                format!(
                    "provider `{}`: statusOnError `{s}` is not an HTTP status (100-599)",
                    self.name
                )
            })?;
        }
        if let Some(b) = c.body {
            if b.max_request_bytes == 0 || b.max_request_bytes > MAX_BODY_IN_CHECK {
                return Err(format!(
                    "provider `{}`: includeRequestBodyInCheck.maxRequestBytes must be 1 to {MAX_BODY_IN_CHECK}, not {}",
                    self.name, b.max_request_bytes
                ));
            }
        }
        Ok(())
    }
}

/// An HTTP status written as Istio's `statusOnError` (a decimal string).
pub fn parse_status(s: &str) -> Option<u16> {
    s.trim().parse().ok().filter(|c| (100..=599).contains(c))
}
