//! The decision service's network-facing parsing (`protocol: decision` listeners) and
//! what moat reads back from the external authorizers it calls: the first byte picks
//! the front door, the rest is what the other side sends.
//!
//! * 0 (mod 3): arbitrary bytes decoded as Envoy's `CheckRequest` (prost) and converted into
//!   moat's request model; no panic, and what is converted keeps the path, method,
//!   headers, body and addresses (`moat_proxy::fuzzing::check_request_conversion`);
//! * 1: header lines of a forward-auth subrequest (nginx `auth_request`, Traefik,
//!   Caddy) turned into the original request: origin form, the named method and host,
//!   no forward-auth header left (`moat_proxy::fuzzing::forward_auth_headers`);
//! * 2: the body of a gRPC provider's answer to a CUSTOM call: one framed
//!   `CheckResponse` or an error (`moat_proxy::fuzzing::check_response_parse`).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let checked = match pick % 3 {
        0 => moat_proxy::fuzzing::check_request_conversion(rest),
        1 => moat_proxy::fuzzing::forward_auth_headers(rest),
        _ => moat_proxy::fuzzing::check_response_parse(rest),
    };
    if let Err(e) = checked {
        panic!("{e}");
    }
});
