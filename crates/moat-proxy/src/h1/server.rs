//! moat's HTTP/1.1 server side: request heads parsed with `httparse` into `http`
//! types, and response heads written into a reused buffer.
//! The connection driver that does the I/O is the proxy's `server` module.
//!
//! Message framing follows RFC 9112 section 6, strictly: a request whose length is
//! ambiguous (`Content-Length` with `Transfer-Encoding`, differing lengths, a coding
//! other than `chunked`) is refused instead of guessed at, because a proxy and its
//! upstream that disagree on where a request ends are how requests get smuggled.

use std::mem::MaybeUninit;

use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode, Uri, Version};

use super::{classify, parse_length, push_decimal, push_field, Chunked, Decoder, Field};

/// Most header fields ever parsed in a request head. The parser's own cap is set
/// per listener below this (see [`parse_request_head`]); the configured
/// `limits.max_headers` is checked on the parsed head.
pub(crate) const MAX_HEADER_SLOTS: usize = 512;

/// A request head moat answers with an error (and then closes the connection).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RequestError {
    /// The status of the error reply.
    pub status: StatusCode,
    /// What was wrong, for the error page.
    pub reason: &'static str,
}

impl RequestError {
    const fn bad(reason: &'static str) -> RequestError {
        RequestError {
            status: StatusCode::BAD_REQUEST,
            reason,
        }
    }

    /// The head is larger than the configured limit.
    pub(crate) const TOO_LARGE: RequestError = RequestError {
        status: StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        reason: "request header fields too large",
    };
}

/// A parsed request head.
#[derive(Debug)]
pub(crate) struct RequestHead {
    /// Method, target, version and header fields.
    pub parts: http::request::Parts,
    /// How the body is delimited.
    pub decoder: Decoder,
    /// The client allows the connection to carry another request after this one.
    pub keep_alive: bool,
    /// `Expect: 100-continue`: the client waits for `100 Continue` before the body.
    pub expect_continue: bool,
}

/// Where the request head in `buf` ends (just past its empty line), if it is
/// complete. Lines may end with CRLF or a bare LF (RFC 9112 2.2 lets a recipient
/// accept both; `httparse` parses both). `scanned` remembers how far previous calls
/// looked, so a head arriving in many small reads is scanned once.
pub(crate) fn request_head_end(buf: &[u8], scanned: &mut usize) -> Option<usize> {
    let from = scanned.saturating_sub(2);
    *scanned = buf.len();
    for i in memchr::memchr_iter(b'\n', &buf[from..]) {
        let at = from + i + 1;
        match buf.get(at..) {
            Some([b'\n', ..]) => return Some(at + 1),
            Some([b'\r', b'\n', ..]) => return Some(at + 2),
            _ => {}
        }
    }
    None
}

