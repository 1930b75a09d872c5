//! Generated HTTP/1.1 requests for the "one request in, one request out" property:
//! valid, ambiguous and hostile (every field moat treats specially, `Connection`
//! nominations of framing, routing and forwarding fields, duplicated and obfuscated
//! framing fields, `Expect`, `Upgrade`, `TE`, `Trailer`, `Content-Encoding`,
//! `X-Forwarded-*`, absolute-form targets, bodies that contain requests, a pipelined
//! request after them), and the judgement of what a real upstream parser read of them
//! through moat. Shared by `one_in_one_out.rs` (hyper's parser) and
//! `backend_parsers.rs` (Go's and Node's). HTTP/2 requests are generated in `h2.rs`.
#![allow(dead_code)]

pub mod h2;

use std::ops::Range;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

/// A request the attacker wants the upstream to see without moat's checks.
pub const SMUGGLED: &[u8] = b"GET /admin/secret HTTP/1.1\r\nHost: x\r\nX-Smuggled: yes\r\n\r\n";

/// How the generated request frames its body.
#[derive(Debug, Clone)]
pub enum Framing {
    /// No framing field (no body).
    None,
    /// `Content-Length: n`.
    Length,
    /// Two `Content-Length` fields with the same value.
    LengthTwice,
    /// `Content-Length: n, n`.
    LengthList,
    /// `Transfer-Encoding: chunked`, chunks of these sizes.
    Chunked(Vec<usize>),
    /// Chunked with a trailer field.
    ChunkedTrailer,
    /// Ambiguous or unsupported: moat must refuse. The field lines, written as is.
    Hostile(Vec<String>),
}

#[derive(Debug, Clone)]
pub struct GenRequest {
    pub method: &'static str,
    pub target: &'static str,
    pub host: Option<&'static str>,
    pub framing: Framing,
    pub connection: Vec<&'static str>,
    pub extras: Vec<(&'static str, &'static str)>,
    pub body: Vec<u8>,
    pub pipelined: bool,
}

/// Tokens a `Connection` field may carry. Those naming framing or routing fields make
/// moat refuse the request (see docs/SECURITY.md); the others change nothing of what
/// is forwarded except that the standard hop-by-hop fields are dropped.
const CONNECTION_TOKENS: &[&str] = &[
    "close",
    "keep-alive",
    "content-length",
    "Content-Length",
    "transfer-encoding",
    "host",
    "x-forwarded-for",
    "x-forwarded-proto",
    "x-request-id",
    "upgrade",
    "te",
    "trailer",
    "expect",
    "content-encoding",
    "content-type",
    "authorization",
    "x-custom",
];

fn nominates_framing_or_routing(tokens: &[&str]) -> bool {
    tokens.iter().any(|t| {
        t.eq_ignore_ascii_case("content-length")
            || t.eq_ignore_ascii_case("transfer-encoding")
            || t.eq_ignore_ascii_case("host")
    })
}

const EXTRAS: &[(&str, &str)] = &[
    ("Upgrade", "websocket"),
    ("Expect", "100-continue"),
    ("Expect", "something-else"),
    ("TE", "trailers"),
    ("Trailer", "x-t"),
    ("Content-Encoding", "gzip"),
    ("X-Forwarded-For", "1.2.3.4"),
    ("X-Forwarded-Proto", "https"),
    ("X-Request-Id", "client-id"),
    ("Keep-Alive", "timeout=5"),
    ("Proxy-Connection", "keep-alive"),
    ("Content-Type", "application/json"),
    ("X-Smuggled", "no"),
];

const HOSTILE: &[&[&str]] = &[
    &["Content-Length: 5", "Transfer-Encoding: chunked"],
    &["Transfer-Encoding: chunked", "Content-Length: 5"],
    &["Content-Length: 5", "Content-Length: 6"],
    &["Content-Length: 5, 6"],
    &["Content-Length: +5"],
    &["Content-Length: 0x5"],
    &["Content-Length: -1"],
    &["Transfer-Encoding: xchunked"],
    &["Transfer-Encoding: chunked, identity"],
    &["Transfer-Encoding: identity"],
    &["Transfer-Encoding: chunked", "Transfer-Encoding: chunked"],
    &["Transfer-Encoding : chunked"],
    &["Transfer-Encoding:\x0bchunked"],
    &[" Transfer-Encoding: chunked"],
    &["Transfer-Encoding: gzip, chunked"],
];

