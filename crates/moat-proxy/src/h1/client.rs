//! moat's HTTP/1.1 client side: request heads written towards upstreams into a
//! reused buffer, response heads parsed with `httparse`.
//!
//! moat drives each upstream exchange from the task that serves the downstream
//! connection instead of handing it to a client connection task (no channel, no second
//! task per request); this module is the pure part of that client, without I/O.

use std::mem::MaybeUninit;

use http::header::{HeaderMap, HeaderName, HeaderValue, CONNECTION, CONTENT_LENGTH, COOKIE, HOST};
use http::header::{TE, TRAILER, TRANSFER_ENCODING, UPGRADE};
use http::{Method, StatusCode, Version};

use super::{classify, parse_length, push_decimal, push_field, BodyError, Chunked, Decoder, Field};

/// `X-Forwarded-For`.
pub(crate) static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
/// `X-Forwarded-Proto`.
pub(crate) static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
/// `X-Request-Id`.
pub(crate) static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
static KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
static PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");

/// Largest accepted upstream response head (status line and header fields).
pub(crate) const MAX_HEAD: usize = 64 << 10;
/// Most header fields accepted in an upstream response head.
pub(crate) const MAX_HEADERS: usize = 128;

/// A response moat refuses to forward (the client gets a 502, or the connection is cut
/// when the head was already sent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProtocolError {
    /// The response head exceeds 64 KiB (`MAX_HEAD`).
    HeadTooLarge,
    /// The response head has more than 128 fields (`MAX_HEADERS`).
    TooManyHeaders,
    /// The response head is not valid HTTP/1.x.
    BadHead,
    /// `Content-Length` is not a number, or several different ones were sent.
    BadContentLength,
    /// `Transfer-Encoding` names a coding other than one final `chunked`, or comes in
    /// an HTTP/1.0 response.
    BadTransferEncoding,
    /// A chunk-size line or a chunk delimiter is invalid.
    BadChunk,
    /// The trailer section is too large or invalid.
    BadTrailers,
    /// The connection closed before the end of the message.
    UnexpectedEof,
    /// `101 Switching Protocols` to a request that asked for no upgrade, or too many
    /// interim (1xx) responses.
    UnexpectedInterim,
}

impl std::fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ProtocolError::HeadTooLarge => "upstream response head too large",
            ProtocolError::TooManyHeaders => "too many upstream response header fields",
            ProtocolError::BadHead => "invalid upstream response head",
            ProtocolError::BadContentLength => "invalid upstream content-length",
            ProtocolError::BadTransferEncoding => "unsupported transfer coding from upstream",
            ProtocolError::BadChunk => "invalid chunked encoding from upstream",
            ProtocolError::BadTrailers => "invalid or oversized upstream trailers",
            ProtocolError::UnexpectedEof => "upstream closed the connection mid-message",
            ProtocolError::UnexpectedInterim => "unexpected interim response from upstream",
        })
    }
}

impl std::error::Error for ProtocolError {}

/// How the request body goes on the wire: always decided by moat from the body it
/// forwards, never taken from the client's framing fields, so that what the upstream
/// reads as this request's body is exactly the body moat inspected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RequestFraming {
    /// No body, and no framing field.
    None,
    /// `content-length: n`, then the body as is.
    Length(u64),
    /// `transfer-encoding: chunked`, and the body encoded in chunks.
    Chunked,
}

/// Header fields that apply to one connection only (RFC 9110 7.6.1), and the framing
/// fields moat writes itself.
pub(crate) fn is_hop_by_hop(name: &HeaderName) -> bool {
    name == CONNECTION
        || name == TE
        || name == TRAILER
        || name == TRANSFER_ENCODING
        || name == CONTENT_LENGTH
        || name == UPGRADE
        || name == KEEP_ALIVE
        || name == PROXY_CONNECTION
}