/// Parses a complete request head (`head` ends with its empty line, see
/// [`request_head_end`]). The target and the header values are copied out of `head`
/// (small copies are cheaper than the atomic reference counts of a shared buffer), so
/// the connection's read buffer stays a plain vector reused in place.
/// More than `max_fields` header fields (at most [`MAX_HEADER_SLOTS`]) is an error.
pub(crate) fn parse_request_head(
    head: &[u8],
    max_fields: usize,
) -> Result<RequestHead, RequestError> {
    let mut slots = [MaybeUninit::<httparse::Header<'_>>::uninit(); MAX_HEADER_SLOTS];
    let slots = &mut slots[..max_fields.clamp(1, MAX_HEADER_SLOTS)];
    let mut req = httparse::Request::new(&mut []);
    match httparse::ParserConfig::default().parse_request_with_uninit_headers(&mut req, head, slots)
    {
        Ok(httparse::Status::Complete(n)) if n == head.len() => {}
        Err(httparse::Error::TooManyHeaders) => return Err(RequestError::TOO_LARGE),
        _ => return Err(RequestError::bad("invalid request head")),
    }
    let (Some(method), Some(target), Some(minor)) = (req.method, req.path, req.version) else {
        return Err(RequestError::bad("invalid request head"));
    };
    let method =
        Method::from_bytes(method.as_bytes()).map_err(|_| RequestError::bad("invalid method"))?;
    let uri = Uri::try_from(target.as_bytes())
        .map_err(|_| RequestError::bad("invalid request target"))?;
    // Only CONNECT uses the authority form, and moat does not tunnel. A fragment is
    // never part of a request target (RFC 9112 3.2): `Uri` would drop it silently.
    if (uri.path_and_query().is_none() && uri != "*") || target.contains('#') {
        return Err(RequestError::bad("invalid request target"));
    }
    let version = if minor == 0 {
        Version::HTTP_10
    } else {
        Version::HTTP_11
    };

    let fields = &*req.headers;
    let mut keep_alive = version == Version::HTTP_11;
    let mut expect_continue = false;
    let mut chunked = false;
    let mut has_te = false;
    let mut length: Option<u64> = None;
    let mut hosts = 0usize;
    let mut headers = HeaderMap::with_capacity(fields.len());
    for f in fields {
        match classify(f.name) {
            Field::Connection => {
                for token in f.value.split(|&b| b == b',').map(<[u8]>::trim_ascii) {
                    if token.eq_ignore_ascii_case(b"close") {
                        keep_alive = false;
                    } else if token.eq_ignore_ascii_case(b"keep-alive") {
                        keep_alive |= version == Version::HTTP_10;
                    } else if names_framing_or_routing(token) {
                        // Only a smuggling attempt asks that the fields framing or
                        // routing this request be dropped on the way (docs/SECURITY.md).
                        return Err(RequestError::bad(
                            "connection header names a framing or routing field",
                        ));
                    }
                }
            }
            Field::TransferEncoding => {
                // Several fields form one list; only `chunked`, once, is understood.
                for coding in f.value.split(|&b| b == b',').map(<[u8]>::trim_ascii) {
                    if coding.is_empty() {
                        continue;
                    }
                    // RFC 9112 6.3: chunked must be the final coding, else the
                    // length cannot be known: 400. Codings under chunked are not
                    // supported either (a proxy would have to undo them).
                    if !coding.eq_ignore_ascii_case(b"chunked") || chunked {
                        return Err(RequestError::bad("unsupported transfer coding"));
                    }
                    chunked = true;
                }
                has_te = true;
            }
            Field::ContentLength => {
                let first = length.is_none();
                let mut parts = 0;
                for part in f.value.split(|&b| b == b',').map(<[u8]>::trim_ascii) {
                    let n =
                        parse_length(part).ok_or(RequestError::bad("invalid content-length"))?;
                    if length.is_some_and(|l| l != n) {
                        return Err(RequestError::bad("conflicting content-length"));
                    }
                    length = Some(n);
                    parts += 1;
                }
                // Repeats of one length are one length: it is forwarded once.
                if !first {
                    continue;
                }
                if parts > 1 {
                    headers.append(
                        http::header::CONTENT_LENGTH,
                        HeaderValue::from(length.unwrap_or(0)),
                    );
                    continue;
                }
            }
            Field::HopByHop | Field::Other => {
                if f.name.eq_ignore_ascii_case("host") {
                    hosts += 1;
                    if !valid_host(f.value) {
                        return Err(RequestError::bad("invalid host"));
                    }
                } else if f.name.eq_ignore_ascii_case("expect") {
                    if f.value.eq_ignore_ascii_case(b"100-continue") {
                        // Answered by moat itself (when the body is first read); the
                        // upstream is not asked again.
                        expect_continue = version == Version::HTTP_11;
                        continue;
                    } else {
                        return Err(RequestError {
                            status: StatusCode::EXPECTATION_FAILED,
                            reason: "expectation not supported",
                        });
                    }
                }
            }
        }
        let name = HeaderName::from_bytes(f.name.as_bytes())
            .map_err(|_| RequestError::bad("invalid header field name"))?;
        let value = HeaderValue::from_bytes(f.value)
            .map_err(|_| RequestError::bad("invalid header field value"))?;
        headers.append(name, value);
    }
    // RFC 9112 3.2: exactly one Host in HTTP/1.1.
    if hosts > 1 || (hosts == 0 && version == Version::HTTP_11) {
        return Err(RequestError::bad("missing or repeated host"));
    }
    let decoder = if has_te {
        if version == Version::HTTP_10 || length.is_some() || !chunked {
            // RFC 9112 6.1: ambiguous framing; refused rather than guessed.
            return Err(RequestError::bad("ambiguous message framing"));
        }
        Decoder::Chunked(Chunked::Size)
    } else {
        Decoder::Length(length.unwrap_or(0))
    };

    let mut req = http::Request::new(());
    *req.method_mut() = method;
    *req.uri_mut() = uri;
    *req.version_mut() = version;
    *req.headers_mut() = headers;
    let (parts, ()) = req.into_parts();
    Ok(RequestHead {
        parts,
        decoder,
        keep_alive,
        expect_continue,
    })
}

/// True when a `Connection` option names a field that frames or routes the request
/// (`Content-Length`, `Transfer-Encoding`, `Host`).
fn names_framing_or_routing(token: &[u8]) -> bool {
    token.eq_ignore_ascii_case(b"content-length")
        || token.eq_ignore_ascii_case(b"transfer-encoding")
        || token.eq_ignore_ascii_case(b"host")
}

/// True when `v` can be a `Host` value: `host[:port]`, the host a registered name,
/// an IPv4 address or a bracketed IP literal (RFC 3986 3.2.2), possibly empty.
pub(crate) fn valid_host(v: &[u8]) -> bool {
    v.iter().all(|&b| {
        b.is_ascii_alphanumeric()
            || matches!(
                b,
                b'-' | b'.'
                    | b'_'
                    | b'~'
                    | b'%'
                    | b':'
                    | b'['
                    | b']'
                    | b'!'
                    | b'$'
                    | b'&'
                    | b'\''
                    | b'('
                    | b')'
                    | b'*'
                    | b'+'
                    | b','
                    | b';'
                    | b'='
            )
    })
}

/// How a response body goes on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ResponseFraming {
    /// No body may follow (`HEAD`, 1xx, 204, 304): the header fields are written as
    /// they are (a `Content-Length` describes the representation, not this message).
    NoBody,
    /// `Content-Length: n`.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Neither: the body ends when the connection closes (HTTP/1.0 clients).
    Close,
}

