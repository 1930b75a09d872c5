//! moat's attack detection engine (WAF).
//!
//! A request is decomposed into named locations (path and segments, query
//! arguments, urlencoded and multipart forms, JSON keys and values, XML text
//! and attributes, cookies, headers), each value is decoded (URL repeated and
//! `%u`, HTML entities, JS escapes, base64 text, UTF-7, nested JSON) with
//! output bounded by its input, and grammar-based detectors run on it:
//! a SQL lexer, an HTML tokenizer with JS-context checks, a shell tokenizer,
//! and structural detectors for traversal, SSRF, XXE, CRLF, code/template
//! injection, JNDI, LDAP, XPath, NoSQL and uploads. A per-value byte-class
//! scan skips values that contain no trigger characters, so benign values cost
//! one pass and no allocation.
//!
//! Wiring: `WafEngine::build(&cfg)?` gives an `Arc<WafEngine>` that implements
//! [`moat_core::RequestHeadersPhase`] (URL, query, cookies, headers: attacks
//! without a body are refused before any buffering) and
//! [`moat_core::RequestBodyPhase`] (parsed body types are buffered up to
//! `limits.max_body_bytes`).

#![warn(missing_docs)]

pub mod charset;
mod clean_cache;
pub mod config;
pub mod decode;
pub mod detect;
pub mod eval;
pub mod extract;
pub mod rawhttp;
pub mod triage;
pub mod util;
pub mod vpatch;

use std::net::IpAddr;
use std::sync::Arc;

use http::StatusCode;
use moat_core::{
    BodyNeed, EventAction, Reply, ReplyFormat, RequestBodyPhase, RequestCtx, RequestHeadersPhase,
    RouteMode, SecurityEvent, Verdict,
};

use charset::BodyText;
pub use config::{
    OnLimit, Sensitivity, VirtualPatches, WafConfig, WafExclusion, WafLimits, WafMode, WafRoute,
};
pub use detect::Attack;
pub use extract::{Finding, Loc};

use extract::{Inspector, Lim};

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum WafError {
    /// An `allowed_ips` entry is not an IP or CIDR.
    #[error("waf.allowed_ips[{index}]: `{value}` is not an IP address or CIDR")]
    BadCidr {
        /// Index in the list.
        index: usize,
        /// The offending text.
        value: String,
    },
    /// The status is not a valid HTTP status code.
    #[error("waf.status: {0} is not a valid HTTP status (100-599)")]
    BadStatus(u16),
    /// An exclusion names an unknown detector.
    #[error("waf.exclusions[{index}].detector: unknown detector `{name}` (known: {known})")]
    BadDetector {
        /// Index in the list.
        index: usize,
        /// The unknown name.
        name: String,
        /// Known names.
        known: String,
    },
    /// A virtual-patch rule file is invalid (file:line:column: field: message).
    #[error("waf.virtual_patches: {0}")]
    Patches(#[from] moat_config::ConfigError),
    /// A per-route status is invalid.
    #[error("waf.routes.{route}.status: {status} is not a valid HTTP status")]
    BadRouteStatus {
        /// Route name.
        route: String,
        /// The value.
        status: u16,
    },
}

/// An inspection limit (`waf.limits`, or a body moat could not decode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Limit {
    /// `limits.max_params`: more parameters than inspected.
    MaxParams,
    /// `limits.max_json_depth`: JSON nested deeper than inspected.
    MaxJsonDepth,
    /// `limits.max_body_bytes`: only a prefix of the body was inspected.
    MaxBodyBytes,
    /// `limits.max_decode_output`: the decoded body is larger than inspected.
    MaxDecodeOutput,
    /// The body's `Content-Encoding` is unsupported or its data corrupt.
    ContentEncoding,
    /// The body is in a text encoding the WAF does not read (an EBCDIC `charset`, an
    /// unknown label; see [`charset`]).
    Charset,
}

impl Limit {
    /// The name in events and reports (the config field, or `content_encoding`).
    pub fn name(self) -> &'static str {
        match self {
            Limit::MaxParams => "max_params",
            Limit::MaxJsonDepth => "max_json_depth",
            Limit::MaxBodyBytes => "max_body_bytes",
            Limit::MaxDecodeOutput => "max_decode_output",
            Limit::ContentEncoding => "content_encoding",
            Limit::Charset => "charset",
        }
    }

    /// The limit a body decoding failure hit.
    pub fn of_decode_error(e: &moat_core::DecodeError) -> Limit {
        match e {
            moat_core::DecodeError::TooLarge { .. } => Limit::MaxDecodeOutput,
            moat_core::DecodeError::Unsupported(_) | moat_core::DecodeError::Corrupt(_) => {
                Limit::ContentEncoding
            }
        }
    }
}

impl std::fmt::Display for Limit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A limit one request hit, and where.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LimitHit {
    /// Which limit.
    pub limit: Limit,
    /// Where it was hit (a location as in [`Finding::location`], e.g. `query` or `body`).
    pub location: String,
}

