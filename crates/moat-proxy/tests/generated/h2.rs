//! Generated HTTP/2 requests for "one request in, one request out" across moat's
//! translation to HTTP/1.1, written as frames built by hand so that anything HPACK can
//! carry can be sent: H2.CL (lengths that disagree with the DATA), H2.TE and the other
//! connection-specific fields, CR, LF and NUL in field names and values, pseudo-header
//! forms, trailers (framing, routing and credential fields among them), header blocks
//! split by CONTINUATION, padding, and up to three streams on one connection, their
//! frames interleaved. Mutated requests change bytes of any field or body.
//!
//! HTTP/2 carries each field as exact bytes, so unlike HTTP/1.1 what the client meant
//! is known even after a mutation: each stream reaches the upstream as exactly its
//! method, `:path`, DATA and fields, once, or not at all.

use proptest::prelude::*;

use super::{apply, body_strategy, edits_strategy, Edit, SMUGGLED};
use crate::common::{h2_frame, hpack_literal, Session, END_HEADERS, END_STREAM, PADDED};

/// A field as HPACK carries it: name and value bytes.
pub use crate::common::Field;

fn field(name: &str, value: &str) -> Field {
    (name.as_bytes().to_vec(), value.as_bytes().to_vec())
}

/// Whether moat must refuse a stream for a field.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Refuse {
    /// moat may forward it.
    No,
    /// Always: malformed in HTTP/2 (RFC 9113 8.2: upper case, CR, LF, NUL, a colon or a
    /// space in a name, CR, LF or NUL in a value), or a line break that would split the
    /// request for HTTP/1.1.
    Always,
    /// Malformed in HTTP/2 (a connection-specific field, `te` other than `trailers`, a
    /// repeated pseudo-header field), which the h2 crate finds while it decodes the
    /// header block; when a CONTINUATION splits the block in the middle of a later
    /// field, h2 (0.4.20) drops the malformed field and keeps the stream
    /// (`a_malformed_field_h2_drops_across_continuation_is_never_forwarded` in
    /// backend_parsers.rs). moat then forwards the request without the field: the
    /// stream must be refused only when its header block is not split.
    UnlessSplit,
}

/// Regular fields a stream may carry, and whether moat must refuse the stream for them.
const FIELDS: &[(&str, &str, Refuse)] = &[
    ("content-type", "application/json", Refuse::No),
    ("te", "trailers", Refuse::No),
    ("cookie", "a=1", Refuse::No),
    ("cookie", "b=2", Refuse::No),
    ("x-forwarded-for", "1.2.3.4", Refuse::No),
    ("x-request-id", "client-id", Refuse::No),
    ("expect", "100-continue", Refuse::No),
    ("expect", "something-else", Refuse::Always),
    ("accept-encoding", "gzip", Refuse::No),
    ("host", "x", Refuse::No),
    ("x-smuggled", "no", Refuse::No),
    ("x-foo", "a, b", Refuse::No),
    ("x-foo", " padded ", Refuse::No),
    ("host", "admin.internal", Refuse::No),
    // Malformed (RFC 9113 8.2.1): moat trims it, as an HTTP/1.1 upstream would.
    ("host", " admin.internal", Refuse::No),
    ("host", "admin .internal", Refuse::Always),
    ("transfer-encoding", "chunked", Refuse::UnlessSplit),
    ("connection", "close", Refuse::UnlessSplit),
    ("keep-alive", "timeout=5", Refuse::UnlessSplit),
    ("proxy-connection", "keep-alive", Refuse::UnlessSplit),
    ("upgrade", "websocket", Refuse::UnlessSplit),
    ("te", "gzip", Refuse::UnlessSplit),
    ("x-foo", "a\r\nx-smuggled: yes", Refuse::Always),
    ("x-foo", "a\nx-smuggled: yes", Refuse::Always),
    ("x-foo", "a\rb", Refuse::Always),
    ("x-foo", "a\0b", Refuse::Always),
    ("Transfer-Encoding", "chunked", Refuse::Always),
    ("x-foo\r\nx-smuggled", "yes", Refuse::Always),
    ("x-foo:", "1", Refuse::Always),
    ("x foo", "1", Refuse::Always),
];