/// `HTTP/1.1 100 Continue`, the interim response to `Expect: 100-continue`.
pub(crate) const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// Writes a response head into `buf`: status line, the fields of `headers` except the
/// framing and connection ones (written from `framing` and `connection`), and `Date`
/// when the response has none.
pub(crate) fn encode_response_head(
    buf: &mut Vec<u8>,
    status: StatusCode,
    headers: &HeaderMap,
    framing: ResponseFraming,
    connection: Option<&'static [u8]>,
) {
    let mut need = 96;
    for (k, v) in headers {
        need += k.as_str().len() + v.len() + 4;
    }
    buf.reserve(need);
    buf.extend_from_slice(b"HTTP/1.1 ");
    buf.extend_from_slice(status.as_str().as_bytes());
    buf.push(b' ');
    buf.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    buf.extend_from_slice(b"\r\n");
    // A protocol switch keeps its own `Connection` and `Upgrade` fields.
    let switching = status == StatusCode::SWITCHING_PROTOCOLS;
    let mut has_date = false;
    for (name, value) in headers {
        let skip = match classify(name.as_str()) {
            Field::ContentLength => framing != ResponseFraming::NoBody,
            Field::TransferEncoding => true,
            Field::Connection | Field::HopByHop => !switching,
            Field::Other => {
                has_date |= name == http::header::DATE;
                false
            }
        };
        if !skip {
            push_field(buf, name.as_str().as_bytes(), value.as_bytes());
        }
    }
    if !has_date {
        date::with(|d| push_field(buf, b"date", d));
    }
    match framing {
        ResponseFraming::Length(n) => {
            buf.extend_from_slice(b"content-length: ");
            push_decimal(buf, n);
            buf.extend_from_slice(b"\r\n");
        }
        ResponseFraming::Chunked => push_field(buf, b"transfer-encoding", b"chunked"),
        ResponseFraming::NoBody | ResponseFraming::Close => {}
    }
    if let Some(c) = connection {
        push_field(buf, b"connection", c);
    }
    buf.extend_from_slice(b"\r\n");
}

/// The `Date` field value, formatted once a second per thread. The second comes from
/// the coarse wall clock (no TSC read per response; it lags by at most a tick).
mod date {
    use std::cell::RefCell;
    use std::time::{Duration, UNIX_EPOCH};

