//! Request attributes as policies see them, path normalization and X-Forwarded-For.

use std::borrow::Cow;
use std::net::IpAddr;
use std::sync::LazyLock;

use http::HeaderMap;
use memchr::memmem;
use serde::{Deserialize, Serialize};

use crate::jwt::VerifiedJwt;

/// The verified client certificate as policies see it.
#[derive(Debug, Clone, Copy)]
pub struct PeerView<'a> {
    /// Every URI SAN of the certificate, with scheme (`spiffe://td/ns/N/sa/S`).
    pub uris: &'a [String],
}

/// Borrowed request attributes evaluated by rules.
#[derive(Debug, Clone, Copy)]
pub struct Attrs<'a> {
    /// `:authority` / `Host`, as sent (port included when sent).
    pub host: &'a str,
    /// `:method`.
    pub method: &'a str,
    /// Normalized path without query (what `paths` match).
    pub path: &'a str,
    /// Path and query as received (`:path` for header conditions).
    pub raw_path: &'a str,
    /// Request headers.
    pub headers: &'a HeaderMap,
    /// Destination (local) port.
    pub port: Option<u16>,
    /// TCP peer address (`source.ip`, `ipBlocks`); `None` when unknown.
    pub source_ip: Option<IpAddr>,
    /// Original client address (`remote.ip`, `remoteIpBlocks`); `None` when unknown.
    pub remote_ip: Option<IpAddr>,
    /// Local address (`destination.ip`).
    pub dest_ip: Option<IpAddr>,
    /// TLS SNI (`connection.sni`).
    pub sni: Option<&'a str>,
    /// Verified client certificate; `None` for plaintext (or when mTLS is DISABLEd).
    pub peer: Option<PeerView<'a>>,
    /// Verified JWT.
    pub jwt: Option<&'a VerifiedJwt>,
    /// The host without its port and trailing dot, which a negated host condition
    /// (`notHosts`, a `notValues` on `:authority` or `host`) must not match either: set
    /// while ALLOW policies are matched under `host_port: both` ([`HostPort`]), `None`
    /// otherwise.
    pub bare_host: Option<&'a str>,
}

impl<'a> Attrs<'a> {
    /// URI SANs of the peer certificate (empty for plaintext).
    pub fn peer_uris(&self) -> impl Iterator<Item = &'a str> + 'a {
        self.peer
            .map(|p| p.uris)
            .unwrap_or(&[])
            .iter()
            .map(|s| s.as_str())
    }

    /// Value of a header for `request.headers[name]` (name lowercase): repeated headers are
    /// joined with `,`; `:authority`/`host`, `:method` and `:path` are the pseudo-headers.
    pub fn header(&self, name: &str) -> Option<Cow<'a, str>> {
        match name {
            ":authority" | "host" => return Some(Cow::Borrowed(self.host)),
            ":method" => return Some(Cow::Borrowed(self.method)),
            ":path" => return Some(Cow::Borrowed(self.raw_path)),
            _ => {}
        }
        header_joined(self.headers, name)
    }
}

/// The values of header `name` joined with `,` (Envoy's view of repeated headers).
pub fn header_joined<'h>(headers: &'h HeaderMap, name: &str) -> Option<Cow<'h, str>> {
    let mut it = headers.get_all(name).iter();
    let first = it.next()?;
    let first_s = String::from_utf8_lossy(first.as_bytes());
    match it.next() {
        None => Some(first_s),
        Some(second) => {
            let mut s = first_s.into_owned();
            s.push(',');
            s.push_str(&String::from_utf8_lossy(second.as_bytes()));
            for v in it {
                s.push(',');
                s.push_str(&String::from_utf8_lossy(v.as_bytes()));
            }
            Some(Cow::Owned(s))
        }
    }
}

/// Istio's mesh `pathNormalization` options.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PathNormalization {
    /// Paths are matched as received (query removed).
    #[serde(alias = "NONE")]
    None,
    /// RFC 3986 dot-segment removal, `\` to `/`, decoding of unreserved `%HH` (the default).
    #[default]
    #[serde(alias = "BASE")]
    Base,
    /// `base`, then `//` merged into `/`.
    #[serde(alias = "MERGE_SLASHES")]
    MergeSlashes,
    /// `%2F`/`%5C` decoded first, then `base`, then slashes merged.
    #[serde(alias = "DECODE_AND_MERGE_SLASHES")]
    DecodeAndMergeSlashes,
}

/// How policies read a path whose segments carry `;` parameters (`/a;jsessionid=1/b`).
///
/// RFC 3986 leaves parameters to the scheme; Envoy and Istio match them as part of the
/// segment, while servlet containers (Tomcat, Jetty) and Spring remove them before
/// routing, so `/admin;x` reaches the `/admin` handler and `/public/..;/admin` resolves
/// to `/admin` (istio/istio#27409: a DENY on `/admin` or an ALLOW on `/public/*` is
/// passed that way).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PathParameters {
    /// A request is allowed only when the policies allow its path both ways: as
    /// normalized, and with every segment's parameters removed and the dot segments that
    /// leaves resolved (the default). Paths without `;` are matched once.
    #[default]
    Both,
    /// Parameters are part of the segment, as Envoy and Istio match them.
    AsReceived,
}