fn body_strategy() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(
        prop_oneof![
            3 => "[a-zA-Z0-9 =&]{0,24}".prop_map(String::into_bytes),
            1 => Just(SMUGGLED.to_vec()),
            1 => Just(b"0\r\n\r\n".to_vec()),
            1 => Just(b"\r\n\r\n".to_vec()),
        ],
        0..4,
    )
    .prop_map(|parts| parts.concat())
}

fn framing_strategy() -> impl Strategy<Value = Framing> {
    prop_oneof![
        1 => Just(Framing::None),
        3 => Just(Framing::Length),
        1 => Just(Framing::LengthTwice),
        1 => Just(Framing::LengthList),
        3 => prop::collection::vec(1usize..16, 0..4).prop_map(Framing::Chunked),
        1 => Just(Framing::ChunkedTrailer),
        2 => prop::sample::select(HOSTILE)
            .prop_map(|h| Framing::Hostile(h.iter().map(|s| s.to_string()).collect())),
    ]
}

pub fn request_strategy() -> impl Strategy<Value = GenRequest> {
    (
        prop::sample::select(&["GET", "POST", "PUT"][..]),
        prop::sample::select(&["/", "/api/items?q=1", "http://x/abs", "/admin/secret"][..]),
        prop_oneof![8 => Just(Some("x")), 1 => Just(None)],
        framing_strategy(),
        prop::sample::subsequence(CONNECTION_TOKENS, 0..3),
        prop::sample::subsequence(EXTRAS, 0..3),
        body_strategy(),
        any::<bool>(),
    )
        .prop_map(
            |(method, target, host, framing, connection, extras, body, pipelined)| GenRequest {
                method,
                target,
                host,
                framing,
                connection,
                extras,
                body,
                pipelined,
            },
        )
}

/// The request a generated one may have pipelined after it.
fn pipelined(case: Option<&str>) -> Vec<u8> {
    let mut w = b"GET /second HTTP/1.1\r\nHost: x\r\n".to_vec();
    if let Some(id) = case {
        w.extend_from_slice(format!("X-Case: {id}\r\n").as_bytes());
    }
    w.extend_from_slice(b"\r\n");
    w
}

impl GenRequest {
    /// The bytes on the wire; with `case`, each request carries `X-Case: {case}` after
    /// `Host`.
    pub fn wire(&self, case: Option<&str>) -> Vec<u8> {
        let mut w = format!("{} {} HTTP/1.1\r\n", self.method, self.target).into_bytes();
        let mut line = |s: &str| {
            w.extend_from_slice(s.as_bytes());
            w.extend_from_slice(b"\r\n");
        };
        if let Some(h) = self.host {
            line(&format!("Host: {h}"));
        }
        if let Some(id) = case {
            line(&format!("X-Case: {id}"));
        }
        if !self.connection.is_empty() {
            line(&format!("Connection: {}", self.connection.join(", ")));
        }
        for (k, v) in &self.extras {
            line(&format!("{k}: {v}"));
        }
        let n = self.body.len();
        match &self.framing {
            Framing::None => {}
            Framing::Length => line(&format!("Content-Length: {n}")),
            Framing::LengthTwice => {
                line(&format!("Content-Length: {n}"));
                line(&format!("Content-Length: {n}"));
            }
            Framing::LengthList => line(&format!("Content-Length: {n}, {n}")),
            Framing::Chunked(_) | Framing::ChunkedTrailer => line("Transfer-Encoding: chunked"),
            Framing::Hostile(lines) => {
                for l in lines {
                    line(l);
                }
            }
        }
        w.extend_from_slice(b"\r\n");
        match &self.framing {
            // No framing field: the request has no body (its bytes are not sent).
            Framing::None => {}
            Framing::Chunked(sizes) => {
                let mut rest = &self.body[..];
                for s in sizes.iter().cycle() {
                    if rest.is_empty() {
                        break;
                    }
                    let take = (*s).min(rest.len());
                    w.extend_from_slice(format!("{take:x}\r\n").as_bytes());
                    w.extend_from_slice(&rest[..take]);
                    w.extend_from_slice(b"\r\n");
                    rest = &rest[take..];
                }
                if sizes.is_empty() && !rest.is_empty() {
                    w.extend_from_slice(format!("{:x}\r\n", rest.len()).as_bytes());
                    w.extend_from_slice(rest);
                    w.extend_from_slice(b"\r\n");
                }
                w.extend_from_slice(b"0\r\n\r\n");
            }
            Framing::ChunkedTrailer => {
                if !self.body.is_empty() {
                    w.extend_from_slice(format!("{:x}\r\n", self.body.len()).as_bytes());
                    w.extend_from_slice(&self.body);
                    w.extend_from_slice(b"\r\n");
                }
                w.extend_from_slice(b"0\r\nx-t: 1\r\n\r\n");
            }
            _ => w.extend_from_slice(&self.body),
        }
        if self.pipelined {
            w.extend_from_slice(&pipelined(case));
        }
        w
    }