    thread_local! {
        static CACHED: RefCell<(u64, [u8; 29])> = const { RefCell::new((u64::MAX, [0; 29])) };
    }

    /// Calls `f` with the current date in IMF-fixdate form.
    pub(super) fn with(f: impl FnOnce(&[u8])) {
        let secs = moat_core::clock::unix_secs();
        CACHED.with_borrow_mut(|(at, text)| {
            if *at != secs {
                let s = httpdate::fmt_http_date(UNIX_EPOCH + Duration::from_secs(secs));
                if s.len() == text.len() {
                    text.copy_from_slice(s.as_bytes());
                    *at = secs;
                }
            }
            f(&text[..]);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(raw: &str) -> Result<RequestHead, RequestError> {
        parse_request_head(raw.as_bytes(), MAX_HEADER_SLOTS)
    }

    fn status(raw: &str) -> StatusCode {
        parse(raw).map_or_else(|e| e.status, |_| StatusCode::OK)
    }

    #[test]
    fn heads_end_at_their_empty_line_in_any_split() {
        for (raw, end) in [
            (&b"GET / HTTP/1.1\r\nHost: x\r\n\r\nNEXT"[..], 27),
            (b"GET / HTTP/1.1\nHost: x\n\nNEXT", 24),
            (b"GET / HTTP/1.1\r\nHost: x\n\r\nNEXT", 26),
        ] {
            assert_eq!(request_head_end(raw, &mut 0), Some(end));
            // Fed a byte at a time.
            let mut scanned = 0;
            let found = (1..=raw.len()).find_map(|n| request_head_end(&raw[..n], &mut scanned));
            assert_eq!(found, Some(end));
        }
        assert_eq!(
            request_head_end(b"GET / HTTP/1.1\r\nHost: x\r\n", &mut 0),
            None
        );
        let h = parse("GET /lf HTTP/1.1\nHost: x\nX-A: 1\n\n").unwrap();
        assert_eq!(h.parts.headers["x-a"], "1");
    }

    #[test]
    fn request_heads_and_framing() {
        let h = parse("POST /a?b=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nX-A: 1\r\n\r\n")
            .unwrap();
        assert_eq!(h.parts.method, Method::POST);
        assert_eq!(h.parts.uri, "/a?b=1");
        assert_eq!(h.parts.headers["x-a"], "1");
        assert_eq!(h.decoder, Decoder::Length(5));
        assert!(h.keep_alive && !h.expect_continue);

        let h = parse("GET / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n").unwrap();
        assert_eq!(h.decoder, Decoder::Chunked(Chunked::Size));
        let h = parse("GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
        assert!(!h.keep_alive);
        assert_eq!(h.decoder, Decoder::Length(0));
        let h = parse("GET / HTTP/1.0\r\n\r\n").unwrap();
        assert!(!h.keep_alive);
        assert_eq!(h.parts.version, Version::HTTP_10);
        let h = parse("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n").unwrap();
        assert!(h.keep_alive);
        let h = parse(
            "PUT /u HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\n",
        )
        .unwrap();
        assert!(h.expect_continue);
        // Answered by moat: not forwarded.
        assert!(!h.parts.headers.contains_key("expect"));
        let h = parse("GET http://a.example:8080/p?q HTTP/1.1\r\nHost: a.example\r\n\r\n").unwrap();
        assert_eq!(h.parts.uri.host(), Some("a.example"));
        assert_eq!(h.parts.uri.path_and_query().unwrap(), "/p?q");
        // The same length repeated is one length.
        let h = parse(
            "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3, 3\r\nContent-Length: 3\r\n\r\n",
        )
        .unwrap();
        assert_eq!(h.decoder, Decoder::Length(3));
        assert_eq!(h.parts.headers.get_all("content-length").iter().count(), 1);
        let h = parse("GET / HTTP/1.1\r\nHost: [::1]:8080\r\n\r\n").unwrap();
        assert_eq!(h.parts.headers["host"], "[::1]:8080");
    }

    #[test]
    fn ambiguous_or_hostile_heads_are_refused() {
        let bad = StatusCode::BAD_REQUEST;
        for (raw, want) in [
            // Smuggling shapes.
            ("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", bad),
            ("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n", bad),
            ("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n", bad),
            ("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\n", bad),
            ("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 0x10\r\n\r\n", bad),
            ("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", bad),
            ("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, chunked\r\n\r\n", bad),
            ("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: gzip\r\n\r\n", bad),
            ("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", bad),
            ("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding : chunked\r\n\r\n", bad),
            // Heads.
            ("GET / HTTP/1.1\r\n\r\n", bad),
            ("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", bad),
            ("G@T / HTTP/1.1\r\nHost: x\r\n\r\n", bad),
            ("GET / HTTP/2.0\r\nHost: x\r\n\r\n", bad),
            ("GET / HTTP/1.1\r\nHost: a b\r\n\r\n", bad),
            ("GET / HTTP/1.1\r\nHost: a/b\r\n\r\n", bad),
            ("GET a.example:80 HTTP/1.1\r\nHost: x\r\n\r\n", bad),
            // Found by fuzz/h1_request_head: `Uri` drops a fragment without a word.
            ("POST /# HTTP/1.0\r\nHost: x\r\n\r\n", bad),
            ("GET /a?b#c HTTP/1.1\r\nHost: x\r\n\r\n", bad),
            ("GET / HTTP/1.1\r\nHost: x\r\nX: a\u{1}b\r\n\r\n", bad),
            ("GET / HTTP/1.1\r\nHost: x\r\nExpect: 200-ok\r\n\r\n", StatusCode::EXPECTATION_FAILED),
        ] {
            assert_eq!(status(raw), want, "{raw:?}");
        }
        let mut many = String::from("GET / HTTP/1.1\r\nHost: x\r\n");
        for i in 0..MAX_HEADER_SLOTS {
            many.push_str(&format!("x-{i}: 1\r\n"));
        }
        many.push_str("\r\n");
        assert_eq!(status(&many), StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
    }

    fn head(
        status: StatusCode,
        h: &[(&str, &str)],
        f: ResponseFraming,
        c: Option<&'static [u8]>,
    ) -> String {
        let mut map = HeaderMap::new();
        for (k, v) in h {
            map.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        let mut buf = Vec::new();
        encode_response_head(&mut buf, status, &map, f, c);
        String::from_utf8(buf).unwrap()
    }

    #[test]
    fn response_heads_carry_their_framing() {
        let date = [("date", "Sat, 21 Nov 2026 10:00:00 GMT")];
        assert_eq!(
            head(StatusCode::OK, &[("x-a", "1"), ("content-length", "9"), ("transfer-encoding", "chunked"), date[0]], ResponseFraming::Length(3), None),
            "HTTP/1.1 200 OK\r\nx-a: 1\r\ndate: Sat, 21 Nov 2026 10:00:00 GMT\r\ncontent-length: 3\r\n\r\n"
        );
        assert_eq!(
            head(StatusCode::NOT_FOUND, &date, ResponseFraming::Chunked, Some(b"close")),
            "HTTP/1.1 404 Not Found\r\ndate: Sat, 21 Nov 2026 10:00:00 GMT\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n"
        );
        // HEAD and 304 keep the representation's length.
        assert_eq!(
            head(StatusCode::NOT_MODIFIED, &[("content-length", "10"), date[0]], ResponseFraming::NoBody, None),
            "HTTP/1.1 304 Not Modified\r\ncontent-length: 10\r\ndate: Sat, 21 Nov 2026 10:00:00 GMT\r\n\r\n"
        );
        // A protocol switch keeps Connection and Upgrade.
        let up = head(
            StatusCode::SWITCHING_PROTOCOLS,
            &[("connection", "upgrade"), ("upgrade", "websocket"), date[0]],
            ResponseFraming::NoBody,
            None,
        );
        assert!(
            up.contains("connection: upgrade\r\nupgrade: websocket\r\n"),
            "{up}"
        );
        // A missing Date is added; an unknown status has an empty reason.
        let h = head(
            StatusCode::from_u16(599).unwrap(),
            &[],
            ResponseFraming::Length(0),
            None,
        );
        assert!(h.starts_with("HTTP/1.1 599 \r\ndate: "), "{h}");
        assert!(h.ends_with(" GMT\r\ncontent-length: 0\r\n\r\n"), "{h}");
    }
}
