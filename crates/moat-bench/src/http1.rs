//! A minimal HTTP/1.1 response reader for the load generator.
//!
//! The client side of a benchmark only needs the status code and where the
//! response ends (Content-Length, chunked, or connection close), so this reader
//! parses just that, skips bodies without copying them out, and keeps leftover
//! bytes for the next response on a keep-alive connection.

use std::io;

use tokio::io::{AsyncRead, AsyncReadExt};

/// Largest response head (status line and headers) accepted.
pub const MAX_HEAD: usize = 64 * 1024;
/// Largest chunk-size line accepted in a chunked body.
const MAX_CHUNK_LINE: usize = 1024;

/// What the head of a response says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    /// Status code.
    pub status: u16,
    /// Length of the head in bytes, including the final CRLFCRLF.
    pub head_len: usize,
    /// How the body is delimited.
    pub body: BodyKind,
    /// The server asked to close the connection.
    pub close: bool,
}

/// How a response body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyKind {
    /// Exactly this many bytes.
    Length(u64),
    /// Chunked transfer coding.
    Chunked,
    /// Until the connection closes.
    UntilClose,
}

/// Parses a response head from `buf`. `Ok(None)` when more bytes are needed.
pub fn parse_head(buf: &[u8], head_request: bool) -> io::Result<Option<Head>> {
    let Some(end) = memchr::memmem::find(buf, b"\r\n\r\n") else {
        if buf.len() > MAX_HEAD {
            return Err(invalid("response head too large"));
        }
        return Ok(None);
    };
    let head_len = end + 4;
    if head_len > MAX_HEAD {
        return Err(invalid("response head too large"));
    }
    let head = &buf[..end];
    let mut lines = head.split(|&b| b == b'\n');
    let status_line = lines.next().unwrap_or_default();
    if !status_line.starts_with(b"HTTP/1.") || status_line.len() < 12 {
        return Err(invalid("malformed status line"));
    }
    let http10 = status_line.starts_with(b"HTTP/1.0");
    let code = &status_line[9..12];
    if !code.iter().all(u8::is_ascii_digit) {
        return Err(invalid("malformed status code"));
    }
    let status = code
        .iter()
        .fold(0u16, |acc, d| acc * 10 + u16::from(d - b'0'));
    let mut length: Option<u64> = None;
    let mut chunked = false;
    let mut close = http10;
    for line in lines {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(colon) = memchr::memchr(b':', line) else {
            return Err(invalid("malformed header line"));
        };
        let (name, value) = (&line[..colon], trim(&line[colon + 1..]));
        if name.eq_ignore_ascii_case(b"content-length") {
            let v = std::str::from_utf8(value)
                .ok()
                .and_then(|s| s.parse::<u64>().ok())
                .ok_or_else(|| invalid("bad content-length"))?;
            length = Some(v);
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            chunked = contains_token(value, b"chunked");
        } else if name.eq_ignore_ascii_case(b"connection") {
            if contains_token(value, b"close") {
                close = true;
            } else if contains_token(value, b"keep-alive") {
                close = false;
            }
        }
    }
    let body = if head_request || status == 204 || status == 304 || (100..200).contains(&status) {
        BodyKind::Length(0)
    } else if chunked {
        BodyKind::Chunked
    } else if let Some(n) = length {
        BodyKind::Length(n)
    } else {
        close = true;
        BodyKind::UntilClose
    };
    Ok(Some(Head {
        status,
        head_len,
        body,
        close,
    }))
}

fn trim(v: &[u8]) -> &[u8] {
    let s = v
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(v.len());
    let e = v
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .map_or(s, |p| p + 1);
    &v[s..e.max(s)]
}

fn contains_token(value: &[u8], token: &[u8]) -> bool {
    value
        .split(|&b| b == b',')
        .any(|t| trim(t).eq_ignore_ascii_case(token))
}