/// How policies read a request that names another method in a method-override field
/// (`X-HTTP-Method-Override: DELETE` on a POST) or a `_method` query parameter.
///
/// Envoy and Istio match the method on the request line only, while Symfony and Laravel,
/// Express's `method-override`, ASP.NET and others route such a request as the method
/// it names: a DENY on `DELETE` or an ALLOW of `GET` only is passed that way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MethodOverrides {
    /// A request is allowed only when the policies allow it with its own method and
    /// with each method it names as an override (the default). Requests that name none
    /// are matched once.
    #[default]
    Both,
    /// The method on the request line only, as Envoy and Istio match it.
    AsReceived,
}

/// Whether DENY policies read the host without its port and trailing dot too.
///
/// `hosts` match the authority as sent, port included (Istio's semantics), while
/// virtual-host routing ignores the port (moat's routes, Istio's gateways since 1.15,
/// nginx's `server_name`) and the trailing dot of a fully qualified name: a DENY on
/// `admin.example.com` is passed by `Host: admin.example.com:443`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HostPort {
    /// A DENY policy that matches the host without its port (or trailing dot) denies
    /// (the default). ALLOW policies match the host as sent, so a port an ALLOW
    /// policy does not list still fails closed, as in Istio.
    #[default]
    Both,
    /// The host as sent only, as Envoy and Istio match it.
    AsReceived,
}

/// `host` as virtual-host routing reads it: without its port and its trailing dot.
/// `None` when that changes nothing.
pub fn bare_host(host: &str) -> Option<&str> {
    let bare = moat_core::strip_port(host);
    let bare = bare.strip_suffix('.').unwrap_or(bare);
    (bare.len() != host.len()).then_some(bare)
}

/// The header fields frameworks take a method override from.
pub const METHOD_OVERRIDE_FIELDS: [&str; 3] = [
    "x-http-method-override",
    "x-http-method",
    "x-method-override",
];

/// Most distinct methods a request may name as overrides: each is a second decision,
/// so a request naming more is refused (400) instead of costing one decision each.
pub const MAX_METHOD_OVERRIDES: usize = 4;

/// Why the method overrides of a request were refused (the gateway answers 400).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TooManyOverrides;

/// The methods other than `method` that a request names as overrides, upper-cased (as
/// the frameworks read them), each once: every comma-separated item of every
/// [`METHOD_OVERRIDE_FIELDS`] field and every `_method` query parameter (however its name
/// is encoded). Items that are no method token are left out, as the frameworks refuse
/// them.
pub fn method_overrides(
    method: &str,
    headers: &HeaderMap,
    query: Option<&str>,
) -> Result<Vec<String>, TooManyOverrides> {
    let mut named = Named {
        method,
        methods: Vec::new(),
    };
    // One pass over the fields: cheaper than a hashed lookup of each name on every
    // request, nearly all of which have none.
    for (name, value) in headers {
        if METHOD_OVERRIDE_FIELDS.contains(&name.as_str()) {
            for item in String::from_utf8_lossy(value.as_bytes()).split(',') {
                named.add(item)?;
            }
        }
    }
    if let Some(query) = query.filter(|q| may_name_method(BodyForm::UrlEncoded, q.as_bytes())) {
        named.form(query)?;
    }
    Ok(named.methods)
}

/// Whether `text`, in `form`'s syntax (a query is urlencoded), may hold a `_method`
/// field: the name spelled, or a letter of it percent-encoded (urlencoded) or escaped
/// (JSON). Nearly no request does, and the parse is skipped for the rest.
pub fn may_name_method(form: BodyForm<'_>, text: &[u8]) -> bool {
    // Built once: a searcher costs more to build than to run over a small body.
    static SPELLED: LazyLock<memmem::Finder<'static>> =
        LazyLock::new(|| memmem::Finder::new(b"method"));
    static MEMBER: LazyLock<memmem::Finder<'static>> =
        LazyLock::new(|| memmem::Finder::new(b"\"_method\""));
    match form {
        BodyForm::UrlEncoded => {
            SPELLED.find(text).is_some()
                || memchr::memchr_iter(b'%', text).any(|at| {
                    let hex = |i: usize| text.get(at + i).map(u8::to_ascii_lowercase);
                    matches!(
                        (hex(1), hex(2)),
                        (Some(b'6'), Some(b'd' | b'5' | b'8' | b'f' | b'4'))
                            | (Some(b'7'), Some(b'4'))
                    )
                })
        }
        BodyForm::Multipart(_) => SPELLED.find(text).is_some(),
        BodyForm::Json => {
            MEMBER.find(text).is_some()
                || memchr::memchr_iter(b'\\', text).any(|at| text.get(at + 1) == Some(&b'u'))
        }
    }
}

