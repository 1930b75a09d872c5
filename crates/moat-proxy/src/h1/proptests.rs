//! Property tests of the HTTP/1.1 wire code, fed hostile and randomly split input.
//!
//! * Request heads ([`parse_request_head`]): arbitrary bytes, token soups and valid
//!   heads with random byte flips, insertions and deletions never panic; an accepted
//!   head is consistent with what `httparse` reads in the same bytes (method, target,
//!   fields and their values in order), never carries both `Content-Length` and
//!   `Transfer-Encoding`, and its body decoder is the one its fields describe. A model
//!   of the framing rules says exactly which `Content-Length` / `Transfer-Encoding`
//!   combinations are accepted.
//! * [`request_head_end`] finds the first empty line (CRLF CRLF, LF LF, LF CRLF)
//!   whatever the split of its input, with `scanned` carried across calls.
//! * Bodies ([`Decoder`]): chunked round trips (random chunks and trailers, random
//!   splits, bytes after the end left in the buffer); the chunked decoder on hostile
//!   bytes never panics, never yields more data than it was given, never yields an
//!   empty data frame, ends within a bounded number of steps and, when it ends well,
//!   consumed exactly one valid chunked body; `Content-Length` bodies yield exactly
//!   their length and leave the rest.
//! * Heads moat writes are read back: [`encode_response_head`] by `httparse` and by
//!   moat's own client parser ([`parse_response_head`]), [`encode_request_head`] by
//!   moat's own server parser.

use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use super::client::{encode_request_head, parse_response_head, RequestFraming, UpstreamHead};
use super::oracle::{
    check_chunked, check_chunked_round_trip, check_request_head, check_response_head, run,
};
use super::server::{
    encode_response_head, parse_request_head, request_head_end, ResponseFraming, MAX_HEADER_SLOTS,
};
use super::{
    encode_chunk, encode_chunked_end, head_end, BodyError, Chunked, Decoder, MAX_CHUNK_LINE,
    MAX_TRAILERS,
};

/// A failed shared check (`oracle`) as a proptest failure.
fn ok<T>(r: Result<T, String>) -> Result<T, TestCaseError> {
    r.map_err(TestCaseError::fail)
}

/// 256 cases a property; failures are reported, not persisted into the source tree.
fn config() -> ProptestConfig {
    ProptestConfig {
        failure_persistence: None,
        ..ProptestConfig::with_cases(256)
    }
}

fn concat(parts: Vec<Vec<u8>>) -> Vec<u8> {
    parts.concat()
}

/// Piece sizes used to split an input into reads (cycled; never zero).
fn pieces() -> impl Strategy<Value = Vec<usize>> {
    vec(1usize..64, 1..16)
}

// ---------------------------------------------------------------------------
// Request heads.
// ---------------------------------------------------------------------------

/// Bytes that look like parts of request heads, in any order.
fn head_soup() -> impl Strategy<Value = Vec<u8>> {
    let token = prop_oneof![
        Just(b"GET ".to_vec()),
        Just(b"POST".to_vec()),
        Just(b" / ".to_vec()),
        Just(b"/a?b=c".to_vec()),
        Just(b"http://h.example/p".to_vec()),
        Just(b"*".to_vec()),
        Just(b" HTTP/1.1".to_vec()),
        Just(b" HTTP/1.0".to_vec()),
        Just(b"\r\n".to_vec()),
        Just(b"\n".to_vec()),
        Just(b"\r".to_vec()),
        Just(b"Host: x".to_vec()),
        Just(b"Content-Length: ".to_vec()),
        Just(b"Transfer-Encoding: ".to_vec()),
        Just(b"chunked".to_vec()),
        Just(b"Expect: 100-continue".to_vec()),
        Just(b"Connection: close".to_vec()),
        Just(b"12".to_vec()),
        Just(b", ".to_vec()),
        Just(b":".to_vec()),
        Just(b" ".to_vec()),
        Just(b"\t".to_vec()),
        any::<u8>().prop_map(|b| vec![b]),
    ];
    vec(token, 0..40).prop_map(concat)
}

