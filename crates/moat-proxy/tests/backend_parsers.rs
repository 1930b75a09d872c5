//! "One request in, one request out" checked by the parsers of the backends users put
//! behind moat, which share no code with moat's own: Go's net/http server and Node's
//! http server (llhttp, strict mode), each a real process on loopback
//! (`tests/backends/`).
//!
//! A corpus of request-smuggling forms, after the permutations of the public smuggling
//! scanners (field-name and value obfuscations of `Transfer-Encoding` and
//! `Content-Length`, chunk-size and chunk-line forms, bare CR and LF, obs-fold, request-line
//! variants, `Host` conflicts, HTTP/1.0), is written byte for byte to a real moat (access
//! control denying `/admin*`, the WAF in block mode) in front of each backend. Every
//! request the client means carries `X-Case: N`; a request hidden in a body carries
//! `X-Smuggled: yes` and targets `/admin/secret`. HTTP/2 requests follow, each on a
//! connection of its own with frames built by hand: H2.CL and H2.TE, CR, LF and NUL in
//! field names and values, request lines in pseudo-header fields, pseudo-header order,
//! cookies split into several fields. For each case:
//! - a form RFC 9112 makes ambiguous or invalid is refused by moat and never reaches the
//!   backend;
//! - a valid form reaches the backend as exactly the requests the client sent (method,
//!   target, body as RFC 9112 frames them), each answered by the backend;
//! - a form the RFC lets a server either refuse or read (obs-fold, bare LF, repeated
//!   equal lengths...) is one or the other, never a third reading.
//!
//! Over the whole run the backend's parser reports no request it could not parse, no body
//! it could not read, no request without a case id, and none with the smuggled marker.
//! The cases share moat's pooled upstream connections, so a desync left by one case would
//! show in the next one's requests.
//!
//! Generated traffic follows the corpus: the generated and mutated HTTP/1.1 requests of
//! `generated/mod.rs`, generated and mutated HTTP/2 connections (`generated/h2.rs`), and
//! mutated upstream responses, each case through a gateway of its own.
//! `MOAT_PROPERTY_SCALE=N` runs N times as many cases.
//!
//! Responses the other way: hostile upstream responses are read through moat by Go's
//! and Node's HTTP clients (`go-client`, `node-client.js`), over HTTP/1.1 and over
//! HTTP/2, each followed by a second request on the same connection: the client reads the
//! upstream's response exactly, or a 502, or a body cut off where the framing fails
//! mid-way, and the second request gets its own response.
// Test code: a failed setup step is a failed run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod generated;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use common::{
    answer_statuses, exchange, guarded_gateway, guarded_gateway_with, h2_exchange, h2_frame,
    h2_session, hpack_literal,
};
use generated::h2::{
    h2_mutated_strategy, h2_strategy, judge_h2, H2Request, H2Stream, Sent, UpstreamRead,
};
use generated::{
    mutated_response_strategy, mutated_strategy, request_strategy, run_property, MutatedResponse,
    Parsed,
};
use moat_testkit::ChildGuard;
use proptest::strategy::Strategy;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestCaseError;
use proptest::test_runner::{Config, TestRunner};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Longest wait for any one exchange; a hang is a failure.
const IO_TIMEOUT: Duration = Duration::from_secs(10);

/// The request a client hides in a body, hoping a parser reads it as a request.
macro_rules! smuggled {
    () => {
        "GET /admin/secret HTTP/1.1\r\nHost: x\r\nX-Smuggled: yes\r\n\r\n"
    };
}
const SMUGGLED: &str = smuggled!();

// ---------------------------------------------------------------------------------
// The corpus.
// ---------------------------------------------------------------------------------