impl LimitHit {
    /// A hit of `limit` at `location`.
    pub fn new(limit: Limit, location: impl Into<String>) -> Self {
        LimitHit {
            limit,
            location: location.into(),
        }
    }
}

/// What [`WafEngine::inspect`] found in one request.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Findings {
    /// Findings after exclusions, strongest first.
    pub findings: Vec<Finding>,
    /// Limits hit (at most 8 are kept).
    pub limits: Vec<LimitHit>,
}

impl Findings {
    /// The strongest finding at or above `min_confidence`.
    pub fn strongest(&self, min_confidence: u8) -> Option<&Finding> {
        self.findings
            .iter()
            .filter(|f| f.confidence >= min_confidence && f.attack != Attack::Scanner)
            .max_by_key(|f| f.confidence)
    }
}

/// A borrowed view of a request head, independent of the `http` types so raw
/// requests (with bytes `http::Uri` refuses) can be inspected too.
#[derive(Debug, Clone)]
pub struct RequestView<'a> {
    /// Method.
    pub method: &'a str,
    /// Request target as received (`/path?query`, or absolute form).
    pub target: &'a [u8],
    /// Headers, names in any case.
    pub headers: ViewHeaders<'a>,
}

/// A [`RequestView`]'s headers: up to 16 (more than a browser sends) are held
/// inline, so a view of a request's parts costs no allocation.
pub type ViewHeaders<'a> = smallvec::SmallVec<[(&'a str, &'a [u8]); 16]>;

impl<'a> RequestView<'a> {
    /// A view of `http` request parts.
    pub fn from_parts(parts: &'a http::request::Parts) -> Self {
        let target = parts
            .uri
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/");
        RequestView {
            method: parts.method.as_str(),
            target: target.as_bytes(),
            headers: parts
                .headers
                .iter()
                .map(|(n, v)| (n.as_str(), v.as_bytes()))
                .collect(),
        }
    }

    /// First header named `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&'a [u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| *v)
    }
}

/// A request body ready for inspection (already content-decoded).
#[derive(Debug, Clone, Copy)]
pub struct BodyView<'a> {
    /// Decoded bytes.
    pub data: &'a [u8],
    /// True when only a prefix was received.
    pub truncated: bool,
}

struct Exclusion {
    route: Option<String>,
    path_prefix: Option<String>,
    location: Option<String>,
    field: Option<String>,
    detector: Option<String>,
    rule: Option<String>,
}

struct RouteSettings {
    mode: WafMode,
    enabled: bool,
    status: StatusCode,
}

/// The compiled WAF.
pub struct WafEngine {
    cfg: WafConfig,
    status: StatusCode,
    allowed: Vec<ipnet::IpNet>,
    exclusions: Vec<Exclusion>,
    routes: std::collections::HashMap<String, RouteSettings>,
    extra_headers: Vec<String>,
    /// Compiled virtual patches.
    patches: vpatch::PatchSet,
    /// Confidence a finding needs to block.
    threshold: u8,
    /// Distinguishes engines (configurations) in the per-thread clean-header memo.
    id: u64,
}

/// The header fields inspected whatever `inspect_all_headers` says: the ones attacks
/// arrive in that backends log and echo.
const ALWAYS_INSPECTED: [&str; 4] = ["user-agent", "referer", "x-forwarded-for", "origin"];

/// Source of [`WafEngine`] ids.
static NEXT_ENGINE_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl std::fmt::Debug for WafEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WafEngine").field("cfg", &self.cfg).finish()
    }
}

/// Parses `a.b.c.d`, `a.b.c.d/n`, IPv6 forms.
fn parse_net(s: &str) -> Option<ipnet::IpNet> {
    let s = s.trim();
    if let Ok(n) = s.parse::<ipnet::IpNet>() {
        return Some(n);
    }
    s.parse::<IpAddr>().ok().map(ipnet::IpNet::from)
}

/// `*` wildcard match; a pattern without `*` matches as a prefix.
fn glob(pattern: &str, text: &str) -> bool {
    if !pattern.contains('*') {
        return text.starts_with(pattern);
    }
    let parts: Vec<&str> = pattern.split('*').collect();
    let mut pos = 0;
    for (i, p) in parts.iter().enumerate() {
        if p.is_empty() {
            continue;
        }
        if i == 0 {
            if !text.starts_with(p) {
                return false;
            }
            pos = p.len();
        } else if i == parts.len() - 1 {
            return text.len() >= pos + p.len() && text[pos..].ends_with(p);
        } else {
            match text[pos..].find(p) {
                Some(x) => pos += x + p.len(),
                None => return false,
            }
        }
    }
    true
}

impl WafEngine {
    /// Validates and compiles a configuration; virtual-patch files resolve
    /// against the current directory.
    pub fn build(cfg: &WafConfig) -> Result<Arc<WafEngine>, WafError> {
        Self::build_with_base(cfg, std::path::Path::new("."))
    }

