//! Every decoder on arbitrary bytes: no panic, output never longer than input
//! (the bound the engine relies on; UTF-16 transcoding at most 1.5 times it),
//! repeated URL decoding terminates; what the body sniff (`moat_core::starts_binary`)
//! calls wide text without a byte order mark, the WAF's transcoder reads with no binary
//! data control.
#![no_main]
use libfuzzer_sys::fuzz_target;
use moat_waf::charset::{self, BodyText};
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
    let _ = (charset::declared(data), charset::of_label(data));
    let _ = (
        charset::of_bom(data),
        charset::of_nuls(data),
        charset::of_xml(data),
    );
    for text in [BodyText::Utf16Le, BodyText::Utf16Be] {
        let t = charset::to_utf8(data, text).unwrap_or_default();
        assert!(t.len() <= data.len() / 2 * 3);
    }
    for text in [BodyText::Utf32Le, BodyText::Utf32Be] {
        let t = charset::to_utf8(data, text).unwrap_or_default();
        assert!(t.len() <= data.len());
    }
    let head = &data[..data.len().min(moat_core::body::SNIFF_BYTES)];
    let control = |c: char| matches!(u32::from(c), 0x00..=0x08 | 0x0B | 0x0E..=0x1A | 0x1C..=0x1F);
    if !moat_core::starts_binary(data)
        && charset::of_bom(data).is_none()
        && head.iter().any(|&b| control(char::from(b)))
    {
        let text = charset::of_nuls(head).expect("text with a control byte is wide text");
        let utf8 = charset::to_utf8(head, text).expect("wide text transcodes");
        assert!(!utf8.chars().any(control), "{text:?}: {utf8:?}");
    }
});
