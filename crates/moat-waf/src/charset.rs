//! The text encoding a request body is read in, so the WAF reads the body as the backend
//! will.
//!
//! Backends honour a body's declared or detectable encoding: ASP.NET decodes forms in the
//! `charset` of `Content-Type` (IBM037, an EBCDIC code page, is the well-known WAF
//! bypass), Jackson detects UTF-16 and UTF-32 JSON from its first bytes (RFC 4627
//! section 3), XML parsers follow a byte order mark or the XML declaration (XML 1.0
//! appendix F). A payload in one of those encodings has none of the ASCII bytes the
//! detectors look for. So the body is read as:
//! - its bytes, when its encoding is ASCII-compatible (UTF-8, the ISO 8859 and Windows
//!   code pages, the CJK multi-byte encodings...): attack syntax is ASCII there;
//! - UTF-8 transcoded from UTF-16 or UTF-32 (either byte order);
//! - unreadable otherwise (EBCDIC and any label not known to be ASCII-compatible): the
//!   `charset` limit, refused or forwarded per `limits.on_limit`.

/// How the WAF reads a body's bytes as text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyText {
    /// ASCII-compatible: the bytes as they are.
    Bytes,
    /// UTF-16, little-endian.
    Utf16Le,
    /// UTF-16, big-endian.
    Utf16Be,
    /// UTF-32, little-endian.
    Utf32Le,
    /// UTF-32, big-endian.
    Utf32Be,
    /// An encoding the WAF does not read (EBCDIC, an unknown label).
    Unreadable,
}

/// The value of the `charset` parameter of a `Content-Type` value, unquoted and trimmed.
pub fn declared(content_type: &[u8]) -> Option<&[u8]> {
    // Most types carry no parameter: one `memchr` rules them out.
    let params = &content_type[memchr::memchr(b';', content_type)? + 1..];
    params.split(|&b| b == b';').find_map(|param| {
        let param = param.trim_ascii();
        let eq = param.iter().position(|&b| b == b'=')?;
        let (name, value) = (param[..eq].trim_ascii(), param[eq + 1..].trim_ascii());
        if !name.eq_ignore_ascii_case(b"charset") {
            return None;
        }
        let value = value
            .strip_prefix(b"\"")
            .and_then(|v| v.strip_suffix(b"\""))
            .unwrap_or(value);
        Some(value.trim_ascii())
    })
}

/// How a body whose encoding is named `label` (a `charset` or an XML `encoding`) is read.
pub fn of_label(label: &[u8]) -> BodyText {
    if label.eq_ignore_ascii_case(b"utf-8") {
        return BodyText::Bytes;
    }
    let mut buf = [0u8; 32];
    if label.is_empty() || label.len() > buf.len() {
        return BodyText::Unreadable;
    }
    let lower = &mut buf[..label.len()];
    lower.copy_from_slice(label);
    lower.make_ascii_lowercase();
    let l: &[u8] = lower;
    let l = l.strip_prefix(b"x-").unwrap_or(l);
    match l {
        b"utf-16le" | b"utf16le" | b"unicodefffe" => return BodyText::Utf16Le,
        b"utf-16be" | b"utf16be" | b"unicodefeff" => return BodyText::Utf16Be,
        // Without a byte order mark (which `of_bom` reads first) UTF-16 is big-endian
        // (RFC 2781 4.3). `unicode` and `ucs-2` are Windows' and Java's names for it.
        b"utf-16" | b"utf16" | b"unicode" | b"ucs-2" | b"iso-10646-ucs-2" | b"csunicode" => {
            return BodyText::Utf16Be
        }
        b"utf-32le" | b"utf32le" => return BodyText::Utf32Le,
        b"utf-32be" | b"utf32be" | b"utf-32" | b"utf32" | b"ucs-4" | b"iso-10646-ucs-4" => {
            return BodyText::Utf32Be
        }
        _ => {}
    }
    if ascii_compatible(l) {
        BodyText::Bytes
    } else {
        BodyText::Unreadable
    }
}

/// The form field a backend may decode a form's other fields in: HTML fills a hidden
/// `_charset_` field with the encoding the browser submits in, and Apache Sling (AEM)
/// decodes the request's parameters, query and body, in the encoding it names.
pub const FORM_FIELD: &str = "_charset_";

/// True when a form whose `_charset_` field holds `value` is read correctly as bytes:
/// the value is empty (the backend's default) or names an ASCII-compatible encoding.
/// Browsers submit forms in such an encoding only (in UTF-8 from a UTF-16 page), so
/// UTF-16 and UTF-32 are unreadable here, as EBCDIC and unknown labels are.
pub fn form_field_readable(value: &[u8]) -> bool {
    let value = value.trim_ascii();
    value.is_empty() || of_label(value) == BodyText::Bytes
}