    /// Validates and compiles a configuration; relative virtual-patch files
    /// resolve against `base` (the directory of the config file).
    pub fn build_with_base(
        cfg: &WafConfig,
        base: &std::path::Path,
    ) -> Result<Arc<WafEngine>, WafError> {
        let status =
            StatusCode::from_u16(cfg.status).map_err(|_| WafError::BadStatus(cfg.status))?;
        let mut allowed = Vec::new();
        for (index, v) in cfg.allowed_ips.iter().enumerate() {
            allowed.push(parse_net(v).ok_or_else(|| WafError::BadCidr {
                index,
                value: v.clone(),
            })?);
        }
        let known: Vec<&str> = Attack::ALL.iter().map(|a| a.name()).collect();
        let mut exclusions = Vec::new();
        for (index, e) in cfg.exclusions.iter().enumerate() {
            if let Some(d) = &e.detector {
                if d != "*" && !known.contains(&d.as_str()) {
                    return Err(WafError::BadDetector {
                        index,
                        name: d.clone(),
                        known: known.join(", "),
                    });
                }
            }
            exclusions.push(Exclusion {
                route: e.route.clone().filter(|r| r != "*"),
                path_prefix: e.path_prefix.clone().filter(|p| !p.is_empty() && p != "/"),
                location: e.location.clone().filter(|l| l != "*"),
                field: e.field.clone().filter(|f| f != "*"),
                detector: e.detector.clone().filter(|d| d != "*"),
                rule: e.rule.clone().filter(|r| r != "*"),
            });
        }
        let mut routes = std::collections::HashMap::new();
        for (name, r) in &cfg.routes {
            let st = match r.status {
                Some(s) => StatusCode::from_u16(s).map_err(|_| WafError::BadRouteStatus {
                    route: name.clone(),
                    status: s,
                })?,
                None => status,
            };
            routes.insert(
                name.clone(),
                RouteSettings {
                    mode: r.mode.unwrap_or(cfg.mode),
                    enabled: r.enabled.unwrap_or(true),
                    status: st,
                },
            );
        }
        let patches = vpatch::PatchSet::load(&cfg.virtual_patches, base)?;
        Ok(Arc::new(WafEngine {
            patches,
            threshold: cfg
                .block_confidence
                .unwrap_or_else(|| cfg.sensitivity.block_confidence()),
            cfg: cfg.clone(),
            status,
            allowed,
            exclusions,
            routes,
            extra_headers: cfg
                .extra_headers
                .iter()
                .map(|h| h.to_ascii_lowercase())
                .collect(),
            id: NEXT_ENGINE_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        }))
    }

    /// The configuration this engine was built from.
    pub fn config(&self) -> &WafConfig {
        &self.cfg
    }

    /// The compiled virtual patches.
    pub fn patches(&self) -> &vpatch::PatchSet {
        &self.patches
    }

    /// Confidence a finding needs to block (`block_confidence` or the sensitivity's).
    pub fn block_threshold(&self) -> u8 {
        self.threshold
    }

    fn excluded(
        &self,
        route: &str,
        path: &[u8],
        attack: Attack,
        rule: Option<&str>,
        location: &str,
    ) -> bool {
        self.exclusions.iter().any(|e| {
            e.route.as_deref().is_none_or(|r| r == route)
                && e.path_prefix
                    .as_deref()
                    .is_none_or(|p| path.starts_with(p.as_bytes()))
                && e.detector.as_deref().is_none_or(|d| d == attack.name())
                && e.rule.as_deref().is_none_or(|r| Some(r) == rule)
                && e.location.as_deref().is_none_or(|l| glob(l, location))
                && e.field
                    .as_deref()
                    .is_none_or(|f| triage::field_of(location) == Some(f))
        })
    }

    fn policy(&self) -> extract::Policy {
        extract::Policy {
            code_penalty: self.cfg.sensitivity.code_penalty(),
            beacon_penalty: self.cfg.sensitivity.beacon_penalty(),
        }
    }

    /// Runs the virtual patches of `phase` and reports their hits.
    fn run_patches(
        &self,
        ins: &mut Inspector<'_>,
        req: &RequestView<'_>,
        body: Option<&[u8]>,
        phase: vpatch::Phase,
    ) {
        if self.patches.is_empty() {
            return;
        }
        let data = vpatch::ReqData::new(req.method, target_path(req.target), &req.headers, body);
        let facts = std::mem::take(&mut ins.facts);
        self.patches
            .check(&data, &facts, phase, &mut |h| ins.report_rule(h));
    }

    fn lim(&self) -> Lim {
        Lim {
            max_params: self.cfg.limits.max_params,
            max_depth: self.cfg.limits.max_json_depth,
        }
    }