/// Fields a stream may send as trailers: well-formed HTTP/2, and which of them may
/// reach the upstream is the question. A pseudo-header field in trailers makes the
/// request malformed (RFC 9113 8.1); h2 drops it and keeps the stream, and nothing of
/// it is forwarded.
const TRAILERS: &[(&str, &str)] = &[
    ("x-t", "1"),
    ("x-checksum", "abc"),
    ("content-length", "0"),
    ("transfer-encoding", "chunked"),
    ("host", "admin"),
    ("authorization", "Bearer forged"),
    ("x-forwarded-for", "9.9.9.9"),
    ("trailer", "x-t"),
    (":path", "/admin/secret"),
];

/// How a stream's pseudo-header fields are written.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Pseudo {
    /// `:method`, `:scheme`, `:path`, `:authority` (when there is one), in that order.
    Normal,
    /// `:path` after the regular fields (RFC 9113 8.3: malformed).
    PathLast,
    /// `:path` twice, the second `/admin/secret`.
    PathTwice,
    /// No `:path`.
    NoPath,
    /// No `:method`.
    NoMethod,
    /// No `:scheme`.
    NoScheme,
    /// A pseudo-header field HTTP/2 does not define for requests.
    Unknown,
    /// `:status`, a response's.
    Status,
}

/// How a stream's `content-length` fields relate to its DATA.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Length {
    None,
    Exact,
    /// One less than the DATA (H2.CL).
    Short,
    /// Sixty more than the DATA.
    Long,
    /// Zero, whatever the DATA.
    Zero,
    /// Twice, equal.
    TwiceEqual,
    /// Twice, the second sixty more.
    TwiceDiffer,
    /// `n, n` in one field.
    List,
    /// `+n`.
    Signed,
}

/// One stream of a generated connection.
#[derive(Debug, Clone)]
pub struct H2Stream {
    pub method: &'static str,
    pub path: &'static str,
    pub authority: Option<&'static str>,
    pub pseudo: Pseudo,
    pub length: Length,
    /// Indexes into [`FIELDS`].
    pub extras: Vec<usize>,
    pub body: Vec<u8>,
    /// The sizes of its DATA frames, repeated until the body is sent.
    pub split: Vec<usize>,
    /// An empty body is sent as an empty DATA frame ending the stream, not by the end
    /// of stream on HEADERS.
    pub empty_data: bool,
    /// Indexes into [`TRAILERS`]; `None` for no trailer section.
    pub trailers: Option<Vec<usize>>,
    /// Each header block is split into HEADERS and CONTINUATION.
    pub continuation: bool,
    /// HEADERS and DATA frames carry padding.
    pub padded: bool,
}

/// A generated HTTP/2 connection: one to three streams (1, 3, 5).
#[derive(Debug, Clone)]
pub struct H2Request {
    pub streams: Vec<H2Stream>,
    /// Frames of the streams interleaved: every HEADERS first, then DATA in turn.
    pub interleave: bool,
}