/// True for the labels of encodings in which every ASCII character is its ASCII byte
/// and no byte of a multi-byte character is mistaken for one that matters here: the
/// WHATWG Encoding Standard's single-byte and CJK encodings (what browsers send), their
/// common aliases, and the DOS code pages legacy clients use. UTF-7 is read as bytes
/// too: the decoder reads its `+...-` runs wherever they occur.
fn ascii_compatible(l: &[u8]) -> bool {
    const EXACT: &[&[u8]] = &[
        b"utf-8",
        b"utf8",
        b"unicode-1-1-utf-8",
        b"unicode11utf8",
        b"unicode20utf8",
        b"utf-7",
        b"utf7",
        b"us-ascii",
        b"ascii",
        b"ansi_x3.4-1968",
        b"iso646-us",
        b"us",
        b"ibm367",
        b"cp367",
        b"csascii",
        b"koi8-r",
        b"koi8-u",
        b"koi8-ru",
        b"koi8",
        b"koi",
        b"cskoi8r",
        b"ibm866",
        b"cp866",
        b"866",
        b"csibm866",
        b"ibm437",
        b"cp437",
        b"437",
        b"ibm850",
        b"cp850",
        b"850",
        b"ibm852",
        b"cp852",
        b"macintosh",
        b"mac",
        b"mac-roman",
        b"mac-cyrillic",
        b"mac-ukrainian",
        b"csmacintosh",
        b"tis-620",
        b"dos-874",
        b"gbk",
        b"gb2312",
        b"gb_2312",
        b"gb_2312-80",
        b"gb18030",
        b"chinese",
        b"csgb2312",
        b"iso-ir-58",
        b"big5",
        b"big5-hkscs",
        b"cn-big5",
        b"csbig5",
        b"euc-jp",
        b"cseucpkdfmtjapanese",
        b"shift_jis",
        b"shift-jis",
        b"sjis",
        b"ms_kanji",
        b"ms932",
        b"windows-31j",
        b"csshiftjis",
        b"euc-kr",
        b"cseuckr",
        b"ks_c_5601-1987",
        b"ks_c_5601-1989",
        b"ksc5601",
        b"ksc_5601",
        b"korean",
        b"windows-949",
        b"cp949",
        b"user-defined",
    ];
    if EXACT.contains(&l) {
        return true;
    }
    // ISO 8859 parts (iso-8859-N, iso8859-N, iso_8859-N, iso_8859-N:YEAR), Windows code
    // pages (windows-125N, cp125N, windows-874), Latin aliases (latinN, lN).
    let digits_after = |prefix: &[u8]| {
        l.strip_prefix(prefix).is_some_and(|rest| {
            let n = rest.split(|&b| b == b':').next().unwrap_or_default();
            !n.is_empty() && n.len() <= 2 && n.iter().all(u8::is_ascii_digit)
        })
    };
    digits_after(b"iso-8859-")
        || digits_after(b"iso8859-")
        || digits_after(b"iso_8859-")
        || digits_after(b"iso8859")
        || digits_after(b"latin")
        || (l.len() <= 3 && digits_after(b"l"))
        || l.strip_prefix(b"windows-").is_some_and(windows_code_page)
        || l.strip_prefix(b"cp").is_some_and(windows_code_page)
}

/// `1250`-`1258` and `874`.
fn windows_code_page(n: &[u8]) -> bool {
    n == b"874" || (n.len() == 4 && n.starts_with(b"125") && (b'0'..=b'8').contains(&n[3]))
}

/// The encoding a byte order mark at the start of `data` names, and the mark's length.
pub fn of_bom(data: &[u8]) -> Option<(BodyText, usize)> {
    match data {
        [0xEF, 0xBB, 0xBF, ..] => Some((BodyText::Bytes, 3)),
        [0xFF, 0xFE, 0, 0, ..] => Some((BodyText::Utf32Le, 4)),
        [0, 0, 0xFE, 0xFF, ..] => Some((BodyText::Utf32Be, 4)),
        [0xFF, 0xFE, ..] => Some((BodyText::Utf16Le, 2)),
        [0xFE, 0xFF, ..] => Some((BodyText::Utf16Be, 2)),
        _ => None,
    }
}

