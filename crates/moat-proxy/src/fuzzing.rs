//! Entry points for the fuzz targets in `fuzz/` (not a stable API): moat's HTTP/1.1
//! wire path without sockets, so that a fuzzer can hold it against a parser that is not
//! moat's own, and the properties of its parsers (the checks the property tests run,
//! one copy in `h1::oracle`). Each check returns `Err` naming what broke.

use bytes::{Bytes, BytesMut};
use http::HeaderValue;

use crate::body::ProxyBody;
use crate::h1::client::{encode_request_head, RequestFraming};
use crate::h1::oracle;
use crate::h1::server::{parse_request_head, request_head_end, MAX_HEADER_SLOTS};
use crate::h1::{encode_chunk, encode_chunked_end, Decoded};
use crate::upstream::{request_framing, UpstreamHead, UpstreamRequest};

/// A request as moat accepted it from the client and wrote it towards the upstream.
#[derive(Debug)]
pub struct Forwarded {
    /// Method.
    pub method: String,
    /// Origin-form target sent upstream.
    pub target: String,
    /// The body as moat decoded it from the client's framing (what its phases inspect).
    pub body: Bytes,
    /// The upstream request with the body in memory (moat frames it with its length).
    pub buffered: Vec<u8>,
    /// The same request with the body streamed (moat frames it in chunks, one per piece
    /// the client's framing delivered).
    pub streamed: Vec<u8>,
    /// Bytes after this request's end (a pipelined next request, or garbage).
    pub rest: usize,
}

/// Runs `input` (bytes from a client) through moat's request head parser and body
/// decoder, and writes the upstream request the proxy would send, both with the body in
/// memory and streamed. `None` when moat refuses the input or it ends mid-request.
pub fn forward_request(input: &[u8]) -> Option<Forwarded> {
    let end = request_head_end(input, &mut 0)?;
    let head = parse_request_head(&input[..end], MAX_HEADER_SLOTS).ok()?;
    let mut decoder = head.decoder;
    let mut buf = BytesMut::from(&input[end..]);
    let mut pieces: Vec<Bytes> = Vec::new();
    let mut trailers = None;
    loop {
        match decoder.decode(&mut buf).ok()? {
            Decoded::Data(d) => pieces.push(d),
            Decoded::Trailers(t) => {
                trailers = Some(t);
                break;
            }
            Decoded::End => break,
            // The input ended mid-body: moat would wait, then time out or see the close.
            Decoded::NeedMore => {
                decoder.on_eof().ok()?;
                break;
            }
        }
    }
    let body: Bytes = pieces.concat().into();
    let parts = &head.parts;
    let peer = HeaderValue::from_static("192.0.2.1");
    let target = parts.uri.path_and_query().map_or("/", |pq| pq.as_str());
    let upstream = |body: ProxyBody| UpstreamRequest {
        head: UpstreamHead {
            method: &parts.method,
            target,
            headers: &parts.headers,
            upgrade: false,
            replace_host: parts.uri.authority().is_some(),
            default_host: parts
                .uri
                .authority()
                .map_or("upstream.test", |a| a.as_str()),
            forwarded_for: &peer,
            forwarded_proto: "http",
            request_id: "fuzz",
        },
        body,
    };

    // The body in memory: the framing `Cluster::send` decides, the bytes as written.
    let req = upstream(ProxyBody::full(body.clone()));
    let framing = request_framing(&req);
    let mut buffered = Vec::new();
    encode_request_head(&mut buffered, &req.head, framing);
    match framing {
        RequestFraming::Chunked => {
            encode_chunk(&mut buffered, &body);
            encode_chunked_end(&mut buffered, None);
        }
        _ => buffered.extend_from_slice(&body),
    }

    // Streamed: chunks as `Conn::write_request` writes them.
    let mut streamed = Vec::new();
    encode_request_head(&mut streamed, &req.head, RequestFraming::Chunked);
    for piece in &pieces {
        encode_chunk(&mut streamed, piece);
    }
    encode_chunked_end(&mut streamed, trailers.as_ref());

    Some(Forwarded {
        method: parts.method.to_string(),
        target: target.to_string(),
        body,
        buffered,
        streamed,
        rest: buf.len(),
    })
}

/// The request head parser on client bytes: the head up to the first empty line (as
/// the server reads it) and the bytes whole, with at most `max_fields` fields, checked
/// against `httparse` and the framing rules of RFC 9112 section 6.
pub fn check_request_head(input: &[u8], max_fields: usize) -> Result<(), String> {
    if let Some(end) = request_head_end(input, &mut 0) {
        oracle::check_request_head(&input[..end], max_fields)?;
    }
    oracle::check_request_head(input, max_fields)
}

/// The response head parser on upstream bytes (to a `GET`, or a `HEAD` when `head`):
/// the head up to its empty line and the bytes whole, checked against `httparse`, the
/// framing of RFC 9112 section 6.3 and the size and field-count limits.
pub fn check_response_head(input: &[u8], head: bool) -> Result<(), String> {
    let method = if head {
        http::Method::HEAD
    } else {
        http::Method::GET
    };
    if let Some(end) = crate::h1::head_end(input, &mut 0) {
        oracle::check_response_head(&input[..end], &method)?;
    }
    oracle::check_response_head(input, &method)
}

/// The chunked decoder on arbitrary bytes, whole and in reads of `pieces` bytes
/// (cycled): same result either way, bounded steps and output, and the body a
/// reference chunk reader finds.
pub fn check_chunked(wire: &[u8], pieces: &[usize]) -> Result<(), String> {
    oracle::check_chunked(wire, pieces)
}

/// Chunked encode then decode of `data` cut at `sizes`, with `trailers` and `after`
/// (bytes of the next message): the same data and trailers come back, in any reads.
pub fn check_chunked_round_trip(
    data: &[u8],
    sizes: &[usize],
    trailers: &http::HeaderMap,
    after: &[u8],
    pieces: &[usize],
) -> Result<(), String> {
    oracle::check_chunked_round_trip(data, sizes, trailers, after, pieces)
}
