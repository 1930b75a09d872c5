//! Connections to an external authorizer: TCP, then TLS when the provider has a `tls`
//! section (moat's upstream TLS client, [`UpstreamConnector`]). One connector serves
//! both clients: hyper's pooled HTTP client takes it as a `Service<Uri>`, the gRPC
//! client (`super::grpc`) calls [`Connector::open`].

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::Uri;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;
use moat_tls::UpstreamConnector;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_util::either::Either;

/// Opens connections to one provider.
#[derive(Clone)]
pub(super) struct Connector {
    /// `None`: plain TCP.
    pub(super) tls: Option<Arc<UpstreamConnector>>,
}

/// A connection to a provider, plain or TLS, as tokio's I/O traits see it.
pub(super) type Stream = Either<TcpStream, TlsStream<TcpStream>>;

/// A connection to a provider, as hyper's I/O traits see it.
pub(super) struct Conn(TokioIo<Stream>);

impl Connector {
    /// Connects to `host:port` (an IPv6 address may be in brackets), then TLS when
    /// configured.
    pub(super) async fn open(&self, host: &str, port: u16) -> io::Result<Stream> {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let tcp = TcpStream::connect((host, port)).await?;
        // Checks are small request/response exchanges: no Nagle delay.
        tcp.set_nodelay(true)?;
        Ok(match &self.tls {
            None => Either::Left(tcp),
            Some(t) => {
                let (stream, _) = t.connect(tcp, host).await.map_err(io::Error::other)?;
                Either::Right(stream)
            }
        })
    }
}

impl tower_service::Service<Uri> for Connector {
    type Response = Conn;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Conn>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let host = uri
                .host()
                .ok_or_else(|| io::Error::other("provider URI without a host"))?;
            let port = uri
                .port_u16()
                .unwrap_or(if uri.scheme_str() == Some("https") {
                    443
                } else {
                    80
                });
            Ok(Conn(TokioIo::new(this.open(host, port).await?)))
        })
    }
}

impl hyper::rt::Read for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write_vectored(cx, bufs)
    }
}

impl Connection for Conn {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}