/// The head of a request as moat sends it upstream, before it is written out (the
/// client's header map is borrowed, not copied or modified).
#[derive(Debug)]
pub struct UpstreamHead<'a> {
    /// Method.
    pub method: &'a Method,
    /// Origin-form request target (path and query).
    pub target: &'a str,
    /// The request's header fields, as the client sent them (after request phases).
    pub headers: &'a HeaderMap,
    /// True when the request asks for a protocol upgrade (a `101` is then accepted).
    pub upgrade: bool,
    /// True when `default_host` replaces the request's `Host` (an absolute-form
    /// target, or HTTP/2's `:authority`).
    pub replace_host: bool,
    /// `Host` to send when the request carries none (HTTP/2, HTTP/1.0).
    pub default_host: &'a str,
    /// The client address appended to `X-Forwarded-For`.
    pub forwarded_for: &'a HeaderValue,
    /// `X-Forwarded-Proto`: `http` or `https`.
    pub forwarded_proto: &'static str,
    /// `X-Request-Id`: the client's, or the one moat made (it replaces the field).
    pub request_id: &'a str,
}

/// Writes the head of `req` as it goes upstream into `buf`, in one pass over its
/// fields (no header map is modified or copied):
///
/// * hop-by-hop fields are dropped: `Connection`, `Keep-Alive`, `Proxy-Connection`,
///   `TE`, `Trailer`, `Transfer-Encoding`, `Upgrade`; for an upgrade, `Upgrade` stays
///   and `Connection: upgrade` is sent. Other fields a `Connection` header names are
///   forwarded: moat forwards the end-to-end fields its phases inspected, and a client
///   cannot make it drop one (`X-Forwarded-For`, `Authorization`, ...). A request whose
///   `Connection` names `Content-Length`, `Transfer-Encoding` or `Host` never gets
///   here (the server refuses it);
/// * `Host` is added when the request has none;
/// * several `Cookie` fields are sent as one, joined by `; `;
/// * the client address is appended to `X-Forwarded-For`, `X-Forwarded-Proto` is set;
///   the client's spellings of these and `X-Request-Id` with `_` are dropped;
/// * the client's `Content-Length` is dropped and `framing` writes moat's own
///   `Content-Length` or `Transfer-Encoding: chunked`.
///
/// Header values were validated by `http` (no CR/LF), so nothing can be injected.
pub(crate) fn encode_request_head(
    buf: &mut Vec<u8>,
    req: &UpstreamHead<'_>,
    framing: RequestFraming,
) {
    let headers = req.headers;
    let mut need = req.method.as_str().len() + req.target.len() + 128;
    for (k, v) in headers {
        need += k.as_str().len() + v.len() + 4;
    }
    buf.reserve(need);
    buf.extend_from_slice(req.method.as_str().as_bytes());
    buf.push(b' ');
    buf.extend_from_slice(req.target.as_bytes());
    buf.extend_from_slice(b" HTTP/1.1\r\n");
    let mut has_host = false;
    let mut cookie_written = false;
    for (name, value) in headers {
        if name == HOST {
            if req.replace_host {
                continue;
            }
            has_host = true;
        } else if is_hop_by_hop(name) {
            if !(req.upgrade && name == UPGRADE) {
                continue;
            }
        } else if name == X_FORWARDED_FOR || name == X_FORWARDED_PROTO || name == X_REQUEST_ID {
            // Rewritten below.
            continue;
        } else if name == COOKIE {
            // One `Cookie` line, its pairs joined by "; " (RFC 9113 8.2.3): browsers
            // split cookies into one HTTP/2 field each, and HTTP/1.1 servers read one
            // line (RFC 6265 5.4), some only the first.
            // An empty field adds no cookie: joined, it would leave a `;` that the
            // engines never read.
            if !cookie_written {
                cookie_written = true;
                let mut crumbs = headers.get_all(COOKIE).iter().filter(|v| !v.is_empty());
                if let Some(first) = crumbs.next() {
                    buf.extend_from_slice(b"cookie: ");
                    buf.extend_from_slice(first.as_bytes());
                    for v in crumbs {
                        buf.extend_from_slice(b"; ");
                        buf.extend_from_slice(v.as_bytes());
                    }
                    buf.extend_from_slice(b"\r\n");
                }
            }
            continue;
        }
        push_field(buf, name.as_str().as_bytes(), value.as_bytes());
    }
    if !has_host {
        push_field(buf, b"host", req.default_host.as_bytes());
    }
    if req.upgrade {
        push_field(buf, b"connection", b"upgrade");
    }
    buf.extend_from_slice(b"x-forwarded-for: ");
    for v in headers.get_all(&X_FORWARDED_FOR) {
        if v.to_str().is_ok() {
            buf.extend_from_slice(v.as_bytes());
            buf.extend_from_slice(b", ");
        }
    }
    buf.extend_from_slice(req.forwarded_for.as_bytes());
    buf.extend_from_slice(b"\r\n");
    push_field(buf, b"x-forwarded-proto", req.forwarded_proto.as_bytes());
    push_field(buf, b"x-request-id", req.request_id.as_bytes());
    match framing {
        RequestFraming::None => {}
        RequestFraming::Length(n) => {
            buf.extend_from_slice(b"content-length: ");
            push_decimal(buf, n);
            buf.extend_from_slice(b"\r\n");
        }
        RequestFraming::Chunked => push_field(buf, b"transfer-encoding", b"chunked"),
    }
    buf.extend_from_slice(b"\r\n");
}

