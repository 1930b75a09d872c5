//! Properties of the HTTP/1.1 wire code that hold for any input, checked against a
//! parser that is not moat's own framing logic (`httparse` reading the same bytes, a
//! reference chunk reader): one copy shared by the property tests (`proptests`) and
//! the fuzz targets in `fuzz/` (through [`crate::fuzzing`]).
//!
//! Each check returns `Err` with what broke instead of panicking, so proptest can
//! shrink a failure and a fuzz target can print it.

use bytes::BytesMut;
use http::header::{HeaderMap, HeaderValue};
use http::{Method, StatusCode, Version};

use super::client::parse_response_head;
use super::server::{parse_request_head, RequestHead, MAX_HEADER_SLOTS};
use super::{classify, parse_length, BodyError, Chunked, Decoded, Decoder, Field};

/// What broke, in words.
pub(crate) type Failure = String;

/// `ensure!(cond)` / `ensure!(cond, "format", args)`: `Err` when `cond` is false.
macro_rules! ensure {
    ($cond:expr) => {
        if !$cond {
            return Err(format!("assertion failed: {}", stringify!($cond)));
        }
    };
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!("assertion failed: {}: {}", stringify!($cond), format_args!($($fmt)+)));
        }
    };
}

/// `ensure_eq!(a, b)` / `ensure_eq!(a, b, "format", args)`: `Err` when `a != b`.
macro_rules! ensure_eq {
    ($a:expr, $b:expr) => {
        if $a != $b {
            return Err(format!("{} != {}: {:?} != {:?}", stringify!($a), stringify!($b), $a, $b));
        }
    };
    ($a:expr, $b:expr, $($fmt:tt)+) => {
        if $a != $b {
            return Err(format!("{} != {}: {:?} != {:?}: {}", stringify!($a), stringify!($b), $a, $b, format_args!($($fmt)+)));
        }
    };
}

/// The comma-separated, trimmed elements of a field value.
fn list(v: &[u8]) -> impl Iterator<Item = &[u8]> {
    v.split(|&b| b == b',').map(<[u8]>::trim_ascii)
}

/// Parses `input` as a complete request head and checks every invariant of an
/// accepted head against what `httparse` reads in the same bytes.
pub(crate) fn check_request_head(input: &[u8], max_fields: usize) -> Result<(), Failure> {
    let Ok(h) = parse_request_head(input, max_fields) else {
        return Ok(());
    };
    let RequestHead { parts, decoder, .. } = &h;

    let mut slots = vec![httparse::EMPTY_HEADER; MAX_HEADER_SLOTS];
    let mut req = httparse::Request::new(&mut slots);
    let status = req.parse(input);
    ensure!(
        matches!(status, Ok(httparse::Status::Complete(n)) if n == input.len()),
        "accepted a head httparse does not read whole: {status:?}"
    );
    ensure!(req.headers.len() <= max_fields.max(1));
    ensure_eq!(Some(parts.method.as_str()), req.method);
    let target = req.path.unwrap_or_default();
    ensure_eq!(
        parts.version,
        if req.version == Some(0) {
            Version::HTTP_10
        } else {
            Version::HTTP_11
        }
    );
    if target.starts_with('/') {
        ensure_eq!(parts.uri.path_and_query().map(|p| p.as_str()), Some(target));
    }

    // Fields: each name keeps its values in order (but a `Content-Length` that moat
    // rewrote from a list of equal lengths).
    let is = |f: &httparse::Header<'_>, n: &str| f.name.eq_ignore_ascii_case(n);
    let fields = &*req.headers;
    for name in parts.headers.keys() {
        if name == http::header::CONTENT_LENGTH || name == http::header::EXPECT {
            continue;
        }
        let want: Vec<&[u8]> = fields
            .iter()
            .filter(|f| is(f, name.as_str()))
            .map(|f| f.value)
            .collect();
        let got: Vec<&[u8]> = parts
            .headers
            .get_all(name)
            .iter()
            .map(HeaderValue::as_bytes)
            .collect();
        ensure_eq!(got, want, "values of {}", name);
    }
    ensure!(!parts.headers.contains_key(http::header::EXPECT));
    let hosts = fields.iter().filter(|f| is(f, "host")).count();
    ensure!(hosts <= 1);
    ensure!(hosts == 1 || parts.version == Version::HTTP_10);
    if fields
        .iter()
        .filter(|f| is(f, "connection"))
        .any(|f| list(f.value).any(|t| t.eq_ignore_ascii_case(b"close")))
    {
        ensure!(!h.keep_alive);
    }
    // A `Connection` field never names a field that frames or routes the request.
    let nominated = fields
        .iter()
        .filter(|f| is(f, "connection"))
        .flat_map(|f| list(f.value))
        .any(|t| {
            ["content-length", "transfer-encoding", "host"]
                .iter()
                .any(|n| t.eq_ignore_ascii_case(n.as_bytes()))
        });
    ensure!(
        !nominated,
        "accepted a Connection naming a framing or routing field"
    );

    // Framing: never both, and the decoder is what the fields say.
    let te: Vec<&[u8]> = fields
        .iter()
        .filter(|f| is(f, "transfer-encoding"))
        .map(|f| f.value)
        .collect();
    let cl: Vec<&[u8]> = fields
        .iter()
        .filter(|f| is(f, "content-length"))
        .map(|f| f.value)
        .collect();
    ensure!(
        te.is_empty() || cl.is_empty(),
        "accepted Content-Length with Transfer-Encoding"
    );
    let map_cl: Vec<_> = parts
        .headers
        .get_all(http::header::CONTENT_LENGTH)
        .iter()
        .collect();
    match *decoder {
        Decoder::Chunked(Chunked::Size) => {
            ensure_eq!(parts.version, Version::HTTP_11);
            let codings: Vec<&[u8]> = te
                .iter()
                .flat_map(|v| list(v))
                .filter(|c| !c.is_empty())
                .collect();
            ensure_eq!(codings.len(), 1);
            ensure!(codings[0].eq_ignore_ascii_case(b"chunked"));
            ensure!(map_cl.is_empty());
        }
        Decoder::Length(n) => {
            ensure!(te.is_empty());
            for v in &cl {
                for part in list(v) {
                    ensure_eq!(super::parse_length(part), Some(n));
                }
            }
            if cl.is_empty() {
                ensure_eq!(n, 0);
                ensure!(map_cl.is_empty());
            } else {
                ensure_eq!(map_cl.len(), 1);
                // As sent (`05` stays `05`), or rewritten from a list of equal lengths.
                for part in list(map_cl[0].as_bytes()) {
                    ensure_eq!(super::parse_length(part), Some(n));
                }
            }
        }
        other => ensure!(false, "request decoder {other:?}"),
    }
    Ok(())
}