fn stream_strategy() -> impl Strategy<Value = H2Stream> {
    (
        (
            prop::sample::select(&["GET", "POST", "PUT", "DELETE"][..]),
            prop::sample::select(&["/", "/t", "/api/items?q=1&x=y", "/admin/secret"][..]),
            prop_oneof![6 => Just(Some("x")), 1 => Just(Some("x:8080")), 1 => Just(None)],
            prop_oneof![
                12 => Just(Pseudo::Normal),
                1 => Just(Pseudo::PathLast),
                1 => Just(Pseudo::PathTwice),
                1 => Just(Pseudo::NoPath),
                1 => Just(Pseudo::NoMethod),
                1 => Just(Pseudo::NoScheme),
                1 => Just(Pseudo::Unknown),
                1 => Just(Pseudo::Status),
            ],
            prop_oneof![
                4 => Just(Length::None),
                4 => Just(Length::Exact),
                1 => Just(Length::Short),
                1 => Just(Length::Long),
                1 => Just(Length::Zero),
                1 => Just(Length::TwiceEqual),
                1 => Just(Length::TwiceDiffer),
                1 => Just(Length::List),
                1 => Just(Length::Signed),
            ],
        ),
        (
            prop::collection::vec(
                prop_oneof![
                    // Mostly fields a well-formed request may carry, which come first.
                    3 => 0..FIELDS.iter().take_while(|f| f.2 == Refuse::No).count(),
                    1 => 0..FIELDS.len(),
                ],
                0..3,
            ),
            body_strategy(),
            prop::collection::vec(1usize..24, 0..3),
            any::<bool>(),
            prop_oneof![
                3 => Just(None),
                1 => prop::collection::vec(0..TRAILERS.len(), 1..3).prop_map(Some),
            ],
            prop::bool::weighted(0.2),
            prop::bool::weighted(0.2),
        ),
    )
        .prop_map(
            |(
                (method, path, authority, pseudo, length),
                (extras, body, split, empty_data, trailers, continuation, padded),
            )| H2Stream {
                method,
                path,
                authority,
                pseudo,
                length,
                extras,
                body,
                split,
                empty_data,
                trailers,
                continuation,
                padded,
            },
        )
}

pub fn h2_strategy() -> impl Strategy<Value = H2Request> {
    (
        prop::collection::vec(stream_strategy(), 1..4),
        any::<bool>(),
    )
        .prop_map(|(streams, interleave)| H2Request {
            streams,
            interleave,
        })
}

/// What a stream sends, field by field: the header block's fields in order (pseudo-
/// header fields included), the DATA, the trailer fields. Mutations change these.
#[derive(Clone)]
pub struct Sent {
    pub fields: Vec<Field>,
    pub body: Vec<u8>,
    pub trailers: Option<Vec<Field>>,
}

/// Bytes as escaped text, for failure messages.
fn text(bytes: &[u8]) -> String {
    bytes.escape_ascii().to_string()
}

impl std::fmt::Debug for Sent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let fields = |list: &[Field]| -> Vec<String> {
            list.iter()
                .map(|(n, v)| format!("{}: {}", text(n), text(v)))
                .collect()
        };
        f.debug_struct("Sent")
            .field("fields", &fields(&self.fields))
            .field("body", &text(&self.body))
            .field("trailers", &self.trailers.as_deref().map(fields))
            .finish()
    }
}

impl Sent {
    /// The value of the first field named `name` (a pseudo-header field's, say).
    pub fn first(&self, name: &str) -> Option<&[u8]> {
        self.fields
            .iter()
            .find(|(n, _)| n == name.as_bytes())
            .map(|(_, v)| &v[..])
    }
}

impl H2Stream {
    /// The stream's fields, DATA and trailers; its regular fields begin with
    /// `x-case: {case}` and `x-stream: {index}`, which attribute what the upstream reads.
    pub fn sent(&self, case: &str, index: usize) -> Sent {
        let n = self.body.len();
        let mut fields = Vec::new();
        if self.pseudo != Pseudo::NoMethod {
            fields.push(field(":method", self.method));
        }
        if self.pseudo != Pseudo::NoScheme {
            fields.push(field(":scheme", "http"));
        }
        if !matches!(self.pseudo, Pseudo::NoPath | Pseudo::PathLast) {
            fields.push(field(":path", self.path));
        }
        if self.pseudo == Pseudo::PathTwice {
            fields.push(field(":path", "/admin/secret"));
        }
        if let Some(a) = self.authority {
            fields.push(field(":authority", a));
        }
        match self.pseudo {
            Pseudo::Unknown => fields.push(field(":smuggle", "GET /admin/secret")),
            Pseudo::Status => fields.push(field(":status", "200")),
            _ => {}
        }
        fields.push(field("x-case", case));
        fields.push(field("x-stream", &index.to_string()));
        let lengths: Vec<String> = match self.length {
            Length::None => vec![],
            Length::Exact => vec![n.to_string()],
            Length::Short => vec![n.saturating_sub(1).to_string()],
            Length::Long => vec![(n + 60).to_string()],
            Length::Zero => vec!["0".into()],
            Length::TwiceEqual => vec![n.to_string(), n.to_string()],
            Length::TwiceDiffer => vec![n.to_string(), (n + 60).to_string()],
            Length::List => vec![format!("{n}, {n}")],
            Length::Signed => vec![format!("+{n}")],
        };
        for l in &lengths {
            fields.push(field("content-length", l));
        }
        for &i in &self.extras {
            fields.push(field(FIELDS[i].0, FIELDS[i].1));
        }
        if self.pseudo == Pseudo::PathLast {
            fields.push(field(":path", self.path));
        }
        let trailers = self.trailers.as_ref().map(|t| {
            t.iter()
                .map(|&i| field(TRAILERS[i].0, TRAILERS[i].1))
                .collect()
        });
        Sent {
            fields,
            body: self.body.clone(),
            trailers,
        }
    }