fn invalid(msg: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// Reads responses from a keep-alive connection, reusing one buffer.
#[derive(Debug)]
pub struct ResponseReader {
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl Default for ResponseReader {
    fn default() -> Self {
        Self::new()
    }
}

/// A response that was read completely.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Bytes of head and body.
    pub bytes: u64,
    /// The connection cannot be reused.
    pub close: bool,
}

impl ResponseReader {
    /// A reader with a 64 KiB buffer.
    pub fn new() -> Self {
        ResponseReader {
            buf: vec![0; 64 * 1024],
            start: 0,
            end: 0,
        }
    }

    /// Forgets buffered bytes (after reconnecting).
    pub fn reset(&mut self) {
        self.start = 0;
        self.end = 0;
    }

    async fn fill<S: AsyncRead + Unpin>(&mut self, s: &mut S) -> io::Result<usize> {
        if self.start > 0 && self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        if self.end == self.buf.len() {
            if self.start > 0 {
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            } else {
                return Err(invalid("response head too large"));
            }
        }
        let n = s.read(&mut self.buf[self.end..]).await?;
        self.end += n;
        Ok(n)
    }

    /// Reads one complete response.
    pub async fn read_response<S: AsyncRead + Unpin>(
        &mut self,
        s: &mut S,
        head_request: bool,
    ) -> io::Result<Response> {
        let head = loop {
            if let Some(h) = parse_head(&self.buf[self.start..self.end], head_request)? {
                break h;
            }
            if self.fill(s).await? == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        };
        self.start += head.head_len;
        let mut bytes = head.head_len as u64;
        match head.body {
            BodyKind::Length(n) => {
                bytes += n;
                self.skip(s, n).await?;
            }
            BodyKind::Chunked => bytes += self.skip_chunked(s).await?,
            BodyKind::UntilClose => loop {
                bytes += (self.end - self.start) as u64;
                self.start = self.end;
                if self.fill(s).await? == 0 {
                    break;
                }
            },
        }
        Ok(Response {
            status: head.status,
            bytes,
            close: head.close,
        })
    }

    async fn skip<S: AsyncRead + Unpin>(&mut self, s: &mut S, mut n: u64) -> io::Result<()> {
        loop {
            let avail = (self.end - self.start) as u64;
            if avail >= n {
                self.start += n as usize;
                return Ok(());
            }
            n -= avail;
            self.start = 0;
            self.end = 0;
            if self.fill(s).await? == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        }
    }

    async fn read_line_len<S: AsyncRead + Unpin>(&mut self, s: &mut S) -> io::Result<usize> {
        loop {
            if let Some(p) = memchr::memchr(b'\n', &self.buf[self.start..self.end]) {
                return Ok(p + 1);
            }
            if self.end - self.start > MAX_CHUNK_LINE {
                return Err(invalid("chunk line too long"));
            }
            if self.fill(s).await? == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        }
    }

    async fn skip_chunked<S: AsyncRead + Unpin>(&mut self, s: &mut S) -> io::Result<u64> {
        let mut total = 0u64;
        loop {
            let len = self.read_line_len(s).await?;
            let line = &self.buf[self.start..self.start + len];
            let size = parse_chunk_size(line)?;
            self.start += len;
            total += len as u64;
            if size == 0 {
                // Trailers until an empty line.
                loop {
                    let len = self.read_line_len(s).await?;
                    let empty = len <= 2;
                    self.start += len;
                    total += len as u64;
                    if empty {
                        return Ok(total);
                    }
                }
            }
            self.skip(s, size + 2).await?;
            total += size + 2;
        }
    }
}

fn parse_chunk_size(line: &[u8]) -> io::Result<u64> {
    let hex = line
        .split(|&b| b == b';' || b == b'\r' || b == b'\n')
        .next()
        .unwrap_or_default();
    let hex = trim(hex);
    if hex.is_empty() || hex.len() > 15 {
        return Err(invalid("bad chunk size"));
    }
    let mut v = 0u64;
    for &b in hex {
        let d = (b as char)
            .to_digit(16)
            .ok_or_else(|| invalid("bad chunk size"))?;
        v = v * 16 + u64::from(d);
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_heads() {
        let h = parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", false)
            .unwrap()
            .unwrap();
        assert_eq!(h.status, 200);
        assert_eq!(h.body, BodyKind::Length(5));
        assert!(!h.close);
        assert_eq!(
            parse_head(b"HTTP/1.1 200 OK\r\nContent-", false).unwrap(),
            None
        );
        let h = parse_head(
            b"HTTP/1.1 404 NF\r\ntransfer-encoding: gzip, chunked\r\nConnection: close\r\n\r\n",
            false,
        )
        .unwrap()
        .unwrap();
        assert_eq!((h.status, h.body, h.close), (404, BodyKind::Chunked, true));
        let h = parse_head(b"HTTP/1.0 200 OK\r\n\r\n", false)
            .unwrap()
            .unwrap();
        assert_eq!((h.body, h.close), (BodyKind::UntilClose, true));
        assert!(parse_head(b"HTP/1.1 200 OK\r\n\r\n", false).is_err());
        assert!(parse_head(b"HTTP/1.1 2x0 OK\r\n\r\n", false).is_err());
        assert!(parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", false).is_err());
        assert!(parse_head(&vec![b'a'; MAX_HEAD + 1], false).is_err());
    }

    #[tokio::test]
    async fn reads_pipelined_length_and_chunked_responses() {
        let data: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabcHTTP/1.1 201 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\nabc\r\n0\r\nT: 1\r\n\r\nHTTP/1.1 204 No\r\n\r\n";
        let mut src = data;
        let mut r = ResponseReader::new();
        let a = r.read_response(&mut src, false).await.unwrap();
        assert_eq!((a.status, a.bytes), (200, 41));
        let b = r.read_response(&mut src, false).await.unwrap();
        assert_eq!(b.status, 201);
        let c = r.read_response(&mut src, false).await.unwrap();
        assert_eq!(c.status, 204);
        assert!(r.read_response(&mut src, false).await.is_err());
    }

    #[tokio::test]
    async fn large_body_is_skipped_across_reads() {
        let mut data = b"HTTP/1.1 200 OK\r\nContent-Length: 200000\r\n\r\n".to_vec();
        data.extend(std::iter::repeat_n(b'x', 200_000));
        data.extend_from_slice(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
        let mut src = &data[..];
        let mut r = ResponseReader::new();
        assert_eq!(r.read_response(&mut src, false).await.unwrap().status, 200);
        assert_eq!(r.read_response(&mut src, false).await.unwrap().bytes, 38);
        let mut truncated = &data[..1000];
        let mut r = ResponseReader::new();
        assert!(r.read_response(&mut truncated, false).await.is_err());
    }
}