/// A parsed response head and how its body is delimited.
#[derive(Debug)]
pub(crate) struct ResponseHead {
    /// Status code.
    pub status: StatusCode,
    /// HTTP/1.0 or HTTP/1.1.
    pub version: Version,
    /// Header fields (`Content-Length` removed when `Transfer-Encoding` overrides it).
    pub headers: HeaderMap,
    /// The body decoder.
    pub decoder: Decoder,
    /// True when the connection may carry another request after this response.
    pub keep_alive: bool,
}

/// Parses a complete response head (`head` ends with its empty line, see
/// [`super::head_end`]). The header values are copied out of `head` (see
/// [`super::server::parse_request_head`]).
pub(crate) fn parse_response_head(
    head: &[u8],
    request_method: &Method,
) -> Result<ResponseHead, ProtocolError> {
    if head.len() > MAX_HEAD {
        return Err(ProtocolError::HeadTooLarge);
    }
    let mut slots = [MaybeUninit::<httparse::Header<'_>>::uninit(); MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut []);
    match httparse::ParserConfig::default()
        .parse_response_with_uninit_headers(&mut resp, head, &mut slots)
    {
        Ok(httparse::Status::Complete(n)) if n == head.len() => {}
        Err(httparse::Error::TooManyHeaders) => return Err(ProtocolError::TooManyHeaders),
        _ => return Err(ProtocolError::BadHead),
    }
    let status = resp
        .code
        .and_then(|c| StatusCode::from_u16(c).ok())
        .ok_or(ProtocolError::BadHead)?;
    let version = if resp.version == Some(0) {
        Version::HTTP_10
    } else {
        Version::HTTP_11
    };
    let fields = &*resp.headers;

    // What the connection-level fields say (RFC 9112 6.3, 9.3).
    let mut keep_alive = version == Version::HTTP_11;
    let mut chunked = false;
    let mut length: Option<u64> = None;
    // How many lengths the fields gave (equal ones: different ones are refused).
    let mut lengths = 0;
    let mut listed: Vec<&[u8]> = Vec::new();
    for f in fields {
        match classify(f.name) {
            Field::Connection => {
                for token in f.value.split(|&b| b == b',').map(<[u8]>::trim_ascii) {
                    if token.eq_ignore_ascii_case(b"close") {
                        keep_alive = false;
                    } else if token.eq_ignore_ascii_case(b"keep-alive") {
                        keep_alive |= version == Version::HTTP_10;
                    } else if !token.is_empty() {
                        listed.push(token);
                    }
                }
            }
            Field::TransferEncoding => {
                // Exactly one coding, `chunked`, in HTTP/1.1. Another coding would reach
                // the client undecoded once moat drops the hop-by-hop field and frames
                // the body itself, and HTTP/1.0 framing with it is faulty (RFC 9112
                // 6.1): both are refused, as nginx refuses them.
                for coding in f.value.split(|&b| b == b',').map(<[u8]>::trim_ascii) {
                    if coding.is_empty() {
                        continue;
                    }
                    if chunked
                        || !coding.eq_ignore_ascii_case(b"chunked")
                        || version != Version::HTTP_11
                    {
                        return Err(ProtocolError::BadTransferEncoding);
                    }
                    chunked = true;
                }
            }
            Field::ContentLength => {
                for part in f.value.split(|&b| b == b',').map(<[u8]>::trim_ascii) {
                    let n = parse_length(part).ok_or(ProtocolError::BadContentLength)?;
                    if length.is_some_and(|l| l != n) {
                        return Err(ProtocolError::BadContentLength);
                    }
                    length = Some(n);
                    lengths += 1;
                }
            }
            Field::HopByHop | Field::Other => {}
        }
    }
    let decoder = if *request_method == Method::HEAD
        || status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
    {
        Decoder::Length(0)
    } else if chunked {
        // Transfer-Encoding overrides Content-Length; a message carrying both is a
        // smuggling attempt or a broken server: never reuse that connection.
        if length.is_some() {
            keep_alive = false;
        }
        Decoder::Chunked(Chunked::Size)
    } else if let Some(n) = length {
        Decoder::Length(n)
    } else {
        keep_alive = false;
        Decoder::UntilClose
    };

    // The fields forwarded downstream: end-to-end ones only, except for a protocol
    // switch (the client needs `Upgrade` and `Connection`).
    let switching = status == StatusCode::SWITCHING_PROTOCOLS;
    // `Content-Length` goes on as one field with one value: none on a 1xx or 204
    // (RFC 9110 8.6: a server must not send it there), none when chunked overrides it,
    // and repeated equal lengths (`5, 5`, or two fields) as one, which HTTP/2 clients
    // require (nghttp2 resets a stream with two).
    let no_length = chunked || status.is_informational() || status == StatusCode::NO_CONTENT;
    let one_length = (lengths > 1 && !no_length).then_some(length).flatten();
    // Sized for every field (connection fields are dropped), which leaves room for the
    // `x-request-id` the proxy adds.
    let mut headers = HeaderMap::with_capacity(fields.len() + 1);
    for f in fields {
        let keep = switching
            || match classify(f.name) {
                Field::Connection | Field::TransferEncoding | Field::HopByHop => false,
                Field::ContentLength => !no_length && one_length.is_none(),
                Field::Other => {
                    listed.is_empty()
                        || !listed
                            .iter()
                            .any(|l| l.eq_ignore_ascii_case(f.name.as_bytes()))
                }
            };
        if keep {
            let name =
                HeaderName::from_bytes(f.name.as_bytes()).map_err(|_| ProtocolError::BadHead)?;
            let value = HeaderValue::from_bytes(f.value).map_err(|_| ProtocolError::BadHead)?;
            headers.append(name, value);
        }
    }
    if let Some(n) = one_length {
        headers.insert(CONTENT_LENGTH, HeaderValue::from(n));
    }
    Ok(ResponseHead {
        status,
        version,
        headers,
        decoder,
        keep_alive,
    })
}

/// True when the response switches protocols as the request asked.
pub(crate) fn is_upgrade_response(head: &ResponseHead) -> bool {
    head.status == StatusCode::SWITCHING_PROTOCOLS && head.headers.contains_key(UPGRADE)
}

impl From<BodyError> for ProtocolError {
    fn from(e: BodyError) -> Self {
        match e {
            BodyError::BadChunk => ProtocolError::BadChunk,
            BodyError::BadTrailers => ProtocolError::BadTrailers,
            BodyError::UnexpectedEof => ProtocolError::UnexpectedEof,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{encode_chunk, encode_chunked_end, head_end};
    use super::*;
    use http::header::CONTENT_LENGTH;

    /// What the connection's read loop does with `raw` received so far.
    fn head(raw: &[u8], method: &Method) -> Result<Option<(usize, ResponseHead)>, ProtocolError> {
        match head_end(raw, &mut 0) {
            Some(n) => parse_response_head(&raw[..n], method).map(|h| Some((n, h))),
            None if raw.len() >= MAX_HEAD => Err(ProtocolError::HeadTooLarge),
            None => Ok(None),
        }
    }

    fn request<'a>(headers: &'a HeaderMap, peer: &'a HeaderValue) -> UpstreamHead<'a> {
        UpstreamHead {
            method: &Method::POST,
            target: "/p?q=1",
            headers,
            upgrade: false,
            replace_host: false,
            default_host: "fallback:80",
            forwarded_for: peer,
            forwarded_proto: "http",
            request_id: "rid-1",
        }
    }

    fn wire(req: &UpstreamHead<'_>, framing: RequestFraming) -> String {
        let mut buf = Vec::new();
        encode_request_head(&mut buf, req, framing);
        String::from_utf8(buf).unwrap()
    }

    #[test]
    fn request_head_is_written_with_framing() {
        let mut h = HeaderMap::new();
        h.insert("host", HeaderValue::from_static("up"));
        h.append("x-a", HeaderValue::from_static("1"));
        let peer = HeaderValue::from_static("10.0.0.1");
        assert_eq!(
            wire(&request(&h, &peer), RequestFraming::Length(1234)),
            "POST /p?q=1 HTTP/1.1\r\nhost: up\r\nx-a: 1\r\nx-forwarded-for: 10.0.0.1\r\n\
             x-forwarded-proto: http\r\nx-request-id: rid-1\r\ncontent-length: 1234\r\n\r\n"
        );
        assert!(wire(&request(&h, &peer), RequestFraming::Chunked)
            .ends_with("transfer-encoding: chunked\r\n\r\n"));
        // No Host: the fallback.
        let empty = HeaderMap::new();
        assert!(wire(&request(&empty, &peer), RequestFraming::None)
            .starts_with("POST /p?q=1 HTTP/1.1\r\nhost: fallback:80\r\n"));

        let mut buf = Vec::new();
        encode_chunk(&mut buf, &[b'x'; 300]);
        encode_chunk(&mut buf, b"");
        encode_chunked_end(&mut buf, None);
        assert!(buf.starts_with(b"12c\r\nxxx"));
        assert!(buf.ends_with(b"xx\r\n0\r\n\r\n"));
        let mut t = HeaderMap::new();
        t.insert("x-sum", HeaderValue::from_static("7"));
        buf.clear();
        encode_chunked_end(&mut buf, Some(&t));
        assert_eq!(buf, b"0\r\nx-sum: 7\r\n\r\n");
        // Fields that may not follow the content are dropped.
        for name in [
            "content-length",
            "transfer-encoding",
            "host",
            "authorization",
        ] {
            t.insert(name, HeaderValue::from_static("1"));
        }
        buf.clear();
        encode_chunked_end(&mut buf, Some(&t));
        assert_eq!(buf, b"0\r\nx-sum: 7\r\n\r\n");
    }

    #[test]
    fn cookie_fields_are_sent_as_one_line() {
        let mut h = HeaderMap::new();
        h.append(COOKIE, HeaderValue::from_static("a=1"));
        h.insert("x-between", HeaderValue::from_static("1"));
        h.append(COOKIE, HeaderValue::from_static("b=2; c=3"));
        h.append(COOKIE, HeaderValue::from_static("d=4"));
        let peer = HeaderValue::from_static("10.0.0.1");
        let out = wire(&request(&h, &peer), RequestFraming::None);
        assert_eq!(out.matches("cookie:").count(), 1, "{out}");
        assert!(out.contains("\r\ncookie: a=1; b=2; c=3; d=4\r\n"), "{out}");
        assert!(out.contains("\r\nx-between: 1\r\n"), "{out}");
    }

    #[test]
    fn hop_by_hop_and_framing_fields_are_dropped_nominations_ignored() {
        let mut h = HeaderMap::new();
        h.insert(
            CONNECTION,
            HeaderValue::from_static("close, x-nominated, x-forwarded-for"),
        );
        h.insert("x-nominated", HeaderValue::from_static("1"));
        h.insert(CONTENT_LENGTH, HeaderValue::from_static("99"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("proxy-connection", HeaderValue::from_static("keep-alive"));
        h.insert(TE, HeaderValue::from_static("trailers"));
        h.insert(UPGRADE, HeaderValue::from_static("websocket"));
        h.insert("x-keep", HeaderValue::from_static("1"));
        h.insert(&X_FORWARDED_PROTO, HeaderValue::from_static("spoofed"));
        h.insert(&X_REQUEST_ID, HeaderValue::from_static("replaced"));
        h.insert(&X_FORWARDED_FOR, HeaderValue::from_static("1.2.3.4"));
        h.append(&X_FORWARDED_FOR, HeaderValue::from_static("5.6.7.8"));
        let peer = HeaderValue::from_static("10.0.0.1");
        let out = wire(&request(&h, &peer), RequestFraming::None);
        assert_eq!(
            out,
            "POST /p?q=1 HTTP/1.1\r\nx-nominated: 1\r\nx-keep: 1\r\nhost: fallback:80\r\n\
             x-forwarded-for: 1.2.3.4, 5.6.7.8, 10.0.0.1\r\nx-forwarded-proto: http\r\n\
             x-request-id: rid-1\r\n\r\n"
        );

        // An upgrade keeps Upgrade and says so in Connection.
        let mut h = HeaderMap::new();
        h.insert(CONNECTION, HeaderValue::from_static("Upgrade"));
        h.insert(UPGRADE, HeaderValue::from_static("websocket"));
        let mut req = request(&h, &peer);
        req.upgrade = true;
        let out = wire(&req, RequestFraming::None);
        assert!(out.contains("\r\nupgrade: websocket\r\n"), "{out}");
        assert!(out.contains("\r\nconnection: upgrade\r\n"), "{out}");
        assert!(!out.contains("Upgrade"), "{out}");
    }

    #[test]
    fn response_heads_and_framing() {
        let raw = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: b\r\n\r\nhello";
        let (n, h) = head(raw, &Method::GET).unwrap().unwrap();
        assert_eq!(n, raw.len() - 5);
        assert_eq!(h.status, StatusCode::OK);
        assert_eq!(h.headers["x-a"], "b");
        assert_eq!(h.decoder, Decoder::Length(5));
        assert!(h.keep_alive);

        // Partial head.
        assert!(head(b"HTTP/1.1 200 OK\r\nContent-Le", &Method::GET)
            .unwrap()
            .is_none());

        // HEAD, 204 and 304 have no body whatever the headers say.
        let (_, h) = head(
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n",
            &Method::HEAD,
        )
        .unwrap()
        .unwrap();
        assert!(h.decoder.is_done());
        for s in ["204 No Content", "304 Not Modified"] {
            let raw = format!("HTTP/1.1 {s}\r\ntransfer-encoding: chunked\r\n\r\n");
            let (_, h) = head(raw.as_bytes(), &Method::GET).unwrap().unwrap();
            assert!(h.decoder.is_done(), "{s}");
        }

        // Chunked; Transfer-Encoding wins over Content-Length and the connection is
        // not reused.
        let (_, h) = head(
            b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n",
            &Method::GET,
        )
        .unwrap()
        .unwrap();
        assert_eq!(h.decoder, Decoder::Chunked(Chunked::Size));
        assert!(!h.keep_alive);
        assert!(!h.headers.contains_key(CONTENT_LENGTH));

        // No length: until close, never reused.
        let (_, h) = head(b"HTTP/1.1 200 OK\r\n\r\n", &Method::GET)
            .unwrap()
            .unwrap();
        assert_eq!(h.decoder, Decoder::UntilClose);
        assert!(!h.keep_alive);
        // Any coding but one `chunked`, and any in HTTP/1.0, is refused: moat drops the
        // field, so the client would get the body still coded.
        for te in [
            "chunked, gzip",
            "gzip, chunked",
            "gzip",
            "identity",
            "chunked, chunked",
            "chunked\r\ntransfer-encoding: chunked",
            "xchunked",
        ] {
            let raw = format!("HTTP/1.1 200 OK\r\ntransfer-encoding: {te}\r\n\r\n");
            assert!(
                matches!(
                    head(raw.as_bytes(), &Method::GET),
                    Err(ProtocolError::BadTransferEncoding)
                ),
                "{te}"
            );
        }
        assert!(matches!(
            head(
                b"HTTP/1.0 200 OK\r\ntransfer-encoding: chunked\r\n\r\n",
                &Method::GET
            ),
            Err(ProtocolError::BadTransferEncoding)
        ));
        let (_, h) = head(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: , Chunked\r\n\r\n",
            &Method::GET,
        )
        .unwrap()
        .unwrap();
        assert_eq!(h.decoder, Decoder::Chunked(Chunked::Size));

        // Connection: close, HTTP/1.0 with and without keep-alive.
        let (_, h) = head(
            b"HTTP/1.1 200 OK\r\nconnection: foo, Close\r\ncontent-length: 0\r\n\r\n",
            &Method::GET,
        )
        .unwrap()
        .unwrap();
        assert!(!h.keep_alive);
        let (_, h) = head(
            b"HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n",
            &Method::GET,
        )
        .unwrap()
        .unwrap();
        assert!(!h.keep_alive);
        assert_eq!(h.version, Version::HTTP_10);
        let (_, h) = head(
            b"HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 0\r\n\r\n",
            &Method::GET,
        )
        .unwrap()
        .unwrap();
        assert!(h.keep_alive);

        // Hop-by-hop fields are not forwarded (those named by Connection included);
        // a 101 keeps them all.
        let (_, h) = head(
            b"HTTP/1.1 200 OK\r\nConnection: keep-alive, X-Hop\r\nx-hop: 1\r\n\
              Keep-Alive: timeout=5\r\nTransfer-Encoding: chunked\r\nUpgrade: h2c\r\n\
              Trailer: x-sum\r\nx-end: 1\r\n\r\n",
            &Method::GET,
        )
        .unwrap()
        .unwrap();
        assert!(h.keep_alive);
        assert_eq!(h.decoder, Decoder::Chunked(Chunked::Size));
        assert_eq!(h.headers.len(), 1, "{:?}", h.headers);
        assert_eq!(h.headers["x-end"], "1");
        let (_, h) = head(
            b"HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\n",
            &Method::GET,
        )
        .unwrap()
        .unwrap();
        assert!(is_upgrade_response(&h));
        assert_eq!(h.headers["connection"], "upgrade");

        // Identical repeated lengths are accepted.
        let (_, h) = head(
            b"HTTP/1.1 200 OK\r\ncontent-length: 4, 4\r\ncontent-length: 4\r\n\r\n",
            &Method::GET,
        )
        .unwrap()
        .unwrap();
        assert_eq!(h.decoder, Decoder::Length(4));
    }

    #[test]
    fn hostile_response_heads_are_refused() {
        let get = &Method::GET;
        for (raw, want) in [
            (
                &b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\ncontent-length: 5\r\n\r\n"[..],
                ProtocolError::BadContentLength,
            ),
            (
                b"HTTP/1.1 200 OK\r\ncontent-length: -1\r\n\r\n",
                ProtocolError::BadContentLength,
            ),
            (
                b"HTTP/1.1 200 OK\r\ncontent-length: 99999999999999999999\r\n\r\n",
                ProtocolError::BadContentLength,
            ),
            (
                b"HTTP/1.1 200 OK\r\ncontent-length: 0x10\r\n\r\n",
                ProtocolError::BadContentLength,
            ),
            (b"HTTP/1.1 2000 OK\r\n\r\n", ProtocolError::BadHead),
            (b"SSH-2.0-OpenSSH\r\n\r\n", ProtocolError::BadHead),
            (
                b"HTTP/1.1 200 OK\r\nbad header\r\n\r\n",
                ProtocolError::BadHead,
            ),
            (
                b"HTTP/1.1 200 OK\r\nx: a\rb\r\n\r\n",
                ProtocolError::BadHead,
            ),
        ] {
            assert_eq!(
                head(raw, get).unwrap_err(),
                want,
                "{}",
                String::from_utf8_lossy(raw)
            );
        }
        // Too many fields.
        let mut raw = b"HTTP/1.1 200 OK\r\n".to_vec();
        for i in 0..=MAX_HEADERS {
            raw.extend_from_slice(format!("x-{i}: 1\r\n").as_bytes());
        }
        raw.extend_from_slice(b"\r\n");
        assert_eq!(head(&raw, get).unwrap_err(), ProtocolError::TooManyHeaders);
        // A head that never ends.
        let mut raw = b"HTTP/1.1 200 OK\r\nx-big: ".to_vec();
        raw.resize(MAX_HEAD, b'a');
        assert_eq!(head(&raw, get).unwrap_err(), ProtocolError::HeadTooLarge);
        raw.truncate(MAX_HEAD - 1);
        assert!(head(&raw, get).unwrap().is_none());
    }
}