    /// True when moat must refuse the stream whatever its engines decide: the request is
    /// malformed in HTTP/2 or would split in HTTP/1.1.
    pub fn must_refuse(&self) -> bool {
        let n = self.body.len();
        let bad_length = match self.length {
            Length::None | Length::Exact | Length::TwiceEqual | Length::List => false,
            Length::Short | Length::Zero => n > 0,
            Length::Long | Length::TwiceDiffer | Length::Signed => true,
        };
        let refuse =
            |r: Refuse| r == Refuse::Always || r == Refuse::UnlessSplit && !self.continuation;
        let pseudo = match self.pseudo {
            Pseudo::Normal => Refuse::No,
            Pseudo::PathTwice => Refuse::UnlessSplit,
            _ => Refuse::Always,
        };
        refuse(pseudo) || bad_length || self.extras.iter().any(|&i| refuse(FIELDS[i].2))
    }
}

/// Field names that [`Sent::fields`] uses to attribute a stream: kept whole by
/// mutations.
const TAGS: &[&[u8]] = &[b"x-case", b"x-stream"];

impl H2Request {
    /// What each stream sends.
    pub fn sent(&self, case: &str) -> Vec<Sent> {
        self.streams
            .iter()
            .enumerate()
            .map(|(k, s)| s.sent(case, k))
            .collect()
    }

    /// The connection's bytes: the preface, SETTINGS, then every stream's frames.
    pub fn frames(&self, sent: &[Sent]) -> Vec<u8> {
        let mut w = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        h2_frame(&mut w, 0x4, 0, 0, &[]);
        let per_stream: Vec<Vec<Vec<u8>>> = self
            .streams
            .iter()
            .zip(sent)
            .enumerate()
            .map(|(k, (s, sent))| s.frames(sent, 2 * k as u32 + 1))
            .collect();
        if self.interleave {
            let most = per_stream.iter().map(Vec::len).max().unwrap_or(0);
            for i in 0..most {
                for frames in &per_stream {
                    if let Some(f) = frames.get(i) {
                        w.extend_from_slice(f);
                    }
                }
            }
        } else {
            for f in per_stream.iter().flatten() {
                w.extend_from_slice(f);
            }
        }
        w
    }
}

