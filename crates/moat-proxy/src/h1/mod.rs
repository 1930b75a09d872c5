//! The HTTP/1.1 wire format, in both directions: the pieces shared by moat's
//! client towards upstreams ([`client`]) and its downstream server ([`server`]):
//! message bodies decoded from a connection's read buffer (`Content-Length`,
//! chunked, until close) with explicit limits, chunked encoding, and header field
//! classification. Everything here is pure except [`poll_body`], which reads a body
//! from a connection.

pub(crate) mod client;
pub(crate) mod oracle;
#[cfg(test)]
mod proptests;
pub(crate) mod server;

use std::sync::LazyLock;

use bytes::{Buf, Bytes, BytesMut};
use http::header::{HeaderMap, HeaderName, HeaderValue};
use memchr::memmem::Finder;

/// Longest accepted chunk-size line (size, extensions, CRLF).
const MAX_CHUNK_LINE: usize = 4096;
/// Largest accepted trailer section of a chunked body.
const MAX_TRAILERS: usize = 16 << 10;
/// Most trailer fields accepted.
const MAX_TRAILER_FIELDS: usize = 64;

/// A message body that is not framed as its head says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyError {
    /// A chunk-size line or a chunk delimiter is invalid.
    BadChunk,
    /// The trailer section is too large or invalid.
    BadTrailers,
    /// The connection closed before the end of the body.
    UnexpectedEof,
}

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BodyError::BadChunk => "invalid chunked encoding",
            BodyError::BadTrailers => "invalid or oversized trailers",
            BodyError::UnexpectedEof => "connection closed mid-body",
        })
    }
}

impl std::error::Error for BodyError {}

/// Pieces of a read buffer up to this size are copied out of it rather than split off
/// (measured on the proxied GET and 1 KiB POST: at 4 KiB the POST body's copy cost 3%
/// more user cycles than splitting it; docs/perf.md).
const COPY_MAX: usize = 512;

/// Boxed error of the bodies moat reads and forwards.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Takes the first `n` bytes of a connection's read buffer as a `Bytes`.
///
/// The first split of a `BytesMut` allocates a shared header for its buffer, and from
/// then on every split, clone and drop of the buffer and its pieces is an atomic
/// reference count update. A small piece (a short chunk, a small body) is cheaper to
/// copy, which keeps the connection's buffer a plain vector reused in place; larger
/// pieces are split without a copy.
pub(crate) fn take_bytes(buf: &mut BytesMut, n: usize) -> Bytes {
    if n <= COPY_MAX {
        let piece = Bytes::copy_from_slice(&buf[..n]);
        buf.advance(n);
        piece
    } else {
        buf.split_to(n).freeze()
    }
}

pub(super) fn push_field(buf: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    buf.extend_from_slice(name);
    buf.extend_from_slice(b": ");
    buf.extend_from_slice(value);
    buf.extend_from_slice(b"\r\n");
}

pub(super) fn push_decimal(buf: &mut Vec<u8>, mut n: u64) {
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

/// Writes the size line of a chunk of `len` bytes (not zero) into `buf`.
pub(crate) fn encode_chunk_head(buf: &mut Vec<u8>, len: usize) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut digits = [0u8; 16];
    let mut i = digits.len();
    let mut n = len;
    loop {
        i -= 1;
        digits[i] = HEX[n & 0xf];
        n >>= 4;
        if n == 0 {
            break;
        }
    }
    buf.extend_from_slice(&digits[i..]);
    buf.extend_from_slice(b"\r\n");
}

/// Writes one chunk of a chunked body (size line, data, CRLF) into `buf`.
pub(crate) fn encode_chunk(buf: &mut Vec<u8>, data: &[u8]) {
    if data.is_empty() {
        // A zero-size chunk would end the body.
        return;
    }
    buf.reserve(data.len() + 20);
    encode_chunk_head(buf, data.len());
    buf.extend_from_slice(data);
    buf.extend_from_slice(b"\r\n");
}

