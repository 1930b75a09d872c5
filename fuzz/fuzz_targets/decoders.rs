//! Every decoder on arbitrary bytes: no panic, output never longer than input
//! (the bound the engine relies on), repeated URL decoding terminates.
#![no_main]
use libfuzzer_sys::fuzz_target;
use moat_waf::decode;

fuzz_target!(|data: &[u8]| {
    let once = decode::url_decode_once(data, true);
    assert!(once.len() <= data.len());
    let rep = decode::url_decode_repeated(data);
    assert!(rep.len() <= data.len());
    let s = String::from_utf8_lossy(data);
    let h = decode::html_decode(&s);
    assert!(h.len() <= s.len() + 3 * s.matches('&').count());
    let j = decode::js_unescape(&s);
    assert!(j.len() <= s.len() + 2 * s.matches('\\').count());
    if let Some(t) = decode::base64_text(&s) {
        assert!(t.len() <= s.len());
    }
    let _ = decode::utf7_decode(&s);
    let _ = decode::utf16_to_utf8(data);
});