impl H2Stream {
    /// The stream's frames, each whole, in order: HEADERS (and CONTINUATION), DATA,
    /// trailers. A header block and its CONTINUATION are one element: nothing may come
    /// between them (RFC 9113 6.10).
    fn frames(&self, sent: &Sent, id: u32) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let no_data = sent.body.is_empty() && !self.empty_data;
        let head_ends = no_data && sent.trailers.is_none();
        out.push(self.block(&sent.fields, id, head_ends));
        if !no_data {
            let mut rest = &sent.body[..];
            let mut sizes = self.split.iter().cycle();
            loop {
                let take = sizes.next().map_or(rest.len(), |s| (*s).min(rest.len()));
                let last = take == rest.len();
                let flags = if last && sent.trailers.is_none() {
                    END_STREAM
                } else {
                    0
                };
                out.push(self.frame(0x0, flags, id, &rest[..take]));
                rest = &rest[take..];
                if last {
                    break;
                }
            }
        }
        if let Some(t) = &sent.trailers {
            out.push(self.block(t, id, true));
        }
        out
    }

    /// A header block of `fields` as HEADERS, split into CONTINUATION when asked.
    fn block(&self, fields: &[Field], id: u32, end_stream: bool) -> Vec<u8> {
        let mut block = Vec::new();
        for (name, value) in fields {
            hpack_literal(&mut block, name, value);
        }
        let es = if end_stream { END_STREAM } else { 0 };
        if self.continuation && block.len() > 1 {
            let (first, second) = block.split_at(block.len() / 2);
            let mut w = self.frame(0x1, es, id, first);
            h2_frame(&mut w, 0x9, END_HEADERS, id, second);
            w
        } else {
            self.frame(0x1, es | END_HEADERS, id, &block)
        }
    }

    /// One frame, padded when the stream pads (HEADERS and DATA).
    fn frame(&self, kind: u8, flags: u8, id: u32, payload: &[u8]) -> Vec<u8> {
        let mut w = Vec::new();
        if self.padded {
            let mut p = vec![3u8];
            p.extend_from_slice(payload);
            p.extend_from_slice(&[0, 0, 0]);
            h2_frame(&mut w, kind, flags | PADDED, id, &p);
        } else {
            h2_frame(&mut w, kind, flags, id, payload);
        }
        w
    }
}

// ---------------------------------------------------------------------------------
// Mutations.
// ---------------------------------------------------------------------------------

/// A generated connection whose bodies carry [`SMUGGLED`], with bytes of one stream's
/// field names, values, trailers or body inserted, overwritten or deleted. The fields
/// that attribute the stream ([`TAGS`]) are kept whole.
#[derive(Debug, Clone)]
pub struct H2Mutated {
    pub base: H2Request,
    pub edits: Vec<PartEdits>,
}

/// Edits to one stream: which stream, which of its parts, and the edits.
pub type PartEdits = (
    prop::sample::Index,
    prop::sample::Index,
    Vec<(prop::sample::Index, Edit)>,
);

pub fn h2_mutated_strategy() -> impl Strategy<Value = H2Mutated> {
    // Streams moat refuses or denies as they are would spend the cases on one outcome.
    let stream = stream_strategy()
        .prop_map(|mut s| {
            s.body.extend_from_slice(SMUGGLED);
            s
        })
        .prop_filter("refused as generated", |s| {
            !s.must_refuse() && !s.path.starts_with("/admin")
        });
    (
        prop::collection::vec(stream, 1..4),
        any::<bool>(),
        prop::collection::vec(
            (
                any::<prop::sample::Index>(),
                any::<prop::sample::Index>(),
                edits_strategy(),
            ),
            1..3,
        ),
    )
        .prop_map(|(streams, interleave, edits)| H2Mutated {
            base: H2Request {
                streams,
                interleave,
            },
            edits,
        })
}

impl H2Mutated {
    /// What each stream sends, after the edits.
    pub fn sent(&self, case: &str) -> Vec<Sent> {
        let mut sent = self.base.sent(case);
        for (stream, part, edits) in &self.edits {
            let s = &mut sent[stream.index(self.base.streams.len())];
            // The parts: each field's name and value, each trailer's, the body.
            let mut parts: Vec<&mut Vec<u8>> = Vec::new();
            for (name, value) in s.fields.iter_mut() {
                if TAGS.contains(&&name[..]) {
                    continue;
                }
                parts.push(name);
                parts.push(value);
            }
            for (name, value) in s.trailers.iter_mut().flatten() {
                parts.push(name);
                parts.push(value);
            }
            parts.push(&mut s.body);
            let bytes = parts.swap_remove(part.index(parts.len()));
            let end = bytes.len();
            apply(bytes, edits, 0..0, end);
        }
        sent
    }
}

// ---------------------------------------------------------------------------------
// The judgement.
// ---------------------------------------------------------------------------------