/// The result of decoding a whole input.
#[derive(Debug)]
pub(crate) struct Run {
    /// The body data, all frames concatenated.
    pub data: Vec<u8>,
    /// `Ok(Some)`: trailers, `Ok(None)`: end without trailers.
    pub outcome: Result<Option<HeaderMap>, BodyError>,
    /// Bytes not consumed (left in the buffer and never fed).
    pub rest: Vec<u8>,
}

/// Decodes `wire` fed in reads of `pieces` bytes (cycled), with end of file after
/// the last byte, checking the invariants of every step.
pub(crate) fn run(mut d: Decoder, wire: &[u8], pieces: &[usize]) -> Result<Run, Failure> {
    let mut buf = BytesMut::new();
    let mut fed = 0;
    let mut next = pieces.iter().cycle();
    let mut data = Vec::new();
    // Each step consumes or feeds at least one byte, or is the single end of file.
    let cap = 2 * wire.len() + 4;
    let mut steps = 0;
    let outcome = loop {
        steps += 1;
        ensure!(steps <= cap, "no end after {steps} steps");
        let before = buf.len();
        match d.decode(&mut buf) {
            Err(e) => break Err(e),
            Ok(Decoded::Data(b)) => {
                ensure!(!b.is_empty(), "empty data frame");
                ensure!(buf.len() + b.len() <= before);
                data.extend_from_slice(&b);
                ensure!(data.len() <= fed);
            }
            Ok(Decoded::Trailers(t)) => break Ok(Some(t)),
            Ok(Decoded::End) => break Ok(None),
            Ok(Decoded::NeedMore) => {
                if fed == wire.len() {
                    if let Err(e) = d.on_eof() {
                        break Err(e);
                    }
                    ensure!(d.is_done());
                    continue;
                }
                let n = next.next().copied().unwrap_or(wire.len()).max(1);
                let end = (fed + n).min(wire.len());
                buf.extend_from_slice(&wire[fed..end]);
                fed = end;
            }
        }
    };
    if outcome.is_ok() {
        ensure!(d.is_done());
        ensure_eq!(d.remaining(), Some(0));
        ensure!(d.on_eof().is_ok());
        ensure!(matches!(d.decode(&mut BytesMut::new()), Ok(Decoded::End)));
    }
    let mut rest = buf.to_vec();
    rest.extend_from_slice(&wire[fed..]);
    Ok(Run {
        data,
        outcome,
        rest,
    })
}