/// Writes the end of a chunked body, with its trailers, into `buf`; trailer fields
/// that may not follow the content ([`trailer_allowed`]) are dropped.
pub(crate) fn encode_chunked_end(buf: &mut Vec<u8>, trailers: Option<&HeaderMap>) {
    buf.extend_from_slice(b"0\r\n");
    for (k, v) in trailers.into_iter().flatten() {
        if trailer_allowed(k.as_str()) {
            push_field(buf, k.as_str().as_bytes(), v.as_bytes());
        }
    }
    buf.extend_from_slice(b"\r\n");
}

/// False for the trailer fields moat never forwards (`name` is lower case, as a
/// `HeaderName` is): those RFC 9110 6.5.1 says cannot be processed after the content
/// (framing, routing, hop-by-hop, authentication, request modifiers, content format:
/// the list Go's net/http refuses in trailers, RFC 7230 4.1.2's), cookies, and the
/// forwarding fields moat sets in the head. A recipient that merges trailers into the
/// header section would otherwise read them as if moat had checked them: a forged
/// `Authorization`, a second `Host`, an `X-Forwarded-For` after moat's own. Also false
/// for a name with `"`, which the `http` crate accepts and is not a token.
pub(crate) fn trailer_allowed(name: &str) -> bool {
    !name.contains('"')
        && !matches!(
            name,
            "authorization"
                | "cache-control"
                | "connection"
                | "content-encoding"
                | "content-length"
                | "content-range"
                | "content-type"
                | "cookie"
                | "expect"
                | "forwarded"
                | "host"
                | "if-match"
                | "if-modified-since"
                | "if-none-match"
                | "if-range"
                | "if-unmodified-since"
                | "keep-alive"
                | "max-forwards"
                | "pragma"
                | "proxy-authenticate"
                | "proxy-authorization"
                | "proxy-connection"
                | "range"
                | "set-cookie"
                | "te"
                | "trailer"
                | "transfer-encoding"
                | "upgrade"
                | "www-authenticate"
                | "x-forwarded-for"
                | "x-forwarded-host"
                | "x-forwarded-proto"
                | "x-real-ip"
                | "x-request-id"
        )
}

/// Where the head in `buf` ends (just past its empty line), if it is complete.
/// `scanned` remembers how far previous calls looked, so a head arriving in many
/// small reads is scanned once.
pub(crate) fn head_end(buf: &[u8], scanned: &mut usize) -> Option<usize> {
    // Built once: `memmem::find` builds its searcher on every call, which cost more
    // than the search of a response head (about 200 instructions a response).
    static BLANK_LINE: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\r\n\r\n"));
    let from = scanned.saturating_sub(3);
    *scanned = buf.len();
    BLANK_LINE.find(&buf[from..]).map(|i| from + i + 4)
}

/// The connection-level role of a header field.
pub(super) enum Field {
    Connection,
    TransferEncoding,
    ContentLength,
    /// Another hop-by-hop field: `Keep-Alive`, `Proxy-Connection`, `TE`, `Trailer`,
    /// `Upgrade`.
    HopByHop,
    Other,
}