/// A request as the upstream's parser read it, attributed to a stream by its
/// `x-stream` field.
#[derive(Debug)]
pub struct UpstreamRead {
    pub stream: Option<String>,
    pub method: String,
    pub target: String,
    pub body: Vec<u8>,
    pub headers: Vec<(String, String)>,
    pub trailers: Vec<(String, String)>,
}

impl UpstreamRead {
    fn values<'a>(list: &'a [(String, String)], name: &str) -> Vec<&'a str> {
        list.iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    }
}

/// Fields moat sets, joins or drops when it writes the request for HTTP/1.1: their
/// values upstream are moat's, not the client's.
const REWRITTEN: &[&str] = &[
    // Connection-specific: never forwarded, and h2 may drop them (`Refuse::UnlessSplit`).
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "upgrade",
    "host",
    "cookie",
    "te",
    "expect",
    "content-length",
    "x-forwarded-for",
    "x-forwarded-proto",
    "x-forwarded-host",
    "x-request-id",
];

/// Fields of the client's that never reach an HTTP/1.1 upstream: the hop-by-hop ones
/// and the expectation, which moat answers itself.
const NEVER_FORWARDED: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "upgrade",
    "te",
    "expect",
];

/// Trailer fields of [`TRAILERS`] that must never reach an HTTP/1.1 upstream (moat
/// passes the others): framing, routing, the hop-by-hop fields, credentials and
/// forwarding fields moat vouches for in the head
/// (RFC 9110 6.5.1; a backend that merges trailers into the header section would
/// otherwise read them as checked).
pub const FORBIDDEN_TRAILERS: &[&str] = &[
    "content-length",
    "transfer-encoding",
    "host",
    "trailer",
    "authorization",
    "x-forwarded-for",
];

/// A field name and value the upstream can be checked to read verbatim: a lower-case
/// token, and visible ASCII with inner spaces (a parser trims the ends).
fn verbatim(name: &[u8], value: &[u8]) -> bool {
    !name.is_empty()
        && name
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.!#$%&'*+^`|~".contains(b))
        && value.iter().all(|b| (0x20..0x7f).contains(b))
        && !REWRITTEN.contains(&std::str::from_utf8(name).unwrap_or(""))
}