    fn inspect_head(&self, ins: &mut Inspector<'_>, req: &RequestView<'_>) {
        // absolute-form: drop scheme://authority
        let target = target_path(req.target);
        let (path, query) = match memchr::memchr(b'?', target) {
            Some(q) => (&target[..q], Some(&target[q + 1..])),
            None => (target, None),
        };
        let path = match memchr::memchr(b'#', path) {
            Some(h) => &path[..h],
            None => path,
        };
        ins.path(path);
        if let Some(q) = query {
            ins.urlencoded(q, false);
        }
        self.inspect_fields(ins, req.headers.iter().copied());
    }

    /// The header fields the WAF reads (cookies, the fields attacks arrive in, and
    /// those the config adds), in any case.
    fn inspect_fields<'a>(
        &self,
        ins: &mut Inspector<'_>,
        fields: impl Iterator<Item = (&'a str, &'a [u8])>,
    ) {
        for (name, value) in fields {
            let lname_buf;
            let lname: &str = if name.bytes().any(|c| c.is_ascii_uppercase()) {
                lname_buf = name.to_ascii_lowercase();
                &lname_buf
            } else {
                name
            };
            match lname {
                // converted to text only for headers that are inspected
                "cookie" => ins.cookies(&crate::util::lossy(value)),
                "content-length" | "host" | "authorization" | "connection" => {}
                n if ALWAYS_INSPECTED.contains(&n) => ins.header(lname, value),
                other => {
                    if self.cfg.inspect_all_headers || self.extra_headers.iter().any(|h| h == other)
                    {
                        ins.header(lname, value)
                    }
                }
            }
        }
    }

    fn inspect_body(&self, ins: &mut Inspector<'_>, req: &RequestView<'_>, body: BodyView<'_>) {
        if body.truncated {
            ins.limit(Limit::MaxBodyBytes, Loc::Body);
        }
        let data = body.data;
        if data.is_empty() {
            return;
        }
        let ct: &[u8] = req.header("content-type").unwrap_or_default();
        let kind = declared(ct);
        // The encoding a backend reads the body in (charset.rs): what its bytes show (a
        // byte order mark, NULs beside its first ASCII characters, an XML declaration)
        // and what `Content-Type` declares. A text shown in UTF-16/32 by a mark, or by
        // NULs in JSON and XML (the rule their parsers apply), is read transcoded; shown
        // by NULs elsewhere, or only declared, it is read both ways, as a backend may go
        // either way. Anything unreadable is the `charset` limit.
        let is = |needle: &[u8]| util::contains_ci(ct, needle);
        let bom = charset::of_bom(data);
        let (shown, sure) = match bom {
            Some((text, _)) => (Some(text), true),
            None => match charset::of_nuls(data) {
                Some(text) => (Some(text), is(b"json") || is(b"xml")),
                None if matches!(
                    data.first(),
                    Some(b'<' | 0x4C | b' ' | b'\t' | b'\r' | b'\n')
                ) && (ct.is_empty() || is(b"xml")) =>
                {
                    (charset::of_xml(data), true)
                }
                None => (None, true),
            },
        };
        let declared = charset::declared(ct).map(charset::of_label);
        let (text, also_bytes) = match (shown, declared) {
            (Some(BodyText::Unreadable), _) | (_, Some(BodyText::Unreadable)) => {
                ins.limit(Limit::Charset, Loc::Body);
                return;
            }
            (Some(text), _) if text != BodyText::Bytes => (text, !sure),
            (_, Some(text)) => (text, true),
            _ => (BodyText::Bytes, false),
        };
        let data = &data[bom.map_or(0, |(_, len)| len)..];
        match charset::to_utf8(data, text) {
            Some(utf8) => {
                self.inspect_body_text(ins, ct, kind, utf8.as_bytes());
                if also_bytes {
                    self.inspect_body_text(ins, ct, kind, data);
                }
            }
            None => self.inspect_body_text(ins, ct, kind, data),
        }
    }

    /// Inspects a body read as ASCII-compatible text, parsed by its `Content-Type` `ct`
    /// (of the [`Declared`] `kind`).
    fn inspect_body_text(&self, ins: &mut Inspector<'_>, ct: &[u8], kind: Declared, data: &[u8]) {
        // serialized Java objects posted raw (application/x-java-serialized-object), under
        // any type
        if data.starts_with(&[0xAC, 0xED, 0x00, 0x05]) {
            ins.report_hit(
                Loc::Body,
                detect::Hit::new(Attack::Deserialization, 90, "\u{AC}\u{ED}\0\u{5}", 0, 4),
            );
            return;
        }
        let ct = match kind {
            Declared::Document => ct,
            // A body declared binary whose first bytes are text is read as one with no type.
            Declared::Binary if !moat_core::starts_binary(data) => &b""[..],
            Declared::Binary | Declared::Framed => return,
        };
        // matched case-insensitively in place: no lowercased copy per request
        let has = |needle: &[u8]| util::contains_ci(ct, needle);
        let first = data.iter().find(|b| !b.is_ascii_whitespace()).copied();
        if has(b"multipart/") {
            let boundaries = boundaries(ct);
            if !boundaries.is_empty() {
                // A type naming two boundaries is read with each: parsers differ on
                // which one counts.
                for b in &boundaries {
                    ins.multipart(data, b);
                }
                return;
            }
        }
        if has(b"json") || (ct.is_empty() && matches!(first, Some(b'{' | b'['))) {
            ins.beacon = data.len() >= extract::BEACON_BYTES;
            if ins.json(data, Loc::Json(""), 0) {
                return;
            }
            ins.beacon = false;
        }
        if has(b"xml") || (ct.is_empty() && first == Some(b'<')) {
            ins.xml(data);
            if ct.is_empty() {
                let s = crate::util::lossy(data);
                ins.value(Loc::Body, &s, detect::Scope::Body);
            }
            return;
        }
        if has(b"x-www-form-urlencoded") {
            ins.urlencoded(data, true);
            return;
        }
        // JSON sent as text (navigator.sendBeacon posts text/plain): walked as JSON
        if matches!(first, Some(b'{' | b'[')) {
            ins.beacon = data.len() >= extract::BEACON_BYTES;
            if ins.json(data, Loc::Json(""), 0) {
                return;
            }
            ins.beacon = false;
        }
        // unknown or text: a urlencoded-looking body is a form, anything else one value
        let s = crate::util::lossy(data);
        let looks_form = !s.contains(['\n', ' ']) && s.contains('=');
        if looks_form {
            ins.urlencoded(data, true);
        } else {
            ins.value(Loc::Body, &s, detect::Scope::Body);
        }
    }

    fn filter<'f>(
        &'f self,
        route: &'f str,
        req: &'f RequestView<'_>,
    ) -> impl Fn(Attack, Option<&str>, &str) -> bool + 'f {
        let target = target_path(req.target);
        let path = match memchr::memchr(b'?', target) {
            Some(q) => &target[..q],
            None => target,
        };
        move |a: Attack, rule: Option<&str>, loc: &str| !self.excluded(route, path, a, rule, loc)
    }

    fn finish(&self, ins: Inspector<'_>) -> Findings {
        let mut findings = ins.findings;
        findings.sort_by_key(|f| std::cmp::Reverse(f.confidence));
        Findings {
            findings,
            limits: ins.limits,
        }
    }

    /// Inspects a whole request (head and optional decoded body) on `route`.
    /// Pure: no events, no mode; exclusions for `route` are applied.
    pub fn inspect(
        &self,
        route: &str,
        req: &RequestView<'_>,
        body: Option<BodyView<'_>>,
    ) -> Findings {
        let filter = self.filter(route, req);
        let mut ins = Inspector::new(self.lim(), self.id, &filter, self.policy());
        ins.patches = Some(&self.patches);
        self.inspect_head(&mut ins, req);
        match body {
            Some(b) => {
                self.inspect_body(&mut ins, req, b);
                self.run_patches(&mut ins, req, Some(b.data), vpatch::Phase::All);
            }
            None => self.run_patches(&mut ins, req, None, vpatch::Phase::Head),
        }
        self.finish(ins)
    }

    /// Inspects only the head (URL, query, cookies, headers).
    pub fn inspect_headers(&self, route: &str, req: &RequestView<'_>) -> Findings {
        self.inspect(route, req, None)
    }

    /// Inspects the trailer fields that ended a request's body as header fields: a
    /// backend that merges trailers into its header section reads them as such.
    pub fn inspect_trailers(
        &self,
        route: &str,
        req: &RequestView<'_>,
        trailers: &http::HeaderMap,
    ) -> Findings {
        let filter = self.filter(route, req);
        let mut ins = Inspector::new(self.lim(), self.id, &filter, self.policy());
        self.inspect_fields(
            &mut ins,
            trailers.iter().map(|(n, v)| (n.as_str(), v.as_bytes())),
        );
        self.finish(ins)
    }

    /// Inspects only a body.
    pub fn inspect_body_only(
        &self,
        route: &str,
        req: &RequestView<'_>,
        body: BodyView<'_>,
    ) -> Findings {
        let filter = self.filter(route, req);
        let mut ins = Inspector::new(self.lim(), self.id, &filter, self.policy());
        ins.patches = Some(&self.patches);
        self.inspect_body(&mut ins, req, body);
        if !body.data.is_empty() {
            let t = target_path(req.target);
            if let Some(q) = memchr::memchr(b'?', t) {
                ins.observe_query(&t[q + 1..]);
            }
            self.run_patches(&mut ins, req, Some(body.data), vpatch::Phase::Body);
        }
        self.finish(ins)
    }

    /// True when the verdict for these findings (ignoring mode) is "block":
    /// a finding at or above `block_confidence`, or a limit with `on_limit: block`.
    pub fn would_block(&self, f: &Findings) -> bool {
        f.strongest(self.threshold).is_some()
            || (!f.limits.is_empty() && self.cfg.limits.on_limit == OnLimit::Block)
    }

    /// The WAF's mode on this request, decided once (with the head) and kept in the
    /// request's WAF slot for the body phase.
    fn route_mode(&self, ctx: &mut RequestCtx) -> RouteMode {
        let mode = self.route_mode_of(ctx);
        ctx.slots.waf = Some(mode);
        mode
    }

    /// [`route_mode`](Self::route_mode) for a phase that cannot write the slot
    /// (`body_need`): the slot when set, else decided again.
    fn route_mode_of(&self, ctx: &RequestCtx) -> RouteMode {
        ctx.slots.waf.unwrap_or_else(|| self.decide_mode(ctx))
    }

    fn decide_mode(&self, ctx: &RequestCtx) -> RouteMode {
        if !self.cfg.enabled || self.allowed.iter().any(|n| n.contains(&ctx.client_ip)) {
            return RouteMode::Off;
        }
        let (mode, status) = match self.routes.get(&*ctx.route) {
            Some(r) if !r.enabled => return RouteMode::Off,
            Some(r) => (r.mode, r.status),
            None => (self.cfg.mode, self.status),
        };
        match mode {
            WafMode::Block if !ctx.monitor_only => RouteMode::Enforce(status),
            _ => RouteMode::Monitor,
        }
    }

    /// Turns findings into events on `ctx` and a verdict.
    fn decide(
        &self,
        ctx: &mut RequestCtx,
        req: &http::request::Parts,
        f: Findings,
        mode: RouteMode,
    ) -> Verdict {
        let (blocking, status) = match mode {
            RouteMode::Enforce(status) => (true, status),
            _ => (false, self.status),
        };
        let mut block_event: Option<String> = None;
        for hit in &f.limits {
            let block = self.cfg.limits.on_limit == OnLimit::Block;
            let action = if block && blocking {
                EventAction::Block
            } else if block {
                EventAction::Monitor
            } else {
                EventAction::Bypass
            };
            let ev = SecurityEvent::new(
                "waf",
                "limit",
                action,
                format!("inspection limit `{}` exceeded", hit.limit),
            )
            .at(hit.location.clone())
            .with_details(serde_json::json!({ "limit": hit.limit }));
            if action == EventAction::Block && block_event.is_none() {
                block_event = Some(ev.id.clone());
            }
            ctx.events.push(ev);
        }
        for finding in f.findings.iter().take(8) {
            let strong = finding.confidence >= self.threshold && finding.attack != Attack::Scanner;
            let action = if strong && blocking {
                EventAction::Block
            } else {
                EventAction::Monitor
            };
            let what = finding.rule.as_deref().unwrap_or(finding.attack.name());
            let ev = SecurityEvent::new(
                "waf",
                what,
                action,
                format!("{what} detected in {}", finding.location),
            )
            .at(finding.location.clone())
            .with_details(triage::event_details(finding));
            if action == EventAction::Block && block_event.is_none() {
                block_event = Some(ev.id.clone());
            }
            ctx.events.push(ev);
        }
        match block_event {
            Some(id) => {
                let format = ReplyFormat::from_accept(req.headers.get(http::header::ACCEPT));
                Verdict::Respond(Reply::page(
                    status,
                    format,
                    "Request blocked",
                    &ctx.request_id,
                    Some(&id),
                ))
            }
            None => Verdict::Continue,
        }
    }

    /// How this request's body is read, by its declared type. One without a type is a
    /// document: a backend may read it as anything. (Whether there is a body at all is
    /// the proxy's to know: an HTTP/2 request announces one by its framing, with no
    /// field saying so.)
    fn declared_body(req: &http::request::Parts) -> Declared {
        req.headers
            .get(http::header::CONTENT_TYPE)
            .map_or(Declared::Document, |ct| declared(ct.as_bytes()))
    }
}

