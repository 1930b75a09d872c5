//! moat's chunked body decoder, two ways:
//!
//! * on arbitrary bytes, read whole and in reads of fuzzer-chosen sizes: the same data,
//!   outcome and leftover either way, never more data than input, a bounded number of
//!   steps, and a body that ends well is exactly the chunks a reference reader (chunk
//!   sizes by `httparse`) finds, followed by one whole trailer section;
//! * round trip: fuzzer-chosen data cut into fuzzer-chosen chunks, with trailers and
//!   bytes of a next message after it, encoded by moat's encoder and decoded back in
//!   any reads: the same data and trailers, the next message left unread.
#![no_main]
use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;

/// Read sizes (cycled), 1 to 64 bytes each.
fn pieces(u: &mut Unstructured<'_>) -> Result<Vec<usize>> {
    let n = u.int_in_range(1..=8)?;
    (0..n).map(|_| u.int_in_range(1..=64)).collect()
}

/// Trailer fields that survive a round trip: valid names (lower case, as moat writes
/// them), values without surrounding whitespace (which HTTP trims).
fn trailers(u: &mut Unstructured<'_>) -> Result<http::HeaderMap> {
    let mut map = http::HeaderMap::new();
    for _ in 0..u.int_in_range(0..=4)? {
        let name: String = u.arbitrary()?;
        let value: Vec<u8> = u.arbitrary()?;
        let trimmed = !value.is_empty()
            && ![b' ', b'\t'].contains(&value[0])
            && ![b' ', b'\t'].contains(&value[value.len() - 1]);
        if let (Ok(n), Ok(v), true) = (
            http::HeaderName::from_bytes(name.to_ascii_lowercase().as_bytes()),
            http::HeaderValue::from_bytes(&value),
            trimmed,
        ) {
            map.append(n, v);
        }
    }
    Ok(map)
}

fn one(data: &[u8]) -> Result<()> {
    let mut u = Unstructured::new(data);
    let round_trip: bool = u.arbitrary()?;
    let pieces = pieces(&mut u)?;
    let result = if round_trip {
        let sizes: Vec<usize> = (0..u.int_in_range(0..=16)?)
            .map(|_| u.int_in_range(0..=300))
            .collect::<Result<_>>()?;
        let trailers = trailers(&mut u)?;
        let after: Vec<u8> = u.arbitrary()?;
        let body = u.take_rest();
        moat_proxy::fuzzing::check_chunked_round_trip(body, &sizes, &trailers, &after, &pieces)
    } else {
        moat_proxy::fuzzing::check_chunked(u.take_rest(), &pieces)
    };
    if let Err(e) = result {
        panic!("{e}\ninput: {data:?}");
    }
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let _ = one(data);
});