/// The syntax of a POST body that frameworks read a `_method` field from, by its
/// `Content-Type`: Rails (`Rack::MethodOverride`), Symfony and Laravel read it from a form,
/// Laravel from a JSON object too, and Express's `method-override` from whatever its
/// body parser made of the body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyForm<'a> {
    /// `application/x-www-form-urlencoded`.
    UrlEncoded,
    /// `multipart/form-data` with this boundary (or `multipart/mixed` and
    /// `multipart/related`, which Rack parses as forms too).
    Multipart(&'a str),
    /// `application/json` or any `+json` type: a top-level `_method` member.
    Json,
}

impl<'a> BodyForm<'a> {
    /// The form of a body with this `Content-Type`; `None` for the types no framework
    /// reads a `_method` from (and for a multipart body without a boundary).
    pub fn of(content_type: &'a str) -> Option<Self> {
        let (media, params) = content_type.split_once(';').unwrap_or((content_type, ""));
        let media = media.trim();
        if media.eq_ignore_ascii_case("application/x-www-form-urlencoded") {
            Some(Self::UrlEncoded)
        } else if [
            "multipart/form-data",
            "multipart/mixed",
            "multipart/related",
        ]
        .iter()
        .any(|m| media.eq_ignore_ascii_case(m))
        {
            params.split(';').find_map(|param| {
                let (key, value) = param.split_once('=')?;
                key.trim().eq_ignore_ascii_case("boundary").then(|| {
                    let value = value.trim();
                    Self::Multipart(
                        value
                            .strip_prefix('"')
                            .and_then(|v| v.strip_suffix('"'))
                            .unwrap_or(value),
                    )
                })
            })
        } else {
            let json = media
                .len()
                .checked_sub(5)
                .and_then(|at| media.get(at..))
                .is_some_and(|end| {
                    end.eq_ignore_ascii_case("/json") || end.eq_ignore_ascii_case("+json")
                });
            json.then_some(Self::Json)
        }
    }
}

/// The methods a POST body names in `_method` fields, added to `head` (the overrides of
/// its head, [`method_overrides`]) under the same limit. Each form is read leniently
/// (see `json_methods` and `multipart_fields`): a body a framework refuses can only add
/// readings, never hide one.
pub fn body_method_overrides(
    method: &str,
    form: BodyForm<'_>,
    body: &[u8],
    head: Vec<String>,
) -> Result<Vec<String>, TooManyOverrides> {
    let mut named = Named {
        method,
        methods: head,
    };
    if !may_name_method(form, body) {
        return Ok(named.methods);
    }
    match form {
        BodyForm::UrlEncoded => named.form(&String::from_utf8_lossy(body))?,
        BodyForm::Multipart(boundary) => {
            for (name, value) in multipart_fields(body, boundary.as_bytes()) {
                if php_name(&String::from_utf8_lossy(name)) == "_method" {
                    named.add(&String::from_utf8_lossy(value))?;
                }
            }
        }
        BodyForm::Json => json_methods(body, &mut named)?,
    }
    Ok(named.methods)
}

/// The methods named so far, and the request's own, which is no override.
struct Named<'m> {
    method: &'m str,
    methods: Vec<String>,
}

impl Named<'_> {
    /// Adds `item` when it is a method token other than the request's own.
    fn add(&mut self, item: &str) -> Result<(), TooManyOverrides> {
        let item = item.trim();
        let token = !item.is_empty()
            && item.len() <= 32
            && item
                .bytes()
                .all(|b| b.is_ascii_alphabetic() || b == b'-' || b == b'_');
        if !token || item.eq_ignore_ascii_case(self.method) {
            return Ok(());
        }
        let upper = item.to_ascii_uppercase();
        if !self.methods.contains(&upper) {
            if self.methods.len() == MAX_METHOD_OVERRIDES {
                return Err(TooManyOverrides);
            }
            self.methods.push(upper);
        }
        Ok(())
    }

    /// Adds the value of every `_method` pair of a query or an urlencoded form.
    fn form(&mut self, form: &str) -> Result<(), TooManyOverrides> {
        for pair in form.split('&') {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            // Form decoding (`+` is a space), then PHP's name mangling.
            let key = crate::percent::decode_all(&key.replace('+', " "));
            if php_name(&key) == "_method" {
                self.add(&crate::percent::decode_all(&value.replace('+', " ")))?;
            }
        }
        Ok(())
    }
}

/// A field name as PHP reads it into `$_GET` and `$_POST` (Symfony, Laravel): a `.`, ` `
/// or `[` is `_`.
fn php_name(name: &str) -> Cow<'_, str> {
    if name.contains(['.', ' ', '[']) {
        Cow::Owned(name.replace(['.', ' ', '['], "_"))
    } else {
        Cow::Borrowed(name)
    }
}