/// The origin-form part of a request target (absolute-form scheme and authority dropped).
fn target_path(target: &[u8]) -> &[u8] {
    if target.first() == Some(&b'/') {
        return target;
    }
    match memchr::memmem::find(target, b"://") {
        Some(p) if target.first() != Some(&b'/') => {
            let rest = &target[p + 3..];
            let s = rest
                .iter()
                .position(|&c| c == b'/' || c == b'?')
                .unwrap_or(rest.len());
            &rest[s..]
        }
        _ => target,
    }
}

/// How the WAF reads a request body, by its declared type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Declared {
    /// A document (JSON, XML, a form, multipart, text) or no type at all: parsed.
    Document,
    /// `image/*`, `video/*`, `audio/*` or an octet stream: read as an untyped document
    /// when its first bytes are text ([`moat_core::starts_binary`]), since a backend may
    /// parse it whatever its type (Go's `json.NewDecoder(r.Body)`, Flask's
    /// `get_json(force=True)`); streamed unread when they are binary, as uploads are.
    Binary,
    /// Protobuf or gRPC: framed binary messages, streamed unread (a gRPC stream is not
    /// held back to wait for its end).
    Framed,
}

/// The [`Declared`] kind of a `Content-Type` (case-insensitive). Only the media type
/// counts, not its parameters: a JSON body labelled `application/json; x=octet-stream`
/// is a document. (Matching the whole header also cost 750 instructions a request,
/// restarting the search at each `o` and `p` of `application/json`.)
fn declared(ct: &[u8]) -> Declared {
    // Byte loops, not `memchr` or `find_ci`: a media type is a few bytes, and their
    // set-up cost more than the search (callgrind, the peer's JSON POST: this is
    // called three times a request).
    let media = match ct.iter().position(|&c| c == b';') {
        Some(p) => &ct[..p],
        None => ct,
    }
    .trim_ascii();
    let (ty, sub) = match media.iter().position(|&c| c == b'/') {
        Some(p) => (&media[..p], &media[p + 1..]),
        None => (media, &b""[..]),
    };
    let sub_names = |name: &[u8]| {
        sub.len() >= name.len()
            && sub
                .windows(name.len())
                .any(|w| w.eq_ignore_ascii_case(name))
    };
    let kind = if sub_names(b"protobuf") || sub_names(b"grpc") {
        Declared::Framed
    } else if [&b"image"[..], b"video", b"audio"]
        .iter()
        .any(|t| ty.eq_ignore_ascii_case(t))
        || sub_names(b"octet-stream")
    {
        Declared::Binary
    } else {
        return Declared::Document;
    };
    // A type the body parsers read as structured text is a document, whatever else it
    // names: Spring reads `application/octet-stream+json` as JSON (`application/*+json`),
    // and `inspect_body_text` finds its parser by these names anywhere in the field.
    // (Looked for only in a type that names a binary one: most name none.)
    if [
        &b"json"[..],
        b"xml",
        b"multipart/",
        b"x-www-form-urlencoded",
    ]
    .iter()
    .any(|n| util::contains_ci(ct, n))
    {
        Declared::Document
    } else {
        kind
    }
}