pub(super) fn classify(name: &str) -> Field {
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
pub(super) fn parse_length(v: &[u8]) -> Option<u64> {
    if v.is_empty() || v.len() > 19 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(
        v.iter()
            .fold(0u64, |acc, &d| acc * 10 + u64::from(d - b'0')),
    )
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
    pub(crate) fn decode(&mut self, buf: &mut BytesMut) -> Result<Decoded, BodyError> {
        match self {
            Decoder::Length(0) => Ok(Decoded::End),
            Decoder::Length(n) => {
                if buf.is_empty() {
                    return Ok(Decoded::NeedMore);
                }
                let take = (*n).min(buf.len() as u64) as usize;
                *n -= take as u64;
                Ok(Decoded::Data(take_bytes(buf, take)))
            }
            Decoder::UntilClose => {
                if buf.is_empty() {
                    Ok(Decoded::NeedMore)
                } else {
                    Ok(Decoded::Data(take_bytes(buf, buf.len())))
                }
            }
            Decoder::Chunked(state) => decode_chunked(state, buf),
        }
    }

    /// The connection reached end of file: fine only for bodies delimited by the close.
    pub(crate) fn on_eof(&mut self) -> Result<(), BodyError> {
        match self {
            Decoder::UntilClose => {
                *self = Decoder::Length(0);
                Ok(())
            }
            d if d.is_done() => Ok(()),
            _ => Err(BodyError::UnexpectedEof),
        }
    }
}

fn decode_chunked(state: &mut Chunked, buf: &mut BytesMut) -> Result<Decoded, BodyError> {
    loop {
        match *state {
            Chunked::Size => {
                match buf.first() {
                    None => return Ok(Decoded::NeedMore),
                    Some(b) if !b.is_ascii_hexdigit() => return Err(BodyError::BadChunk),
                    Some(_) => {}
                }
                match httparse::parse_chunk_size(buf) {
                    // The limit holds for a line that arrived whole as for one that
                    // is still incomplete (the result must not depend on the reads).
                    Ok(httparse::Status::Complete((n, size))) if n <= MAX_CHUNK_LINE => {
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
                    _ => return Err(BodyError::BadChunk),
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
                return Ok(Decoded::Data(take_bytes(buf, take)));
            }
            Chunked::DataEnd => match buf.get(..2) {
                None if buf.first().is_none_or(|&b| b == b'\r') => return Ok(Decoded::NeedMore),
                Some(b"\r\n") => {
                    buf.advance(2);
                    *state = Chunked::Size;
                }
                _ => return Err(BodyError::BadChunk),
            },
            Chunked::Trailers => {
                // A bare-LF empty line ends no trailer section (see `parse_trailers`):
                // refused as soon as it is seen, however the bytes arrive.
                if buf.first() == Some(&b'\n') {
                    return Err(BodyError::BadTrailers);
                }
                if buf.len() < 2 {
                    return Ok(Decoded::NeedMore);
                }
                if buf.starts_with(b"\r\n") {
                    buf.advance(2);
                    *state = Chunked::Done;
                    return Ok(Decoded::End);
                }
                let Some(end) = find_blank_line(buf) else {
                    return if buf.len() > MAX_TRAILERS
                        || memchr::memmem::find(buf, b"\n\n").is_some()
                    {
                        Err(BodyError::BadTrailers)
                    } else {
                        Ok(Decoded::NeedMore)
                    };
                };
                if end > MAX_TRAILERS {
                    return Err(BodyError::BadTrailers);
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

/// Bytes reserved in a read buffer before each read (when less is free).
pub(crate) const READ_CHUNK: usize = 16 << 10;

/// Why reading a body from a connection failed.
#[derive(Debug)]
pub(crate) enum ReadError {
    /// The bytes are not framed as the head said.
    Framing(BodyError),
    /// The connection failed.
    Io(std::io::Error),
}

/// Polls the next piece of a body delimited by `decoder` from a connection: decodes
/// what `rbuf` holds, reads more from `io` when that is not enough. Shared by the
/// upstream response bodies and the downstream request bodies.
///
/// Returns `Decoded::End` once the body ended (by its framing, or by end of file for a
/// body delimited by the close); never `Decoded::NeedMore`. Sets `arrived` when it read
/// bytes from `io`, though they decode to nothing yet (part of a chunk-size line).
pub(crate) fn poll_body<R: tokio::io::AsyncRead + Unpin>(
    decoder: &mut Decoder,
    rbuf: &mut BytesMut,
    io: &mut R,
    cx: &mut std::task::Context<'_>,
    arrived: &mut bool,
) -> std::task::Poll<Result<Decoded, ReadError>> {
    use std::task::Poll;
    loop {
        match decoder.decode(rbuf) {
            Ok(Decoded::NeedMore) => {}
            Ok(step) => return Poll::Ready(Ok(step)),
            Err(e) => return Poll::Ready(Err(ReadError::Framing(e))),
        }
        if rbuf.capacity() - rbuf.len() < 1024 {
            rbuf.reserve(READ_CHUNK);
        }
        match tokio_util::io::poll_read_buf(std::pin::Pin::new(&mut *io), cx, rbuf) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Ok(0)) => {
                // Only a body delimited by the close may end here.
                return Poll::Ready(match decoder.on_eof() {
                    Ok(()) => Ok(Decoded::End),
                    Err(e) => Err(ReadError::Framing(e)),
                });
            }
            Poll::Ready(Ok(_)) => *arrived = true,
            Poll::Ready(Err(e)) => return Poll::Ready(Err(ReadError::Io(e))),
        }
    }
}

/// Offset just past the first empty line (`\r\n\r\n`) in `buf`.
fn find_blank_line(buf: &[u8]) -> Option<usize> {
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4)
}

fn parse_trailers(section: &[u8]) -> Result<HeaderMap, BodyError> {
    let mut fields = [httparse::EMPTY_HEADER; MAX_TRAILER_FIELDS];
    // httparse also ends a section at a bare-LF empty line: the section must be all
    // it parsed, else bytes after that line would be swallowed as trailers.
    let fields = match httparse::parse_headers(section, &mut fields) {
        Ok(httparse::Status::Complete((n, f))) if n == section.len() => f,
        _ => return Err(BodyError::BadTrailers),
    };
    let mut map = HeaderMap::with_capacity(fields.len());
    for f in fields {
        let name = HeaderName::from_bytes(f.name.as_bytes()).map_err(|_| BodyError::BadTrailers)?;
        let value = HeaderValue::from_bytes(f.value).map_err(|_| BodyError::BadTrailers)?;
        map.append(name, value);
    }
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes all of `wire` fed in pieces of `step` bytes; returns data and trailers.
    fn decode_all(
        mut d: Decoder,
        wire: &[u8],
        step: usize,
    ) -> Result<(Vec<u8>, Option<HeaderMap>), BodyError> {
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
            // A bare-LF empty line does not end trailers (found by the property tests:
            // whole, the bytes after it were swallowed as trailers).
            b"0\r\n\n\r\n\r\n",
            b"0\r\nx: 1\n\nGET /next HTTP/1.1\r\n\r\n",
        ] {
            assert!(
                decode_all(chunked(), wire, 1).is_err(),
                "{}",
                String::from_utf8_lossy(wire)
            );
            assert!(decode_all(chunked(), wire, wire.len()).is_err());
        }
        // A complete chunk-size line over the limit, arriving in one read.
        let mut wire = b"1;".to_vec();
        wire.resize(MAX_CHUNK_LINE, b'a');
        wire.extend_from_slice(b"\r\nx\r\n0\r\n\r\n");
        assert_eq!(
            decode_all(chunked(), &wire, wire.len()).unwrap_err(),
            BodyError::BadChunk
        );
        // An endless extension or trailer section.
        let mut wire = b"5;".to_vec();
        wire.resize(MAX_CHUNK_LINE + 10, b'a');
        assert_eq!(
            decode_all(chunked(), &wire, 512).unwrap_err(),
            BodyError::BadChunk
        );
        let mut wire = b"0\r\nx: ".to_vec();
        wire.resize(MAX_TRAILERS + 10, b'a');
        assert_eq!(
            decode_all(chunked(), &wire, 4096).unwrap_err(),
            BodyError::BadTrailers
        );
        // Early close in every state.
        for wire in [&b"5\r\nhel"[..], b"5\r\nhello", b"5\r\nhello\r\n", b"5"] {
            assert_eq!(
                decode_all(chunked(), wire, 2).unwrap_err(),
                BodyError::UnexpectedEof
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
            BodyError::UnexpectedEof
        );
        let (data, _) = decode_all(Decoder::UntilClose, b"all of it", 4).unwrap();
        assert_eq!(data, b"all of it");
    }
}