/// The encoding of a text whose first two characters are ASCII, from the NULs of its
/// first four bytes ([`moat_core::shown_by_nuls`]: RFC 4627 section 3's rule for JSON).
pub fn of_nuls(data: &[u8]) -> Option<BodyText> {
    moat_core::shown_by_nuls(data).map(|wide| match wide {
        moat_core::WideText::Utf16Le => BodyText::Utf16Le,
        moat_core::WideText::Utf16Be => BodyText::Utf16Be,
        moat_core::WideText::Utf32Le => BodyText::Utf32Le,
        moat_core::WideText::Utf32Be => BodyText::Utf32Be,
    })
}

/// An ASCII-looking XML document's encoding (XML 1.0 appendix F): `<?xm` in EBCDIC is
/// unreadable, and so is an XML declaration whose `encoding` is. `None`: the bytes are
/// read as they are.
pub fn of_xml(data: &[u8]) -> Option<BodyText> {
    if data.starts_with(&[0x4C, 0x6F, 0xA7, 0x94]) {
        return Some(BodyText::Unreadable);
    }
    let start = data.iter().position(|b| !b.is_ascii_whitespace())?;
    let decl = data[start..].strip_prefix(b"<?xml")?;
    let decl = &decl[..memchr::memmem::find(decl, b"?>")?];
    let at = memchr::memmem::find(decl, b"encoding")?;
    let rest = decl[at + b"encoding".len()..].trim_ascii_start();
    let rest = rest.strip_prefix(b"=")?.trim_ascii_start();
    let quote = *rest.first().filter(|q| matches!(q, b'"' | b'\''))?;
    let value = &rest[1..];
    let end = value.iter().position(|&b| b == quote)?;
    // A declaration readable as ASCII that names UTF-16 or UTF-32 contradicts itself:
    // its bytes are read as they are.
    match of_label(&value[..end]) {
        BodyText::Unreadable => Some(BodyText::Unreadable),
        _ => None,
    }
}

