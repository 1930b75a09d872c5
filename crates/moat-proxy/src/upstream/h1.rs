//! The HTTP/1.1 wire format towards upstreams: request heads written into a reused
//! buffer, response heads parsed with `httparse`, response bodies decoded
//! (`Content-Length`, chunked, until close) with explicit limits.
//!
//! moat drives each upstream exchange from the task that serves the downstream
//! connection instead of handing it to a client connection task (no channel, no second
//! task per request); this module is the pure part of that client, without I/O.

use std::mem::MaybeUninit;

use bytes::{Buf, Bytes, BytesMut};
use http::header::{HeaderMap, HeaderName, HeaderValue, CONNECTION, HOST};
use http::header::{TE, TRAILER, TRANSFER_ENCODING, UPGRADE};
use http::{Method, StatusCode, Version};

use super::UpstreamRequest;

/// `X-Forwarded-For`.
pub(crate) static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
/// `X-Forwarded-Proto`.
pub(crate) static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
static KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
static PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");

/// Largest accepted upstream response head (status line and header fields).
pub(crate) const MAX_HEAD: usize = 64 << 10;
/// Most header fields accepted in an upstream response head.
pub(crate) const MAX_HEADERS: usize = 128;
/// Longest accepted chunk-size line (size, extensions, CRLF).
const MAX_CHUNK_LINE: usize = 4096;
/// Largest accepted trailer section of a chunked response.
const MAX_TRAILERS: usize = 16 << 10;
/// Most trailer fields accepted.
const MAX_TRAILER_FIELDS: usize = 64;

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
            ProtocolError::BadChunk => "invalid chunked encoding from upstream",
            ProtocolError::BadTrailers => "invalid or oversized upstream trailers",
            ProtocolError::UnexpectedEof => "upstream closed the connection mid-message",
            ProtocolError::UnexpectedInterim => "unexpected interim response from upstream",
        })
    }
}

impl std::error::Error for ProtocolError {}

/// How the request body goes on the wire (decided from headers and body).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RequestFraming {
    /// No body, and no framing header to add.
    None,
    /// The headers carry `Content-Length`: the body is written as is.
    Length,
    /// Add `content-length: N`, then the body as is.
    AddLength(u64),
    /// Add `transfer-encoding: chunked` and encode the body in chunks.
    Chunked,
}

/// Header fields that apply to one connection only (RFC 9110 7.6.1).
fn is_hop_by_hop(name: &HeaderName) -> bool {
    name == CONNECTION
        || name == TE
        || name == TRAILER
        || name == TRANSFER_ENCODING
        || name == UPGRADE
        || name == KEEP_ALIVE
        || name == PROXY_CONNECTION
}

/// Other fields a `Connection` header names as hop-by-hop (rare: allocates only then).
fn connection_listed(headers: &HeaderMap) -> Vec<HeaderName> {
    let mut listed = Vec::new();
    for v in headers.get_all(CONNECTION) {
        for token in v.as_bytes().split(|&b| b == b',') {
            if let Ok(name) = HeaderName::from_bytes(token.trim_ascii()) {
                if !is_hop_by_hop(&name) {
                    listed.push(name);
                }
            }
        }
    }
    listed
}

fn push_field(buf: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    buf.extend_from_slice(name);
    buf.extend_from_slice(b": ");
    buf.extend_from_slice(value);
    buf.extend_from_slice(b"\r\n");
}

