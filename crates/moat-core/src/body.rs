//! Buffered bodies and bounded content decoding.
//!
//! Several engines inspect the same body (WAF, secrets, discovery); the decoded
//! form is computed once per body and cached here. Decoding is bounded both in
//! output size and in expansion ratio so a decompression bomb costs at most
//! `max_output` bytes of memory.

use std::io::Read;
use std::sync::OnceLock;

use bytes::Bytes;

/// Limits for [`decode`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeLimits {
    /// Maximum decoded size in bytes.
    pub max_output: usize,
    /// Maximum decoded/encoded ratio.
    pub max_ratio: usize,
}

impl Default for DecodeLimits {
    fn default() -> Self {
        DecodeLimits {
            max_output: 8 << 20,
            max_ratio: 100,
        }
    }
}

/// Why a body could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The `Content-Encoding` is not one moat decodes.
    #[error("unsupported content-encoding `{0}`")]
    Unsupported(String),
    /// The compressed data is corrupt.
    #[error("corrupt {0} data")]
    Corrupt(&'static str),
    /// Decoding would exceed [`DecodeLimits::max_output`] or the ratio limit.
    #[error("decoded body exceeds the limit of {limit} bytes (ratio limit {ratio})")]
    TooLarge {
        /// The output limit that applied.
        limit: usize,
        /// The ratio limit that applied.
        ratio: usize,
    },
}

/// Decodes `data` according to a `Content-Encoding` header value
/// (`gzip`, `x-gzip`, `deflate`, `br`, `identity`, or a comma-separated chain).
pub fn decode(encoding: &str, data: &[u8], limits: DecodeLimits) -> Result<Vec<u8>, DecodeError> {
    let mut current: Vec<u8> = data.to_vec();
    // Encodings are listed in the order applied; undo them in reverse.
    for enc in encoding.rsplit(',') {
        let enc = enc.trim().to_ascii_lowercase();
        let cap = limits
            .max_output
            .min(current.len().saturating_mul(limits.max_ratio).max(1024));
        current = match enc.as_str() {
            "" | "identity" => current,
            "gzip" | "x-gzip" => read_bounded(
                flate2::read::MultiGzDecoder::new(&current[..]),
                cap,
                "gzip",
                limits,
            )?,
            "deflate" => {
                // RFC 9110 says zlib-wrapped; some clients send raw deflate.
                match read_bounded(
                    flate2::read::ZlibDecoder::new(&current[..]),
                    cap,
                    "deflate",
                    limits,
                ) {
                    Err(DecodeError::Corrupt(_)) => read_bounded(
                        flate2::read::DeflateDecoder::new(&current[..]),
                        cap,
                        "deflate",
                        limits,
                    )?,
                    other => other?,
                }
            }
            "br" => read_bounded(
                brotli::Decompressor::new(&current[..], 4096),
                cap,
                "br",
                limits,
            )?,
            other => return Err(DecodeError::Unsupported(other.to_string())),
        };
    }
    Ok(current)
}

fn read_bounded<R: Read>(
    reader: R,
    cap: usize,
    name: &'static str,
    limits: DecodeLimits,
) -> Result<Vec<u8>, DecodeError> {
    let mut out = Vec::new();
    let mut limited = reader.take(cap as u64 + 1);
    limited
        .read_to_end(&mut out)
        .map_err(|_| DecodeError::Corrupt(name))?;
    if out.len() > cap {
        return Err(DecodeError::TooLarge {
            limit: limits.max_output,
            ratio: limits.max_ratio,
        });
    }
    Ok(out)
}

/// A buffered body as received, with its decoded form computed on first use.
#[derive(Debug)]
pub struct Body {
    raw: Bytes,
    content_encoding: Option<String>,
    truncated: bool,
    limits: DecodeLimits,
    decoded: OnceLock<Result<Bytes, DecodeError>>,
    modified: bool,
}