    /// The body the request carries, as RFC 9112 frames it.
    pub fn body(&self) -> &[u8] {
        match self.framing {
            Framing::None => b"",
            _ => &self.body,
        }
    }

    /// True when moat must refuse the request whatever its engines decide.
    pub fn must_refuse(&self) -> bool {
        matches!(self.framing, Framing::Hostile(_))
            || nominates_framing_or_routing(&self.connection)
            || self.extras.contains(&("Expect", "something-else"))
            || self.host.is_none()
    }
}

// ---------------------------------------------------------------------------------
// Generated responses.
// ---------------------------------------------------------------------------------

/// How a generated upstream response frames its body.
#[derive(Debug, Clone)]
pub enum RespFraming {
    Length,
    LengthTwice,
    Chunked(usize),
    /// Both: Transfer-Encoding wins (RFC 9112 6.3), the connection is not reused.
    ChunkedAndLength,
    /// Neither: the body ends with the connection.
    UntilClose,
}

/// A generated upstream response to `GET`: status 200, `x-seq: 1`.
#[derive(Debug, Clone)]
pub struct GenResponse {
    pub framing: RespFraming,
    pub connection: Vec<&'static str>,
    pub body: Vec<u8>,
}

/// A response the upstream hides in a body, hoping a client reads it as the next one.
pub const SMUGGLED_RESPONSE: &[u8] =
    b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\nX-Smuggled: yes\r\n\r\nsmuggled";

pub fn response_strategy() -> impl Strategy<Value = GenResponse> {
    (
        prop_oneof![
            Just(RespFraming::Length),
            Just(RespFraming::LengthTwice),
            (1usize..16).prop_map(RespFraming::Chunked),
            Just(RespFraming::ChunkedAndLength),
            Just(RespFraming::UntilClose),
        ],
        prop::sample::subsequence(
            &[
                "content-length",
                "transfer-encoding",
                "keep-alive",
                "x-a",
                "date",
            ][..],
            0..3,
        ),
        prop::collection::vec(
            prop_oneof![
                3 => "[a-z0-9]{0,20}".prop_map(String::into_bytes),
                1 => Just(SMUGGLED_RESPONSE.to_vec()),
            ],
            0..3,
        )
        .prop_map(|p| p.concat()),
    )
        .prop_map(|(framing, connection, body)| GenResponse {
            framing,
            connection,
            body,
        })
}

impl GenResponse {
    /// The bytes on the wire.
    pub fn wire(&self) -> Vec<u8> {
        let n = self.body.len();
        let mut w = b"HTTP/1.1 200 OK\r\nx-seq: 1\r\n".to_vec();
        if !self.connection.is_empty() {
            w.extend_from_slice(
                format!("Connection: {}\r\n", self.connection.join(", ")).as_bytes(),
            );
        }
        match self.framing {
            RespFraming::Length => {
                w.extend_from_slice(format!("Content-Length: {n}\r\n").as_bytes())
            }
            RespFraming::LengthTwice => w.extend_from_slice(
                format!("Content-Length: {n}\r\nContent-Length: {n}\r\n").as_bytes(),
            ),
            RespFraming::Chunked(_) => w.extend_from_slice(b"Transfer-Encoding: chunked\r\n"),
            RespFraming::ChunkedAndLength => w.extend_from_slice(
                format!(
                    "Content-Length: {}\r\nTransfer-Encoding: chunked\r\n",
                    n + 3
                )
                .as_bytes(),
            ),
            RespFraming::UntilClose => {}
        }
        w.extend_from_slice(b"\r\n");
        match self.framing {
            RespFraming::Chunked(size) => {
                for piece in self.body.chunks(size) {
                    w.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
                    w.extend_from_slice(piece);
                    w.extend_from_slice(b"\r\n");
                }
                w.extend_from_slice(b"0\r\n\r\n");
            }
            RespFraming::ChunkedAndLength => {
                if n > 0 {
                    w.extend_from_slice(format!("{n:x}\r\n").as_bytes());
                    w.extend_from_slice(&self.body);
                    w.extend_from_slice(b"\r\n");
                }
                w.extend_from_slice(b"0\r\n\r\n");
            }
            _ => w.extend_from_slice(&self.body),
        }
        w
    }

    /// True when the upstream closes the connection after this response.
    pub fn closes(&self) -> bool {
        matches!(self.framing, RespFraming::UntilClose)
    }
}

