//! The decision service's network-facing parsing (`protocol: decision` listeners): the
//! first byte picks the front door, the rest is what a caller sends.
//!
//! * even: arbitrary bytes decoded as Envoy's `CheckRequest` (prost) and converted into
//!   moat's request model; no panic, and what is converted keeps the path, method,
//!   headers, body and addresses (`moat_proxy::fuzzing::check_request_conversion`);
//! * odd: header lines of a forward-auth subrequest (nginx `auth_request`, Traefik,
//!   Caddy) turned into the original request: origin form, the named method and host,
//!   no forward-auth header left (`moat_proxy::fuzzing::forward_auth_headers`).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let checked = if pick % 2 == 0 {
        moat_proxy::fuzzing::check_request_conversion(rest)
    } else {
        moat_proxy::fuzzing::forward_auth_headers(rest)
    };
    if let Err(e) = checked {
        panic!("{e}");
    }
});
