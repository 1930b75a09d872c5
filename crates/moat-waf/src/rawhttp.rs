//! Parsing of raw HTTP/1.x request files (for `moat waf test` and corpus
//! replay). Lenient like the blazehttp tool: leading `#` comment lines and
//! blank lines are skipped, `\n` or `\r\n` line ends, the body is the rest.

use crate::{BodyView, RequestView};

/// An owned raw request.
#[derive(Debug, Clone, Default)]
pub struct RawRequest {
    /// Method.
    pub method: String,
    /// Request target bytes.
    pub target: Vec<u8>,
    /// Headers in order.
    pub headers: Vec<(String, Vec<u8>)>,
    /// Body bytes as in the file (possibly content-encoded or chunked).
    pub body: Vec<u8>,
}

/// Why a raw request could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid raw HTTP request: {0}")]
pub struct RawError(pub &'static str);

impl RawRequest {
    /// Parses raw request bytes.
    pub fn parse(data: &[u8]) -> Result<RawRequest, RawError> {
        let mut pos = 0;
        // skip comment and blank lines
        loop {
            if pos >= data.len() {
                return Err(RawError("empty"));
            }
            let end = memchr::memchr(b'\n', &data[pos..])
                .map(|x| pos + x)
                .unwrap_or(data.len());
            let line = &data[pos..end];
            let t = line.strip_suffix(b"\r").unwrap_or(line);
            if t.is_empty() || t.starts_with(b"#") {
                pos = end + 1;
                continue;
            }
            break;
        }
        let end = memchr::memchr(b'\n', &data[pos..])
            .map(|x| pos + x)
            .unwrap_or(data.len());
        let line = &data[pos..end];
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        pos = (end + 1).min(data.len());
        let sp1 = memchr::memchr(b' ', line).ok_or(RawError("no request target"))?;
        let method = String::from_utf8_lossy(&line[..sp1]).into_owned();
        let rest = &line[sp1 + 1..];
        let target = match memchr::memrchr(b' ', rest) {
            Some(p) if rest[p + 1..].starts_with(b"HTTP/") => &rest[..p],
            _ => rest,
        };
        let mut headers = Vec::new();
        while pos < data.len() {
            let end = memchr::memchr(b'\n', &data[pos..])
                .map(|x| pos + x)
                .unwrap_or(data.len());
            let line = &data[pos..end];
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            pos = (end + 1).min(data.len());
            if line.is_empty() {
                break;
            }
            if let Some(c) = memchr::memchr(b':', line) {
                let name = String::from_utf8_lossy(&line[..c]).trim().to_string();
                let mut v = &line[c + 1..];
                while let Some((f, r)) = v.split_first() {
                    if *f == b' ' || *f == b'\t' {
                        v = r;
                    } else {
                        break;
                    }
                }
                headers.push((name, v.to_vec()));
            }
        }
        let body = data[pos.min(data.len())..].to_vec();
        Ok(RawRequest {
            method,
            target: target.to_vec(),
            headers,
            body,
        })
    }

    /// A borrowed view for [`crate::WafEngine::inspect`].
    pub fn view(&self) -> RequestView<'_> {
        RequestView {
            method: &self.method,
            target: &self.target,
            headers: self
                .headers
                .iter()
                .map(|(n, v)| (n.as_str(), v.as_slice()))
                .collect(),
        }
    }

    /// First header value by name.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
    }

    /// The body after transfer and content decoding, bounded by `limits`
    /// ([`Limit::of_decode_error`](crate::Limit::of_decode_error) names the limit an
    /// error hit).
    pub fn decoded_body(
        &self,
        limits: moat_core::DecodeLimits,
    ) -> Result<Vec<u8>, moat_core::DecodeError> {
        let mut body = self.body.clone();
        if self.header("transfer-encoding").is_some_and(|v| {
            String::from_utf8_lossy(v)
                .to_ascii_lowercase()
                .contains("chunked")
        }) {
            body = dechunk(&body);
        }
        match self.header("content-encoding") {
            Some(enc) => {
                let enc = String::from_utf8_lossy(enc).into_owned();
                moat_core::body::decode(&enc, &body, limits)
            }
            None => Ok(body),
        }
    }

    /// A body view over `data` with `truncated` false.
    pub fn body_view(data: &[u8]) -> BodyView<'_> {
        BodyView {
            data,
            truncated: false,
        }
    }
}

fn dechunk(b: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(b.len());
    let mut pos = 0;
    while pos < b.len() {
        let end = match memchr::memchr(b'\n', &b[pos..]) {
            Some(x) => pos + x,
            None => break,
        };
        let line = String::from_utf8_lossy(&b[pos..end]);
        let size_s = line.trim().split(';').next().unwrap_or("").to_string();
        let Ok(size) = usize::from_str_radix(size_s.trim(), 16) else {
            return b.to_vec();
        };
        pos = end + 1;
        if size == 0 {
            break;
        }
        let e = (pos + size).min(b.len());
        out.extend_from_slice(&b[pos..e]);
        pos = e;
        while pos < b.len() && (b[pos] == b'\r' || b[pos] == b'\n') {
            pos += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_with_comments_and_lf() {
        let r = RawRequest::parse(b"# x\n\nGET /a?b=1 HTTP/1.1\nHost: h\nX: y\n\nbody").unwrap();
        assert_eq!(r.method, "GET");
        assert_eq!(r.target, b"/a?b=1");
        assert_eq!(r.headers.len(), 2);
        assert_eq!(r.body, b"body");
        assert!(RawRequest::parse(b"").is_err());
        assert_eq!(dechunk(b"3\r\nabc\r\n0\r\n\r\n"), b"abc");
    }
}