// ---------------------------------------------------------------------------------
// Mutated requests and responses.
// ---------------------------------------------------------------------------------

/// Bytes parsers disagree on, which a mutation inserts or writes over one byte.
const MUTATION_BYTES: &[&[u8]] = &[
    b" ",
    b"\t",
    b"\r",
    b"\n",
    b"\r\n",
    b"\0",
    b"\x0b",
    b"\x0c",
    b",",
    b";",
    b"=",
    b"0",
    b"1",
    b"f",
    b"-",
    b"+",
    b"\"",
    b":",
    b"\xff",
    b"chunked",
    b"\r\n0\r\n\r\n",
];

/// One change to a generated request's bytes.
#[derive(Debug, Clone)]
pub enum Edit {
    Insert(&'static [u8]),
    Overwrite(u8),
    Delete,
}

/// A generated request whose body carries [`SMUGGLED`], with bytes changed where its
/// framing is decided: anywhere before the pipelined request (the request line, the
/// header fields, the framing fields, the chunk lines and the body) but in its
/// `X-Case` line. What the
/// request should mean is no longer known; what must hold is that the upstream reads no
/// request the client did not get an answer for from it, and nothing hidden in a body.
#[derive(Debug, Clone)]
pub struct MutatedRequest {
    pub base: GenRequest,
    pub edits: Vec<(prop::sample::Index, Edit)>,
}

/// One to three edits at positions chosen when they are applied.
fn edits_strategy() -> impl Strategy<Value = Vec<(prop::sample::Index, Edit)>> {
    let edit = prop_oneof![
        3 => prop::sample::select(MUTATION_BYTES).prop_map(Edit::Insert),
        2 => prop::sample::select(MUTATION_BYTES).prop_map(|b| Edit::Overwrite(b[0])),
        1 => Just(Edit::Delete),
    ];
    prop::collection::vec((any::<prop::sample::Index>(), edit), 1..4)
}

pub fn mutated_strategy() -> impl Strategy<Value = MutatedRequest> {
    // Bases moat refuses or denies as they are would spend the cases on one outcome.
    let base = request_strategy().prop_filter("refused as generated", |r| {
        !r.must_refuse() && !r.target.contains("/admin")
    });
    (base, edits_strategy()).prop_map(|(mut base, edits)| {
        base.body.extend_from_slice(SMUGGLED);
        MutatedRequest { base, edits }
    })
}

impl MutatedRequest {
    /// The bytes on the wire, each request carrying `X-Case: {case}`.
    pub fn wire(&self, case: &str) -> Vec<u8> {
        let mut w = self.base.wire(Some(case));
        let tag = format!("X-Case: {case}\r\n");
        let tag_at = w
            .windows(tag.len())
            .position(|x| x == tag.as_bytes())
            .unwrap_or(0);
        let end = w.len()
            - if self.base.pipelined {
                pipelined(Some(case)).len()
            } else {
                0
            };
        // Both requests keep their tags whole.
        apply(&mut w, &self.edits, tag_at..tag_at + tag.len(), end);
        w
    }
}

/// Applies `edits` to `w[..end]` but for the bytes of `kept`, which stay as they are.
fn apply(w: &mut Vec<u8>, edits: &[(prop::sample::Index, Edit)], kept: Range<usize>, end: usize) {
    let (mut kept, mut end) = (kept, end);
    for (at, edit) in edits {
        let span = kept.start + (end - kept.end);
        if span == 0 {
            break;
        }
        let at = match at.index(span) {
            i if i < kept.start => i,
            i => kept.end + (i - kept.start),
        };
        let grew: isize = match edit {
            Edit::Insert(bytes) => {
                w.splice(at..at, bytes.iter().copied());
                bytes.len() as isize
            }
            Edit::Overwrite(b) => {
                w[at] = *b;
                0
            }
            Edit::Delete => {
                w.remove(at);
                -1
            }
        };
        end = end.wrapping_add_signed(grew);
        if at < kept.start {
            kept = kept.start.wrapping_add_signed(grew)..kept.end.wrapping_add_signed(grew);
        }
    }
}

/// A generated upstream response with a [`SMUGGLED_RESPONSE`] in its body and bytes
/// inserted, overwritten or deleted anywhere in it. What it means is no longer known;
/// what must hold is that no client reads the hidden response, and that the next
/// request on the connection gets its own response.
#[derive(Debug, Clone)]
pub struct MutatedResponse {
    pub base: GenResponse,
    pub edits: Vec<(prop::sample::Index, Edit)>,
}

pub fn mutated_response_strategy() -> impl Strategy<Value = MutatedResponse> {
    (response_strategy(), edits_strategy()).prop_map(|(mut base, edits)| {
        base.body.extend_from_slice(SMUGGLED_RESPONSE);
        MutatedResponse { base, edits }
    })
}

impl MutatedResponse {
    /// The bytes on the wire.
    pub fn wire(&self) -> Vec<u8> {
        let mut w = self.base.wire();
        let end = w.len();
        apply(&mut w, &self.edits, 0..0, end);
        w
    }
}

/// Judges one mutated request (see [`MutatedRequest`]): `parsed` are the requests the
/// upstream read for it, `answer` what the client read back. Each answer from the
/// upstream is for one request it read, and it read no other; it never read a request
/// for `/admin*`, which access control denies: the hidden one, if a mutation frees it
/// from the body, is a request moat reads, and denies, too.
pub fn judge_mutated(wire: &[u8], answer: &[u8], parsed: &[Parsed]) -> Result<(), String> {
    let answers = crate::common::answer_statuses(answer);
    let from_upstream = answers.iter().filter(|(_, up)| *up).count();
    let hidden = parsed
        .iter()
        .any(|(_, target, _)| target.starts_with("/admin"));
    if from_upstream == parsed.len() && !hidden {
        return Ok(());
    }
    Err(format!(
        "the upstream read {:?}; moat answered {answers:?}\nrequest:\n{}\nmoat answered:\n{}",
        parsed.iter().map(show).collect::<Vec<_>>(),
        String::from_utf8_lossy(wire).escape_debug(),
        String::from_utf8_lossy(answer)
    ))
}

/// A request as the upstream's parser read it: method, target, body.
pub type Parsed = (String, String, Vec<u8>);

/// A parsed request for a failure message, its body as text.
fn show((method, target, body): &Parsed) -> String {
    format!("{method} {target} {:?}", String::from_utf8_lossy(body))
}

/// Judges one generated request: `answer` is every byte the client read back from moat
/// on the request's connection, `parsed` the requests the upstream's parser read from
/// moat for that connection, in order. Each answer the client got from the upstream is
/// for the client's request in the same position, which the upstream read exactly, body
/// included; a request moat answered itself (an engine blocked it, or it was refused)
/// never reached the upstream; nothing else did; a request moat must refuse got a 4xx
/// or a close. Returns the violation, with the request and the answer, if any.
pub fn judge(req: &GenRequest, answer: &[u8], parsed: &[Parsed]) -> Result<(), String> {
    let answers = crate::common::answer_statuses(answer);
    let report = |what: String| {
        Err(format!(
            "{what}\nthe upstream read {:?}\nrequest:\n{}\nmoat answered:\n{}",
            parsed.iter().map(show).collect::<Vec<_>>(),
            String::from_utf8_lossy(&req.wire(None)),
            String::from_utf8_lossy(answer)
        ))
    };
    let mut sent: Vec<Parsed> = Vec::new();
    let target = req.target.strip_prefix("http://x").unwrap_or(req.target);
    sent.push((req.method.into(), target.into(), req.body().to_vec()));
    if req.pipelined {
        sent.push(("GET".into(), "/second".into(), Vec::new()));
    }
    let mut upstream_read = parsed.iter();
    for (i, (_, from_upstream)) in answers.iter().enumerate() {
        if !from_upstream {
            continue;
        }
        if i >= sent.len() {
            return report(format!("more answers than requests: {answers:?}"));
        }
        let next = upstream_read.next();
        if next != Some(&sent[i]) {
            return report(format!(
                "answer {i} came from the upstream, which read {:?} for the client's {:?}",
                next.map(show),
                show(&sent[i])
            ));
        }
    }
    if upstream_read.next().is_some() {
        return report(format!(
            "the upstream read requests nobody got an answer to; answers {answers:?}"
        ));
    }
    if req.must_refuse() && !matches!(answers.first(), Some((400..=499, false)) | None) {
        return report(format!(
            "moat forwarded or accepted a request it must refuse: {answers:?}"
        ));
    }
    Ok(())
}

/// Runs `check` on `cases` values of `strategy`, each on a two-thread runtime.
pub fn run_property<S, F, Fut>(cases: u32, strategy: S, check: F)
where
    S: Strategy,
    F: Fn(S::Value) -> Fut,
    Fut: std::future::Future<Output = Result<(), TestCaseError>>,
{
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&strategy, |v| rt.block_on(check(v)))
        .unwrap_or_else(|e| panic!("{e}"));
}