/// Adds every string value of a top-level `_method` member of a JSON object, duplicates
/// included (PHP keeps the last, another parser the first: each is read). A scanner that
/// counts brackets instead of a recursive parser: PHP's `json_decode` reads 512 levels of
/// nesting where serde_json stops at 128, so a deep value next to `_method` must not hide
/// it; a body cut at the inspection limit, or one that is no valid JSON, gives the members
/// read before the cut or the error.
fn json_methods(body: &[u8], named: &mut Named<'_>) -> Result<(), TooManyOverrides> {
    /// Where the scanner is in the top-level object.
    #[derive(PartialEq)]
    enum At {
        Key,
        Colon,
        Value,
        Other,
    }
    let (mut depth, mut top_object, mut at, mut method_key) = (0usize, false, At::Other, false);
    let mut i = 0;
    while i < body.len() {
        match body[i] {
            b'"' => {
                let start = i + 1;
                i = start;
                while i < body.len() && body[i] != b'"' {
                    // An escape takes the next byte with it (`\"` is no end).
                    i += if body[i] == b'\\' { 2 } else { 1 };
                }
                let raw = &body[start..i.min(body.len())];
                if depth == 1 && top_object {
                    match at {
                        At::Key => {
                            method_key = json_string(raw) == "_method";
                            at = At::Colon;
                        }
                        At::Value => {
                            if method_key {
                                named.add(&json_string(raw))?;
                            }
                            at = At::Other;
                        }
                        _ => {}
                    }
                }
            }
            open @ (b'{' | b'[') => {
                if depth == 0 {
                    top_object = open == b'{';
                    at = At::Key;
                } else if depth == 1 {
                    at = At::Other;
                }
                depth += 1;
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            b':' if depth == 1 && at == At::Colon => at = At::Value,
            b',' if depth == 1 => {
                at = At::Key;
                method_key = false;
            }
            // A value that is no string (a number, `true`, `null`).
            b if depth == 1 && at == At::Value && !b.is_ascii_whitespace() => at = At::Other,
            _ => {}
        }
        i += 1;
    }
    Ok(())
}

/// The text of a JSON string's contents (`raw`, between its quotes), escapes decoded;
/// contents that do not decode (cut in an escape) are taken as they are.
fn json_string(raw: &[u8]) -> Cow<'_, str> {
    if !raw.contains(&b'\\') {
        return String::from_utf8_lossy(raw);
    }
    let mut quoted = Vec::with_capacity(raw.len() + 2);
    quoted.push(b'"');
    quoted.extend_from_slice(raw);
    quoted.push(b'"');
    match serde_json::from_slice::<String>(&quoted) {
        Ok(text) => Cow::Owned(text),
        Err(_) => String::from_utf8_lossy(raw),
    }
}

/// The `(name, value)` of every part of a `multipart/form-data` body, as a lenient
/// parser (Rack's, PHP's) reads it: parts start at a `--boundary` at the start of a
/// line, the name is the part's `Content-Disposition` one, the value runs to the line
/// break before the next delimiter (or to the end of what was read). Parts without a
/// name are left out; the epilogue after a closing delimiter is read as a part too,
/// which can only add readings.
fn multipart_fields<'b>(body: &'b [u8], boundary: &[u8]) -> Vec<(&'b [u8], &'b [u8])> {
    let mut fields = Vec::new();
    if boundary.is_empty() {
        return fields;
    }
    let mut delimiter = Vec::with_capacity(boundary.len() + 2);
    delimiter.extend_from_slice(b"--");
    delimiter.extend_from_slice(boundary);
    let starts: Vec<usize> = memchr::memmem::find_iter(body, &delimiter)
        .filter(|&at| at == 0 || body[at - 1] == b'\n')
        .collect();
    for (i, &start) in starts.iter().enumerate() {
        let end = starts.get(i + 1).map_or(body.len(), |&next| next);
        let part = &body[start + delimiter.len()..end];
        // The rest of the delimiter line (`--` closes the body, then transport padding).
        let Some(line_end) = memchr::memchr(b'\n', part) else {
            continue;
        };
        let part = &part[line_end + 1..];
        let (head, value) = match memchr::memmem::find(part, b"\r\n\r\n") {
            Some(at) => (&part[..at], &part[at + 4..]),
            None => match memchr::memmem::find(part, b"\n\n") {
                Some(at) => (&part[..at], &part[at + 2..]),
                None => continue,
            },
        };
        let value = value.strip_suffix(b"\n").unwrap_or(value);
        let value = value.strip_suffix(b"\r").unwrap_or(value);
        if let Some(name) = head.split(|&b| b == b'\n').find_map(disposition_name) {
            fields.push((name, value));
        }
    }
    fields
}