impl Body {
    /// Wraps received bytes. `truncated` is true when the body was longer than
    /// the buffer limit and only this prefix was read.
    pub fn new(
        raw: Bytes,
        content_encoding: Option<String>,
        truncated: bool,
        limits: DecodeLimits,
    ) -> Self {
        let content_encoding = content_encoding.filter(|e| {
            let e = e.trim();
            !e.is_empty() && !e.eq_ignore_ascii_case("identity")
        });
        Body {
            raw,
            content_encoding,
            truncated,
            limits,
            decoded: OnceLock::new(),
            modified: false,
        }
    }

    /// The bytes as received (still content-encoded).
    pub fn raw(&self) -> &Bytes {
        &self.raw
    }

    /// The `Content-Encoding` that applies to [`raw`](Self::raw), if any.
    pub fn content_encoding(&self) -> Option<&str> {
        self.content_encoding.as_deref()
    }

    /// True when the body exceeded the buffer limit and only a prefix is here.
    pub fn truncated(&self) -> bool {
        self.truncated
    }

    /// The decoded body (identical to `raw` when there is no content encoding).
    /// Computed once and cached.
    pub fn decoded(&self) -> Result<&Bytes, &DecodeError> {
        self.decoded
            .get_or_init(|| match &self.content_encoding {
                None => Ok(self.raw.clone()),
                Some(enc) => decode(enc, &self.raw, self.limits).map(Bytes::from),
            })
            .as_ref()
    }

    /// Replaces the body with new, *unencoded* content (e.g. after redaction).
    /// The proxy then drops `Content-Encoding` and fixes `Content-Length`.
    pub fn replace(&mut self, decoded: Bytes) {
        self.raw = decoded.clone();
        self.content_encoding = None;
        self.decoded = OnceLock::new();
        let _ = self.decoded.set(Ok(decoded));
        self.modified = true;
    }

    /// True when a phase replaced the body.
    pub fn modified(&self) -> bool {
        self.modified
    }

    /// Consumes the body, returning the bytes to forward.
    pub fn into_raw(self) -> Bytes {
        self.raw
    }
}

/// How many of a body's first bytes [`starts_binary`] reads: the WHATWG MIME Sniffing
/// standard's resource header length.
pub const SNIFF_BYTES: usize = 1445;

/// Whether a body is binary by the WHATWG MIME Sniffing standard's rule for telling text
/// from binary: it does not start with a byte order mark (UTF-8, UTF-16 or, beyond the
/// standard, UTF-32 big-endian, whose little-endian mark starts as UTF-16's), and one of its
/// first [`SNIFF_BYTES`] bytes is a binary data byte (a C0 control other than tab, line
/// feed, form feed, carriage return and escape). JSON, XML and form parsers refuse such
/// bytes in UTF-8, so a body with one is not a document they read, whatever its type.
///
/// Also beyond the standard: UTF-16 and UTF-32 text without a byte order mark has a
/// NUL in every character it shares with ASCII, and JSON parsers read it (Python's
/// `json.loads` and Jackson apply RFC 4627 section 3's rule, [`shown_by_nuls`]). Such a
/// body is text when its first bytes show the encoding and its first [`SNIFF_BYTES`]
/// decode in it to characters none of which is binary data.
pub fn starts_binary(data: &[u8]) -> bool {
    if data.starts_with(&[0xFE, 0xFF])
        || data.starts_with(&[0xFF, 0xFE])
        || data.starts_with(&[0xEF, 0xBB, 0xBF])
        || data.starts_with(&[0, 0, 0xFE, 0xFF])
    {
        return false;
    }
    let head = &data[..data.len().min(SNIFF_BYTES)];
    if !head.iter().any(|&b| is_binary_data(u32::from(b))) {
        return false;
    }
    !shown_by_nuls(head).is_some_and(|wide| decodes_to_text(head, wide))
}

/// A Unicode encoding whose code units are wider than a byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WideText {
    /// UTF-16, little-endian.
    Utf16Le,
    /// UTF-16, big-endian.
    Utf16Be,
    /// UTF-32, little-endian.
    Utf32Le,
    /// UTF-32, big-endian.
    Utf32Be,
}

