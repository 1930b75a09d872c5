//! HTTP plumbing of the console: responses with the security headers, form and query
//! decoding, the checks every request passes (peer, Host, Origin).

use std::net::IpAddr;

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::Full;
use moat_proxy::AdminResponse;

/// The Content-Security-Policy of every console response: scripts, styles and
/// connections from the console itself only, no inline script or style, no framing,
/// forms post only to the console.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
                       img-src 'self'; connect-src 'self'; form-action 'self'; \
                       frame-ancestors 'none'; base-uri 'none'";

/// Largest form body the console decodes (the policy form with its headers is the
/// biggest); the admin listener's own limit is far larger.
pub const MAX_FORM_BYTES: usize = 64 << 10;

/// Most fields of a form or query string.
pub const MAX_FIELDS: usize = 64;

fn respond(status: StatusCode, content_type: &'static str, body: Bytes) -> AdminResponse {
    let mut r = Response::new(Full::new(body));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    // Not `no-referrer`: under it browsers send `Origin: null` even to the console
    // itself, and the Origin check of POSTs needs the real one.
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    r
}

/// An HTML page.
pub fn html(status: StatusCode, markup: maud::Markup) -> AdminResponse {
    respond(
        status,
        "text/html; charset=utf-8",
        Bytes::from(markup.into_string()),
    )
}

/// A JSON document.
pub fn json(v: &serde_json::Value) -> AdminResponse {
    respond(
        StatusCode::OK,
        "application/json",
        Bytes::from(v.to_string()),
    )
}

/// A download: `disposition` is the `Content-Disposition` value
/// (`attachment; filename="..."`).
pub fn download(
    content_type: &'static str,
    disposition: &'static str,
    body: String,
) -> AdminResponse {
    let mut r = respond(StatusCode::OK, content_type, Bytes::from(body));
    r.headers_mut().insert(
        header::CONTENT_DISPOSITION,
        HeaderValue::from_static(disposition),
    );
    r
}

/// A static asset embedded in the binary.
pub fn asset(content_type: &'static str, body: &'static str) -> AdminResponse {
    let mut r = respond(
        StatusCode::OK,
        content_type,
        Bytes::from_static(body.as_bytes()),
    );
    // Assets change only with the binary; a session's pages reuse them.
    r.headers_mut().insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("private, max-age=3600"),
    );
    r
}

/// A plain-text error.
pub fn plain(status: StatusCode, msg: &'static str) -> AdminResponse {
    respond(
        status,
        "text/plain; charset=utf-8",
        Bytes::from_static(msg.as_bytes()),
    )
}

/// `303 See Other` to `location` (a console path), with extra headers.
pub fn redirect(location: &str, set_cookie: Option<String>) -> AdminResponse {
    let mut r = respond(StatusCode::SEE_OTHER, "text/plain", Bytes::new());
    if let Ok(v) = HeaderValue::from_str(location) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    if let Some(c) = set_cookie.and_then(|c| HeaderValue::from_str(&c).ok()) {
        r.headers_mut().insert(header::SET_COOKIE, c);
    }
    r
}

/// Decoded `application/x-www-form-urlencoded` pairs (or a query string), at most
/// [`MAX_FIELDS`]; `None` when there are more.
pub fn decode_pairs(s: &str) -> Option<Vec<(String, String)>> {
    let mut out = Vec::new();
    for pair in s.split('&').filter(|p| !p.is_empty()) {
        if out.len() == MAX_FIELDS {
            return None;
        }
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        out.push((decode(k), decode(v)));
    }
    Some(out)
}

fn decode(s: &str) -> String {
    let plus = s.replace('+', " ");
    percent_encoding::percent_decode_str(&plus)
        .decode_utf8_lossy()
        .into_owned()
}

/// Percent-encodes a query value.
pub fn encode(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// The first value of `key` among decoded pairs.
pub fn field<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// True when `Host` names this machine by address or as `localhost`: a page that DNS
/// rebinding loaded under another name cannot read the console.
pub fn host_is_local_name(headers: &http::HeaderMap) -> bool {
    let Some(host) = headers.get(header::HOST).and_then(|h| h.to_str().ok()) else {
        return false;
    };
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(h, _)| h),
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<IpAddr>().is_ok()
}

/// True when a state-changing request comes from a console page: its `Origin` (sent by
/// every browser on a POST) names the host it was sent to. Absent: not a browser.
pub fn same_origin(headers: &http::HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN).and_then(|h| h.to_str().ok()) else {
        return true;
    };
    let Some(host) = headers.get(header::HOST).and_then(|h| h.to_str().ok()) else {
        return false;
    };
    origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"))
        == Some(host)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn pairs_are_decoded_and_bounded() {
        let p = decode_pairs("a=1+2&b=%3Cx%3E&c").unwrap();
        assert_eq!(field(&p, "a"), Some("1 2"));
        assert_eq!(field(&p, "b"), Some("<x>"));
        assert_eq!(field(&p, "c"), Some(""));
        let many = "x=1&".repeat(MAX_FIELDS + 1);
        assert!(decode_pairs(&many).is_none());
        // Invalid UTF-8 and stray percent signs do not panic.
        assert!(decode_pairs("a=%ff%fe%&b=%zz").is_some());
    }

    #[test]
    fn hosts_and_origins() {
        assert!(host_is_local_name(&headers(&[("host", "127.0.0.1:9901")])));
        assert!(host_is_local_name(&headers(&[("host", "[::1]:9901")])));
        assert!(host_is_local_name(&headers(&[("host", "localhost:1")])));
        assert!(!host_is_local_name(&headers(&[(
            "host",
            "evil.example:9901"
        )])));
        assert!(!host_is_local_name(&headers(&[])));
        let h = headers(&[("host", "127.0.0.1:9"), ("origin", "http://127.0.0.1:9")]);
        assert!(same_origin(&h));
        let h = headers(&[("host", "127.0.0.1:9"), ("origin", "http://evil.example")]);
        assert!(!same_origin(&h));
        assert!(same_origin(&headers(&[("host", "127.0.0.1:9")])));
    }
}