/// A request the backend must see: method, target and the body RFC 9112 frames.
type Want = (&'static str, &'static str, &'static [u8]);

/// What moat must do with a case.
#[derive(Debug)]
enum Expect {
    /// Refuse the first request (4xx from moat, or a close without an answer); nothing
    /// reaches the backend.
    Refuse,
    /// The backend sees exactly these requests, in order, each answered from it. moat may
    /// answer further requests itself after them (a smuggled `/admin/secret` the client
    /// sent as a request of its own is denied by access control).
    Forward(&'static [Want]),
    /// The RFC lets a server refuse the form or read it: either [`Expect::Refuse`] or
    /// [`Expect::Forward`] of these requests.
    Either(&'static [Want]),
}

struct Case {
    name: &'static str,
    /// The bytes the client writes; `{c}` is replaced by the case id and `{smuggled}` by
    /// [`SMUGGLED`].
    wire: &'static str,
    expect: Expect,
}

const SECOND: Want = ("GET", "/second", b"");
const HELLO: Want = ("POST", "/t", b"hello");

/// The head of a POST to `/t` with the case id, before its framing fields.
macro_rules! post {
    ($fields:literal) => {
        concat!("POST /t HTTP/1.1\r\nHost: x\r\nX-Case: {c}\r\n", $fields)
    };
}

/// A GET to `/second` pipelined after the case's request.
macro_rules! then_second {
    () => {
        "GET /second HTTP/1.1\r\nHost: x\r\nX-Case: {c}\r\n\r\n"
    };
}

const CASES: &[Case] = &[
    // Valid framing, in the forms clients and scanners write it.
    Case {
        name: "content-length",
        wire: concat!(post!("Content-Length: 5\r\n\r\nhello"), then_second!()),
        expect: Expect::Forward(&[HELLO, SECOND]),
    },
    Case {
        name: "content-length without a space",
        wire: concat!(post!("Content-Length:5\r\n\r\nhello"), then_second!()),
        expect: Expect::Forward(&[HELLO, SECOND]),
    },
    Case {
        name: "content-length, trailing whitespace",
        wire: concat!(post!("Content-Length: 5 \t\r\n\r\nhello"), then_second!()),
        expect: Expect::Forward(&[HELLO, SECOND]),
    },
    Case {
        name: "content-length, name upper case",
        wire: concat!(post!("CONTENT-LENGTH: 5\r\n\r\nhello"), then_second!()),
        expect: Expect::Forward(&[HELLO, SECOND]),
    },
    Case {
        name: "chunked",
        wire: concat!(
            post!("Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
            then_second!()
        ),
        expect: Expect::Forward(&[HELLO, SECOND]),
    },
    Case {
        name: "chunked, coding in capitals",
        wire: concat!(
            post!("Transfer-Encoding: CHUNKED\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
            then_second!()
        ),
        expect: Expect::Forward(&[HELLO, SECOND]),
    },
    Case {
        name: "chunked, name in capitals",
        wire: concat!(
            post!("TRANSFER-ENCODING: Chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
            then_second!()
        ),
        expect: Expect::Forward(&[HELLO, SECOND]),
    },
    Case {
        name: "chunked without a space",
        wire: concat!(
            post!("Transfer-Encoding:chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
            then_second!()
        ),
        expect: Expect::Forward(&[HELLO, SECOND]),
    },
    Case {
        name: "chunked after a tab",
        wire: concat!(
            post!("Transfer-Encoding:\tchunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
            then_second!()
        ),
        expect: Expect::Forward(&[HELLO, SECOND]),
    },
    Case {
        name: "chunked, trailing whitespace",
        wire: concat!(
            post!("Transfer-Encoding: chunked \t\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
            then_second!()
        ),
        expect: Expect::Forward(&[HELLO, SECOND]),
    },
    Case {
        name: "chunk extensions, one quoted with a semicolon",
        wire: concat!(
            post!("Transfer-Encoding: chunked\r\n\r\n2;a=b\r\nhe\r\n3 ; q=\"x;y\"\r\nllo\r\n0;z\r\n\r\n"),
            then_second!()
        ),
        expect: Expect::Forward(&[HELLO, SECOND]),
    },
    Case {
        name: "chunk sizes with leading zeros and capitals",
        wire: concat!(
            post!("Transfer-Encoding: chunked\r\n\r\n0005\r\nhello\r\n000\r\n\r\n"),
            then_second!()
        ),
        expect: Expect::Forward(&[HELLO, SECOND]),
    },
    Case {
        name: "chunked with a trailer",
        wire: concat!(
            post!("Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-T: 1\r\n\r\n"),
            then_second!()
        ),
        expect: Expect::Forward(&[HELLO, SECOND]),
    },
    Case {
        name: "chunked, a trailer naming a length",
        wire: concat!(
            post!("Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nContent-Length: 60\r\n\r\n"),
            then_second!()
        ),
        expect: Expect::Either(&[HELLO, SECOND]),
    },
    Case {
        name: "a body holding a request, by length",
        wire: concat!(post!("Content-Length: 56\r\n\r\n{smuggled}"), then_second!()),
        expect: Expect::Forward(&[("POST", "/t", SMUGGLED.as_bytes()), SECOND]),
    },
    Case {
        name: "a body holding a request, chunked",
        wire: concat!(
            post!("Transfer-Encoding: chunked\r\n\r\n38\r\n{smuggled}\r\n0\r\n\r\n"),
            then_second!()
        ),
        expect: Expect::Forward(&[("POST", "/t", SMUGGLED.as_bytes()), SECOND]),
    },
    Case {
        name: "GET with a body",
        wire: concat!(
            "GET /t HTTP/1.1\r\nHost: x\r\nX-Case: {c}\r\nContent-Length: 5\r\n\r\nhello",
            then_second!()
        ),
        expect: Expect::Forward(&[("GET", "/t", b"hello"), SECOND]),
    },
    Case {
        name: "Expect: 100-continue",
        wire: concat!(
            post!("Expect: 100-continue\r\nContent-Length: 5\r\n\r\nhello"),
            then_second!()
        ),
        expect: Expect::Forward(&[HELLO, SECOND]),
    },
    Case {
        name: "absolute-form target",
        wire: concat!(
            "POST http://x/t HTTP/1.1\r\nHost: x\r\nX-Case: {c}\r\nContent-Length: 5\r\n\r\nhello",
            then_second!()
        ),
        expect: Expect::Forward(&[HELLO, SECOND]),
    },
    Case {
        name: "a length of zero, then the request a scanner hides",
        wire: concat!(post!("Content-Length: 0\r\n\r\n{smuggled}")),
        expect: Expect::Forward(&[("POST", "/t", b"")]),
    },
    Case {
        name: "chunked, then the request a scanner hides",
        wire: concat!(post!("Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n{smuggled}")),
        expect: Expect::Forward(&[("POST", "/t", b"")]),
    },
    Case {
        name: "HTTP/1.0 with a length",
        wire: "POST /t HTTP/1.0\r\nHost: x\r\nX-Case: {c}\r\nContent-Length: 5\r\n\r\nhello",
        expect: Expect::Forward(&[HELLO]),
    },
    Case {
        name: "HTTP/1.0 keep-alive, then a second request",
        wire: concat!(
            "POST /t HTTP/1.0\r\nHost: x\r\nX-Case: {c}\r\nConnection: keep-alive\r\nContent-Length: 5\r\n\r\nhello",
            then_second!()
        ),
        expect: Expect::Forward(&[HELLO, SECOND]),
    },
    Case {
        name: "an unknown method",
        wire: concat!(
            "PURGE /t HTTP/1.1\r\nHost: x\r\nX-Case: {c}\r\nContent-Length: 5\r\n\r\nhello",
            then_second!()
        ),
        expect: Expect::Forward(&[("PURGE", "/t", b"hello"), SECOND]),
    },
    // Forms the RFC lets a server refuse or read.
    Case {
        name: "two equal lengths",
        wire: concat!(post!("Content-Length: 5\r\nContent-Length: 5\r\n\r\nhello"), then_second!()),
        expect: Expect::Either(&[HELLO, SECOND]),
    },
    Case {
        name: "a list of equal lengths",
        wire: concat!(post!("Content-Length: 5, 5\r\n\r\nhello"), then_second!()),
        expect: Expect::Either(&[HELLO, SECOND]),
    },
    Case {
        name: "a length with leading zeros",
        wire: concat!(post!("Content-Length: 005\r\n\r\nhello"), then_second!()),
        expect: Expect::Either(&[HELLO, SECOND]),
    },
    Case {
        name: "an underscore for the dash, beside a length",
        wire: concat!(
            post!("Transfer_Encoding: chunked\r\nContent-Length: 5\r\n\r\nhello"),
            then_second!()
        ),
        expect: Expect::Either(&[HELLO, SECOND]),
    },
    Case {
        name: "obs-fold continuing the chunked field",
        wire: concat!(
            post!("Transfer-Encoding:\r\n chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
            then_second!()
        ),
        expect: Expect::Either(&[HELLO, SECOND]),
    },
    Case {
        name: "obs-fold hiding a chunked field in another field, beside a length",
        wire: concat!(
            post!("X-Foo: bar\r\n Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\nhello"),
            then_second!()
        ),
        expect: Expect::Either(&[HELLO, SECOND]),
    },
    Case {
        name: "whitespace before the first field",
        wire: concat!(
            "POST /t HTTP/1.1\r\n Transfer-Encoding: chunked\r\nHost: x\r\nX-Case: {c}\r\nContent-Length: 5\r\n\r\nhello",
            then_second!()
        ),
        expect: Expect::Either(&[HELLO, SECOND]),
    },
    Case {
        name: "bare LF ending the field lines",
        wire: concat!(
            "POST /t HTTP/1.1\nHost: x\nX-Case: {c}\nTransfer-Encoding: chunked\n\n5\r\nhello\r\n0\r\n\r\n",
            then_second!()
        ),
        expect: Expect::Either(&[HELLO, SECOND]),
    },
    Case {
        name: "bare LF ending the chunk lines",
        wire: concat!(
            post!("Transfer-Encoding: chunked\r\n\r\n5\nhello\n0\n\n"),
            then_second!()
        ),
        expect: Expect::Either(&[HELLO, SECOND]),
    },
    Case {
        name: "whitespace after a chunk size",
        wire: concat!(
            post!("Transfer-Encoding: chunked\r\n\r\n5 \r\nhello\r\n0\r\n\r\n"),
            then_second!()
        ),
        expect: Expect::Either(&[HELLO, SECOND]),
    },
    Case {
        name: "a parameter on chunked",
        wire: concat!(
            post!("Transfer-Encoding: chunked;q=1\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
            then_second!()
        ),
        expect: Expect::Either(&[HELLO, SECOND]),
    },
    Case {
        name: "a minor HTTP version above 1.1",
        wire: concat!(
            "POST /t HTTP/1.2\r\nHost: x\r\nX-Case: {c}\r\nContent-Length: 5\r\n\r\nhello",
            then_second!()
        ),
        expect: Expect::Either(&[HELLO, SECOND]),
    },
    Case {
        name: "a fragment in the target",
        wire: concat!(
            "POST /t#frag HTTP/1.1\r\nHost: x\r\nX-Case: {c}\r\nContent-Length: 5\r\n\r\nhello",
            then_second!()
        ),
        expect: Expect::Either(&[HELLO, SECOND]),
    },
    Case {
        name: "a tab between method and target",
        wire: concat!(
            "POST\t/t HTTP/1.1\r\nHost: x\r\nX-Case: {c}\r\nContent-Length: 5\r\n\r\nhello",
            then_second!()
        ),
        expect: Expect::Either(&[HELLO, SECOND]),
    },
    Case {
        name: "a bare LF after a chunk's data",
        wire: concat!(
            post!("Transfer-Encoding: chunked\r\n\r\n5\r\nhello\n0\r\n\r\n"),
            then_second!()
        ),
        expect: Expect::Either(&[HELLO, SECOND]),
    },
    Case {
        name: "a trailer line ended by a bare LF",
        wire: concat!(
            post!("Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-T: 1\n\r\n"),
            then_second!()
        ),
        expect: Expect::Either(&[HELLO, SECOND]),
    },
    Case {
        name: "an empty element before chunked",
        wire: concat!(
            post!("Transfer-Encoding: , chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
            then_second!()
        ),
        expect: Expect::Either(&[HELLO, SECOND]),
    },
    Case {
        name: "an empty element after the length",
        wire: concat!(post!("Content-Length: 5,\r\n\r\nhello"), then_second!()),
        expect: Expect::Either(&[HELLO, SECOND]),
    },
    Case {
        name: "GET, chunked",
        wire: concat!(
            "GET /t HTTP/1.1\r\nHost: x\r\nX-Case: {c}\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
            then_second!()
        ),
        expect: Expect::Forward(&[("GET", "/t", b"hello"), SECOND]),
    },
    Case {
        name: "an absolute-form target naming another host",
        wire: concat!(
            "GET http://other/t HTTP/1.1\r\nHost: x\r\nX-Case: {c}\r\n\r\n",
            then_second!()
        ),
        expect: Expect::Forward(&[("GET", "/t", b""), SECOND]),
    },
    Case {
        name: "OPTIONS *",
        wire: "OPTIONS * HTTP/1.1\r\nHost: x\r\nX-Case: {c}\r\n\r\n",
        expect: Expect::Either(&[("OPTIONS", "*", b"")]),
    },
    // Funky chunks (2025): chunk lines ended differently by different parsers.
    Case {
        name: "a bare LF ending a chunk extension",
        wire: post!("Transfer-Encoding: chunked\r\n\r\n2;\nxx\r\n38\r\n{smuggled}\r\n0\r\n\r\n"),
        expect: Expect::Either(&[("POST", "/t", concat!("xx", smuggled!()).as_bytes())]),
    },
    Case {
        name: "two bytes other than CRLF after a chunk's data",
        wire: post!("Transfer-Encoding: chunked\r\n\r\n2\r\nxxyy38\r\n{smuggled}\r\n0\r\n\r\n"),
        expect: Expect::Refuse,
    },
    Case {
        name: "no CRLF after the last chunk, then a request",
        wire: post!("Transfer-Encoding: chunked\r\n\r\n0\r\n{smuggled}"),
        expect: Expect::Refuse,
    },
    Case {
        name: "CONNECT",
        wire: "CONNECT x:80 HTTP/1.1\r\nHost: x:80\r\nX-Case: {c}\r\n\r\n{smuggled}",
        expect: Expect::Refuse,
    },
    Case {
        name: "a port in Host",
        wire: concat!(
            "GET /t HTTP/1.1\r\nHost: x:8080\r\nX-Case: {c}\r\n\r\n",
            then_second!()
        ),
        expect: Expect::Forward(&[("GET", "/t", b""), SECOND]),
    },
    Case {
        name: "userinfo in Host",
        wire: "GET /t HTTP/1.1\r\nHost: admin@x\r\nX-Case: {c}\r\n\r\n",
        expect: Expect::Refuse,
    },
    Case {
        name: "userinfo in an absolute-form target",
        wire: "GET http://admin@x/t HTTP/1.1\r\nHost: x\r\nX-Case: {c}\r\n\r\n",
        expect: Expect::Refuse,
    },
    Case {
        name: "a path in Host",
        wire: "GET /t HTTP/1.1\r\nHost: x/admin\r\nX-Case: {c}\r\n\r\n",
        expect: Expect::Refuse,
    },
    // CL.TE and TE.CL: both framings at once.
    Case {
        name: "CL.TE",
        wire: post!("Content-Length: 61\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n{smuggled}"),
        expect: Expect::Refuse,
    },
    Case {
        name: "TE.CL",
        wire: post!("Transfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n38\r\n{smuggled}\r\n0\r\n\r\n"),
        expect: Expect::Refuse,
    },
    Case {
        name: "CL.TE, the coding in capitals",
        wire: post!("Content-Length: 61\r\nTransfer-Encoding: CHUNKED\r\n\r\n0\r\n\r\n{smuggled}"),
        expect: Expect::Refuse,
    },
    Case {
        name: "CL.TE, chunked after a tab",
        wire: post!("Content-Length: 61\r\nTransfer-Encoding:\tchunked\r\n\r\n0\r\n\r\n{smuggled}"),
        expect: Expect::Refuse,
    },
    Case {
        name: "CL.TE, chunked in an obs-fold",
        wire: post!("Content-Length: 61\r\nTransfer-Encoding:\r\n chunked\r\n\r\n0\r\n\r\n{smuggled}"),
        expect: Expect::Refuse,
    },
    Case {
        name: "CL.TE, chunked after a bare LF",
        wire: "POST /t HTTP/1.1\r\nHost: x\r\nX-Case: {c}\r\nContent-Length: 61\r\nX: y\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n{smuggled}",
        expect: Expect::Refuse,
    },
    Case {
        name: "CL.TE, chunked after a bare CR",
        wire: "POST /t HTTP/1.1\r\nHost: x\r\nX-Case: {c}\r\nContent-Length: 61\r\nX: y\rTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n{smuggled}",
        expect: Expect::Refuse,
    },
    // Obfuscated transfer codings.
    Case {
        name: "space before the colon",
        wire: post!("Transfer-Encoding : chunked\r\n\r\n0\r\n\r\n{smuggled}"),
        expect: Expect::Refuse,
    },
    Case {
        name: "tab before the colon",
        wire: post!("Transfer-Encoding\t: chunked\r\n\r\n0\r\n\r\n{smuggled}"),
        expect: Expect::Refuse,
    },
    Case {
        name: "vertical tab before chunked",
        wire: post!("Transfer-Encoding:\x0bchunked\r\n\r\n0\r\n\r\n{smuggled}"),
        expect: Expect::Refuse,
    },
    Case {
        name: "form feed before chunked",
        wire: post!("Transfer-Encoding:\x0cchunked\r\n\r\n0\r\n\r\n{smuggled}"),
        expect: Expect::Refuse,
    },
    Case {
        name: "NUL after chunked",
        wire: post!("Transfer-Encoding: chunked\x00\r\n\r\n0\r\n\r\n{smuggled}"),
        expect: Expect::Refuse,
    },
    Case {
        name: "chunked in quotes",
        wire: post!("Transfer-Encoding: \"chunked\"\r\n\r\n0\r\n\r\n{smuggled}"),
        expect: Expect::Refuse,
    },
    Case {
        name: "xchunked",
        wire: post!("Transfer-Encoding: xchunked\r\n\r\n0\r\n\r\n{smuggled}"),
        expect: Expect::Refuse,
    },
    Case {
        name: "chunked-false",
        wire: post!("Transfer-Encoding: chunked-false\r\n\r\n0\r\n\r\n{smuggled}"),
        expect: Expect::Refuse,
    },
    Case {
        name: "chunked twice in one field",
        wire: post!("Transfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n{smuggled}"),
        expect: Expect::Refuse,
    },
    Case {
        name: "chunked twice in two fields",
        wire: post!("Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n{smuggled}"),
        expect: Expect::Refuse,
    },
    Case {
        name: "chunked, then an unknown coding",
        wire: post!("Transfer-Encoding: chunked\r\nTransfer-Encoding: x\r\n\r\n0\r\n\r\n{smuggled}"),
        expect: Expect::Refuse,
    },
    Case {
        name: "identity",
        wire: post!("Transfer-Encoding: identity\r\nContent-Length: 61\r\n\r\n0\r\n\r\n{smuggled}"),
        expect: Expect::Refuse,
    },
    Case {
        name: "chunked not last",
        wire: post!("Transfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n{smuggled}"),
        expect: Expect::Refuse,
    },
    Case {
        name: "gzip before chunked",
        wire: post!("Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n{smuggled}"),
        expect: Expect::Refuse,
    },
    Case {
        name: "chunked in HTTP/1.0",
        wire: "POST /t HTTP/1.0\r\nHost: x\r\nX-Case: {c}\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n{smuggled}",
        expect: Expect::Refuse,
    },
    Case {
        name: "a field line without a colon",
        wire: post!("Transfer-Encoding chunked\r\n\r\n0\r\n\r\n{smuggled}"),
        expect: Expect::Refuse,
    },
    Case {
        name: "NUL in a field name",
        wire: post!("Transfer-Encoding\x00: chunked\r\n\r\n0\r\n\r\n{smuggled}"),
        expect: Expect::Refuse,
    },
    Case {
        name: "an empty field name",
        wire: post!(": chunked\r\nContent-Length: 61\r\n\r\n0\r\n\r\n{smuggled}"),
        expect: Expect::Refuse,
    },
    // Obfuscated lengths.
    Case {
        name: "two different lengths",
        wire: post!("Content-Length: 0\r\nContent-Length: 56\r\n\r\n{smuggled}"),
        expect: Expect::Refuse,
    },
    Case {
        name: "a list of different lengths",
        wire: post!("Content-Length: 0, 56\r\n\r\n{smuggled}"),
        expect: Expect::Refuse,
    },
    Case {
        name: "a signed length",
        wire: post!("Content-Length: +56\r\n\r\n{smuggled}"),
        expect: Expect::Refuse,
    },
    Case {
        name: "a negative length",
        wire: post!("Content-Length: -1\r\n\r\n{smuggled}"),
        expect: Expect::Refuse,
    },
    Case {
        name: "a hexadecimal length",
        wire: post!("Content-Length: 0x38\r\n\r\n{smuggled}"),
        expect: Expect::Refuse,
    },
    Case {
        name: "a decimal point in the length",
        wire: post!("Content-Length: 56.0\r\n\r\n{smuggled}"),
        expect: Expect::Refuse,
    },
    Case {
        name: "a space inside the length",
        wire: post!("Content-Length: 5 6\r\n\r\n{smuggled}"),
        expect: Expect::Refuse,
    },
    Case {
        name: "an empty length",
        wire: post!("Content-Length: \r\n\r\n{smuggled}"),
        expect: Expect::Refuse,
    },
    Case {
        name: "a length past 64 bits",
        wire: post!("Content-Length: 18446744073709551672\r\n\r\n{smuggled}"),
        expect: Expect::Refuse,
    },
    Case {
        name: "NUL after the length",
        wire: post!("Content-Length: 56\x00\r\n\r\n{smuggled}"),
        expect: Expect::Refuse,
    },
    Case {
        name: "space before the length's colon",
        wire: post!("Content-Length : 56\r\n\r\n{smuggled}"),
        expect: Expect::Refuse,
    },
    // Chunk lines.
    Case {
        name: "a chunk size with 0x",
        wire: post!("Transfer-Encoding: chunked\r\n\r\n0x38\r\n{smuggled}\r\n0\r\n\r\n"),
        expect: Expect::Refuse,
    },
    Case {
        name: "a signed chunk size",
        wire: post!("Transfer-Encoding: chunked\r\n\r\n+38\r\n{smuggled}\r\n0\r\n\r\n"),
        expect: Expect::Refuse,
    },
    Case {
        name: "a chunk size with leading whitespace",
        wire: post!("Transfer-Encoding: chunked\r\n\r\n 38\r\n{smuggled}\r\n0\r\n\r\n"),
        expect: Expect::Refuse,
    },
    Case {
        name: "a chunk size past 64 bits",
        wire: post!("Transfer-Encoding: chunked\r\n\r\n10000000000000038\r\n{smuggled}\r\n0\r\n\r\n"),
        expect: Expect::Refuse,
    },
    Case {
        name: "chunk data longer than its size",
        wire: post!("Transfer-Encoding: chunked\r\n\r\n2\r\nhello\r\n0\r\n\r\n{smuggled}"),
        expect: Expect::Refuse,
    },
    Case {
        name: "a bare CR in a chunk extension",
        wire: post!("Transfer-Encoding: chunked\r\n\r\n5;a\rb\r\nhello\r\n0\r\n\r\n{smuggled}"),
        expect: Expect::Refuse,
    },
    Case {
        name: "a chunk size that is not hexadecimal",
        wire: post!("Transfer-Encoding: chunked\r\n\r\nz\r\n{smuggled}\r\n0\r\n\r\n"),
        expect: Expect::Refuse,
    },
    // Request lines and Host.
    Case {
        name: "two different Host fields",
        wire: "POST /admin/secret HTTP/1.1\r\nHost: x\r\nHost: y\r\nX-Case: {c}\r\nContent-Length: 0\r\n\r\n",
        expect: Expect::Refuse,
    },
    Case {
        name: "no Host in HTTP/1.1",
        wire: "POST /t HTTP/1.1\r\nX-Case: {c}\r\nContent-Length: 0\r\n\r\n",
        expect: Expect::Refuse,
    },
    Case {
        name: "a space in the target",
        wire: "GET /t HTTP/1.1 /admin/secret HTTP/1.1\r\nHost: x\r\nX-Case: {c}\r\n\r\n",
        expect: Expect::Refuse,
    },
    Case {
        name: "HTTP/0.9",
        wire: "GET /t\r\n\r\n",
        expect: Expect::Refuse,
    },
    Case {
        name: "HTTP/2.0 on the request line",
        wire: "GET /t HTTP/2.0\r\nHost: x\r\nX-Case: {c}\r\n\r\n",
        expect: Expect::Refuse,
    },
    Case {
        name: "a lower-case protocol name",
        wire: "GET /t http/1.1\r\nHost: x\r\nX-Case: {c}\r\n\r\n",
        expect: Expect::Refuse,
    },
    Case {
        name: "NUL in the target",
        wire: "GET /t\x00/admin HTTP/1.1\r\nHost: x\r\nX-Case: {c}\r\n\r\n",
        expect: Expect::Refuse,
    },
];

/// An HTTP/2 request of the corpus, sent with prior knowledge on a connection of its own.
struct H2Case {
    name: &'static str,
    /// The field block in order, pseudo-header fields included; `{c}` in a value is
    /// replaced by the case id.
    fields: &'static [(&'static str, &'static str)],
    /// The DATA of the stream; `{smuggled}` is replaced by [`SMUGGLED`].
    body: &'static str,
    expect: Expect,
    /// Fields the backend must see with exactly these values, once each.
    also: &'static [(&'static str, &'static str)],
}

/// A request's pseudo-header fields: POST to `/t` on `x`, then the case id.
macro_rules! h2_post {
    ($($field:expr),* $(,)?) => {
        &[(":method", "POST"), (":scheme", "http"), (":path", "/t"), (":authority", "x"),
          ("x-case", "{c}") $(, $field)*]
    };
}

const H2_CASES: &[H2Case] = &[
    H2Case {
        name: "h2: POST with a length",
        fields: h2_post!(("content-length", "5")),
        body: "hello",
        expect: Expect::Forward(&[HELLO]),
        also: &[],
    },
    H2Case {
        name: "h2: POST without a length",
        fields: h2_post!(),
        body: "hello",
        expect: Expect::Forward(&[HELLO]),
        also: &[],
    },
    H2Case {
        name: "h2: te: trailers",
        fields: h2_post!(("te", "trailers")),
        body: "hello",
        expect: Expect::Forward(&[HELLO]),
        also: &[],
    },
    H2Case {
        name: "h2: cookie in two fields, joined for HTTP/1.1",
        fields: h2_post!(("cookie", "a=1"), ("cookie", "b=2")),
        body: "hello",
        expect: Expect::Forward(&[HELLO]),
        also: &[("cookie", "a=1; b=2")],
    },
    H2Case {
        name: "h2: a host field beside :authority",
        fields: h2_post!(("host", "y")),
        body: "hello",
        expect: Expect::Either(&[HELLO]),
        also: &[],
    },
    H2Case {
        name: "h2: whitespace around a field value",
        fields: h2_post!(("x-foo", " bar ")),
        body: "hello",
        expect: Expect::Either(&[HELLO]),
        also: &[],
    },
    H2Case {
        name: "h2: two equal lengths",
        fields: h2_post!(("content-length", "5"), ("content-length", "5")),
        body: "hello",
        expect: Expect::Either(&[HELLO]),
        also: &[],
    },
    H2Case {
        name: "h2: a field value with obs-text and a tab",
        fields: h2_post!(("x-foo", "caf\u{e9}\tbar")),
        body: "hello",
        expect: Expect::Either(&[HELLO]),
        also: &[],
    },
    H2Case {
        name: "h2: :scheme https on a plain-text connection",
        fields: &[
            (":method", "POST"),
            (":scheme", "https"),
            (":path", "/t"),
            (":authority", "x"),
            ("x-case", "{c}"),
        ],
        body: "hello",
        expect: Expect::Either(&[HELLO]),
        also: &[],
    },
    H2Case {
        name: "h2: userinfo in :authority",
        fields: &[
            (":method", "POST"),
            (":scheme", "http"),
            (":path", "/t"),
            (":authority", "admin@x"),
            ("x-case", "{c}"),
        ],
        body: "hello",
        expect: Expect::Either(&[HELLO]),
        also: &[],
    },
    H2Case {
        name: "h2: a fragment in :path",
        fields: &[
            (":method", "POST"),
            (":scheme", "http"),
            (":path", "/t#/admin/secret"),
            (":authority", "x"),
            ("x-case", "{c}"),
        ],
        body: "hello",
        expect: Expect::Either(&[HELLO]),
        also: &[],
    },
    H2Case {
        name: "h2: OPTIONS *",
        fields: &[
            (":method", "OPTIONS"),
            (":scheme", "http"),
            (":path", "*"),
            (":authority", "x"),
            ("x-case", "{c}"),
        ],
        body: "",
        expect: Expect::Either(&[("OPTIONS", "*", b"")]),
        also: &[],
    },
    H2Case {
        name: "h2: CONNECT",
        fields: &[
            (":method", "CONNECT"),
            (":authority", "x:80"),
            ("x-case", "{c}"),
        ],
        body: "{smuggled}",
        expect: Expect::Refuse,
        also: &[],
    },
    H2Case {
        name: "h2: extended CONNECT",
        fields: &[
            (":method", "CONNECT"),
            (":protocol", "websocket"),
            (":scheme", "http"),
            (":path", "/t"),
            (":authority", "x"),
            ("x-case", "{c}"),
        ],
        body: "{smuggled}",
        expect: Expect::Refuse,
        also: &[],
    },
    H2Case {
        name: "h2: a length on a GET without DATA",
        fields: &[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/t"),
            (":authority", "x"),
            ("x-case", "{c}"),
            ("content-length", "0"),
        ],
        body: "",
        expect: Expect::Forward(&[("GET", "/t", b"")]),
        also: &[],
    },
    // H2.CL and H2.TE (Kettle, 2021): a length or a coding for the HTTP/1.1 side.
    H2Case {
        name: "H2.CL: a length of zero, a request in DATA",
        fields: h2_post!(("content-length", "0")),
        body: "{smuggled}",
        expect: Expect::Refuse,
        also: &[],
    },
    H2Case {
        name: "H2.CL: a length shorter than DATA",
        fields: h2_post!(("content-length", "5")),
        body: "hello{smuggled}",
        expect: Expect::Refuse,
        also: &[],
    },
    H2Case {
        name: "H2.CL: two different lengths",
        fields: h2_post!(("content-length", "5"), ("content-length", "61")),
        body: "hello{smuggled}",
        expect: Expect::Refuse,
        also: &[],
    },
    H2Case {
        name: "H2.CL: a signed length",
        fields: h2_post!(("content-length", "+61")),
        body: "hello{smuggled}",
        expect: Expect::Refuse,
        also: &[],
    },
    H2Case {
        name: "H2.TE: transfer-encoding chunked",
        fields: h2_post!(("transfer-encoding", "chunked")),
        body: "0\r\n\r\n{smuggled}",
        expect: Expect::Refuse,
        also: &[],
    },
    H2Case {
        name: "h2: upgrade",
        fields: h2_post!(("upgrade", "h2c")),
        body: "hello",
        expect: Expect::Refuse,
        also: &[],
    },
    // Request splitting through fields HTTP/1.1 would read as line ends.
    H2Case {
        name: "h2: CRLF in a field value",
        fields: h2_post!(("x-foo", "bar\r\nTransfer-Encoding: chunked")),
        body: "0\r\n\r\n{smuggled}",
        expect: Expect::Refuse,
        also: &[],
    },
    H2Case {
        name: "h2: LF in a field value",
        fields: h2_post!(("x-foo", "bar\nContent-Length: 0")),
        body: "{smuggled}",
        expect: Expect::Refuse,
        also: &[],
    },
    H2Case {
        name: "h2: NUL in a field value",
        fields: h2_post!(("x-foo", "bar\u{0}baz")),
        body: "hello",
        expect: Expect::Refuse,
        also: &[],
    },
    H2Case {
        name: "h2: CRLF in a field name",
        fields: h2_post!(("x-foo\r\ntransfer-encoding", "chunked")),
        body: "0\r\n\r\n{smuggled}",
        expect: Expect::Refuse,
        also: &[],
    },
    H2Case {
        name: "h2: a colon in a field name",
        fields: h2_post!(("transfer-encoding:chunked", "1")),
        body: "0\r\n\r\n{smuggled}",
        expect: Expect::Refuse,
        also: &[],
    },
    H2Case {
        name: "h2: a space in a field name",
        fields: h2_post!(("transfer-encoding ", "chunked")),
        body: "0\r\n\r\n{smuggled}",
        expect: Expect::Refuse,
        also: &[],
    },
    H2Case {
        name: "h2: an upper-case field name",
        fields: h2_post!(("Transfer-Encoding", "chunked")),
        body: "0\r\n\r\n{smuggled}",
        expect: Expect::Refuse,
        also: &[],
    },
    H2Case {
        name: "h2: a request line in :path",
        fields: &[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/t HTTP/1.1\r\nHost: x\r\n\r\nGET /admin/secret"),
            (":authority", "x"),
            ("x-case", "{c}"),
        ],
        body: "",
        expect: Expect::Refuse,
        also: &[],
    },
    H2Case {
        name: "h2: a space in :path",
        fields: &[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/t /admin/secret"),
            (":authority", "x"),
            ("x-case", "{c}"),
        ],
        body: "",
        expect: Expect::Refuse,
        also: &[],
    },
    H2Case {
        name: "h2: a request line in :method",
        fields: &[
            (":method", "GET /admin/secret HTTP/1.1\r\nX:"),
            (":scheme", "http"),
            (":path", "/t"),
            (":authority", "x"),
            ("x-case", "{c}"),
        ],
        body: "",
        expect: Expect::Refuse,
        also: &[],
    },
    H2Case {
        name: "h2: CRLF in :authority",
        fields: &[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/t"),
            (":authority", "x\r\nX-Smuggled: yes"),
            ("x-case", "{c}"),
        ],
        body: "",
        expect: Expect::Refuse,
        also: &[],
    },
    H2Case {
        name: "h2: :path without a leading slash",
        fields: &[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "admin/secret"),
            (":authority", "x"),
            ("x-case", "{c}"),
        ],
        body: "",
        expect: Expect::Refuse,
        also: &[],
    },
    H2Case {
        name: "h2: a pseudo-header after a regular field",
        fields: &[
            (":method", "GET"),
            (":scheme", "http"),
            (":authority", "x"),
            ("x-case", "{c}"),
            (":path", "/admin/secret"),
        ],
        body: "",
        expect: Expect::Refuse,
        also: &[],
    },
    H2Case {
        name: "h2: :path twice",
        fields: &[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/t"),
            (":path", "/admin/secret"),
            (":authority", "x"),
            ("x-case", "{c}"),
        ],
        body: "",
        expect: Expect::Refuse,
        also: &[],
    },
    H2Case {
        name: "h2: no :path",
        fields: &[
            (":method", "GET"),
            (":scheme", "http"),
            (":authority", "x"),
            ("x-case", "{c}"),
        ],
        body: "",
        expect: Expect::Refuse,
        also: &[],
    },
    H2Case {
        name: "h2: an unknown pseudo-header",
        fields: h2_post!((":smuggle", "GET /admin/secret")),
        body: "hello",
        expect: Expect::Refuse,
        also: &[],
    },
    // HTTP/2 allows `"` in a field name, HTTP/1.1 does not (it is no token).
    H2Case {
        name: "h2: a quote in a field name",
        fields: h2_post!(("\"ontent-length", "61")),
        body: "hello",
        expect: Expect::Refuse,
        also: &[],
    },
    H2Case {
        name: "h2: an expectation other than 100-continue",
        fields: h2_post!(("expect", "something-else")),
        body: "hello",
        expect: Expect::Refuse,
        also: &[],
    },
    H2Case {
        name: "h2: expect 100-continue",
        fields: h2_post!(("expect", "100-continue")),
        body: "hello",
        expect: Expect::Forward(&[HELLO]),
        also: &[],
    },
];

impl H2Case {
    /// The HPACK field block, each field a literal without indexing.
    fn block(&self, id: &str) -> Vec<u8> {
        let mut block = Vec::new();
        for (name, value) in self.fields {
            hpack_literal(&mut block, name, value.replace("{c}", id));
        }
        block
    }
}

impl Case {
    fn wire(&self, id: usize) -> Vec<u8> {
        self.wire
            .replace("{c}", &id.to_string())
            .replace("{smuggled}", SMUGGLED)
            .into_bytes()
    }
}

// ---------------------------------------------------------------------------------
// The backends.
// ---------------------------------------------------------------------------------

/// A backend process and the records it printed.
struct Backend {
    name: &'static str,
    addr: SocketAddr,
    records: Arc<Mutex<Vec<Value>>>,
    /// Requests [`Backend::drain`] sent so far: each waits for its own record.
    drains: AtomicUsize,
    _child: ChildGuard,
}

impl Backend {
    /// Starts `cmd`, reads its `listening PORT` line, then collects its records.
    fn start(name: &'static str, mut cmd: Command) -> Backend {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("starting the {name} backend: {e}"));
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut first = String::new();
        out.read_line(&mut first).unwrap();
        let port: u16 = first
            .trim()
            .strip_prefix("listening ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("{name} backend printed {first:?}"));
        let records = Arc::new(Mutex::new(Vec::new()));
        let r = records.clone();
        std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                let v: Value = serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("backend record {line:?}: {e}"));
                r.lock().unwrap().push(v);
            }
        });
        Backend {
            name,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            records,
            drains: AtomicUsize::new(0),
            _child: ChildGuard(child),
        }
    }

    /// Sends the backend a request of its own and waits for its record: every record
    /// of what moat sent before (all answered or closed) is then in.
    async fn drain(&self) {
        let end = format!("{DRAIN}{}", self.drains.fetch_add(1, Ordering::SeqCst));
        let mut s = TcpStream::connect(self.addr).await.unwrap();
        s.write_all(
            format!("GET {end} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let mut out = Vec::new();
        let _ = tokio::time::timeout(IO_TIMEOUT, s.read_to_end(&mut out)).await;
        let seen = tokio::time::timeout(IO_TIMEOUT, async {
            loop {
                if self
                    .records
                    .lock()
                    .unwrap()
                    .iter()
                    .any(|r| r["target"] == end.as_str())
                {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
        assert!(
            seen.is_ok(),
            "{}: its own request was never recorded",
            self.name
        );
    }
}

/// The target prefix of [`Backend::drain`]'s own requests.
const DRAIN: &str = "/__end/";

/// True for the record of a [`Backend::drain`] request.
fn is_drain(record: &Value) -> bool {
    record["target"]
        .as_str()
        .is_some_and(|t| t.starts_with(DRAIN))
}

/// Builds the Go program `tests/backends/NAME` into `target/tools`, once per test
/// process: the tests run in parallel, and a second build must not rewrite a binary
/// another test is starting. `None` (after a notice) when Go is missing.
fn go_program(name: &'static str) -> Option<PathBuf> {
    static BUILT: Mutex<Vec<&str>> = Mutex::new(Vec::new());
    let go = moat_testkit::real_part("go", "install Go from https://go.dev/dl")?;
    let tools = moat_testkit::tools_dir();
    let exe = tools.join(name);
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if !built.contains(&name) {
        std::fs::create_dir_all(&tools).unwrap();
        let build = Command::new(&go)
            .args(["build", "-o"])
            .arg(&exe)
            .arg(".")
            .current_dir(
                Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("tests/backends")
                    .join(name),
            )
            .output()
            .unwrap();
        assert!(
            build.status.success(),
            "go build tests/backends/{name}: {}",
            String::from_utf8_lossy(&build.stderr)
        );
        built.push(name);
    }
    Some(exe)
}

fn go_backend(args: &[&str]) -> Option<Backend> {
    let mut cmd = Command::new(go_program("go-recorder")?);
    cmd.args(args);
    Some(Backend::start("Go net/http", cmd))
}

fn node_backend() -> Option<Backend> {
    let node = moat_testkit::real_part("node", "install Node.js from https://nodejs.org")?;
    let mut cmd = Command::new(node);
    cmd.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/backends/node-recorder.js"));
    Some(Backend::start("Node http (llhttp)", cmd))
}

// ---------------------------------------------------------------------------------
// The run.
// ---------------------------------------------------------------------------------

/// Every value of the header `name` (any case) in a backend's request record.
fn fields<'a>(record: &'a Value, name: &str) -> Vec<&'a str> {
    record["headers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|h| {
            let pair = h.as_array()?;
            pair[0]
                .as_str()?
                .eq_ignore_ascii_case(name)
                .then(|| pair[1].as_str())?
        })
        .collect()
}

fn field<'a>(record: &'a Value, name: &str) -> Option<&'a str> {
    fields(record, name).first().copied()
}

/// Method, target and body of each request record.
fn requests(records: &[&Value]) -> Vec<(String, String, Vec<u8>)> {
    records
        .iter()
        .map(|r| {
            let body = base64::engine::general_purpose::STANDARD
                .decode(r["body"].as_str().unwrap_or_default())
                .unwrap();
            (
                r["method"].as_str().unwrap_or_default().to_string(),
                r["target"].as_str().unwrap_or_default().to_string(),
                body,
            )
        })
        .collect()
}

/// What a case came to: `Ok(true)` forwarded, `Ok(false)` refused, or the violation.
fn judge(
    case: &Case,
    answers: &[(u16, bool)],
    seen: &[(String, String, Vec<u8>)],
) -> Result<bool, String> {
    let refused = matches!(answers.first(), None | Some((400..=499, false))) && seen.is_empty();
    let forwarded = |want: &[Want]| {
        let from_upstream = answers.iter().take_while(|(_, up)| *up).count();
        let expected: Vec<(String, String, Vec<u8>)> = want
            .iter()
            .map(|(m, t, b)| (m.to_string(), t.to_string(), b.to_vec()))
            .collect();
        from_upstream == want.len()
            && answers[from_upstream..]
                .iter()
                .all(|(s, up)| !up && (400..500).contains(s))
            && seen == expected
    };
    let ok = match case.expect {
        Expect::Refuse => refused,
        Expect::Forward(want) => forwarded(want),
        Expect::Either(want) => refused || forwarded(want),
    };
    if ok {
        Ok(!refused)
    } else {
        Err(format!(
            "{:?} expected {:?}; moat answered {:?}, the backend saw {:?}",
            case.name,
            case.expect,
            answers,
            seen.iter()
                .map(|(m, t, b)| format!("{m} {t} {:?}", String::from_utf8_lossy(b)))
                .collect::<Vec<_>>()
        ))
    }
}

/// Runs the corpus through a moat in front of `backend`; returns the violations.
async fn run_corpus(backend: &Backend) -> Vec<String> {
    let (gw, _dir) = guarded_gateway(backend.addr).await;
    let addr = gw.listener_addr("main").unwrap();
    let mut answers = Vec::new();
    for (id, case) in CASES.iter().enumerate() {
        answers.push(answer_statuses(&exchange(addr, &case.wire(id)).await));
    }
    for (k, case) in H2_CASES.iter().enumerate() {
        let body = case.body.replace("{smuggled}", SMUGGLED);
        h2_exchange(addr, &case.block(&format!("h2-{k}")), body.as_bytes()).await;
    }
    gw.shutdown(Duration::from_secs(5)).await;
    backend.drain().await;

    let records = backend.records.lock().unwrap().clone();
    let mut violations = Vec::new();
    let mut outcome = Vec::new();
    for r in &records {
        let about = format!("{}: {r}", backend.name);
        if r["kind"] != "request" {
            violations.push(format!(
                "{about}: the backend could not parse what moat sent"
            ));
        } else if r.get("body_error").is_some() {
            violations.push(format!(
                "{about}: the backend could not read a body moat framed"
            ));
        } else if field(r, "x-smuggled").is_some() {
            violations.push(format!(
                "{about}: a request hidden in a body reached the backend"
            ));
        } else if field(r, "x-case").is_none() && !is_drain(r) {
            violations.push(format!(
                "{about}: a request no client sent reached the backend"
            ));
        }
    }
    let of_case = |id: &str| -> Vec<&Value> {
        records
            .iter()
            .filter(|r| r["kind"] == "request" && field(r, "x-case") == Some(id))
            .collect()
    };
    for (id, case) in CASES.iter().enumerate() {
        let seen = requests(&of_case(&id.to_string()));
        match judge(case, &answers[id], &seen) {
            Ok(forwarded) => outcome.push(format!(
                "  {:<10} {}",
                if forwarded { "forwarded" } else { "refused" },
                case.name
            )),
            Err(e) => violations.push(format!("{}: {e}", backend.name)),
        }
    }
    for (k, case) in H2_CASES.iter().enumerate() {
        let of = of_case(&format!("h2-{k}"));
        let seen = requests(&of);
        let want = |w: &[Want]| {
            w.iter()
                .map(|(m, t, b)| (m.to_string(), t.to_string(), b.to_vec()))
                .collect::<Vec<_>>()
        };
        let fields_ok = of.iter().all(|r| {
            case.also
                .iter()
                .all(|(name, value)| fields(r, name) == [*value])
        });
        let ok = fields_ok
            && match case.expect {
                Expect::Refuse => seen.is_empty(),
                Expect::Forward(w) => seen == want(w),
                Expect::Either(w) => seen.is_empty() || seen == want(w),
            };
        if ok {
            outcome.push(format!(
                "  {:<10} {}",
                if seen.is_empty() {
                    "refused"
                } else {
                    "forwarded"
                },
                case.name
            ));
        } else {
            violations.push(format!(
                "{}: {:?} expected {:?} with {:?}; the backend saw {:?}",
                backend.name, case.name, case.expect, case.also, of
            ));
        }
    }
    eprintln!("{} behind moat:\n{}", backend.name, outcome.join("\n"));
    violations
}

#[test]
fn smuggling_forms_frame_one_request_in_go_and_node() {
    let backends: Vec<Backend> = [go_backend(&[]), node_backend()]
        .into_iter()
        .flatten()
        .collect();
    if backends.is_empty() {
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut violations = Vec::new();
    for backend in &backends {
        violations.extend(rt.block_on(run_corpus(backend)));
    }
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

/// Writes `wire` through a gateway of its own in front of `backend` (see
/// [`records_through_moat`]). Returns what the client read back and the requests the
/// backend read, in order.
async fn through_moat(
    backend: &Backend,
    wire: &[u8],
    framed: Option<&str>,
) -> Result<(Vec<u8>, Vec<Parsed>), TestCaseError> {
    let (answer, records) =
        records_through_moat(backend, wire, framed, |addr| exchange(addr, wire)).await?;
    Ok((answer, requests(&records.iter().collect::<Vec<_>>())))
}

/// Runs `send` (the client, writing `wire`) against a gateway of its own in front of
/// `backend`, shut down before the backend is drained: every record of the case is then
/// in. The backend must have read nothing it could not parse (but for a method llhttp
/// does not know) and no body it could not read. With `framed`, the client's requests
/// carry `X-Case: {framed}` and are framed as the client means them: the backend must
/// also have read nothing with the smuggled marker and nothing without that tag.
/// Returns what `send` returned and the backend's records of the requests it read.
async fn records_through_moat<T, Fut>(
    backend: &Backend,
    wire: &[u8],
    framed: Option<&str>,
    send: impl FnOnce(SocketAddr) -> Fut,
) -> Result<(T, Vec<Value>), TestCaseError>
where
    Fut: std::future::Future<Output = T>,
{
    let start = backend.records.lock().unwrap().len();
    let (gw, _dir) = guarded_gateway(backend.addr).await;
    let addr = gw.listener_addr("main").unwrap();
    let answer = send(addr).await;
    gw.shutdown(Duration::from_secs(5)).await;
    backend.drain().await;

    let records = backend.records.lock().unwrap()[start..].to_vec();
    let mut of_case = Vec::new();
    for r in records.into_iter().filter(|r| !is_drain(r)) {
        let violation = if r["kind"] == "refused" && r["code"] == "HPE_INVALID_METHOD" {
            // llhttp knows a fixed list of methods; a method is any token (RFC 9110
            // 9.1), and moat forwards any, as nginx and Envoy do. Node refuses the
            // request and closes the connection: nothing is read past it.
            continue;
        } else if r["kind"] != "request" {
            "could not parse what moat sent"
        } else if r.get("body_error").is_some() {
            "could not read a body moat framed"
        } else if framed.is_some() && field(&r, "x-smuggled") == Some("yes") {
            "read a request hidden in a body"
        } else if framed.is_some() && field(&r, "x-case") != framed {
            "read a request no client sent"
        } else {
            of_case.push(r);
            continue;
        };
        return Err(TestCaseError::fail(format!(
            "{}: the backend {violation}: {r}\nrequest:\n{}",
            backend.name,
            String::from_utf8_lossy(wire).escape_debug()
        )));
    }
    Ok((answer, of_case))
}

/// How many times the generated properties' usual number of cases to run:
/// `MOAT_PROPERTY_SCALE`, for long runs by hand; 1 by default.
fn property_scale() -> usize {
    std::env::var("MOAT_PROPERTY_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1)
}

/// Runs `cases` values of `strategy()` through moat in front of Go's and of Node's server
/// (`check` gets the backend, the case id and the value, and says whether the backend
/// read a request of it); fails unless at least `least` cases reached the backend, for a
/// property that holds because moat refuses everything holds vacuously.
/// `MOAT_PROPERTY_SCALE=N` multiplies `cases` and `least` (see [`property_scale`]).
fn against_backends<S, F, Fut>(cases: usize, least: usize, strategy: fn() -> S, check: F)
where
    S: Strategy,
    F: Fn(Arc<Backend>, String, S::Value) -> Fut,
    Fut: std::future::Future<Output = Result<bool, TestCaseError>>,
{
    let (cases, least) = (cases * property_scale(), least * property_scale());
    for backend in [go_backend(&[]), node_backend()].into_iter().flatten() {
        let backend = Arc::new(backend);
        let (next, forwarded) = (AtomicUsize::new(0), AtomicUsize::new(0));
        run_property(cases as u32, strategy(), |value| {
            let id = format!("g{}", next.fetch_add(1, Ordering::SeqCst));
            let checked = check(backend.clone(), id, value);
            async {
                let reached = checked.await?;
                forwarded.fetch_add(usize::from(reached), Ordering::SeqCst);
                Ok(())
            }
        });
        let forwarded = forwarded.into_inner();
        eprintln!(
            "{}: {forwarded} of {cases} generated requests reached it",
            backend.name
        );
        assert!(
            forwarded >= least,
            "{}: only {forwarded} of {cases} generated requests reached the backend",
            backend.name
        );
    }
}

/// The generated property of `one_in_one_out.rs` ("one request in, one request out")
/// judged by Go's and Node's servers instead of hyper's: each generated request, tagged
/// `X-Case: gN` (its pipelined follower too), reaches the backend exactly as
/// `generated::judge` demands.
#[test]
fn generated_requests_frame_one_request_in_go_and_node() {
    // About 44% reach the backend: 32 is 4 standard deviations below.
    against_backends(128, 32, request_strategy, |backend, id, req| async move {
        let (answer, parsed) = through_moat(&backend, &req.wire(Some(&id)), Some(&id)).await?;
        generated::judge(&req, &answer, &parsed)
            .map_err(|e| TestCaseError::fail(format!("{}: {e}", backend.name)))?;
        Ok(!parsed.is_empty())
    });
}

/// Generated requests with bytes inserted, overwritten or deleted where framing is
/// decided (`generated::MutatedRequest`), a request hidden in every body: whatever moat
/// makes of them, Go's and Node's servers read exactly the requests whose answers the
/// client got from them, and never the hidden one (`generated::judge_mutated`).
#[test]
fn mutated_requests_frame_one_request_in_go_and_node() {
    // About 30% reach the backend: 28 is 4.5 standard deviations below.
    against_backends(192, 28, mutated_strategy, |backend, id, req| async move {
        let wire = req.wire(&id);
        let (answer, parsed) = through_moat(&backend, &wire, None).await?;
        generated::judge_mutated(&wire, &answer, &parsed)
            .map_err(|e| TestCaseError::fail(format!("{}: {e}", backend.name)))?;
        Ok(!parsed.is_empty())
    });
}

/// A backend's record of a request, as `generated::h2` judges it.
fn h2_read(r: &Value) -> UpstreamRead {
    let pairs = |key: &str| -> Vec<(String, String)> {
        r[key]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| Some((p[0].as_str()?.to_string(), p[1].as_str()?.to_string())))
            .collect()
    };
    let (method, target, body) = requests(&[r]).remove(0);
    UpstreamRead {
        stream: field(r, "x-stream").map(str::to_string),
        method,
        target,
        body,
        headers: pairs("headers"),
        trailers: pairs("trailers"),
    }
}

/// Writes `sent` as `req`'s frames through moat in front of `backend` and judges the
/// connection (`generated::h2::judge_h2`); `refuse` says which streams moat must refuse.
/// Returns whether any stream reached the backend.
async fn h2_through_moat(
    backend: &Backend,
    req: &H2Request,
    sent: &[Sent],
    refuse: &[bool],
    id: &str,
) -> Result<bool, TestCaseError> {
    let frames = req.frames(sent);
    let (session, records) = records_through_moat(backend, &frames, Some(id), |addr| {
        h2_session(addr, &frames, sent.len())
    })
    .await?;
    let read: Vec<UpstreamRead> = records.iter().map(h2_read).collect();
    judge_h2(sent, refuse, &session, &read)
        .map(|reached| reached > 0)
        .map_err(|e| TestCaseError::fail(format!("{}: {e}", backend.name)))
}

/// Generated HTTP/2 connections (`generated::h2`: H2.CL, H2.TE, connection-specific
/// fields, CR, LF and NUL in names and values, pseudo-header forms, trailers,
/// CONTINUATION, padding, up to three streams interleaved) through moat to Go's and
/// Node's HTTP/1.1 servers: each stream reaches the backend once as exactly what it
/// sent, or not at all; a malformed one never does; no trailer field that frames,
/// routes or vouches for the request reaches it.
#[test]
fn generated_h2_streams_frame_one_request_in_go_and_node() {
    // About 35% of the connections have a stream that reaches the backend: 20 is 4.5
    // standard deviations below.
    against_backends(128, 20, h2_strategy, |backend, id, req| async move {
        let sent = req.sent(&id);
        let refuse: Vec<bool> = req.streams.iter().map(H2Stream::must_refuse).collect();
        h2_through_moat(&backend, &req, &sent, &refuse, &id).await
    });
}

/// Generated HTTP/2 connections with bytes of a stream's field names, values, trailers
/// or body inserted, overwritten or deleted, a request hidden in every body: whatever
/// moat makes of them, each stream reaches Go's and Node's servers at most once and as
/// exactly what it sent, a stream moat answered itself never, and nothing else does.
#[test]
fn mutated_h2_streams_frame_one_request_in_go_and_node() {
    // About 24% reach the backend: 16 is 4.2 standard deviations below.
    against_backends(
        160,
        16,
        h2_mutated_strategy,
        |backend, id, req| async move {
            let sent = req.sent(&id);
            let refuse = vec![false; sent.len()];
            h2_through_moat(&backend, &req.base, &sent, &refuse, &id).await
        },
    );
}

/// h2 (0.4.20) finds a malformed field (a connection-specific one, a repeated
/// pseudo-header field) while it decodes a header block, and forgets it when a
/// CONTINUATION splits the block in the middle of a later field: the stream is kept,
/// without the field. moat sees only what h2 kept, so what it checks and what it
/// forwards stay one request: the backend reads the first `:path` and nothing of the
/// client's `transfer-encoding`, never `/admin/secret`. Unsplit, the same blocks are
/// refused. (Found by `generated_h2_streams_frame_one_request_in_go_and_node`; it
/// models the behaviour as `generated::h2::Refuse::UnlessSplit`.)
#[test]
fn a_malformed_field_h2_drops_across_continuation_is_never_forwarded() {
    let Some(backend) = go_backend(&[]) else {
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let malformed: [&[(&str, &str)]; 2] = [
        &[(":path", "/"), (":path", "/admin/secret")],
        &[(":path", "/"), ("transfer-encoding", "chunked")],
    ];
    for (k, fields) in malformed.iter().enumerate() {
        for split in [false, true] {
            let case = format!("c{k}-{split}");
            let mut block = Vec::new();
            hpack_literal(&mut block, ":method", "GET");
            hpack_literal(&mut block, ":scheme", "http");
            for (name, value) in *fields {
                hpack_literal(&mut block, name, value);
            }
            hpack_literal(&mut block, ":authority", "x");
            hpack_literal(&mut block, "x-case", &case);
            hpack_literal(&mut block, "x-padding", "a".repeat(40));
            let mut w = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
            h2_frame(&mut w, 0x4, 0, 0, &[]);
            if split {
                // Inside the value of the last field.
                let cut = block.len() - 10;
                h2_frame(&mut w, 0x1, 0x1, 1, &block[..cut]);
                h2_frame(&mut w, 0x9, 0x4, 1, &block[cut..]);
            } else {
                h2_frame(&mut w, 0x1, 0x1 | 0x4, 1, &block);
            }
            let (session, records) = one_h2_stream(&rt, &backend, None, &w);
            let read: Vec<&Value> = records
                .iter()
                .filter(|r| field(r, "x-case") == Some(&case))
                .collect();
            let answer = &session.streams[0];
            if split {
                assert_eq!(read.len(), 1, "{case}: {records:?}");
                assert_eq!(read[0]["target"], "/", "{case}: {records:?}");
                assert!(
                    field(read[0], "transfer-encoding").is_none(),
                    "{case}: {records:?}"
                );
                assert!(answer.answered_by_upstream(), "{case}: {answer:?}");
            } else {
                assert!(read.is_empty(), "{case}: {records:?}");
                assert!(!answer.answered_by_upstream(), "{case}: {answer:?}");
            }
        }
    }
}

/// Sends `wire` (an HTTP/2 connection of one stream) to a fresh guarded gateway in
/// front of `backend`, with `policy` in place of its `/admin*` denial when given: what
/// the client read, and every record the backend holds after it.
fn one_h2_stream(
    rt: &tokio::runtime::Runtime,
    backend: &Backend,
    policy: Option<&str>,
    wire: &[u8],
) -> (common::Session, Vec<Value>) {
    let session = rt.block_on(async {
        let (gw, _dir) = match policy {
            Some(p) => guarded_gateway_with(backend.addr, p).await,
            None => guarded_gateway(backend.addr).await,
        };
        let addr = gw.listener_addr("main").unwrap();
        let session = h2_session(addr, wire, 1).await;
        gw.shutdown(Duration::from_secs(5)).await;
        backend.drain().await;
        session
    });
    let records = backend.records.lock().unwrap().clone();
    (session, records)
}

/// An HTTP/2 request without `:authority` is routed and authorized on its `host`
/// field; an HTTP/1.1 parser strips the whitespace around a field value. moat strips
/// it first and refuses a `host` that is not one `host[:port]`, so no host reaches
/// the backend that moat did not match its policies against: here a DENY on
/// `admin.internal`, which `" admin.internal"` once slipped past.
#[test]
fn an_h2_host_field_moat_did_not_authorize_never_reaches_the_backend() {
    let Some(backend) = go_backend(&[]) else {
        return;
    };
    const DENY_HOST: &str = r#"apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: deny-admin-host, namespace: istio-system}
spec:
  action: DENY
  rules:
  - to: [{operation: {hosts: ["admin.internal", "admin.internal:*"]}}]
"#;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // The host fields of each stream, and whether the backend may read it.
    let cases: [(&[&str], bool); 8] = [
        (&["x"], true),
        (&["x:8080"], true),
        (&[" x\t"], true),
        (&["admin.internal"], false),
        (&[" admin.internal"], false),
        (&["admin.internal\t"], false),
        (&["x", "admin.internal"], false),
        (&["admin .internal"], false),
    ];
    for (k, (hosts, forwarded)) in cases.iter().enumerate() {
        let case = format!("h{k}");
        let mut block = Vec::new();
        hpack_literal(&mut block, ":method", "GET");
        hpack_literal(&mut block, ":scheme", "http");
        hpack_literal(&mut block, ":path", "/");
        for host in *hosts {
            hpack_literal(&mut block, "host", host);
        }
        hpack_literal(&mut block, "x-case", &case);
        let mut w = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        h2_frame(&mut w, 0x4, 0, 0, &[]);
        h2_frame(&mut w, 0x1, 0x1 | 0x4, 1, &block);
        let (session, records) = one_h2_stream(&rt, &backend, Some(DENY_HOST), &w);
        let read: Vec<&Value> = records
            .iter()
            .filter(|r| field(r, "x-case") == Some(&case))
            .collect();
        let answer = &session.streams[0];
        if *forwarded {
            assert_eq!(read.len(), 1, "{hosts:?}: {records:?}");
            assert_eq!(field(read[0], "host"), Some(hosts[0].trim()), "{hosts:?}");
            assert!(answer.answered_by_upstream(), "{hosts:?}: {answer:?}");
        } else {
            assert!(
                read.is_empty(),
                "{hosts:?} reached the backend: {records:?}"
            );
            assert!(!answer.answered_by_upstream(), "{hosts:?}: {answer:?}");
            let status = answer.status();
            assert!(
                matches!(status.as_deref(), Some("400" | "403")) || answer.reset.is_some(),
                "{hosts:?}: {answer:?}"
            );
        }
    }
}

/// Trailer fields that frame, route or vouch for a request (RFC 9110 6.5.1: framing,
/// routing, hop-by-hop, credentials, and the forwarding fields moat sets in the head)
/// never reach the backend, from an HTTP/1.1 chunked body or HTTP/2 trailers; other
/// trailer fields do, exactly. A backend that merges trailers into the header section
/// would otherwise read a forged `Authorization` or `X-Forwarded-For` as checked.
#[test]
fn trailer_fields_that_frame_route_or_vouch_never_reach_the_backend() {
    let backends: Vec<Backend> = [go_backend(&[]), node_backend()]
        .into_iter()
        .flatten()
        .collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let trailers = [
        ("x-t", "1"),
        ("authorization", "Bearer forged"),
        ("host", "admin"),
        ("content-length", "0"),
        ("transfer-encoding", "chunked"),
        ("x-forwarded-for", "9.9.9.9"),
        ("cookie", "session=forged"),
        ("x-checksum", "abc"),
    ];
    for backend in &backends {
        let mut h1 = "POST /t HTTP/1.1\r\nHost: x\r\nX-Case: t1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n".to_string();
        for (name, value) in trailers {
            h1.push_str(&format!("{name}: {value}\r\n"));
        }
        h1.push_str("\r\n");
        let mut block = Vec::new();
        for (name, value) in h2_post!() {
            hpack_literal(&mut block, name, value.replace("{c}", "t2"));
        }
        let mut tail = Vec::new();
        // HTTP/2 resets a stream with a connection-specific field in any header block.
        for (name, value) in trailers.iter().filter(|(n, _)| *n != "transfer-encoding") {
            hpack_literal(&mut tail, name, value);
        }
        let mut h2 = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        h2_frame(&mut h2, 0x4, 0, 0, &[]);
        h2_frame(&mut h2, 0x1, 0x4, 1, &block);
        h2_frame(&mut h2, 0x0, 0, 1, b"hello");
        h2_frame(&mut h2, 0x1, 0x4 | 0x1, 1, &tail);
        rt.block_on(async {
            let (gw, _dir) = guarded_gateway(backend.addr).await;
            let addr = gw.listener_addr("main").unwrap();
            let answer = exchange(addr, h1.as_bytes()).await;
            assert_eq!(answer_statuses(&answer), [(200, true)], "{}", backend.name);
            let session = h2_session(addr, &h2, 1).await;
            assert!(
                session.streams[0].answered_by_upstream(),
                "{}: {session:?}",
                backend.name
            );
            gw.shutdown(Duration::from_secs(5)).await;
            backend.drain().await;
        });
        let records = backend.records.lock().unwrap().clone();
        for case in ["t1", "t2"] {
            let read: Vec<&Value> = records
                .iter()
                .filter(|r| field(r, "x-case") == Some(case))
                .collect();
            assert_eq!(read.len(), 1, "{}: {case}: {records:?}", backend.name);
            // Go keeps trailers in a map: their order is not kept.
            let mut got: Vec<(String, String)> = h2_read(read[0])
                .trailers
                .into_iter()
                .map(|(n, v)| (n.to_ascii_lowercase(), v))
                .collect();
            got.sort();
            assert_eq!(
                got,
                [
                    ("x-checksum".into(), "abc".into()),
                    ("x-t".into(), "1".into())
                ],
                "{}: {case}",
                backend.name
            );
            assert_eq!(field(read[0], "authorization"), None);
            assert_eq!(field(read[0], "host"), Some("x"));
        }
    }
}

/// h2c smuggling (Bishop Fox, 2020): a client asks to upgrade its connection to HTTP/2
/// (`Upgrade: h2c`). A proxy that forwards the upgrade and then tunnels the connection
/// after the backend's `101` lets every later request reach the backend unseen. Against a
/// real Go backend that speaks h2c (golang.org/x/net/http2/h2c), moat must forward the
/// request as plain HTTP/1.1, keep the connection its own, and refuse what access control
/// denies, whatever protocol the client then speaks.
#[test]
fn h2c_upgrade_does_not_tunnel_past_moat() {
    let Some(backend) = go_backend(&["-h2c"]) else {
        return;
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (gw, _dir) = guarded_gateway(backend.addr).await;
        let addr = gw.listener_addr("main").unwrap();

        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(
            b"GET /t HTTP/1.1\r\nHost: x\r\nX-Case: h2c\r\nUpgrade: h2c\r\n\
              HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\
              Connection: Upgrade, HTTP2-Settings\r\n\r\n",
        )
        .await
        .unwrap();
        let head = common::read_head(&mut s).await;
        let head = String::from_utf8_lossy(&head).into_owned();
        // Whatever moat answered, the client now speaks HTTP/2 on the connection, as an
        // attacker would after a 101: a request for what access control denies.
        let mut w = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        h2_frame(&mut w, 0x4, 0, 0, &[]);
        // :method GET (static 2), :scheme http (6), :authority x, :path /admin/secret.
        let mut block = vec![0x82, 0x86, 0x01, 0x01, b'x'];
        hpack_literal(&mut block, ":path", "/admin/secret");
        hpack_literal(&mut block, "x-smuggled", "yes");
        h2_frame(&mut w, 0x1, 0x4 | 0x1, 3, &block);
        let _ = s.write_all(&w).await;
        let mut rest = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(3), s.read_to_end(&mut rest)).await;
        drop(s);
        gw.shutdown(Duration::from_secs(5)).await;
        backend.drain().await;

        let records = backend.records.lock().unwrap().clone();
        assert!(
            head.starts_with("HTTP/1.1 200") && head.contains("x-upstream: yes"),
            "the upgrade request was not answered by the backend over HTTP/1.1: {head}"
        );
        let smuggled: Vec<&Value> = records
            .iter()
            .filter(|r| field(r, "x-smuggled").is_some() || r["target"] == "/admin/secret")
            .collect();
        assert!(
            smuggled.is_empty(),
            "a request reached the backend through an h2c tunnel: {smuggled:?}"
        );
        let upgrade: Vec<&Value> = records
            .iter()
            .filter(|r| field(r, "x-case") == Some("h2c"))
            .collect();
        assert_eq!(upgrade.len(), 1, "{records:?}");
        assert_eq!(upgrade[0]["proto"], "HTTP/1.1", "{records:?}");
        assert!(field(upgrade[0], "upgrade").is_none(), "{records:?}");
    });
}

// ---------------------------------------------------------------------------------
// Responses, read by the clients of Go and Node.
// ---------------------------------------------------------------------------------

/// What a client must read for the first request of a response case.
#[derive(Debug)]
enum RespExpect {
    /// Exactly this status and body, as the upstream framed them.
    Exact(u16, &'static [u8]),
    /// moat's 502: the upstream's framing is invalid.
    BadGateway,
    /// The RFC lets moat refuse the form or read it: a 502 or exactly this.
    Either(u16, &'static [u8]),
    /// The framing fails after the head was forwarded: a 502, or a body the client sees
    /// cut off (an error), never a complete wrong one.
    Cut,
}

/// A hostile upstream response to `GET /r/N`.
struct RespCase {
    name: &'static str,
    wire: &'static str,
    /// The upstream closes the connection after it (the body ends at the close).
    closes: bool,
    expect: RespExpect,
}

const RESP_CASES: &[RespCase] = &[
    RespCase {
        name: "a length",
        wire: "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
        closes: false,
        expect: RespExpect::Exact(200, b"hello"),
    },
    RespCase {
        name: "chunked, an extension and a trailer",
        wire: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2;x=y\r\nhe\r\n3\r\nllo\r\n0\r\nX-T: 1\r\n\r\n",
        closes: false,
        expect: RespExpect::Exact(200, b"hello"),
    },
    RespCase {
        name: "a length and chunked",
        wire: "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        closes: false,
        expect: RespExpect::Either(200, b"hello"),
    },
    RespCase {
        name: "two equal lengths",
        wire: "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
        closes: false,
        expect: RespExpect::Either(200, b"hello"),
    },
    RespCase {
        name: "two different lengths",
        wire: "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 50\r\n\r\nhello",
        closes: true,
        expect: RespExpect::BadGateway,
    },
    RespCase {
        name: "a signed length",
        wire: "HTTP/1.1 200 OK\r\nContent-Length: +5\r\n\r\nhello",
        closes: true,
        expect: RespExpect::BadGateway,
    },
    RespCase {
        name: "bytes past the length, a response in them",
        wire: "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhelloHTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nsmuggled",
        closes: false,
        expect: RespExpect::Exact(200, b"hello"),
    },
    RespCase {
        name: "a body holding a response",
        wire: "HTTP/1.1 200 OK\r\nContent-Length: 46\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nsmuggled",
        closes: false,
        expect: RespExpect::Exact(200, b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nsmuggled"),
    },
    RespCase {
        name: "a body ended by the close",
        wire: "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nhello",
        closes: true,
        expect: RespExpect::Exact(200, b"hello"),
    },
    RespCase {
        name: "HTTP/1.0, a body ended by the close",
        wire: "HTTP/1.0 200 OK\r\n\r\nhello",
        closes: true,
        expect: RespExpect::Exact(200, b"hello"),
    },
    RespCase {
        name: "chunked in HTTP/1.0",
        wire: "HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        closes: true,
        expect: RespExpect::BadGateway,
    },
    RespCase {
        name: "204 with bytes after it",
        wire: "HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\nhello",
        closes: true,
        expect: RespExpect::Either(204, b""),
    },
    RespCase {
        name: "304 with a length",
        wire: "HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\n",
        closes: false,
        expect: RespExpect::Exact(304, b""),
    },
    RespCase {
        name: "100 Continue, then the response",
        wire: "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
        closes: false,
        expect: RespExpect::Exact(200, b"hello"),
    },
    RespCase {
        name: "103 Early Hints, then the response",
        wire: "HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
        closes: false,
        expect: RespExpect::Exact(200, b"hello"),
    },
    RespCase {
        name: "no reason phrase",
        wire: "HTTP/1.1 200\r\nContent-Length: 5\r\n\r\nhello",
        closes: false,
        expect: RespExpect::Exact(200, b"hello"),
    },
    RespCase {
        name: "obs-fold in a field",
        wire: "HTTP/1.1 200 OK\r\nX-A: a\r\n b\r\nContent-Length: 5\r\n\r\nhello",
        closes: true,
        expect: RespExpect::Either(200, b"hello"),
    },
    RespCase {
        name: "bare LF line ends",
        wire: "HTTP/1.1 200 OK\nContent-Length: 5\n\nhello",
        closes: true,
        expect: RespExpect::Either(200, b"hello"),
    },
    RespCase {
        name: "NUL in a field value",
        wire: "HTTP/1.1 200 OK\r\nX-A: a\0b\r\nContent-Length: 5\r\n\r\nhello",
        closes: true,
        expect: RespExpect::Either(200, b"hello"),
    },
    RespCase {
        name: "101 to a request that asked for no switch",
        wire: "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nsmuggled",
        closes: true,
        expect: RespExpect::BadGateway,
    },
    RespCase {
        name: "gzip before chunked",
        wire: "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        closes: true,
        expect: RespExpect::BadGateway,
    },
    RespCase {
        name: "gzip alone",
        wire: "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nhello",
        closes: true,
        expect: RespExpect::BadGateway,
    },
    RespCase {
        name: "a chunk size past 64 bits",
        wire: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10000000000000005\r\nhello\r\n0\r\n\r\n",
        closes: true,
        expect: RespExpect::Cut,
    },
    RespCase {
        name: "a chunk size that is not hexadecimal",
        wire: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
        closes: true,
        expect: RespExpect::Cut,
    },
    RespCase {
        name: "a body cut short of its length",
        wire: "HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\nhello",
        closes: true,
        expect: RespExpect::Cut,
    },
];

/// The upstream of the response cases: `/r/N` gets `cases[N]` as written (and closes the
/// connection after it when the case says so), any other request a plain `second`.
async fn raw_response_upstream(cases: Arc<Vec<(Vec<u8>, bool)>>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let cases = cases.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    let head_end = loop {
                        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            break i + 4;
                        }
                        let mut chunk = [0u8; 4096];
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    };
                    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
                    buf.drain(..head_end);
                    let path = head.split(' ').nth(1).unwrap_or_default().to_string();
                    let case = path
                        .strip_prefix("/r/")
                        .and_then(|n| n.parse::<usize>().ok())
                        .and_then(|n| cases.get(n));
                    let (wire, closes) = match case {
                        Some((wire, closes)) => (&wire[..], *closes),
                        None => (
                            &b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\nX-Upstream: second\r\n\r\nsecond"[..],
                            false,
                        ),
                    };
                    if s.write_all(wire).await.is_err() || closes {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// A client's reading of one request: status and body, or the error it reported.
type Read = Result<(u16, Vec<u8>), String>;

/// Parses a client's output (see `backends/go-client`): the reading of each case's first
/// and second request.
fn readings(client: &str, out: &str) -> Vec<(Read, Read)> {
    let read = |r: &Value| -> Read {
        match r["error"].as_str() {
            Some(e) => Err(e.to_string()),
            None => Ok((
                r["status"].as_u64().unwrap_or_default() as u16,
                base64::engine::general_purpose::STANDARD
                    .decode(r["body"].as_str().unwrap_or_default())
                    .unwrap(),
            )),
        }
    };
    out.lines()
        .map(|l| {
            let line: Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("{client}: {l:?}: {e}"));
            (read(&line["first"]), read(&line["second"]))
        })
        .collect()
}

fn shown(r: &Read) -> String {
    match r {
        Ok((s, b)) => format!("{s} {:?}", String::from_utf8_lossy(b)),
        Err(e) => format!("error {e}"),
    }
}

/// Judges one client's reading of the response cases; returns the violations.
fn judge_responses(client: &str, out: &str) -> Vec<String> {
    let mut violations = Vec::new();
    let lines = readings(client, out);
    if lines.len() != RESP_CASES.len() {
        violations.push(format!(
            "{client}: {} results for {} cases",
            lines.len(),
            RESP_CASES.len()
        ));
    }
    let mut outcome = Vec::new();
    for (case, (first, second)) in RESP_CASES.iter().zip(&lines) {
        let exact =
            |status: u16, body: &[u8]| first.as_ref().is_ok_and(|(s, b)| *s == status && b == body);
        let bad_gateway = first.as_ref().is_ok_and(|(s, _)| *s == 502);
        let ok = match case.expect {
            RespExpect::Exact(status, body) => exact(status, body),
            RespExpect::BadGateway => bad_gateway,
            RespExpect::Either(status, body) => bad_gateway || exact(status, body),
            RespExpect::Cut => bad_gateway || first.is_err(),
        } && *second == Ok((200, b"second".to_vec()));
        if ok {
            outcome.push(format!("  {:<28} {}", shown(first), case.name));
        } else {
            violations.push(format!(
                "{client}: {:?} expected {:?}: first {}, second {}",
                case.name,
                case.expect,
                shown(first),
                shown(second)
            ));
        }
    }
    eprintln!("{client} reading moat's responses:\n{}", outcome.join("\n"));
    violations
}

/// Serves `cases` through a gateway (`/r/N` answered with `cases[N]`) and has Go's and
/// Node's clients read each in turn, followed by a second request on the same
/// connection, over HTTP/1.1 or, with `h2`, as streams of one HTTP/2 connection (h2c
/// with prior knowledge); returns each client's name and output (see
/// `backends/go-client`). Every response a client read came in the protocol asked for.
fn read_by_clients(cases: Vec<(Vec<u8>, bool)>, h2: bool) -> Vec<(&'static str, String)> {
    let node = moat_testkit::real_part("node", "install Node.js from https://nodejs.org");
    let mut clients: Vec<(&str, Command)> = Vec::new();
    if let Some(exe) = go_program("go-client") {
        let name = if h2 {
            "Go net/http client (HTTP/2)"
        } else {
            "Go net/http client"
        };
        clients.push((name, Command::new(exe)));
    }
    if let Some(node) = node {
        let mut cmd = Command::new(node);
        cmd.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/backends/node-client.js"));
        let name = if h2 {
            "Node http2 client (nghttp2)"
        } else {
            "Node http client (llhttp)"
        };
        clients.push((name, cmd));
    }
    let protocol = if h2 { "HTTP/2.0" } else { "HTTP/1.1" };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let n = cases.len();
    rt.block_on(async {
        let up = raw_response_upstream(Arc::new(cases)).await;
        let (gw, _dir) = guarded_gateway(up).await;
        let addr = gw.listener_addr("main").unwrap();
        let mut outputs = Vec::new();
        for (name, mut cmd) in clients {
            let out = tokio::task::spawn_blocking(move || {
                cmd.arg(format!("http://{addr}")).arg(n.to_string());
                if h2 {
                    cmd.arg("--h2");
                }
                cmd.output().unwrap()
            })
            .await
            .unwrap();
            assert!(
                out.status.success(),
                "{name}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let out = String::from_utf8_lossy(&out.stdout).into_owned();
            for line in out.lines() {
                let line: Value = serde_json::from_str(line).unwrap();
                for r in [&line["first"], &line["second"]] {
                    if let Some(proto) = r["proto"].as_str() {
                        assert_eq!(proto, protocol, "{name}: {line}");
                    }
                }
            }
            outputs.push((name, out));
        }
        gw.shutdown(Duration::from_secs(5)).await;
        outputs
    })
}

/// "One response in, one response out", judged by Go's and Node's HTTP/1.1 clients:
/// for each hostile upstream response, a client reads exactly the upstream's response or
/// moat's 502 (a cut-off body where the framing fails mid-way), and the next request on
/// the same connection gets its own response, never bytes of the one before.
#[test]
fn hostile_responses_frame_one_response_in_go_and_node_clients() {
    hostile_responses_read_by_clients(false);
}

/// The same responses read by Go's and Node's HTTP/2 clients (moat translating the
/// upstream's HTTP/1.1 to HTTP/2): a body cut off mid-way is a reset stream.
#[test]
fn hostile_responses_frame_one_response_in_go_and_node_h2_clients() {
    hostile_responses_read_by_clients(true);
}

fn hostile_responses_read_by_clients(h2: bool) {
    let cases = RESP_CASES
        .iter()
        .map(|c| (c.wire.as_bytes().to_vec(), c.closes))
        .collect();
    let violations: Vec<String> = read_by_clients(cases, h2)
        .iter()
        .flat_map(|(name, out)| judge_responses(name, out))
        .collect();
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

/// Generated upstream responses (`generated::MutatedResponse`: every framing, a response
/// hidden in every body, one to three bytes inserted, overwritten or deleted anywhere),
/// read through moat by Go's and Node's clients. Whatever moat makes of a response, no
/// client reads the hidden one, and the next request on the connection gets its own
/// response: moat never answers it with bytes the upstream sent before.
#[test]
fn mutated_responses_frame_one_response_in_go_and_node_clients() {
    mutated_responses_read_by_clients(false);
}

/// The same, read by Go's and Node's HTTP/2 clients.
#[test]
fn mutated_responses_frame_one_response_in_go_and_node_h2_clients() {
    mutated_responses_read_by_clients(true);
}

fn mutated_responses_read_by_clients(h2: bool) {
    // A mutation that removes a response's framing leaves a body delimited by a close
    // that never comes: the gateway's `read_timeout` (1s) cuts it.
    let cases_run = 200 * property_scale();
    let mut runner = TestRunner::new(Config::default());
    let strategy = mutated_response_strategy();
    let generated: Vec<MutatedResponse> = (0..cases_run)
        .map(|_| strategy.new_tree(&mut runner).unwrap().current())
        .collect();
    let cases = generated
        .iter()
        .map(|r| (r.wire(), r.base.closes()))
        .collect();
    let mut violations = Vec::new();
    for (name, out) in read_by_clients(cases, h2) {
        let lines = readings(name, &out);
        assert_eq!(lines.len(), cases_run, "{name}: {out}");
        let mut forwarded = 0;
        for (resp, (first, second)) in generated.iter().zip(&lines) {
            forwarded += usize::from(first.as_ref().is_ok_and(|(s, _)| *s == 200));
            // A mutation that makes the first response an interim one (`100`) makes
            // the one in its body the upstream's final response: reading it is right.
            let wire = resp.wire();
            let interim = {
                let mut fields = [httparse::EMPTY_HEADER; 16];
                let mut head = httparse::Response::new(&mut fields);
                head.parse(&wire).is_ok() && head.code.is_some_and(|c| c < 200)
            };
            let hidden = |r: &Read| !interim && r.as_ref().is_ok_and(|(_, b)| b == b"smuggled");
            if hidden(first) || *second != Ok((200, b"second".to_vec())) {
                violations.push(format!(
                    "{name}: first {}, second {}; the upstream sent:\n{}",
                    shown(first),
                    shown(second),
                    String::from_utf8_lossy(&resp.wire()).escape_debug()
                ));
            }
        }
        // Vacuous if moat answered every case with its 502: most still frame a response.
        assert!(
            forwarded >= cases_run / 5,
            "{name}: only {forwarded} of {cases_run} responses read as the upstream's"
        );
    }
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}