const LINE_ENDS: [&str; 2] = ["\r\n", "\n"];

/// A valid-looking request head: method, target, version, `Host`, and fields among
/// which the framing and connection ones, with values that may or may not be valid.
fn valid_head() -> impl Strategy<Value = Vec<u8>> {
    let method = prop_oneof![
        Just("GET"),
        Just("POST"),
        Just("PUT"),
        Just("HEAD"),
        Just("OPTIONS"),
        Just("X-CUSTOM"),
    ];
    let target = prop_oneof![
        "/[a-z0-9/._-]{0,12}(\\?[a-z0-9=&]{0,8})?",
        Just("*".to_string()),
        Just("http://h.example:8080/p?q".to_string()),
    ];
    let name = prop_oneof![
        Just("Content-Length".to_string()),
        Just("content-length".to_string()),
        Just("Transfer-Encoding".to_string()),
        Just("TRANSFER-ENCODING".to_string()),
        Just("Connection".to_string()),
        Just("Expect".to_string()),
        Just("Host".to_string()),
        "[A-Za-z][A-Za-z0-9-]{0,12}",
    ];
    let value = prop_oneof![
        Just("chunked".to_string()),
        Just("Chunked, ".to_string()),
        Just("gzip, chunked".to_string()),
        "[0-9]{1,3}",
        Just("5, 5".to_string()),
        Just("close".to_string()),
        Just("keep-alive".to_string()),
        Just("100-continue".to_string()),
        Just("content-length".to_string()),
        Just("keep-alive, Host".to_string()),
        Just("Transfer-Encoding".to_string()),
        "[ -~]{0,20}",
    ];
    (
        method,
        target,
        0u8..2,
        prop::option::of("[a-z0-9.]{0,12}(:[0-9]{1,5})?"),
        vec((name, value), 0..8),
        0usize..2,
    )
        .prop_map(|(method, target, minor, host, fields, le)| {
            let le = LINE_ENDS[le];
            let mut s = format!("{method} {target} HTTP/1.{minor}{le}");
            if let Some(h) = host {
                s.push_str(&format!("Host: {h}{le}"));
            }
            for (n, v) in fields {
                s.push_str(&format!("{n}: {v}{le}"));
            }
            s.push_str(le);
            s.into_bytes()
        })
}

/// One random edit of a byte string.
#[derive(Debug, Clone)]
enum Edit {
    Flip(usize, u8),
    Insert(usize, u8),
    Delete(usize),
}

fn edits() -> impl Strategy<Value = Vec<Edit>> {
    let interesting = prop_oneof![
        Just(b'\r'),
        Just(b'\n'),
        Just(b' '),
        Just(b'\t'),
        Just(b':'),
        Just(b','),
        Just(0u8),
        Just(0x7f),
        Just(0x80),
        Just(0xff),
        any::<u8>(),
    ];
    let edit = prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Edit::Flip(i, b)),
        (any::<usize>(), interesting).prop_map(|(i, b)| Edit::Insert(i, b)),
        any::<usize>().prop_map(Edit::Delete),
    ];
    vec(edit, 1..6)
}

fn apply(mut v: Vec<u8>, edits: &[Edit]) -> Vec<u8> {
    for e in edits {
        match *e {
            Edit::Flip(i, b) if !v.is_empty() => {
                let i = i % v.len();
                v[i] ^= b | 1;
            }
            Edit::Insert(i, b) => {
                let i = i % (v.len() + 1);
                v.insert(i, b);
            }
            Edit::Delete(i) if !v.is_empty() => {
                let i = i % v.len();
                v.remove(i);
            }
            _ => {}
        }
    }
    v
}

