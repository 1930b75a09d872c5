//! The secret scanner's recursive decoding (gitleaks' `detect/codec`) on arbitrary
//! bytes:
//!
//! * the hand-written segment finder the scanner uses finds exactly the segments
//!   gitleaks' combined regex finds (compiled with `regex-automata`);
//! * each decoder agrees with an independent one on every segment it is given:
//!   percent with `percent-encoding`, hex with `hex`, base64 with the `base64` crate
//!   (standard padded, else URL-safe unpadded, Go's lenient trailing bits), with
//!   gitleaks' rule that a decoded value must be printable ASCII;
//! * every decoding pass is shorter than the text it decoded, and its segments lie in
//!   order inside the texts they point into.
#![no_main]
use base64::alphabet;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use base64::Engine as _;
use libfuzzer_sys::fuzz_target;
use moat_secrets::decode::fuzzing as codec;

/// gitleaks' printable ASCII: 0x09..=0x7e.
fn printable(b: &[u8]) -> bool {
    b.iter().all(|&c| (0x09..0x7f).contains(&c))
}

/// `Some` when printable, else the refusal (empty).
fn kept(d: Vec<u8>) -> Vec<u8> {
    if printable(&d) {
        d
    } else {
        Vec::new()
    }
}

fn base64_reference(v: &[u8]) -> Vec<u8> {
    // Go's decoders accept non-zero unused bits (its `Strict` mode does not).
    let config = GeneralPurposeConfig::new().with_decode_allow_trailing_bits(true);
    let std = GeneralPurpose::new(
        &alphabet::STANDARD,
        config.with_decode_padding_mode(DecodePaddingMode::RequireCanonical),
    );
    let url = GeneralPurpose::new(
        &alphabet::URL_SAFE,
        config.with_decode_padding_mode(DecodePaddingMode::RequireNone),
    );
    // gitleaks only tries values with a digit or one of `+/-_`.
    if !v
        .iter()
        .any(|&b| b.is_ascii_digit() || matches!(b, b'+' | b'/' | b'-' | b'_'))
    {
        return Vec::new();
    }
    match std.decode(v) {
        Ok(d) if printable(&d) => d,
        _ => url.decode(v).map(kept).unwrap_or_default(),
    }
}

fn hex_reference(v: &[u8]) -> Vec<u8> {
    if !v.iter().any(u8::is_ascii_digit) {
        return Vec::new();
    }
    hex::decode(v).map(kept).unwrap_or_default()
}

fn percent_reference(v: &[u8]) -> Vec<u8> {
    // Any escape of a byte that is not printable refuses the whole segment.
    let escapes_ok = v.windows(3).all(|w| {
        w[0] != b'%'
            || !(w[1].is_ascii_hexdigit() && w[2].is_ascii_hexdigit())
            || std::str::from_utf8(&w[1..])
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .is_some_and(|b| printable(&[b]))
    });
    if !escapes_ok {
        return Vec::new();
    }
    percent_encoding::percent_decode(v).collect()
}

fuzz_target!(|data: &[u8]| {
    let [ours, regex] = codec::encoding_matches(data);
    assert_eq!(ours, regex, "finder and regex disagree");
    for &(kind, s, e) in &ours {
        let v = &data[s..e];
        match kind {
            0 => assert_eq!(
                codec::decode_percent(v),
                percent_reference(v),
                "percent {v:?}"
            ),
            1 => {
                let d = codec::decode_unicode(v);
                assert!(std::str::from_utf8(&d).is_ok(), "unicode {v:?} -> {d:?}");
                assert!(d.len() < v.len());
            }
            2 => assert_eq!(codec::decode_hex(v), hex_reference(v), "hex {v:?}"),
            _ => assert_eq!(codec::decode_base64(v), base64_reference(v), "base64 {v:?}"),
        }
    }
    let mut prev: &[u8] = data;
    for (text, segments) in &codec::passes(data, 8) {
        assert!(text.len() < prev.len(), "a pass did not shrink its text");
        let mut last_end = 0;
        for s in segments {
            let (ds, de) = s.decoded;
            assert!(0 <= ds && ds < de && de as usize <= text.len(), "{s:?}");
            assert!(ds >= last_end, "segments out of order: {segments:?}");
            last_end = de;
            let (es, ee) = s.encoded;
            assert!(0 <= es && es < ee && ee as usize <= prev.len(), "{s:?}");
            let (os, oe) = s.original;
            assert!(0 <= os && os <= oe && oe as usize <= data.len(), "{s:?}");
        }
        prev = text;
    }
});