/// `data` in `text` (UTF-16 or UTF-32) as UTF-8; invalid units become U+FFFD, a trailing
/// partial unit is dropped. `None` for [`BodyText::Bytes`] and [`BodyText::Unreadable`].
pub fn to_utf8(data: &[u8], text: BodyText) -> Option<String> {
    match text {
        BodyText::Utf16Le | BodyText::Utf16Be => {
            let le = text == BodyText::Utf16Le;
            let units = data.chunks_exact(2).map(|c| {
                if le {
                    u16::from_le_bytes([c[0], c[1]])
                } else {
                    u16::from_be_bytes([c[0], c[1]])
                }
            });
            Some(
                char::decode_utf16(units)
                    .map(|c| c.unwrap_or(char::REPLACEMENT_CHARACTER))
                    .collect(),
            )
        }
        BodyText::Utf32Le | BodyText::Utf32Be => {
            let le = text == BodyText::Utf32Le;
            Some(
                data.chunks_exact(4)
                    .map(|c| {
                        let b = [c[0], c[1], c[2], c[3]];
                        let n = if le {
                            u32::from_le_bytes(b)
                        } else {
                            u32::from_be_bytes(b)
                        };
                        char::from_u32(n).unwrap_or(char::REPLACEMENT_CHARACTER)
                    })
                    .collect(),
            )
        }
        BodyText::Bytes | BodyText::Unreadable => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charset_parameter_is_found_quoted_or_not() {
        assert_eq!(
            declared(b"application/x-www-form-urlencoded; charset=ibm037"),
            Some(&b"ibm037"[..])
        );
        assert_eq!(
            declared(b"text/xml;Charset=\"UTF-16\" ; x=y"),
            Some(&b"UTF-16"[..])
        );
        assert_eq!(
            declared(b"multipart/form-data; boundary=a; charset = utf-8"),
            Some(&b"utf-8"[..])
        );
        assert_eq!(declared(b"application/json"), None);
        assert_eq!(declared(b"text/plain; charsetx=1"), None);
    }

    #[test]
    fn charset_form_fields_name_ascii_compatible_encodings_or_nothing() {
        for readable in [
            &b""[..],
            b" ",
            b"UTF-8",
            b"utf-8",
            b"Shift_JIS",
            b"windows-1252",
        ] {
            assert!(form_field_readable(readable), "{readable:?}");
        }
        for unreadable in [
            &b"ibm037"[..],
            b"cp500",
            b"UTF-16",
            b"utf-32le",
            b"no-such-code",
        ] {
            assert!(!form_field_readable(unreadable), "{unreadable:?}");
        }
    }

    #[test]
    fn labels_are_classified() {
        for ascii in [
            "UTF-8",
            "utf8",
            "ISO-8859-1",
            "iso_8859-15:1998",
            "latin1",
            "l2",
            "windows-1252",
            "cp1251",
            "Windows-874",
            "x-sjis",
            "Shift_JIS",
            "GBK",
            "gb18030",
            "big5",
            "EUC-KR",
            "koi8-r",
            "us-ascii",
            "utf-7",
            "x-mac-cyrillic",
        ] {
            assert_eq!(of_label(ascii.as_bytes()), BodyText::Bytes, "{ascii}");
        }
        for (label, text) in [
            ("utf-16", BodyText::Utf16Be),
            ("UTF-16LE", BodyText::Utf16Le),
            ("unicodeFFFE", BodyText::Utf16Le),
            ("utf-32le", BodyText::Utf32Le),
            ("UTF-32", BodyText::Utf32Be),
        ] {
            assert_eq!(of_label(label.as_bytes()), text, "{label}");
        }
        for unreadable in [
            "ibm037",
            "IBM500",
            "cp037",
            "cp1140",
            "ibm1047",
            "ebcdic-cp-us",
            "cp875",
            "iso-2022-jp",
            "utf-32x",
            "windows-1259",
            "cp12",
            "latin",
            "",
            "a-label-far-too-long-to-be-any-charset",
        ] {
            assert_eq!(
                of_label(unreadable.as_bytes()),
                BodyText::Unreadable,
                "{unreadable}"
            );
        }
    }

    #[test]
    fn marks_json_and_xml_starts_name_their_encoding() {
        assert_eq!(of_bom(b"\xFF\xFE{\0"), Some((BodyText::Utf16Le, 2)));
        assert_eq!(of_bom(b"\xFF\xFE\0\0{\0\0\0"), Some((BodyText::Utf32Le, 4)));
        assert_eq!(of_bom(b"\xEF\xBB\xBF{}"), Some((BodyText::Bytes, 3)));
        assert_eq!(of_bom(b"{}"), None);
        assert_eq!(of_nuls(b"{\0\0\0\"\0\0\0"), Some(BodyText::Utf32Le));
        assert_eq!(of_nuls(b"\0\0\0{\0\0\0\""), Some(BodyText::Utf32Be));
        assert_eq!(of_nuls(b"{\0\"\0"), Some(BodyText::Utf16Le));
        assert_eq!(of_nuls(b"\0q\0="), Some(BodyText::Utf16Be));
        assert_eq!(of_nuls(b"<\0?\0x\0"), Some(BodyText::Utf16Le));
        assert_eq!(of_nuls(b"{\"a\":1}"), None);
        assert_eq!(of_xml(b"\x4C\x6F\xA7\x94\x93"), Some(BodyText::Unreadable));
        assert_eq!(
            of_xml(b"<?xml version=\"1.0\" encoding='IBM037'?><a/>"),
            Some(BodyText::Unreadable)
        );
        assert_eq!(
            of_xml(b" <?xml version=\"1.0\" encoding = \"utf-8\"?><a/>"),
            None
        );
        assert_eq!(
            of_xml(b"<?xml version=\"1.0\" encoding=\"utf-16\"?><a/>"),
            None
        );
        assert_eq!(of_xml(b"<?xml version=\"1.0\"?><a/>"), None);
        assert_eq!(of_xml(b"<a encoding='ibm037'/>"), None);
    }

    #[test]
    fn utf16_and_utf32_become_utf8() {
        let s = "q=<script>é😀";
        let le16: Vec<u8> = s.encode_utf16().flat_map(u16::to_le_bytes).collect();
        let be16: Vec<u8> = s.encode_utf16().flat_map(u16::to_be_bytes).collect();
        let le32: Vec<u8> = s.chars().flat_map(|c| (c as u32).to_le_bytes()).collect();
        let be32: Vec<u8> = s.chars().flat_map(|c| (c as u32).to_be_bytes()).collect();
        assert_eq!(to_utf8(&le16, BodyText::Utf16Le).as_deref(), Some(s));
        assert_eq!(to_utf8(&be16, BodyText::Utf16Be).as_deref(), Some(s));
        assert_eq!(to_utf8(&le32, BodyText::Utf32Le).as_deref(), Some(s));
        assert_eq!(to_utf8(&be32, BodyText::Utf32Be).as_deref(), Some(s));
        // A lone surrogate and a value past U+10FFFF are U+FFFD; a trailing odd byte is
        // dropped.
        assert_eq!(
            to_utf8(&[0x00, 0xD8, b'a', 0, 7], BodyText::Utf16Le).as_deref(),
            Some("\u{FFFD}a")
        );
        assert_eq!(
            to_utf8(&[0, 0, 0x11, 0, b'a', 0, 0, 0], BodyText::Utf32Le).as_deref(),
            Some("\u{FFFD}a")
        );
        assert_eq!(to_utf8(b"abc", BodyText::Bytes), None);
    }
}