/// The encoding of a text whose first two characters are ASCII, from the NULs of its
/// first four bytes: RFC 4627 section 3's rule for JSON (Jackson and Python's `json`
/// apply it), which holds as well for a form (`q=`) or an XML document (`<?`, XML 1.0
/// appendix F). `None` when the bytes show no NUL there.
pub fn shown_by_nuls(data: &[u8]) -> Option<WideText> {
    match data {
        [0, 0, 0, a, ..] if *a != 0 => Some(WideText::Utf32Be),
        [a, 0, 0, 0, ..] if *a != 0 => Some(WideText::Utf32Le),
        [0, a, ..] if *a != 0 => Some(WideText::Utf16Be),
        [a, 0, ..] if *a != 0 => Some(WideText::Utf16Le),
        _ => None,
    }
}

/// A C0 control other than tab, line feed, form feed, carriage return and escape.
fn is_binary_data(c: u32) -> bool {
    matches!(c, 0x00..=0x08 | 0x0B | 0x0E..=0x1A | 0x1C..=0x1F)
}

/// Whether `head`, the first bytes of a body, decodes in `wide` to valid characters none
/// of which is binary data. A unit (or a UTF-16 high surrogate) at its very end may be
/// cut by the end of `head` and is not read.
fn decodes_to_text(head: &[u8], wide: WideText) -> bool {
    match wide {
        WideText::Utf16Le | WideText::Utf16Be => {
            let unit = |b: &[u8]| match wide {
                WideText::Utf16Le => u16::from_le_bytes([b[0], b[1]]),
                _ => u16::from_be_bytes([b[0], b[1]]),
            };
            let units = head.chunks_exact(2).map(unit);
            let cut_pair = units
                .clone()
                .next_back()
                .is_some_and(|last| (0xD800..=0xDBFF).contains(&last));
            let n = units.len() - usize::from(cut_pair);
            char::decode_utf16(units.take(n))
                .all(|c| c.is_ok_and(|c| !is_binary_data(u32::from(c))))
        }
        WideText::Utf32Le | WideText::Utf32Be => head.chunks_exact(4).all(|b| {
            let b = [b[0], b[1], b[2], b[3]];
            let unit = match wide {
                WideText::Utf32Le => u32::from_le_bytes(b),
                _ => u32::from_be_bytes(b),
            };
            char::from_u32(unit).is_some_and(|c| !is_binary_data(u32::from(c)))
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    #[test]
    fn gzip_roundtrip_and_cache() {
        let body = Body::new(
            Bytes::from(gzip(b"hello world")),
            Some("gzip".into()),
            false,
            DecodeLimits::default(),
        );
        assert_eq!(&body.decoded().unwrap()[..], b"hello world");
        assert_eq!(&body.decoded().unwrap()[..], b"hello world");
    }

    #[test]
    fn bomb_is_refused() {
        let bomb = gzip(&vec![0u8; 50 << 20]);
        let limits = DecodeLimits {
            max_output: 1 << 20,
            max_ratio: 100,
        };
        assert!(matches!(
            decode("gzip", &bomb, limits),
            Err(DecodeError::TooLarge { .. })
        ));
    }

    #[test]
    fn corrupt_and_unknown() {
        let l = DecodeLimits::default();
        assert_eq!(
            decode("gzip", b"not gzip", l),
            Err(DecodeError::Corrupt("gzip"))
        );
        assert!(matches!(
            decode("zstd", b"x", l),
            Err(DecodeError::Unsupported(_))
        ));
        assert!(decode("br", b"\xff\xff\xff", l).is_err());
    }

    #[test]
    fn deflate_raw_and_zlib() {
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        z.write_all(b"abc").unwrap();
        let z = z.finish().unwrap();
        assert_eq!(
            decode("deflate", &z, DecodeLimits::default()).unwrap(),
            b"abc"
        );
        let mut d = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::default());
        d.write_all(b"abc").unwrap();
        let d = d.finish().unwrap();
        assert_eq!(
            decode("deflate", &d, DecodeLimits::default()).unwrap(),
            b"abc"
        );
    }

    #[test]
    fn replace_drops_encoding() {
        let mut body = Body::new(
            Bytes::from(gzip(b"x")),
            Some("gzip".into()),
            false,
            DecodeLimits::default(),
        );
        body.replace(Bytes::from_static(b"plain"));
        assert!(body.modified());
        assert_eq!(body.content_encoding(), None);
        assert_eq!(&body.decoded().unwrap()[..], b"plain");
    }

    #[test]
    fn binary_bodies_by_their_first_bytes() {
        use super::{starts_binary, SNIFF_BYTES};
        assert!(!starts_binary(b""));
        assert!(!starts_binary(b"{\"id\": \"1' or 1=1 --\"}\r\n\t\x0c\x1b"));
        assert!(!starts_binary("caf\u{e9} \u{1F600}".as_bytes()));
        assert!(starts_binary(b"\x89PNG\r\n\x1a\n"));
        assert!(starts_binary(b"PK\x03\x04"));
        assert!(starts_binary(b"\x1f\x8b\x08"));
        assert!(starts_binary(&[0xAC, 0xED, 0x00, 0x05]));
        // UTF-16 text with its byte order mark is text.
        assert!(!starts_binary(&[0xFF, 0xFE, b'{', 0, b'}', 0]));
        assert!(!starts_binary(&[0, 0, 0xFE, 0xFF, 0, 0, 0, b'{']));
        // Without it, it is text when its characters are (Python's `json.loads` and
        // Jackson read it), and binary when they are not.
        let utf16 = |s: &str, le: bool| -> Vec<u8> {
            s.encode_utf16()
                .flat_map(|u| if le { u.to_le_bytes() } else { u.to_be_bytes() })
                .collect()
        };
        let utf32 = |s: &str, le: bool| -> Vec<u8> {
            s.chars()
                .flat_map(|c| {
                    let c = u32::from(c);
                    if le {
                        c.to_le_bytes()
                    } else {
                        c.to_be_bytes()
                    }
                })
                .collect()
        };
        let json = "{\"q\": \"1' or 1=1 -- \u{1F600} caf\u{e9}\"}\r\n";
        for le in [true, false] {
            assert!(!starts_binary(&utf16(json, le)), "{le}");
            assert!(!starts_binary(&utf32(json, le)), "{le}");
            assert!(starts_binary(&utf16("{\u{1}}", le)), "{le}");
            assert!(starts_binary(&utf32("{\u{1}}", le)), "{le}");
        }
        assert!(!starts_binary(&[b'{', 0, b'}', 0]));
        // A body cut in the middle of a unit or a surrogate pair is read up to the cut.
        let long = utf16(&format!("[\"{}\u{1F600}\"]", "a".repeat(SNIFF_BYTES)), true);
        assert!(!starts_binary(&long[..SNIFF_BYTES]));
        let pair = utf16("[\u{1F600}", true);
        assert!(!starts_binary(&pair[..pair.len() - 2]));
        assert!(!starts_binary(&pair[..pair.len() - 1]));
        // An unpaired surrogate or a value above U+10FFFF is no text.
        assert!(starts_binary(&[b'[', 0, 0x00, 0xDC, b']', 0]));
        assert!(starts_binary(&[b'[', 0, 0, 0, 0, 0, 0x11, 0]));
        // Binary formats whose first bytes look like wide text are still binary.
        assert!(starts_binary(&[b'M', b'Z', 0x90, 0, 3, 0, 0, 0])); // a Windows executable
        assert!(starts_binary(&[b'M', 0, 0x90, 0, 3, 0, 0, 0])); // U+0003
        assert!(starts_binary(&[0, 0, 1, 0, 1, 0, 16, 16, 0, 0])); // ICO

        // Only the first SNIFF_BYTES count.
        let mut late = vec![b'a'; SNIFF_BYTES];
        late.push(0);
        assert!(!starts_binary(&late));
        late[SNIFF_BYTES - 1] = 0;
        assert!(starts_binary(&late));
    }
}
