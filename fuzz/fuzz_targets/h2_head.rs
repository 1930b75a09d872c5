//! "What the engines read is what the upstream reads" for HTTP/2 requests: an
//! arbitrary `:authority` and fields, as the h2 crate hands them to moat, through
//! moat's HTTP/2 head check (whitespace around values trimmed, the host checked) and
//! written as the HTTP/1.1 head moat sends upstream, read back by `httparse`, a parser
//! that is not moat's own: every field the engines read reaches the upstream with the
//! same values in order, and the host moat routed and authorized on is the upstream's
//! (`moat_proxy::fuzzing::check_h2_head`).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(e) = moat_proxy::fuzzing::check_h2_head(data) {
        panic!("{e}");
    }
});