/// A request head with `Host` and a random list of framing fields.
fn framing_head() -> impl Strategy<Value = (u8, Vec<(bool, &'static str)>)> {
    let te = prop_oneof![
        Just("chunked"),
        Just("Chunked"),
        Just("chunked, "),
        Just(", chunked"),
        Just("gzip, chunked"),
        Just("chunked, gzip"),
        Just("chunked, chunked"),
        Just("identity"),
        Just(""),
        Just("chunked;q=1"),
        Just("\"chunked\""),
    ];
    let cl = prop_oneof![
        Just("0"),
        Just("5"),
        Just("05"),
        Just("6"),
        Just("+5"),
        Just("-5"),
        Just("5, 5"),
        Just("5,6"),
        Just("5,"),
        Just(""),
        Just("0x5"),
        Just("5 5"),
        Just("9999999999999999999"),
        Just("18446744073709551616"),
    ];
    let field = prop_oneof![te.prop_map(|v| (true, v)), cl.prop_map(|v| (false, v))];
    (0u8..2, vec(field, 0..4))
}

/// What RFC 9112 section 6 and moat's stricter rules accept: the body decoder, or
/// `None` when the head must be refused.
fn framing_model(minor: u8, fields: &[(bool, &str)]) -> Option<Decoder> {
    let te: Vec<&str> = fields.iter().filter(|f| f.0).map(|f| f.1).collect();
    let cl: Vec<&str> = fields.iter().filter(|f| !f.0).map(|f| f.1).collect();
    if !te.is_empty() {
        let codings: Vec<&str> = te
            .iter()
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .collect();
        let ok = minor == 1
            && cl.is_empty()
            && codings.len() == 1
            && codings[0].eq_ignore_ascii_case("chunked");
        return ok.then_some(Decoder::Chunked(Chunked::Size));
    }
    let mut length = None;
    for part in cl.iter().flat_map(|v| v.split(',')).map(str::trim) {
        if part.is_empty() || part.len() > 19 || !part.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let n: u64 = part.parse().ok()?;
        if length.is_some_and(|l| l != n) {
            return None;
        }
        length = Some(n);
    }
    Some(Decoder::Length(length.unwrap_or(0)))
}

/// The first empty line in `buf`: just past LF LF or LF CR LF.
fn first_empty_line(buf: &[u8]) -> Option<usize> {
    (0..buf.len()).find_map(|i| {
        if buf[i] != b'\n' {
            return None;
        }
        match &buf[i + 1..] {
            [b'\n', ..] => Some(i + 2),
            [b'\r', b'\n', ..] => Some(i + 3),
            _ => None,
        }
    })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn request_heads_from_arbitrary_bytes(input in vec(any::<u8>(), 0..512), max in 0usize..600) {
        ok(check_request_head(&input, max))?;
    }

    #[test]
    fn request_heads_from_head_soup(input in head_soup(), max in 1usize..16) {
        ok(check_request_head(&input, max))?;
        if let Some(end) = request_head_end(&input, &mut 0) {
            ok(check_request_head(&input[..end], max))?;
        }
    }

    #[test]
    fn valid_request_heads_with_random_edits(head in valid_head(), edits in edits()) {
        ok(check_request_head(&head, MAX_HEADER_SLOTS))?;
        let input = apply(head, &edits);
        ok(check_request_head(&input, MAX_HEADER_SLOTS))?;
        // As the server reads it: up to the first empty line.
        if let Some(end) = request_head_end(&input, &mut 0) {
            ok(check_request_head(&input[..end], MAX_HEADER_SLOTS))?;
        }
    }

    #[test]
    fn request_framing_follows_the_model((minor, fields) in framing_head()) {
        let mut s = format!("POST / HTTP/1.{minor}\r\nHost: x\r\n");
        for (te, v) in &fields {
            let name = if *te { "Transfer-Encoding" } else { "Content-Length" };
            s.push_str(&format!("{name}: {v}\r\n"));
        }
        s.push_str("\r\n");
        let got = parse_request_head(s.as_bytes(), MAX_HEADER_SLOTS);
        let want = framing_model(minor, &fields);
        prop_assert_eq!(got.as_ref().ok().map(|h| h.decoder), want, "{:?} -> {:?}", s, got);
        ok(check_request_head(s.as_bytes(), MAX_HEADER_SLOTS))?;
    }

    #[test]
    fn request_head_end_is_split_independent(
        input in prop_oneof![head_soup(), valid_head().prop_map(|mut h| { h.extend_from_slice(b"BODY\r\n\r\n"); h })],
        pieces in pieces(),
    ) {
        let want = first_empty_line(&input);
        prop_assert_eq!(request_head_end(&input, &mut 0), want);
        let mut scanned = 0;
        let mut len = 0;
        let mut found = None;
        for p in pieces.iter().cycle() {
            len = (len + p).min(input.len());
            found = request_head_end(&input[..len], &mut scanned);
            prop_assert_eq!(scanned, len);
            if found.is_some() || len == input.len() {
                break;
            }
        }
        prop_assert_eq!(found, want);
        if let Some(end) = found {
            prop_assert!(end <= len);
        }
    }

    #[test]
    fn response_heads_from_head_soup(
        input in prop_oneof![
            head_soup().prop_map(|mut h| { h.splice(0..0, b"HTTP/1.1 200 OK\r\n".iter().copied()); h }),
            vec(any::<u8>(), 0..256),
        ],
        head in any::<bool>(),
    ) {
        let method = if head { Method::HEAD } else { Method::GET };
        ok(check_response_head(&input, &method))?;
        if let Some(end) = head_end(&input, &mut 0) {
            ok(check_response_head(&input[..end], &method))?;
        }
    }

    #[test]
    fn head_end_is_split_independent(input in head_soup(), pieces in pieces()) {
        let want = memchr::memmem::find(&input, b"\r\n\r\n").map(|i| i + 4);
        prop_assert_eq!(head_end(&input, &mut 0), want);
        let mut scanned = 0;
        let mut len = 0;
        let mut found = None;
        for p in pieces.iter().cycle() {
            len = (len + p).min(input.len());
            found = head_end(&input[..len], &mut scanned);
            if found.is_some() || len == input.len() {
                break;
            }
        }
        prop_assert_eq!(found, want);
    }
}

// ---------------------------------------------------------------------------
// Bodies.
// ---------------------------------------------------------------------------

const TRAILERS: [(&str, &str); 7] = [
    ("x-sum", "7"),
    ("x-trace", "a b\tc"),
    ("etag", "\"v1\""),
    ("x-sum", "8"),
    ("server-timing", "db;dur=53"),
    // Never forwarded (`trailer_allowed`): the round trip drops them.
    ("content-length", "0"),
    ("authorization", "Bearer forged"),
];

/// Chunked-looking bytes: size lines, delimiters, data, trailers, garbage.
fn chunked_soup() -> impl Strategy<Value = Vec<u8>> {
    let token = prop_oneof![
        (1usize..40).prop_map(|n| format!("{n:x}\r\n").into_bytes()),
        Just(b"0\r\n".to_vec()),
        Just(b"\r\n".to_vec()),
        Just(b"\n".to_vec()),
        Just(b"\r".to_vec()),
        Just(b";ext=1".to_vec()),
        Just(b"x-t: 1".to_vec()),
        Just(b":".to_vec()),
        Just(b" ".to_vec()),
        Just(b"ffffffffffffffff".to_vec()),
        Just(b"GET / HTTP/1.1".to_vec()),
        vec(any::<u8>(), 1..8),
        vec(Just(b'a'), 1..40),
    ];
    vec(token, 0..32).prop_map(concat)
}

/// A valid chunked body up to its last-chunk line, then trailer-like bytes.
fn trailer_soup() -> impl Strategy<Value = Vec<u8>> {
    let token = prop_oneof![
        Just(b"x-t: 1".to_vec()),
        Just(b"\r\n".to_vec()),
        Just(b"\n".to_vec()),
        Just(b"\r".to_vec()),
        Just(b":".to_vec()),
        Just(b" ".to_vec()),
        Just(b"GET / HTTP/1.1".to_vec()),
        vec(any::<u8>(), 1..4),
    ];
    (vec(any::<u8>(), 0..64), vec(token, 0..12)).prop_map(|(data, tokens)| {
        let mut wire = Vec::new();
        encode_chunk(&mut wire, &data);
        wire.extend_from_slice(b"0\r\n");
        wire.extend_from_slice(&tokens.concat());
        wire
    })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn chunked_round_trip(
        data in vec(any::<u8>(), 0..2048),
        sizes in vec(0usize..300, 0..12),
        trailers in vec(0usize..TRAILERS.len(), 0..4),
        after in vec(any::<u8>(), 0..24),
        pieces in pieces(),
    ) {
        let mut map = HeaderMap::new();
        for i in trailers {
            let (k, v) = TRAILERS[i];
            map.append(k, HeaderValue::from_static(v));
        }
        ok(check_chunked_round_trip(&data, &sizes, &map, &after, &pieces))?;
        // Without trailers, `None` and an empty map are the same end.
        let mut a = Vec::new();
        let mut b = Vec::new();
        encode_chunked_end(&mut a, None);
        encode_chunked_end(&mut b, Some(&HeaderMap::new()));
        prop_assert_eq!(a, b"0\r\n\r\n".to_vec());
        prop_assert_eq!(b, b"0\r\n\r\n".to_vec());
    }

    #[test]
    fn chunked_decoder_on_hostile_bytes(
        wire in prop_oneof![chunked_soup(), vec(any::<u8>(), 0..256)],
        pieces in pieces(),
    ) {
        // `run` asserts: no panic, bounded steps, no empty data frame, never more data
        // than input, a finished decoder after a good end; `check_chunked` that the
        // body read is what a reference chunk reader reads.
        ok(check_chunked(&wire, &pieces))?;
    }

    #[test]
    fn length_bodies_yield_exactly_their_length(
        wire in vec(any::<u8>(), 0..3000),
        n in 0u64..3000,
        pieces in pieces(),
    ) {
        let r = ok(run(Decoder::Length(n), &wire, &pieces))?;
        if n as usize <= wire.len() {
            prop_assert!(r.outcome.as_ref().is_ok_and(Option::is_none));
            prop_assert_eq!(&r.data[..], &wire[..n as usize]);
            prop_assert_eq!(&r.rest[..], &wire[n as usize..]);
        } else {
            prop_assert_eq!(r.outcome.unwrap_err(), BodyError::UnexpectedEof);
            prop_assert_eq!(&r.data, &wire);
        }
        let r = ok(run(Decoder::UntilClose, &wire, &pieces))?;
        prop_assert!(r.outcome.is_ok());
        prop_assert_eq!(&r.data, &wire);
        prop_assert!(r.rest.is_empty());
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..config() })]

    #[test]
    fn trailer_limit_is_split_independent(
        len in (MAX_TRAILERS - 12)..(MAX_TRAILERS + 4),
        pieces in vec(256usize..4096, 1..8),
    ) {
        // A trailer section of exactly `len` bytes: `x: aaa…\r\n\r\n`.
        let mut wire = b"0\r\nx: ".to_vec();
        wire.resize(3 + len - 4, b'a');
        wire.extend_from_slice(b"\r\n\r\n");
        let whole = ok(run(Decoder::Chunked(Chunked::Size), &wire, &[wire.len()]))?;
        let split = ok(run(Decoder::Chunked(Chunked::Size), &wire, &pieces))?;
        prop_assert_eq!(&whole.outcome, &split.outcome);
        if len <= MAX_TRAILERS {
            let t = whole.outcome.map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(t.map(|t| t["x"].len()), Some(len - 7));
        } else {
            prop_assert_eq!(whole.outcome.unwrap_err(), BodyError::BadTrailers);
        }
    }
}

