//! moat's HTTP/1.1 request head parser on arbitrary client bytes (the head up to its
//! first empty line, as the server reads it, and the bytes whole). An accepted head
//! must be what `httparse` reads in the same bytes (method, target, version, every
//! field's values in order), never carry both `Content-Length` and
//! `Transfer-Encoding`, have exactly one `Host` (HTTP/1.1), and get the body decoder
//! its framing fields describe; the field-count limit holds. The checks are the ones
//! the property tests run (`moat-proxy` `h1::oracle`).
#![no_main]
use libfuzzer_sys::fuzz_target;

/// Field-count limits the server is configured with, the first byte picks one.
const MAX_FIELDS: [usize; 6] = [1, 2, 4, 16, 100, 512];

fuzz_target!(|data: &[u8]| {
    let Some((&pick, input)) = data.split_first() else {
        return;
    };
    let max = MAX_FIELDS[usize::from(pick) % MAX_FIELDS.len()];
    if let Err(e) = moat_proxy::fuzzing::check_request_head(input, max) {
        panic!("{e}\ninput: {:?}", String::from_utf8_lossy(input));
    }
});