/// Judges one connection: `sent` is what each stream sent, `refuse` whether moat must
/// refuse it (known for generated streams, not for mutated ones), `session` what the
/// client read, `read` the requests the upstream read for the connection. Each stream
/// reaches the upstream at most once, as exactly its method, `:path`, DATA and fields;
/// a stream answered by the upstream reached it, one moat answered itself did not; a
/// stream moat must refuse never reaches it; nothing reaches it that no stream sent,
/// nor `/admin*`, nor a trailer field of [`FORBIDDEN_TRAILERS`]. Returns how many
/// streams reached the upstream.
pub fn judge_h2(
    sent: &[Sent],
    refuse: &[bool],
    session: &Session,
    read: &[UpstreamRead],
) -> Result<usize, String> {
    let report = |what: String| {
        Err(format!(
            "{what}\nthe client sent {sent:#?}\nit read {session:?}\nthe upstream read {read:#?}"
        ))
    };
    for r in read {
        let known = r
            .stream
            .as_deref()
            .and_then(|s| s.parse::<usize>().ok())
            .is_some_and(|k| k < sent.len());
        if !known {
            return report(format!("the upstream read a request no stream sent: {r:?}"));
        }
        if r.target.starts_with("/admin") {
            return report(format!(
                "the upstream read a request access control denies: {r:?}"
            ));
        }
        for name in NEVER_FORWARDED {
            if !UpstreamRead::values(&r.headers, name).is_empty() {
                return report(format!("the upstream read the client's {name}: {r:?}"));
            }
        }
        for name in FORBIDDEN_TRAILERS {
            if !UpstreamRead::values(&r.trailers, name).is_empty() {
                return report(format!("the upstream read a trailer field {name}: {r:?}"));
            }
        }
    }
    let mut reached = 0;
    for (k, s) in sent.iter().enumerate() {
        let answer = &session.streams[k];
        let of: Vec<&UpstreamRead> = read
            .iter()
            .filter(|r| r.stream.as_deref() == Some(&k.to_string()))
            .collect();
        if of.len() > 1 {
            return report(format!(
                "stream {k} reached the upstream {} times",
                of.len()
            ));
        }
        if answer.answered_by_upstream() && of.is_empty() {
            return report(format!(
                "stream {k} was answered by the upstream, which never read it"
            ));
        }
        // moat answered the stream itself, yet the upstream read it.
        if answer.head.is_some() && !answer.answered_by_upstream() && !of.is_empty() {
            return report(format!(
                "stream {k} was answered by moat ({:?}) and read by the upstream",
                answer.status()
            ));
        }
        if refuse[k] && (!of.is_empty() || answer.answered_by_upstream()) {
            return report(format!("stream {k} must be refused; it was forwarded"));
        }
        let Some(r) = of.first() else { continue };
        reached += 1;
        let lossy = |v: Option<&[u8]>| String::from_utf8_lossy(v.unwrap_or_default()).into_owned();
        if r.method != lossy(s.first(":method")) || r.target != lossy(s.first(":path")) {
            return report(format!(
                "stream {k} reached the upstream as {} {}",
                r.method, r.target
            ));
        }
        if r.body != s.body {
            return report(format!(
                "stream {k}'s body reached the upstream as {:?}",
                String::from_utf8_lossy(&r.body)
            ));
        }
        // The trailer fields that may follow the content, verbatim (moat buffers the
        // body for the WAF, so it knows of the trailers before it frames the body).
        let trailers = s.trailers.iter().flatten();
        if trailers
            .clone()
            .all(|(n, v)| verbatim(n, v) || n.starts_with(b":"))
        {
            let mut want: Vec<(String, String)> = trailers
                .filter(|(n, _)| !n.starts_with(b":"))
                .map(|(n, v)| {
                    let n = String::from_utf8_lossy(n).into_owned();
                    (n, String::from_utf8_lossy(v).trim().to_string())
                })
                .filter(|(n, _)| !FORBIDDEN_TRAILERS.contains(&n.as_str()))
                .collect();
            let mut got: Vec<(String, String)> = r
                .trailers
                .iter()
                .map(|(n, v)| (n.to_ascii_lowercase(), v.trim().to_string()))
                .collect();
            want.sort();
            got.sort();
            if got != want {
                return report(format!(
                    "stream {k}'s trailers reached the upstream as {got:?}, not {want:?}"
                ));
            }
        }
        // The host moat routed and authorized on is the one the upstream reads:
        // `:authority`, else `host` (RFC 9113 8.3.1).
        // The upstream's parser strips the whitespace around a value; so must moat,
        // before it routes.
        if let Some(host) = s.first(":authority").or(s.first("host")) {
            let host = String::from_utf8_lossy(host.trim_ascii());
            if UpstreamRead::values(&r.headers, "host") != [host.as_ref()] {
                return report(format!(
                    "stream {k} reached the upstream for another host than {host}"
                ));
            }
        }
        // Every regular field the client sent, verbatim, in order; nothing of a value
        // split off as a field of its own.
        let regular = s.fields.iter().filter(|(n, _)| !n.starts_with(b":"));
        let mut names: Vec<&[u8]> = regular.clone().map(|(n, _)| &n[..]).collect();
        names.dedup();
        for name in names {
            let values: Vec<&[u8]> = regular
                .clone()
                .filter(|(n, _)| &n[..] == name)
                .map(|(_, v)| &v[..])
                .collect();
            if !values.iter().all(|v| verbatim(name, v)) {
                continue;
            }
            let name = std::str::from_utf8(name).unwrap_or_default();
            let want: Vec<String> = values
                .iter()
                .map(|v| String::from_utf8_lossy(v).trim().to_string())
                .collect();
            let got: Vec<String> = UpstreamRead::values(&r.headers, name)
                .iter()
                .map(|v| v.trim().to_string())
                .collect();
            if got != want {
                return report(format!(
                    "stream {k}'s field {name} reached the upstream as {got:?}, not {want:?}"
                ));
            }
        }
    }
    Ok(reached)
}
