//! moat's HTTP/1.1 response head parser (the client side, on upstream bytes), to a
//! `GET` or a `HEAD`: an accepted head must be what `httparse` reads in the same bytes
//! (status, version), forward only end-to-end fields with their values in order (no
//! connection-level field but for a `101`, no `Content-Length` beside
//! `Transfer-Encoding`, nothing `Connection` names), get the body framing RFC 9112
//! section 6.3 derives from its fields, and never be reused after `close`, a body
//! delimited by the close or both framings. Heads over 64 KiB or 128 fields are
//! refused as such.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, input)) = data.split_first() else {
        return;
    };
    if let Err(e) = moat_proxy::fuzzing::check_response_head(input, pick & 1 == 1) {
        panic!("{e}\ninput: {:?}", String::from_utf8_lossy(input));
    }
});
