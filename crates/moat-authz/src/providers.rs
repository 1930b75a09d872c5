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

impl ExtensionProvider {
    /// Checks one entry: exactly one kind, a service, a status code for errors.
    pub fn validate(&self) -> Result<(), String> {
        let (service, status) = match (&self.envoy_ext_authz_grpc, &self.envoy_ext_authz_http) {
            (Some(g), None) => (&g.service, &g.status_on_error),
            (None, Some(h)) => (&h.service, &h.status_on_error),
            _ => {
                return Err(format!(
                    "provider `{}`: give exactly one of envoyExtAuthzGrpc, envoyExtAuthzHttp",
                    self.name
                ))
            }
        };
        if service.is_empty() || service.contains(['/', ' ']) {
            return Err(format!(
                "provider `{}`: `service` must be a host name or IP",
                self.name
            ));
        }
        if let Some(s) = status {
            parse_status(s).ok_or_else(|| {
                format!(
                    "provider `{}`: statusOnError `{s}` is not an HTTP status (100-599)",
                    self.name
                )
            })?;
        }
        Ok(())
    }
}

/// An HTTP status written as Istio's `statusOnError` (a decimal string).
pub fn parse_status(s: &str) -> Option<u16> {
    s.trim().parse().ok().filter(|c| (100..=599).contains(c))
}