/// The distinct `boundary` parameters of a multipart `Content-Type` (one, unless the
/// client sent an ambiguous type), their case preserved.
fn boundaries(ct: &[u8]) -> Vec<String> {
    let orig = String::from_utf8_lossy(ct);
    // Lowercasing ASCII keeps every byte where it was.
    let lower = orig.to_ascii_lowercase();
    let mut out: Vec<String> = Vec::new();
    for (at, _) in lower.match_indices("boundary=") {
        let raw = &orig[at + 9..];
        let raw = raw.split(';').next().unwrap_or(raw).trim();
        let b = raw.trim_matches('"');
        if !b.is_empty() && b.len() <= 200 && !out.iter().any(|o| o == b) {
            out.push(b.to_string());
        }
    }
    out
}

impl RequestHeadersPhase for WafEngine {
    fn name(&self) -> &'static str {
        "waf"
    }

    /// Without `inspect_all_headers`, the fields inspected: a CGI-style backend would
    /// read a client's `user_agent` as the `User-Agent` the WAF inspected, and the twin
    /// itself would go uninspected. With it (the default), a twin is inspected as a
    /// field of its own; virtual patches name fields of products that read them by
    /// their exact names, so theirs are not listed.
    fn fields_decided_on(&self) -> Vec<http::HeaderName> {
        if self.cfg.inspect_all_headers {
            return Vec::new();
        }
        ALWAYS_INSPECTED
            .into_iter()
            .chain(self.extra_headers.iter().map(String::as_str))
            .filter_map(|n| http::HeaderName::from_bytes(n.as_bytes()).ok())
            .collect()
    }

    fn on_request_headers(&self, ctx: &mut RequestCtx, req: &mut http::request::Parts) -> Verdict {
        let mode = self.route_mode(ctx);
        if mode == RouteMode::Off {
            return Verdict::Continue;
        }
        let view = RequestView::from_parts(req);
        let f = self.inspect_headers(&ctx.route, &view);
        if f.findings.is_empty() && f.limits.is_empty() {
            return Verdict::Continue;
        }
        self.decide(ctx, req, f, mode)
    }
}

