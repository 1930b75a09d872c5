//! A TCP connection, plain or under TLS, as one type: moat's HTTP/1.1 server, its
//! upstream client and the benchmark's load generator read and write through it with
//! static dispatch.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// Plain TCP, or a TLS stream over TCP (`T`: the client or the server side of
/// tokio-rustls). The TLS state is boxed: it is large and this enum is moved around.
#[derive(Debug)]
pub enum MaybeTls<T> {
    /// Plaintext.
    Plain(TcpStream),
    /// TLS.
    Tls(Box<T>),
}

impl<T: AsyncRead + Unpin> AsyncRead for MaybeTls<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(t) => Pin::new(t).poll_read(cx, buf),
            MaybeTls::Tls(t) => Pin::new(t.as_mut()).poll_read(cx, buf),
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for MaybeTls<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            MaybeTls::Plain(t) => Pin::new(t).poll_write(cx, buf),
            MaybeTls::Tls(t) => Pin::new(t.as_mut()).poll_write(cx, buf),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(t) => Pin::new(t).poll_flush(cx),
            MaybeTls::Tls(t) => Pin::new(t.as_mut()).poll_flush(cx),
        }
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            MaybeTls::Plain(t) => Pin::new(t).poll_shutdown(cx),
            MaybeTls::Tls(t) => Pin::new(t.as_mut()).poll_shutdown(cx),
        }
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            MaybeTls::Plain(t) => Pin::new(t).poll_write_vectored(cx, bufs),
            MaybeTls::Tls(t) => Pin::new(t.as_mut()).poll_write_vectored(cx, bufs),
        }
    }
    fn is_write_vectored(&self) -> bool {
        match self {
            MaybeTls::Plain(t) => t.is_write_vectored(),
            MaybeTls::Tls(t) => t.is_write_vectored(),
        }
    }
}
