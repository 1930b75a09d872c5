//! Request attributes as policies see them, path normalization and X-Forwarded-For.

use std::borrow::Cow;
use std::net::IpAddr;

use http::HeaderMap;
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
    let mut named = Vec::new();
    let mut add = |item: &str| {
        let item = item.trim();
        let token = !item.is_empty()
            && item.len() <= 32
            && item
                .bytes()
                .all(|b| b.is_ascii_alphabetic() || b == b'-' || b == b'_');
        if !token || item.eq_ignore_ascii_case(method) {
            return Ok(());
        }
        let upper = item.to_ascii_uppercase();
        if !named.contains(&upper) {
            if named.len() == MAX_METHOD_OVERRIDES {
                return Err(TooManyOverrides);
            }
            named.push(upper);
        }
        Ok(())
    };
    // One pass over the fields: cheaper than a hashed lookup of each name on every
    // request, nearly all of which have none.
    for (name, value) in headers {
        if METHOD_OVERRIDE_FIELDS.contains(&name.as_str()) {
            for item in String::from_utf8_lossy(value.as_bytes()).split(',') {
                add(item)?;
            }
        }
    }
    // The query is parsed only when it may hold the name, spelled or percent-encoded.
    if let Some(query) = query.filter(|q| q.contains("method") || q.contains('%')) {
        for pair in query.split('&') {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            // Form decoding (`+` is a space), then PHP's (Symfony, Laravel): a `.`, ` `
            // or `[` in a name is read as `_`.
            let key = crate::percent::decode_all(&key.replace('+', " "));
            let key = key.replace(['.', ' ', '['], "_");
            if key == "_method" {
                add(&crate::percent::decode_all(&value.replace('+', " ")))?;
            }
        }
    }
    Ok(named)
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