/// The `name` parameter of a `Content-Disposition` header line, quoted or not.
fn disposition_name(line: &[u8]) -> Option<&[u8]> {
    let (field, params) = line.split_at(memchr::memchr(b':', line)?);
    if !field
        .trim_ascii()
        .eq_ignore_ascii_case(b"content-disposition")
    {
        return None;
    }
    params[1..].split(|&b| b == b';').find_map(|param| {
        let at = memchr::memchr(b'=', param)?;
        let (key, value) = (param[..at].trim_ascii(), param[at + 1..].trim_ascii());
        if !key.eq_ignore_ascii_case(b"name") {
            return None;
        }
        Some(
            value
                .strip_prefix(b"\"")
                .map(|v| v.strip_suffix(b"\"").unwrap_or(v))
                .unwrap_or(value),
        )
    })
}

/// `path` (normalized, without the query) as servlet containers read it: every
/// segment's `;` parameters removed, then dot segments resolved and, when `merge` is set,
/// `//` merged. `None` when the path has no `;`.
pub fn without_path_parameters(path: &str, merge: bool) -> Option<String> {
    if !path.as_bytes().contains(&b';') {
        return None;
    }
    let stripped = path
        .split('/')
        .map(|segment| segment.split_once(';').map_or(segment, |(name, _)| name))
        .collect::<Vec<_>>()
        .join("/");
    let resolved = remove_dot_segments(&stripped);
    Some(if merge {
        merge_slashes(&resolved)
    } else {
        resolved
    })
}

/// Why a path was refused (the gateway answers 400).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadPath(pub &'static str);

/// Maximum path length accepted for normalization (longer paths are refused with 400).
pub const MAX_PATH_LEN: usize = 64 * 1024;

/// Normalizes a request path (query and fragment removed) for policy matching.
pub fn normalize_path(raw: &str, mode: PathNormalization) -> Result<Cow<'_, str>, BadPath> {
    if raw.len() > MAX_PATH_LEN {
        return Err(BadPath("path too long"));
    }
    // One walk over the bytes finds the end of the path and what the checks
    // below look for: this runs on every request, and separate substring
    // searches (each with its own set-up) cost more than the walk.
    let bytes = raw.as_bytes();
    let (mut end, mut percent, mut backslash, mut slash_dot, mut slashes) =
        (bytes.len(), false, false, false, false);
    for (i, &c) in bytes.iter().enumerate() {
        match c {
            b'?' | b'#' => {
                end = i;
                break;
            }
            b'%' => percent = true,
            b'\\' => backslash = true,
            b'/' => match bytes.get(i + 1) {
                Some(b'.') => slash_dot = true,
                Some(b'/') => slashes = true,
                _ => {}
            },
            _ => {}
        }
    }
    let path = &raw[..end];
    if percent && path.contains("%00") {
        return Err(BadPath("path contains %00"));
    }
    if mode == PathNormalization::None {
        return Ok(Cow::Borrowed(path));
    }
    let merge = merges_slashes(mode);
    let needs =
        percent || backslash || slash_dot || path == "." || path == ".." || (merge && slashes);
    if !needs {
        return Ok(Cow::Borrowed(path));
    }
    let mut s: String = if mode == PathNormalization::DecodeAndMergeSlashes {
        decode_slashes(path)
    } else {
        path.to_string()
    };
    s = s.replace('\\', "/");
    s = decode_unreserved(&s);
    s = remove_dot_segments(&s);
    if merge {
        s = merge_slashes(&s);
    }
    Ok(Cow::Owned(s))
}

/// Whether `mode` merges `//` into `/`.
pub fn merges_slashes(mode: PathNormalization) -> bool {
    matches!(
        mode,
        PathNormalization::MergeSlashes | PathNormalization::DecodeAndMergeSlashes
    )
}

fn merge_slashes(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut prev_slash = false;
    for c in s.chars() {
        if c == '/' && prev_slash {
            continue;
        }
        prev_slash = c == '/';
        out.push(c);
    }
    out
}

fn decode_slashes(s: &str) -> String {
    crate::percent::decode_where(s, |c| c == b'/' || c == b'\\')
}

/// Decodes the unreserved characters Envoy's `normalize_path` decodes.
fn decode_unreserved(s: &str) -> String {
    crate::percent::decode_where(s, |c| {
        c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~')
    })
}

/// RFC 3986 section 5.2.4.
pub fn remove_dot_segments(input: &str) -> String {
    let mut inp = input;
    let mut out = String::with_capacity(input.len());
    while !inp.is_empty() {
        if let Some(r) = inp.strip_prefix("../") {
            inp = r;
        } else if let Some(r) = inp.strip_prefix("./") {
            inp = r;
        } else if inp.starts_with("/./") {
            inp = &inp[2..];
        } else if inp == "/." {
            inp = "/";
        } else if inp.starts_with("/../") {
            inp = &inp[3..];
            pop_segment(&mut out);
        } else if inp == "/.." {
            inp = "/";
            pop_segment(&mut out);
        } else if inp == "." || inp == ".." {
            inp = "";
        } else {
            let start = usize::from(inp.starts_with('/'));
            let end = inp[start..]
                .find('/')
                .map(|i| i + start)
                .unwrap_or(inp.len());
            out.push_str(&inp[..end]);
            inp = &inp[end..];
        }
    }
    out
}