/// Writes the head of `req` as it goes upstream into `buf`, in one pass over its
/// fields (no header map is modified or copied):
///
/// * hop-by-hop fields are dropped: `Connection`, `Keep-Alive`, `Proxy-Connection`,
///   `TE`, `Trailer`, `Transfer-Encoding`, `Upgrade` and the fields `Connection` names;
///   for an upgrade, `Upgrade` stays and `Connection: upgrade` is sent;
/// * `Host` is added when the request has none;
/// * the client address is appended to `X-Forwarded-For`, `X-Forwarded-Proto` is set;
/// * `framing` adds `Content-Length` or `Transfer-Encoding: chunked` when needed.
///
/// Header values were validated by `http` (no CR/LF), so nothing can be injected.
pub(crate) fn encode_request_head(
    buf: &mut Vec<u8>,
    req: &UpstreamRequest<'_>,
    framing: RequestFraming,
) {
    let headers = req.headers;
    let listed = if headers.contains_key(CONNECTION) {
        connection_listed(headers)
    } else {
        Vec::new()
    };
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
    for (name, value) in headers {
        if name == HOST {
            has_host = true;
        } else if is_hop_by_hop(name) {
            if !(req.upgrade && name == UPGRADE) {
                continue;
            }
        } else if name == X_FORWARDED_FOR || name == X_FORWARDED_PROTO {
            // Rewritten below.
            continue;
        }
        if !listed.is_empty() && listed.contains(name) {
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
    if !listed.contains(&X_FORWARDED_FOR) {
        for v in headers.get_all(&X_FORWARDED_FOR) {
            if v.to_str().is_ok() {
                buf.extend_from_slice(v.as_bytes());
                buf.extend_from_slice(b", ");
            }
        }
    }
    buf.extend_from_slice(req.forwarded_for.as_bytes());
    buf.extend_from_slice(b"\r\n");
    push_field(buf, b"x-forwarded-proto", req.forwarded_proto.as_bytes());
    match framing {
        RequestFraming::None | RequestFraming::Length => {}
        RequestFraming::AddLength(n) => {
            buf.extend_from_slice(b"content-length: ");
            push_decimal(buf, n);
            buf.extend_from_slice(b"\r\n");
        }
        RequestFraming::Chunked => push_field(buf, b"transfer-encoding", b"chunked"),
    }
    buf.extend_from_slice(b"\r\n");
}

fn push_decimal(buf: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    buf.extend_from_slice(&digits[i..]);
}

/// Writes one chunk of a chunked request body (size line, data, CRLF) into `buf`.
pub(crate) fn encode_chunk(buf: &mut Vec<u8>, data: &[u8]) {
    if data.is_empty() {
        // A zero-size chunk would end the body.
        return;
    }
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut digits = [0u8; 16];
    let mut i = digits.len();
    let mut n = data.len();
    loop {
        i -= 1;
        digits[i] = HEX[n & 0xf];
        n >>= 4;
        if n == 0 {
            break;
        }
    }
    buf.reserve(data.len() + 20);
    buf.extend_from_slice(&digits[i..]);
    buf.extend_from_slice(b"\r\n");
    buf.extend_from_slice(data);
    buf.extend_from_slice(b"\r\n");
}

/// Writes the end of a chunked body, with its trailers, into `buf`.
pub(crate) fn encode_chunked_end(buf: &mut Vec<u8>, trailers: Option<&HeaderMap>) {
    buf.extend_from_slice(b"0\r\n");
    for (k, v) in trailers.into_iter().flatten() {
        push_field(buf, k.as_str().as_bytes(), v.as_bytes());
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

/// Parses a response head at the start of `buf`. `Ok(None)`: incomplete, read more.
/// On success, returns the head length and the head; the body framing follows RFC 9112
/// section 6.3 (`request_method` decides whether a body may follow).
/// Where the head in `buf` ends (just past its empty line), if it is complete.
/// `scanned` remembers how far previous calls looked, so a head arriving in many
/// small reads is scanned once.
pub(crate) fn head_end(buf: &[u8], scanned: &mut usize) -> Option<usize> {
    let from = scanned.saturating_sub(3);
    *scanned = buf.len();
    memchr::memmem::find(&buf[from..], b"\r\n\r\n").map(|i| from + i + 4)
}

/// Parses a complete response head (`head` ends with its empty line, see
/// [`head_end`]). The header values share `head`'s buffer: nothing is copied.
pub(crate) fn parse_response_head(
    head: Bytes,
    request_method: &Method,
) -> Result<ResponseHead, ProtocolError> {
    if head.len() > MAX_HEAD {
        return Err(ProtocolError::HeadTooLarge);
    }
    let mut slots = [MaybeUninit::<httparse::Header<'_>>::uninit(); MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut []);
    match httparse::ParserConfig::default()
        .parse_response_with_uninit_headers(&mut resp, &head, &mut slots)
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
    let mut chunked: Option<bool> = None;
    let mut length: Option<u64> = None;
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
                // Only the last coding matters: chunked must be last to delimit the body.
                if let Some(last) = f
                    .value
                    .split(|&b| b == b',')
                    .map(<[u8]>::trim_ascii)
                    .rfind(|t| !t.is_empty())
                {
                    chunked = Some(last.eq_ignore_ascii_case(b"chunked"));
                }
            }
            Field::ContentLength => {
                for part in f.value.split(|&b| b == b',').map(<[u8]>::trim_ascii) {
                    let n = parse_length(part).ok_or(ProtocolError::BadContentLength)?;
                    if length.is_some_and(|l| l != n) {
                        return Err(ProtocolError::BadContentLength);
                    }
                    length = Some(n);
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
    } else if let Some(chunked) = chunked {
        // Transfer-Encoding overrides Content-Length; a message carrying both is a
        // smuggling attempt or a broken server: never reuse that connection.
        if length.is_some() {
            keep_alive = false;
        }
        if chunked && version == Version::HTTP_11 {
            Decoder::Chunked(Chunked::Size)
        } else {
            // Any other final coding: the body ends when the connection does.
            keep_alive = false;
            Decoder::UntilClose
        }
    } else if let Some(n) = length {
        Decoder::Length(n)
    } else {
        keep_alive = false;
        Decoder::UntilClose
    };

    // The fields forwarded downstream: end-to-end ones only, except for a protocol
    // switch (the client needs `Upgrade` and `Connection`).
    let switching = status == StatusCode::SWITCHING_PROTOCOLS;
    let mut headers = HeaderMap::with_capacity(fields.len());
    for f in fields {
        let keep = switching
            || match classify(f.name) {
                Field::Connection | Field::TransferEncoding | Field::HopByHop => false,
                Field::ContentLength => chunked.is_none(),
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
            let value = HeaderValue::from_maybe_shared(head.slice_ref(f.value))
                .map_err(|_| ProtocolError::BadHead)?;
            headers.append(name, value);
        }
    }
    Ok(ResponseHead {
        status,
        version,
        headers,
        decoder,
        keep_alive,
    })
}

/// The connection-level role of a response field.
enum Field {
    Connection,
    TransferEncoding,
    ContentLength,
    /// Another hop-by-hop field: `Keep-Alive`, `Proxy-Connection`, `TE`, `Trailer`,
    /// `Upgrade`.
    HopByHop,
    Other,
}

fn classify(name: &str) -> Field {
    let is = |n: &str| name.eq_ignore_ascii_case(n);
    match name.len() {
        10 if is("connection") => Field::Connection,
        17 if is("transfer-encoding") => Field::TransferEncoding,
        14 if is("content-length") => Field::ContentLength,
        10 if is("keep-alive") => Field::HopByHop,
        16 if is("proxy-connection") => Field::HopByHop,
        2 if is("te") => Field::HopByHop,
        7 if is("trailer") || is("upgrade") => Field::HopByHop,
        _ => Field::Other,
    }
}

/// A `Content-Length` value: decimal digits only, at most 19 (no overflow).
fn parse_length(v: &[u8]) -> Option<u64> {
    if v.is_empty() || v.len() > 19 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(
        v.iter()
            .fold(0u64, |acc, &d| acc * 10 + u64::from(d - b'0')),
    )
}

/// True when the response switches protocols as the request asked.
pub(crate) fn is_upgrade_response(head: &ResponseHead) -> bool {
    head.status == StatusCode::SWITCHING_PROTOCOLS && head.headers.contains_key(UPGRADE)
}

/// Where a chunked body decoder is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Chunked {
    /// Expecting a chunk-size line.
    Size,
    /// Inside chunk data: bytes left in this chunk.
    Data(u64),
    /// Expecting the CRLF after chunk data.
    DataEnd,
    /// After the last chunk: expecting the trailer section.
    Trailers,
    /// The body ended.
    Done,
}

/// Decodes a response body from the connection's read buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decoder {
    /// `Content-Length`: bytes left.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked(Chunked),
    /// No length: the body ends when the upstream closes the connection.
    UntilClose,
}

/// One step of [`Decoder::decode`].
#[derive(Debug)]
pub(crate) enum Decoded {
    /// Body bytes.
    Data(Bytes),
    /// The trailers of a chunked body (its last frame).
    Trailers(HeaderMap),
    /// The body ended (for chunked bodies: with no trailers).
    End,
    /// The buffer holds no complete unit: read more from the connection.
    NeedMore,
}

impl Decoder {
    /// True once the whole body was decoded.
    pub(crate) fn is_done(&self) -> bool {
        matches!(self, Decoder::Length(0) | Decoder::Chunked(Chunked::Done))
    }

    /// Bytes still expected, when known.
    pub(crate) fn remaining(&self) -> Option<u64> {
        match self {
            Decoder::Length(n) => Some(*n),
            Decoder::Chunked(Chunked::Done) => Some(0),
            _ => None,
        }
    }

    /// Takes the next piece of the body from `buf` (consumed as it is decoded).
    pub(crate) fn decode(&mut self, buf: &mut BytesMut) -> Result<Decoded, ProtocolError> {
        match self {
            Decoder::Length(0) => Ok(Decoded::End),
            Decoder::Length(n) => {
                if buf.is_empty() {
                    return Ok(Decoded::NeedMore);
                }
                let take = (*n).min(buf.len() as u64) as usize;
                *n -= take as u64;
                Ok(Decoded::Data(buf.split_to(take).freeze()))
            }
            Decoder::UntilClose => {
                if buf.is_empty() {
                    Ok(Decoded::NeedMore)
                } else {
                    Ok(Decoded::Data(buf.split().freeze()))
                }
            }
            Decoder::Chunked(state) => decode_chunked(state, buf),
        }
    }

    /// The connection reached end of file: fine only for bodies delimited by the close.
    pub(crate) fn on_eof(&mut self) -> Result<(), ProtocolError> {
        match self {
            Decoder::UntilClose => {
                *self = Decoder::Length(0);
                Ok(())
            }
            d if d.is_done() => Ok(()),
            _ => Err(ProtocolError::UnexpectedEof),
        }
    }
}

fn decode_chunked(state: &mut Chunked, buf: &mut BytesMut) -> Result<Decoded, ProtocolError> {
    loop {
        match *state {
            Chunked::Size => {
                match buf.first() {
                    None => return Ok(Decoded::NeedMore),
                    Some(b) if !b.is_ascii_hexdigit() => return Err(ProtocolError::BadChunk),
                    Some(_) => {}
                }
                match httparse::parse_chunk_size(buf) {
                    Ok(httparse::Status::Complete((n, size))) => {
                        buf.advance(n);
                        *state = if size == 0 {
                            Chunked::Trailers
                        } else {
                            Chunked::Data(size)
                        };
                    }
                    Ok(httparse::Status::Partial) if buf.len() < MAX_CHUNK_LINE => {
                        return Ok(Decoded::NeedMore)
                    }
                    _ => return Err(ProtocolError::BadChunk),
                }
            }
            Chunked::Data(n) => {
                if buf.is_empty() {
                    return Ok(Decoded::NeedMore);
                }
                let take = n.min(buf.len() as u64) as usize;
                *state = if take as u64 == n {
                    Chunked::DataEnd
                } else {
                    Chunked::Data(n - take as u64)
                };
                return Ok(Decoded::Data(buf.split_to(take).freeze()));
            }
            Chunked::DataEnd => match buf.get(..2) {
                None if buf.first().is_none_or(|&b| b == b'\r') => return Ok(Decoded::NeedMore),
                Some(b"\r\n") => {
                    buf.advance(2);
                    *state = Chunked::Size;
                }
                _ => return Err(ProtocolError::BadChunk),
            },
            Chunked::Trailers => {
                if buf.len() < 2 {
                    return if buf.first().is_none_or(|&b| b != b'\n') {
                        Ok(Decoded::NeedMore)
                    } else {
                        Err(ProtocolError::BadTrailers)
                    };
                }
                if buf.starts_with(b"\r\n") {
                    buf.advance(2);
                    *state = Chunked::Done;
                    return Ok(Decoded::End);
                }
                let Some(end) = find_blank_line(buf) else {
                    return if buf.len() > MAX_TRAILERS {
                        Err(ProtocolError::BadTrailers)
                    } else {
                        Ok(Decoded::NeedMore)
                    };
                };
                if end > MAX_TRAILERS {
                    return Err(ProtocolError::BadTrailers);
                }
                let trailers = parse_trailers(&buf[..end])?;
                buf.advance(end);
                *state = Chunked::Done;
                return Ok(Decoded::Trailers(trailers));
            }
            Chunked::Done => return Ok(Decoded::End),
        }
    }
}

/// Offset just past the first empty line (`\r\n\r\n`) in `buf`.
fn find_blank_line(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

fn parse_trailers(section: &[u8]) -> Result<HeaderMap, ProtocolError> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_TRAILER_FIELDS];
    let fields = match httparse::parse_headers(section, &mut fields) {
        Ok(httparse::Status::Complete((_, f))) => f,
        _ => return Err(ProtocolError::BadTrailers),
    };
    let mut map = HeaderMap::with_capacity(fields.len());
    for f in fields {
        let name =
            HeaderName::from_bytes(f.name.as_bytes()).map_err(|_| ProtocolError::BadTrailers)?;
        let value = HeaderValue::from_bytes(f.value).map_err(|_| ProtocolError::BadTrailers)?;
        map.append(name, value);
    }
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::CONTENT_LENGTH;

    /// What the connection's read loop does with `raw` received so far.
    fn head(raw: &[u8], method: &Method) -> Result<Option<(usize, ResponseHead)>, ProtocolError> {
        match head_end(raw, &mut 0) {
            Some(n) => {
                parse_response_head(Bytes::copy_from_slice(&raw[..n]), method).map(|h| Some((n, h)))
            }
            None if raw.len() >= MAX_HEAD => Err(ProtocolError::HeadTooLarge),
            None => Ok(None),
        }
    }

    /// Decodes all of `wire` fed in pieces of `step` bytes; returns data and trailers.
    fn decode_all(
        mut d: Decoder,
        wire: &[u8],
        step: usize,
    ) -> Result<(Vec<u8>, Option<HeaderMap>), ProtocolError> {
        let mut buf = BytesMut::new();
        let mut fed = 0;
        let mut out = Vec::new();
        loop {
            match d.decode(&mut buf)? {
                Decoded::Data(b) => out.extend_from_slice(&b),
                Decoded::Trailers(t) => return Ok((out, Some(t))),
                Decoded::End => return Ok((out, None)),
                Decoded::NeedMore => {
                    if fed == wire.len() {
                        d.on_eof()?;
                        continue;
                    }
                    let end = (fed + step).min(wire.len());
                    buf.extend_from_slice(&wire[fed..end]);
                    fed = end;
                }
            }
        }
    }

    fn request<'a>(headers: &'a HeaderMap, peer: &'a HeaderValue) -> UpstreamRequest<'a> {
        UpstreamRequest {
            method: &Method::POST,
            target: "/p?q=1",
            headers,
            body: crate::body::ProxyBody::Empty,
            upgrade: false,
            default_host: "fallback:80",
            forwarded_for: peer,
            forwarded_proto: "http",
        }
    }

    fn wire(req: &UpstreamRequest<'_>, framing: RequestFraming) -> String {
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
            wire(&request(&h, &peer), RequestFraming::AddLength(1234)),
            "POST /p?q=1 HTTP/1.1\r\nhost: up\r\nx-a: 1\r\nx-forwarded-for: 10.0.0.1\r\n\
             x-forwarded-proto: http\r\ncontent-length: 1234\r\n\r\n"
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
    }

    #[test]
    fn hop_by_hop_request_fields_are_dropped_and_forwarded_for_appended() {
        let mut h = HeaderMap::new();
        h.insert(CONNECTION, HeaderValue::from_static("close, x-secret-hop"));
        h.insert("x-secret-hop", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("proxy-connection", HeaderValue::from_static("keep-alive"));
        h.insert(TE, HeaderValue::from_static("trailers"));
        h.insert(UPGRADE, HeaderValue::from_static("websocket"));
        h.insert("x-keep", HeaderValue::from_static("1"));
        h.insert(&X_FORWARDED_PROTO, HeaderValue::from_static("spoofed"));
        h.insert(&X_FORWARDED_FOR, HeaderValue::from_static("1.2.3.4"));
        h.append(&X_FORWARDED_FOR, HeaderValue::from_static("5.6.7.8"));
        let peer = HeaderValue::from_static("10.0.0.1");
        let out = wire(&request(&h, &peer), RequestFraming::None);
        assert_eq!(
            out,
            "POST /p?q=1 HTTP/1.1\r\nx-keep: 1\r\nhost: fallback:80\r\n\
             x-forwarded-for: 1.2.3.4, 5.6.7.8, 10.0.0.1\r\nx-forwarded-proto: http\r\n\r\n"
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

        // No length: until close, never reused; another coding last: until close.
        let (_, h) = head(b"HTTP/1.1 200 OK\r\n\r\n", &Method::GET)
            .unwrap()
            .unwrap();
        assert_eq!(h.decoder, Decoder::UntilClose);
        assert!(!h.keep_alive);
        let (_, h) = head(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked, gzip\r\n\r\n",
            &Method::GET,
        )
        .unwrap()
        .unwrap();
        assert_eq!(h.decoder, Decoder::UntilClose);

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

    #[test]
    fn chunked_bodies_decode_in_any_split() {
        let wire = b"5;ext=1\r\nhello\r\n6\r\n world\r\nA\r\n0123456789\r\n0\r\n\r\n";
        for step in [1, 2, 3, 7, wire.len()] {
            let (data, trailers) = decode_all(Decoder::Chunked(Chunked::Size), wire, step).unwrap();
            assert_eq!(data, b"hello world0123456789", "step {step}");
            assert!(trailers.is_none());
        }
        let wire = b"3\r\nabc\r\n0\r\nx-sum: 1\r\nx-other: 2\r\n\r\n";
        for step in [1, 4, wire.len()] {
            let (data, trailers) = decode_all(Decoder::Chunked(Chunked::Size), wire, step).unwrap();
            assert_eq!(data, b"abc");
            let t = trailers.unwrap();
            assert_eq!(t["x-sum"], "1");
            assert_eq!(t["x-other"], "2");
        }
        // Bytes after the end stay in the buffer (the caller refuses to reuse the
        // connection then).
        let mut buf = BytesMut::from(&b"0\r\n\r\nHTTP/1.1"[..]);
        let mut d = Decoder::Chunked(Chunked::Size);
        assert!(matches!(d.decode(&mut buf), Ok(Decoded::End)));
        assert!(d.is_done());
        assert_eq!(&buf[..], b"HTTP/1.1");
    }

    #[test]
    fn bad_chunked_bodies_are_errors() {
        let chunked = || Decoder::Chunked(Chunked::Size);
        for wire in [
            &b"zz\r\nhello\r\n0\r\n\r\n"[..],
            b"\r\nhello\r\n0\r\n\r\n",
            b"-5\r\nhello\r\n0\r\n\r\n",
            b"5\r\nhelloXX0\r\n\r\n",
            b"5\nhello\r\n0\r\n\r\n",
            b"ffffffffffffffffff\r\n",
            b"0\r\nno-colon\r\n\r\n",
            b"0\r\n\n",
        ] {
            assert!(
                decode_all(chunked(), wire, 1).is_err(),
                "{}",
                String::from_utf8_lossy(wire)
            );
            assert!(decode_all(chunked(), wire, wire.len()).is_err());
        }
        // An endless extension or trailer section.
        let mut wire = b"5;".to_vec();
        wire.resize(MAX_CHUNK_LINE + 10, b'a');
        assert_eq!(
            decode_all(chunked(), &wire, 512).unwrap_err(),
            ProtocolError::BadChunk
        );
        let mut wire = b"0\r\nx: ".to_vec();
        wire.resize(MAX_TRAILERS + 10, b'a');
        assert_eq!(
            decode_all(chunked(), &wire, 4096).unwrap_err(),
            ProtocolError::BadTrailers
        );
        // Early close in every state.
        for wire in [&b"5\r\nhel"[..], b"5\r\nhello", b"5\r\nhello\r\n", b"5"] {
            assert_eq!(
                decode_all(chunked(), wire, 2).unwrap_err(),
                ProtocolError::UnexpectedEof
            );
        }
    }

    #[test]
    fn length_and_close_delimited_bodies() {
        let (data, _) = decode_all(Decoder::Length(5), b"hello", 2).unwrap();
        assert_eq!(data, b"hello");
        // Extra bytes beyond the length are not body.
        let mut buf = BytesMut::from(&b"helloEXTRA"[..]);
        let mut d = Decoder::Length(5);
        assert!(matches!(d.decode(&mut buf), Ok(Decoded::Data(b)) if &b[..] == b"hello"));
        assert!(d.is_done());
        assert_eq!(&buf[..], b"EXTRA");
        assert_eq!(
            decode_all(Decoder::Length(10), b"short", 3).unwrap_err(),
            ProtocolError::UnexpectedEof
        );
        let (data, _) = decode_all(Decoder::UntilClose, b"all of it", 4).unwrap();
        assert_eq!(data, b"all of it");
    }
}