/// A reference reading of the chunks of `wire` (size lines by `httparse`, data, CRLF):
/// the data, and where the trailer section starts (after the last-chunk line).
pub(crate) fn reference_chunks(wire: &[u8]) -> Option<(Vec<u8>, usize)> {
    let mut data = Vec::new();
    let mut at = 0;
    loop {
        let (n, size) = match httparse::parse_chunk_size(wire.get(at..)?) {
            Ok(httparse::Status::Complete(c)) => c,
            _ => return None,
        };
        at += n;
        if size == 0 {
            return Some((data, at));
        }
        let end = at.checked_add(usize::try_from(size).ok()?)?;
        data.extend_from_slice(wire.get(at..end)?);
        if wire.get(end..end + 2)? != b"\r\n" {
            return None;
        }
        at = end + 2;
    }
}

/// True when `section` is one whole trailer section as `httparse` reads it.
pub(crate) fn whole_trailer_section(section: &[u8]) -> bool {
    let mut fields = [httparse::EMPTY_HEADER; 64];
    matches!(
        httparse::parse_headers(section, &mut fields),
        Ok(httparse::Status::Complete((n, _))) if n == section.len()
    )
}

/// The chunked decoder on arbitrary bytes, read whole and in reads of `pieces` bytes:
/// both readings agree (data, outcome, what is left), never yield more data than they
/// were given, and a body that ends well is exactly the chunks a reference reader finds
/// followed by one whole trailer section.
pub(crate) fn check_chunked(wire: &[u8], pieces: &[usize]) -> Result<(), Failure> {
    let whole = run(Decoder::Chunked(Chunked::Size), wire, &[wire.len().max(1)])?;
    let split = run(Decoder::Chunked(Chunked::Size), wire, pieces)?;
    ensure_eq!(&whole.data, &split.data);
    ensure_eq!(&whole.outcome, &split.outcome);
    ensure_eq!(&whole.rest, &split.rest);
    ensure!(whole.data.len() <= wire.len());
    if whole.outcome.is_ok() {
        let consumed = wire.len() - whole.rest.len();
        let Some((data, start)) = reference_chunks(wire) else {
            return Err("decoded what the reference refuses".into());
        };
        ensure_eq!(&whole.data, &data);
        ensure!(start + 2 <= consumed);
        // The trailer section is what lies between the last chunk and the end.
        let section = &wire[start..consumed];
        ensure!(
            section == b"\r\n" || whole_trailer_section(section),
            "took {:?} as trailers",
            String::from_utf8_lossy(section)
        );
    }
    Ok(())
}

/// Splits `data` at the given chunk sizes (the remainder is the last chunk).
pub(crate) fn chunks<'a>(data: &'a [u8], sizes: &[usize]) -> Vec<&'a [u8]> {
    let mut out = Vec::new();
    let mut at = 0;
    for &s in sizes {
        let end = (at + s).min(data.len());
        out.push(&data[at..end]);
        at = end;
    }
    out.push(&data[at..]);
    out
}

/// Chunked encoding then decoding gives back `data` and the `trailers` moat forwards
/// (those [`super::trailer_allowed`] keeps), whatever the chunk sizes and the reads, and
/// leaves the bytes after the body (`after`) unread.
pub(crate) fn check_chunked_round_trip(
    data: &[u8],
    sizes: &[usize],
    trailers: &HeaderMap,
    after: &[u8],
    pieces: &[usize],
) -> Result<(), Failure> {
    let mut wire = Vec::new();
    for c in chunks(data, sizes) {
        super::encode_chunk(&mut wire, c);
    }
    super::encode_chunked_end(&mut wire, Some(trailers));
    let mut kept = HeaderMap::new();
    for (k, v) in trailers {
        if super::trailer_allowed(k.as_str()) {
            kept.append(k, v.clone());
        }
    }
    let body_len = wire.len();
    wire.extend_from_slice(after);
    for pieces in [pieces, &[1], &[wire.len()]] {
        let r = run(Decoder::Chunked(Chunked::Size), &wire, pieces)?;
        ensure_eq!(&r.data[..], data);
        match &r.outcome {
            Ok(Some(t)) => ensure_eq!(t, &kept),
            Ok(None) => ensure!(kept.is_empty()),
            Err(e) => return Err(format!("error {e:?}")),
        }
        ensure_eq!(&r.rest[..], after);
        ensure_eq!(wire.len() - r.rest.len(), body_len);
    }
    Ok(())
}

