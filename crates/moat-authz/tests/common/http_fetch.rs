//! A small real [`JwksFetcher`] for the engine's tests: one blocking HTTP/1.1 `GET` over
//! `std::net::TcpStream` (plain `http://` only; the gateway's HTTP(S) client lives in
//! moat-proxy and is tested there). Keeps the contract: status 200 only, the timeout
//! bounds the whole exchange, bodies over `MAX_DOCUMENT_BYTES` are refused.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use moat_authz::{JwksFetcher, MAX_DOCUMENT_BYTES};

/// Largest response head read.
const MAX_HEAD_BYTES: usize = 16 * 1024;

/// Plain-HTTP fetcher over `std::net`.
#[derive(Debug, Default, Clone, Copy)]
pub struct StdHttpFetcher;

impl JwksFetcher for StdHttpFetcher {
    fn fetch(&self, url: &str, timeout: Duration) -> Result<String, String> {
        get(url, timeout).map_err(|e| format!("GET {url}: {e}"))
    }
}

fn get(url: &str, timeout: Duration) -> Result<String, String> {
    let deadline = Instant::now() + timeout;
    let rest = url
        .strip_prefix("http://")
        .ok_or("the test fetcher speaks plain http:// only")?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let addr = authority
        .to_socket_addrs()
        .map_err(|e| format!("resolve: {e}"))?
        .next()
        .ok_or("no address")?;
    let left = || {
        deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or_else(|| format!("timed out after {timeout:?}"))
    };
    let mut s = TcpStream::connect_timeout(&addr, left()?).map_err(|e| format!("connect: {e}"))?;
    s.set_write_timeout(Some(left()?))
        .map_err(|e| e.to_string())?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {authority}\r\nAccept: application/json\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| format!("write: {e}"))?;
    // Read until EOF (Connection: close), never more than the head and the body limit.
    let cap = MAX_HEAD_BYTES + MAX_DOCUMENT_BYTES + 1;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        s.set_read_timeout(Some(left()?))
            .map_err(|e| e.to_string())?;
        let n = s.read(&mut chunk).map_err(|e| format!("read: {e}"))?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
        if buf.len() > cap {
            return Err(format!("response over {cap} bytes"));
        }
    }
    let end = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .filter(|&i| i <= MAX_HEAD_BYTES)
        .ok_or("no complete response head")?;
    let head = std::str::from_utf8(&buf[..end]).map_err(|_| "response head is not UTF-8")?;
    let status = head
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .ok_or("no status line")?;
    if status != "200" {
        return Err(format!("status {status}"));
    }
    let body = &buf[end + 4..];
    if body.len() > MAX_DOCUMENT_BYTES {
        return Err(format!("body over {MAX_DOCUMENT_BYTES} bytes"));
    }
    // The body runs to EOF; a length, if given, must match (no chunked coding here).
    for line in head.lines().skip(1) {
        let (name, value) = line.split_once(':').ok_or("malformed header line")?;
        if name.eq_ignore_ascii_case("transfer-encoding") {
            return Err("transfer-encoding is not supported by the test fetcher".into());
        }
        if name.eq_ignore_ascii_case("content-length")
            && value.trim().parse::<usize>().ok() != Some(body.len())
        {
            return Err("body length differs from content-length".into());
        }
    }
    String::from_utf8(body.to_vec()).map_err(|_| "body is not UTF-8".into())
}
