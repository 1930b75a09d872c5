//! Client connections shared by the syslog and HTTP sinks: TCP, optionally TLS.

use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::RootCertStore;
use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use crate::config::ClientTlsConfig;
use crate::SinkError;

/// Builds the rustls client configuration: the CA file's certificates, or the Mozilla roots.
pub fn client_config(
    tls: &ClientTlsConfig,
    base_dir: &Path,
) -> Result<Arc<rustls::ClientConfig>, SinkError> {
    let mut roots = RootCertStore::empty();
    match &tls.ca_file {
        Some(f) => {
            let path = base_dir.join(f);
            let io = |e: std::io::Error| SinkError::Tls(format!("{}: {e}", path.display()));
            let pem = std::fs::read(&path).map_err(io)?;
            let mut n = 0;
            for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
                roots
                    .add(cert.map_err(io)?)
                    .map_err(|e| SinkError::Tls(format!("{}: {e}", path.display())))?;
                n += 1;
            }
            if n == 0 {
                return Err(SinkError::Tls(format!(
                    "{}: no PEM certificate",
                    path.display()
                )));
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| SinkError::Tls(e.to_string()))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(Arc::new(cfg))
}

/// Where a stream sink connects: address, and TLS when configured.
#[derive(Clone)]
pub(crate) struct Endpoint {
    pub(crate) address: String,
    pub(crate) tls: Option<(TlsConnector, ServerName<'static>)>,
}

impl Endpoint {
    /// `address` is `host:port`; `tls` the client configuration and the name to verify
    /// (the host of `address` when `server_name` is `None`).
    pub(crate) fn new(
        address: &str,
        tls: Option<(Arc<rustls::ClientConfig>, Option<&str>)>,
    ) -> Result<Endpoint, SinkError> {
        let tls = match tls {
            None => None,
            Some((cfg, name)) => {
                let host = name
                    .or_else(|| crate::config::split_host_port(address).map(|(h, _)| h))
                    .unwrap_or_default();
                let name = ServerName::try_from(host.to_string())
                    .map_err(|e| SinkError::Tls(format!("server name `{host}`: {e}")))?;
                Some((TlsConnector::from(cfg), name))
            }
        };
        Ok(Endpoint {
            address: address.to_string(),
            tls,
        })
    }

    pub(crate) async fn connect(&self) -> std::io::Result<Conn> {
        let tcp = TcpStream::connect(&self.address).await?;
        tcp.set_nodelay(true)?;
        match &self.tls {
            None => Ok(Conn::Plain(tcp)),
            Some((connector, name)) => Ok(Conn::Tls(Box::new(
                connector.connect(name.clone(), tcp).await?,
            ))),
        }
    }
}

/// A connected stream.
pub(crate) enum Conn {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_flush(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