// The decoder must not depend on how the bytes arrive. Both properties below found
// bugs (fixed): their minimal inputs are kept in the comments.
proptest! {
    #![proptest_config(config())]

    /// Found (fixed): a trailer section was taken to end at the first CRLF CRLF, but parsed with
    /// `httparse::parse_headers`, which also ends a section at a bare LF empty line and
    /// whose consumed length is not checked. So `0\r\n\n` + anything + `\r\n\r\n` is
    /// accepted whole, the bytes after the LF (e.g. a pipelined request) silently
    /// swallowed as "trailers", while the same bytes fed one at a time are refused
    /// (`0\r\n\n` alone is `BadTrailers`). Minimal: `b"0\r\n\n\r\n\r\n"`: whole, it is
    /// `Trailers({})` consuming 7 bytes; in 1-byte reads it is `Err(BadTrailers)`.
    #[test]
    fn chunked_trailers_end_where_httparse_ends_them(
        wire in prop_oneof![chunked_soup(), trailer_soup()],
        pieces in pieces(),
    ) {
        ok(check_chunked(&wire, &pieces))?;
    }

    /// Found (fixed): `MAX_CHUNK_LINE` was only checked while a chunk-size line is
    /// incomplete. A longer line that arrives whole in one read is accepted; the same
    /// line in smaller reads is `BadChunk`. Minimal: `b"1;"` + 4093 bytes `a` +
    /// `b"\r\nx\r\n0\r\n\r\n"` (a size line of 4097 bytes): whole, it decodes to
    /// `x`; in 1-byte reads it is `Err(BadChunk)`.
    #[test]
    fn chunk_line_limit_is_split_independent(
        ext in (MAX_CHUNK_LINE - 8)..(MAX_CHUNK_LINE + 8),
        pieces in pieces(),
    ) {
        let mut wire = b"1;".to_vec();
        wire.resize(2 + ext, b'a');
        wire.extend_from_slice(b"\r\nx\r\n0\r\n\r\n");
        let whole = ok(run(Decoder::Chunked(Chunked::Size), &wire, &[wire.len()]))?;
        let split = ok(run(Decoder::Chunked(Chunked::Size), &wire, &pieces))?;
        prop_assert_eq!(&whole.outcome, &split.outcome, "extension of {} bytes", ext);
        prop_assert_eq!(whole.outcome.is_ok(), 2 + ext + 2 <= MAX_CHUNK_LINE);
    }
}