/// Parses `input` as a complete upstream response head (to a `method` request) and
/// checks an accepted head against what `httparse` reads in the same bytes: status,
/// version, the fields forwarded (end-to-end ones, with their values in order), and
/// the body framing and connection reuse RFC 9112 section 6.3 derives from the fields.
/// Limits: a head over `MAX_HEAD` bytes or `MAX_HEADERS` fields is refused.
pub(crate) fn check_response_head(input: &[u8], method: &Method) -> Result<(), Failure> {
    use super::client::{ProtocolError, MAX_HEAD, MAX_HEADERS};
    let got = parse_response_head(input, method);
    if input.len() > MAX_HEAD {
        ensure!(matches!(got, Err(ProtocolError::HeadTooLarge)));
        return Ok(());
    }
    let mut slots = vec![httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut slots);
    let status = resp.parse(input);
    if matches!(status, Err(httparse::Error::TooManyHeaders)) {
        ensure!(matches!(got, Err(ProtocolError::TooManyHeaders)));
        return Ok(());
    }
    let Ok(h) = got else {
        return Ok(());
    };
    ensure!(
        matches!(status, Ok(httparse::Status::Complete(n)) if n == input.len()),
        "accepted a head httparse does not read whole: {status:?}"
    );
    ensure_eq!(Some(h.status.as_u16()), resp.code);
    ensure_eq!(
        h.version,
        if resp.version == Some(0) {
            Version::HTTP_10
        } else {
            Version::HTTP_11
        }
    );
    let fields = &*resp.headers;
    let is = |f: &httparse::Header<'_>, n: &str| f.name.eq_ignore_ascii_case(n);
    let values = |n: &str| {
        fields
            .iter()
            .filter(|f| is(f, n))
            .flat_map(|f| list(f.value))
            .filter(|t| !t.is_empty())
            .collect::<Vec<&[u8]>>()
    };
    let switching = h.status == StatusCode::SWITCHING_PROTOCOLS;
    let codings = values("transfer-encoding");
    let lengths = values("content-length");
    let connection = values("connection");

    // Forwarded fields: as received, in order; no connection-level field but for a
    // protocol switch. Repeated equal lengths go on as one.
    let one_length = lengths
        .first()
        .and_then(|l| parse_length(l))
        .map(|n| n.to_string());
    for name in h.headers.keys() {
        let mut want: Vec<&[u8]> = fields
            .iter()
            .filter(|f| is(f, name.as_str()))
            .map(|f| f.value)
            .collect();
        if name == http::header::CONTENT_LENGTH && !switching && lengths.len() > 1 {
            want = one_length.iter().map(|n| n.as_bytes()).collect();
        }
        let got: Vec<&[u8]> = h
            .headers
            .get_all(name)
            .iter()
            .map(HeaderValue::as_bytes)
            .collect();
        ensure_eq!(got, want, "values of {}", name);
        if !switching {
            ensure!(
                !matches!(
                    classify(name.as_str()),
                    Field::Connection | Field::TransferEncoding | Field::HopByHop
                ),
                "forwarded {name}"
            );
            ensure!(
                name != http::header::CONTENT_LENGTH || codings.is_empty(),
                "forwarded content-length with transfer-encoding"
            );
            let named = connection
                .iter()
                .any(|t| t.eq_ignore_ascii_case(name.as_str().as_bytes()));
            ensure!(
                !(named && matches!(classify(name.as_str()), Field::Other)),
                "forwarded {name}, which Connection names"
            );
        }
    }

    // A length goes on unless chunked overrides it, or the status forbids one (1xx
    // and 204, RFC 9110 8.6).
    if !switching {
        let forbidden = h.status.is_informational() || h.status == StatusCode::NO_CONTENT;
        ensure_eq!(
            h.headers.contains_key(http::header::CONTENT_LENGTH),
            !lengths.is_empty() && codings.is_empty() && !forbidden,
            "content-length forwarded"
        );
    }

    // Transfer codings: one `chunked` in HTTP/1.1 or none (another coding would reach
    // the client undecoded).
    ensure!(
        codings.is_empty()
            || (codings.len() == 1
                && codings[0].eq_ignore_ascii_case(b"chunked")
                && h.version == Version::HTTP_11),
        "accepted transfer codings {:?} in {:?}",
        codings,
        h.version
    );

    // Framing.
    let bodyless = *method == Method::HEAD
        || h.status.is_informational()
        || h.status == StatusCode::NO_CONTENT
        || h.status == StatusCode::NOT_MODIFIED;
    let want = if bodyless {
        Decoder::Length(0)
    } else if !codings.is_empty() {
        Decoder::Chunked(Chunked::Size)
    } else if let Some(first) = lengths.first() {
        // Every length must be the same number.
        let n = parse_length(first);
        ensure!(n.is_some() && lengths.iter().all(|l| parse_length(l) == n));
        Decoder::Length(n.unwrap_or_default())
    } else {
        Decoder::UntilClose
    };
    ensure_eq!(h.decoder, want);

    // Reuse: never after a close, a body delimited by the close, or both framings.
    if h.keep_alive {
        ensure!(!connection.iter().any(|t| t.eq_ignore_ascii_case(b"close")));
        ensure!(
            h.version == Version::HTTP_11
                || connection
                    .iter()
                    .any(|t| t.eq_ignore_ascii_case(b"keep-alive"))
        );
        ensure!(h.decoder != Decoder::UntilClose);
        ensure!(bodyless || codings.is_empty() || lengths.is_empty());
    }
    Ok(())
}