fn pop_segment(out: &mut String) {
    match out.rfind('/') {
        Some(i) => out.truncate(i),
        None => out.clear(),
    }
}

/// The original client address from `X-Forwarded-For` with `trusted` proxies in front:
/// the `trusted`-th address from the right; the TCP peer when `trusted` is 0, the header
/// is missing, has fewer entries or the entry does not parse (Envoy's rule).
pub fn remote_ip_from_xff(
    headers: &HeaderMap,
    trusted: u32,
    peer: Option<IpAddr>,
) -> Option<IpAddr> {
    if trusted == 0 {
        return peer;
    }
    let Some(joined) = header_joined(headers, "x-forwarded-for") else {
        return peer;
    };
    let entries: Vec<&str> = joined.split(',').map(|e| e.trim()).collect();
    let n = trusted as usize;
    if entries.len() < n {
        return peer;
    }
    match entries[entries.len() - n].parse::<IpAddr>() {
        Ok(ip) => Some(canonical_ip(ip)),
        Err(_) => peer,
    }
}

/// IPv4-mapped IPv6 addresses become IPv4 (as on a v4 listener).
pub fn canonical_ip(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => ip,
        },
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(p: &str, m: PathNormalization) -> String {
        normalize_path(p, m).unwrap().into_owned()
    }

    #[test]
    fn base_normalization() {
        use PathNormalization::*;
        assert_eq!(n("/a/b/../c?x=1", Base), "/a/c");
        assert_eq!(n("/a/./b", Base), "/a/b");
        assert_eq!(n("/../a", Base), "/a");
        assert_eq!(n("/a/%2e%2E/b", Base), "/b");
        assert_eq!(n("/%61dmin", Base), "/admin");
        assert_eq!(n("/a\\b", Base), "/a/b");
        assert_eq!(n("/a%2Fb", Base), "/a%2Fb");
        assert_eq!(n("/a//b", Base), "/a//b");
        assert_eq!(n("/a/b/..", Base), "/a/");
        assert_eq!(n("/a%20b", Base), "/a%20b");
        assert_eq!(n("/a%2", Base), "/a%2");
        assert_eq!(n("/a%", Base), "/a%");
    }

    #[test]
    fn other_modes() {
        use PathNormalization::*;
        assert_eq!(n("/a//b/../c", None), "/a//b/../c");
        assert_eq!(n("/a//b#frag", None), "/a//b");
        assert_eq!(n("/a//b///c", MergeSlashes), "/a/b/c");
        assert_eq!(n("/a%2F%2fb%5Cc", DecodeAndMergeSlashes), "/a/b/c");
        assert_eq!(n("/a%2F..%2Fadmin", DecodeAndMergeSlashes), "/admin");
        assert_eq!(n("/a%2F..%2Fadmin", MergeSlashes), "/a%2F..%2Fadmin");
        assert!(normalize_path("/a%00b", Base).is_err());
        assert!(normalize_path("/a%00b", None).is_err());
        let long = "/".repeat(MAX_PATH_LEN + 1);
        assert!(normalize_path(&long, Base).is_err());
    }

    #[test]
    fn path_parameters_removed_as_servlet_containers_do() {
        let w = |p: &str, merge: bool| without_path_parameters(p, merge);
        assert_eq!(w("/admin", false), None);
        assert_eq!(w("/admin;x", false).as_deref(), Some("/admin"));
        assert_eq!(w("/a;jsessionid=1/b;v=2", false).as_deref(), Some("/a/b"));
        assert_eq!(w("/public/..;/admin", false).as_deref(), Some("/admin"));
        assert_eq!(
            w("/public/.;x/admin", false).as_deref(),
            Some("/public/admin")
        );
        assert_eq!(w("/a/;x/admin", false).as_deref(), Some("/a//admin"));
        assert_eq!(w("/a/;x/admin", true).as_deref(), Some("/a/admin"));
        assert_eq!(w("/;", false).as_deref(), Some("/"));
        assert_eq!(w("/é;x/ü", false).as_deref(), Some("/é/ü"));
    }

    #[test]
    fn hosts_as_routing_reads_them() {
        assert_eq!(bare_host("admin.example.com"), None);
        assert_eq!(
            bare_host("admin.example.com:443"),
            Some("admin.example.com")
        );
        assert_eq!(bare_host("admin.example.com."), Some("admin.example.com"));
        assert_eq!(
            bare_host("admin.example.com.:80"),
            Some("admin.example.com")
        );
        assert_eq!(bare_host("admin.example.com:"), Some("admin.example.com"));
        assert_eq!(bare_host("[::1]:8080"), Some("[::1]"));
        assert_eq!(bare_host("[::1]"), None);
        assert_eq!(bare_host("10.0.0.1:80"), Some("10.0.0.1"));
        assert_eq!(bare_host("a:b"), None);
        assert_eq!(bare_host(""), None);
    }

    #[test]
    fn method_overrides_from_fields_and_query() {
        let mut h = HeaderMap::new();
        let m = |h: &HeaderMap, q: Option<&str>| method_overrides("POST", h, q);
        assert_eq!(m(&h, None), Ok(vec![]));
        assert_eq!(m(&h, Some("a=1&b=_method")), Ok(vec![]));
        h.append("x-http-method-override", "delete".parse().unwrap());
        h.append("x-http-method", "PUT, post,,GET".parse().unwrap());
        h.append("X-Method-Override", "Delete".parse().unwrap());
        h.append("x-http-method-override", "not a method; x".parse().unwrap());
        assert_eq!(
            m(&h, None),
            Ok(vec!["DELETE".into(), "PUT".into(), "GET".into()])
        );
        let h = HeaderMap::new();
        for q in [
            "_method=PATCH",
            "a=1&_method=patch&b=2",
            "%5Fmethod=PATCH",
            "_%6Dethod=PATCH",
            ".method=PATCH",
            "+method=PATCH",
            "[method=PATCH",
            "_method=%50ATCH",
        ] {
            assert_eq!(m(&h, Some(q)), Ok(vec!["PATCH".into()]), "{q}");
        }
        assert_eq!(m(&h, Some("_method=POST&x_method=PUT")), Ok(vec![]));
        // Hostile: each distinct method is one more decision, so past the limit the
        // request is refused; repeating one method costs nothing.
        let many: Vec<String> = (0..MAX_METHOD_OVERRIDES)
            .map(|i| format!("_method=M{}", char::from(b'A' + i as u8)))
            .collect();
        assert_eq!(
            m(&h, Some(&many.join("&"))).unwrap().len(),
            MAX_METHOD_OVERRIDES
        );
        let over = format!("{}&_method=ZZ", many.join("&"));
        assert_eq!(m(&h, Some(&over)), Err(TooManyOverrides));
        let mut h = HeaderMap::new();
        h.append(
            "x-http-method-override",
            vec!["DELETE"; 10_000].join(",").parse().unwrap(),
        );
        assert_eq!(m(&h, None), Ok(vec!["DELETE".into()]));
    }

    #[test]
    fn body_forms_by_content_type() {
        use BodyForm::*;
        for (ct, form) in [
            ("application/x-www-form-urlencoded", Some(UrlEncoded)),
            (
                "Application/X-WWW-Form-Urlencoded; charset=UTF-8",
                Some(UrlEncoded),
            ),
            ("multipart/form-data; boundary=abc", Some(Multipart("abc"))),
            (
                "multipart/form-data; charset=x; Boundary=\"a b\"",
                Some(Multipart("a b")),
            ),
            ("multipart/form-data", None),
            ("multipart/mixed; boundary=b", Some(Multipart("b"))),
            ("application/json", Some(Json)),
            ("application/vnd.api+json; charset=utf-8", Some(Json)),
            ("text/plain", None),
            ("application/jsonx", None),
            ("", None),
        ] {
            assert_eq!(BodyForm::of(ct), form, "{ct}");
        }
    }

    #[test]
    fn method_fields_of_bodies() {
        let m = |form: BodyForm<'_>, body: &str| {
            body_method_overrides("POST", form, body.as_bytes(), vec!["PUT".into()])
        };
        let put_and = |x: &str| Ok(vec!["PUT".to_string(), x.to_string()]);
        let put = Ok(vec!["PUT".to_string()]);
        // Forms: form and PHP decoding of the name, as for the query.
        assert_eq!(
            m(BodyForm::UrlEncoded, "a=1&_method=delete"),
            put_and("DELETE")
        );
        assert_eq!(
            m(BodyForm::UrlEncoded, "%5Fmethod=DELETE"),
            put_and("DELETE")
        );
        assert_eq!(m(BodyForm::UrlEncoded, "a=_method&b=DELETE"), put);
        assert_eq!(m(BodyForm::UrlEncoded, "_method=put&_method=post"), put);
        // JSON: every top-level `_method` string, escaped names included; nested ones,
        // non-strings and bodies that do not parse name none.
        for (body, want) in [
            (r#"{"_method":"DELETE"}"#, put_and("DELETE")),
            (
                r#"{"a":[1,{"b":2}],"\u005fmethod":"delete"}"#,
                put_and("DELETE"),
            ),
            (
                r#"{"_method":"PATCH","_method":"DELETE"}"#,
                Ok(vec!["PUT".into(), "PATCH".into(), "DELETE".into()]),
            ),
            (r#"{"a":{"_method":"DELETE"}}"#, put.clone()),
            (r#"{"_method":["DELETE"]}"#, put.clone()),
            (r#"{"_method":1,"a":"DELETE"}"#, put.clone()),
            (r#"["_method","DELETE"]"#, put.clone()),
            (r#"{"a":"}{\",","_method":"DELETE"}"#, put_and("DELETE")),
            (
                r#"{"a":{"b":"_method"},"c":"_method","d":"DELETE"}"#,
                put.clone(),
            ),
            // Cut at the inspection limit, or no valid JSON: what was read before counts.
            (r#"{"_method":"DELETE""#, put_and("DELETE")),
            (r#"{"_method" : "DELETE", "a":[1,"#, put_and("DELETE")),
            (r#"{"_method":"DEL\"#, put.clone()),
        ] {
            assert_eq!(m(BodyForm::Json, body), want, "{body}");
        }
        // Multipart: quoted or bare names, CRLF or LF lines, a delimiter only at the
        // start of a line.
        let part = |name: &str, value: &str, eol: &str| {
            format!("--b{eol}Content-Disposition: form-data; name={name}{eol}{eol}{value}{eol}")
        };
        let mp = BodyForm::Multipart("b");
        for (body, want) in [
            (format!("{}--b--\r\n", part("\"_method\"", "DELETE", "\r\n")), put_and("DELETE")),
            (format!("{}--b--", part("_method", "patch", "\n")), put_and("PATCH")),
            (format!("preamble\r\n{}", part("\"x\"", "_method", "\r\n")), put.clone()),
            (
                format!("{}{}", part("\"a\"", "x--b", "\r\n"), part("\"_method\"", "DELETE", "\r\n")),
                put_and("DELETE"),
            ),
            (
                "--b\r\nX: a --b y\r\ncontent-disposition: form-data; name=\"_method\"\r\n\r\nDELETE".into(),
                put_and("DELETE"),
            ),
            ("--b--b\r\n--b".into(), put.clone()),
            (part("\"_method\"", "DELETE", "\r\n").replace("--b", "--c"), put.clone()),
        ] {
            assert_eq!(m(mp, &body), want, "{body:?}");
        }
        // Nesting deeper than a recursive parser's limit (PHP reads 512 levels) hides
        // nothing, before or after the member.
        let deep = format!("{}{}", "[".repeat(300), "]".repeat(300));
        for (body, want) in [
            (
                format!(r#"{{"a":{deep},"_method":"DELETE"}}"#),
                put_and("DELETE"),
            ),
            (
                format!(r#"{{"_method":"DELETE","a":{deep}}}"#),
                put_and("DELETE"),
            ),
            // Unclosed brackets: the member is inside them, not at the top.
            (
                format!(r#"{{"a":{}"_method":"DELETE"}}"#, "[".repeat(100_000)),
                put.clone(),
            ),
        ] {
            assert_eq!(m(BodyForm::Json, &body), want);
        }
        // The limit counts the head's methods too; 100,000 parts cost one pass each.
        let over = "_method=A&_method=B&_method=C&_method=D";
        assert_eq!(m(BodyForm::UrlEncoded, over), Err(TooManyOverrides));
        let many = part("\"_method\"", "DELETE", "\r\n").repeat(100_000);
        assert_eq!(m(mp, &many), put_and("DELETE"));
        for (form, text, may) in [
            (
                BodyForm::UrlEncoded,
                "title=hello&body=world%20and%C3%A9",
                false,
            ),
            (BodyForm::UrlEncoded, "_m%65thod=x", true),
            (BodyForm::UrlEncoded, "payment_method=card", true),
            (BodyForm::Json, r#"{"payment_method":"card"}"#, false),
            (BodyForm::Json, r#"{"_m\u0065thod":"x"}"#, true),
            (
                mp,
                "--b\r\ncontent-disposition: form-data; name=x\r\n\r\n%6d",
                false,
            ),
        ] {
            assert_eq!(may_name_method(form, text.as_bytes()), may, "{text}");
        }
    }

    #[test]
    fn xff() {
        let mut h = HeaderMap::new();
        let peer: Option<IpAddr> = Some("10.0.0.1".parse().unwrap());
        assert_eq!(remote_ip_from_xff(&h, 1, peer), peer);
        h.append("x-forwarded-for", "1.1.1.1, 2.2.2.2".parse().unwrap());
        h.append("x-forwarded-for", "3.3.3.3".parse().unwrap());
        assert_eq!(remote_ip_from_xff(&h, 0, peer), peer);
        assert_eq!(
            remote_ip_from_xff(&h, 1, peer),
            Some("3.3.3.3".parse().unwrap())
        );
        assert_eq!(
            remote_ip_from_xff(&h, 3, peer),
            Some("1.1.1.1".parse().unwrap())
        );
        assert_eq!(remote_ip_from_xff(&h, 4, peer), peer);
        let mut h = HeaderMap::new();
        h.append("x-forwarded-for", "garbage".parse().unwrap());
        assert_eq!(remote_ip_from_xff(&h, 1, peer), peer);
        h.insert("x-forwarded-for", "::ffff:1.2.3.4".parse().unwrap());
        assert_eq!(
            remote_ip_from_xff(&h, 1, peer),
            Some("1.2.3.4".parse().unwrap())
        );
    }
}