// ---------------------------------------------------------------------------
// Heads moat writes.
// ---------------------------------------------------------------------------

/// Header names: framing, hop-by-hop and ordinary ones.
fn field_name() -> impl Strategy<Value = HeaderName> {
    prop_oneof![
        Just("content-length".to_string()),
        Just("transfer-encoding".to_string()),
        Just("connection".to_string()),
        Just("keep-alive".to_string()),
        Just("upgrade".to_string()),
        Just("te".to_string()),
        Just("trailer".to_string()),
        Just("proxy-connection".to_string()),
        Just("date".to_string()),
        Just("set-cookie".to_string()),
        "[a-z][a-z0-9!#$%&'*+.^_`|~-]{0,16}",
    ]
    .prop_filter_map("header name", |n| HeaderName::from_bytes(n.as_bytes()).ok())
}

/// Header values: visible ASCII, spaces, tabs and obs-text.
fn field_value() -> impl Strategy<Value = HeaderValue> {
    let byte = prop_oneof![
        8 => 0x21u8..0x7f,
        1 => Just(b' '),
        1 => Just(b'\t'),
        1 => 0x80u8..=0xff,
    ];
    vec(byte, 0..24).prop_filter_map("header value", |v| HeaderValue::from_bytes(&v).ok())
}

fn trim_ows(v: &[u8]) -> &[u8] {
    let start = v
        .iter()
        .position(|&b| b != b' ' && b != b'\t')
        .unwrap_or(v.len());
    let end = v
        .iter()
        .rposition(|&b| b != b' ' && b != b'\t')
        .map_or(start, |i| i + 1);
    &v[start..end]
}