impl RequestBodyPhase for WafEngine {
    fn name(&self) -> &'static str {
        "waf"
    }

    fn body_need(&self, ctx: &RequestCtx, req: &http::request::Parts) -> BodyNeed {
        if self.route_mode_of(ctx) == RouteMode::Off {
            return BodyNeed::None;
        }
        let limit = usize::try_from(self.cfg.limits.max_body_bytes).unwrap_or(usize::MAX);
        match Self::declared_body(req) {
            Declared::Document => BodyNeed::Buffer(limit),
            // Whether an encoded body is text shows once it is decoded.
            Declared::Binary if req.headers.contains_key(http::header::CONTENT_ENCODING) => {
                BodyNeed::Buffer(limit)
            }
            Declared::Binary => BodyNeed::BufferText(limit),
            Declared::Framed => BodyNeed::None,
        }
    }

    fn on_request_body(
        &self,
        ctx: &mut RequestCtx,
        req: &mut http::request::Parts,
        body: &mut moat_core::Body,
    ) -> Verdict {
        let mode = self.route_mode(ctx);
        // Another phase may have had a body buffered that the WAF does not read (a
        // binary upload, for secret detection): it is read no more than when streamed,
        // and its truncation is no limit of the WAF's.
        let declared = Self::declared_body(req);
        if mode == RouteMode::Off || declared == Declared::Framed {
            return Verdict::Continue;
        }
        let view = RequestView::from_parts(req);
        let f = match body.decoded() {
            Ok(data) if declared == Declared::Binary && moat_core::starts_binary(data) => {
                return Verdict::Continue;
            }
            Ok(data) => {
                let over = data.len() as u64 > self.cfg.limits.max_decode_output;
                let data = if over {
                    &data
                        [..usize::try_from(self.cfg.limits.max_decode_output).unwrap_or(usize::MAX)]
                } else {
                    &data[..]
                };
                let mut f = self.inspect_body_only(
                    &ctx.route,
                    &view,
                    BodyView {
                        data,
                        truncated: body.truncated(),
                    },
                );
                if over {
                    f.limits
                        .push(LimitHit::new(Limit::MaxDecodeOutput, Loc::Body.to_string()));
                }
                f
            }
            Err(e) => Findings {
                findings: Vec::new(),
                limits: vec![LimitHit::new(
                    Limit::of_decode_error(e),
                    Loc::Body.to_string(),
                )],
            },
        };
        if f.findings.is_empty() && f.limits.is_empty() {
            return Verdict::Continue;
        }
        self.decide(ctx, req, f, mode)
    }

    fn inspects_trailers(&self, ctx: &RequestCtx) -> bool {
        self.route_mode_of(ctx) != RouteMode::Off
    }

    fn on_request_trailers(
        &self,
        ctx: &mut RequestCtx,
        req: &mut http::request::Parts,
        trailers: &http::HeaderMap,
    ) -> Verdict {
        let mode = self.route_mode(ctx);
        if mode == RouteMode::Off {
            return Verdict::Continue;
        }
        let view = RequestView::from_parts(req);
        let f = self.inspect_trailers(&ctx.route, &view, trailers);
        if f.findings.is_empty() && f.limits.is_empty() {
            return Verdict::Continue;
        }
        self.decide(ctx, req, f, mode)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn declared_body_kinds() {
        for (ct, kind) in [
            ("application/octet-stream", Declared::Binary),
            ("Image/PNG", Declared::Binary),
            ("video/mp4", Declared::Binary),
            ("audio/ogg; codecs=opus", Declared::Binary),
            (" application/OCTET-STREAM ", Declared::Binary),
            ("application/x-protobuf", Declared::Framed),
            ("application/grpc+proto", Declared::Framed),
            (
                "application/vnd.google.protobuf; proto=x.Y",
                Declared::Framed,
            ),
            ("application/grpc-web", Declared::Framed),
        ] {
            assert_eq!(declared(ct.as_bytes()), kind, "{ct}");
        }
        for ct in [
            "application/json",
            "application/json; x=octet-stream",
            "text/plain; charset=grpc",
            "multipart/form-data; boundary=image/",
            "application/x-www-form-urlencoded",
            "imagex/png",
            "application/octet-stream+json",
            "application/vnd.google.protobuf+json",
            "application/grpc+xml",
            "image/svg+xml",
            "application/octet-stream; format=json",
            "",
        ] {
            assert_eq!(declared(ct.as_bytes()), Declared::Document, "{ct}");
        }
    }

    #[test]
    fn glob_matches() {
        assert!(glob("query:q", "query:q"));
        assert!(glob("json:/comment/*", "json:/comment/0/text"));
        assert!(glob("header:*", "header:user-agent"));
        assert!(!glob("json:/a/*/b", "json:/a/x/c"));
        assert!(glob("json:/a/*/b", "json:/a/x/b"));
    }

    #[test]
    fn build_validates() {
        let mut c = WafConfig {
            allowed_ips: vec!["10.0.0.0/8".into(), "::1".into()],
            ..Default::default()
        };
        assert!(WafEngine::build(&c).is_ok());
        c.allowed_ips = vec!["nope".into()];
        assert!(WafEngine::build(&c).is_err());
        let c = WafConfig {
            status: 42,
            ..Default::default()
        };
        assert!(WafEngine::build(&c).is_err());
        let c = WafConfig {
            exclusions: vec![WafExclusion {
                detector: Some("sqlx".into()),
                ..Default::default()
            }],
            ..Default::default()
        };
        assert!(WafEngine::build(&c).is_err());
    }
}