fn response_framing() -> impl Strategy<Value = ResponseFraming> {
    prop_oneof![
        Just(ResponseFraming::NoBody),
        // moat's parsers accept lengths of at most 19 digits.
        (0u64..10_000_000_000_000_000_000).prop_map(ResponseFraming::Length),
        Just(ResponseFraming::Chunked),
        Just(ResponseFraming::Close),
    ]
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn response_heads_read_back(
        code in 100u16..1000,
        fields in vec((field_name(), field_value()), 0..12),
        framing in response_framing(),
        connection in prop_oneof![Just(None), Just(Some(&b"close"[..])), Just(Some(&b"keep-alive"[..]))],
    ) {
        let status = StatusCode::from_u16(code).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let mut map = HeaderMap::new();
        for (k, v) in &fields {
            map.append(k.clone(), v.clone());
        }
        let mut buf = b"left alone".to_vec();
        encode_response_head(&mut buf, status, &map, framing, connection);
        prop_assert!(buf.starts_with(b"left alone"));
        let out = &buf[10..];
        prop_assert_eq!(head_end(out, &mut 0), Some(out.len()));

        let mut slots = [httparse::EMPTY_HEADER; 32];
        let mut resp = httparse::Response::new(&mut slots);
        let parsed = resp.parse(out);
        prop_assert!(
            matches!(parsed, Ok(httparse::Status::Complete(n)) if n == out.len()),
            "{:?}: {:?}", parsed, String::from_utf8_lossy(out)
        );
        prop_assert_eq!(resp.version, Some(1));
        prop_assert_eq!(resp.code, Some(code));
        prop_assert_eq!(resp.reason, Some(status.canonical_reason().unwrap_or("")));

        // The fields: the map's (framing and connection ones dropped, but a protocol
        // switch keeps its connection fields, a response without body its length),
        // `date` when missing, then the framing and `connection`.
        let switching = status == StatusCode::SWITCHING_PROTOCOLS;
        let mut want: Vec<(String, Vec<u8>)> = Vec::new();
        for (k, v) in &map {
            let drop = match k.as_str() {
                "content-length" => framing != ResponseFraming::NoBody,
                "transfer-encoding" => true,
                "connection" | "keep-alive" | "upgrade" | "te" | "trailer" | "proxy-connection" => {
                    !switching
                }
                _ => false,
            };
            if !drop {
                want.push((k.as_str().to_string(), trim_ows(v.as_bytes()).to_vec()));
            }
        }
        let has_date = map.contains_key(http::header::DATE);
        let got: Vec<(String, Vec<u8>)> = resp
            .headers
            .iter()
            .map(|h| (h.name.to_string(), h.value.to_vec()))
            .collect();
        let mut rest = &got[..];
        prop_assert!(rest.len() >= want.len());
        prop_assert_eq!(&rest[..want.len()], &want[..]);
        rest = &rest[want.len()..];
        if !has_date {
            prop_assert!(!rest.is_empty());
            prop_assert_eq!(&rest[0].0, "date");
            let d = std::str::from_utf8(&rest[0].1).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert!(httpdate::parse_http_date(d).is_ok(), "date {:?}", d);
            rest = &rest[1..];
        }
        let mut tail: Vec<(String, Vec<u8>)> = Vec::new();
        match framing {
            ResponseFraming::Length(n) => {
                tail.push(("content-length".into(), n.to_string().into_bytes()));
            }
            ResponseFraming::Chunked => {
                tail.push(("transfer-encoding".into(), b"chunked".to_vec()));
            }
            ResponseFraming::NoBody | ResponseFraming::Close => {}
        }
        if let Some(c) = connection {
            tail.push(("connection".into(), c.to_vec()));
        }
        prop_assert_eq!(rest, &tail[..]);

        // moat's own client reads the body framing back.
        if framing != ResponseFraming::NoBody {
            let h = parse_response_head(out, &Method::GET);
            let h = h.map_err(|e| TestCaseError::fail(format!("{e}: {}", String::from_utf8_lossy(out))))?;
            prop_assert_eq!(h.status, status);
            let bodyless = status.is_informational()
                || status == StatusCode::NO_CONTENT
                || status == StatusCode::NOT_MODIFIED;
            let want = match framing {
                _ if bodyless => Decoder::Length(0),
                ResponseFraming::Length(n) => Decoder::Length(n),
                ResponseFraming::Chunked => Decoder::Chunked(Chunked::Size),
                _ => Decoder::UntilClose,
            };
            prop_assert_eq!(h.decoder, want);
        }
    }

    #[test]
    fn request_heads_moat_writes_are_read_back(
        method in prop_oneof![Just(Method::GET), Just(Method::POST), Just(Method::PUT), Just(Method::DELETE)],
        target in "/[a-zA-Z0-9/._~%!$&'()*+,;=:@-]{0,24}(\\?[a-zA-Z0-9=&/?%-]{0,16})?",
        host in prop::option::of("[a-z0-9.-]{1,16}(:[0-9]{1,5})?"),
        fields in vec(
            (field_name(), field_value())
                .prop_filter("framing, host and expect are set apart", |(k, _)| {
                    !matches!(k.as_str(), "content-length" | "transfer-encoding" | "host" | "expect")
                }),
            0..10,
        ),
        length in prop::option::of(0u64..1 << 40),
        framing in 0usize..3,
        replace_host in any::<bool>(),
    ) {
        let mut map = HeaderMap::new();
        if let Some(h) = &host {
            map.insert(http::header::HOST, HeaderValue::from_str(h).map_err(|e| TestCaseError::fail(e.to_string()))?);
        }
        for (k, v) in &fields {
            map.append(k.clone(), v.clone());
        }
        // The client's own length is never forwarded: moat writes the framing it
        // decided from the body (`upstream::request_framing`).
        if let Some(n) = length {
            map.insert(http::header::CONTENT_LENGTH, HeaderValue::from(n));
        }
        let framing = match framing {
            0 => RequestFraming::None,
            1 => RequestFraming::Length(length.map_or(7, |n| n / 2)),
            _ => RequestFraming::Chunked,
        };
        let peer = HeaderValue::from_static("192.0.2.1");
        let req = UpstreamHead {
            method: &method,
            target: &target,
            headers: &map,
            upgrade: false,
            replace_host,
            default_host: "up.example:8080",
            forwarded_for: &peer,
            forwarded_proto: "https",
            request_id: "req-7",
        };
        let mut buf = Vec::new();
        encode_request_head(&mut buf, &req, framing);
        prop_assert_eq!(request_head_end(&buf, &mut 0), Some(buf.len()));
        let h = parse_request_head(&buf, MAX_HEADER_SLOTS)
            .map_err(|e| TestCaseError::fail(format!("{}: {}", e.reason, String::from_utf8_lossy(&buf))))?;
        ok(check_request_head(&buf, MAX_HEADER_SLOTS))?;
        prop_assert_eq!(&h.parts.method, &method);
        prop_assert_eq!(h.parts.uri.path_and_query().map(|p| p.as_str()), Some(&target[..]));
        prop_assert!(h.keep_alive);
        let want_decoder = match framing {
            RequestFraming::None => Decoder::Length(0),
            RequestFraming::Length(n) => Decoder::Length(n),
            RequestFraming::Chunked => Decoder::Chunked(Chunked::Size),
        };
        prop_assert_eq!(h.decoder, want_decoder);
        let want_host = match &host {
            Some(h) if !replace_host => h.as_str(),
            _ => "up.example:8080",
        };
        prop_assert_eq!(h.parts.headers.get_all(http::header::HOST).iter().count(), 1);
        prop_assert_eq!(h.parts.headers[http::header::HOST].as_bytes(), want_host.as_bytes());
        prop_assert_eq!(&h.parts.headers["x-forwarded-proto"], "https");
        prop_assert_eq!(h.parts.headers.get_all("x-request-id").iter().count(), 1);
        prop_assert_eq!(&h.parts.headers["x-request-id"], "req-7");
        for name in ["connection", "keep-alive", "upgrade", "te", "trailer", "proxy-connection"] {
            prop_assert!(!h.parts.headers.contains_key(name), "{} forwarded", name);
        }
        // Every ordinary field arrives with its values in order (trimmed), whatever a
        // `Connection` field names.
        for (k, _) in &fields {
            let ordinary = !matches!(
                k.as_str(),
                "connection" | "keep-alive" | "upgrade" | "te" | "trailer" | "proxy-connection"
                    | "x-forwarded-for" | "x-forwarded-proto" | "x-request-id"
            );
            if !ordinary {
                continue;
            }
            let want: Vec<&[u8]> = map.get_all(k).iter().map(|v| trim_ows(v.as_bytes())).collect();
            let got: Vec<&[u8]> = h.parts.headers.get_all(k).iter().map(HeaderValue::as_bytes).collect();
            prop_assert_eq!(got, want, "{}", k);
        }
    }
}
