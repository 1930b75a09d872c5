//! The downstream connection's I/O as the HTTP/1.1 loop and a request body share it:
//! the byte stream (TCP or TLS), its read buffer, writes watched for progress, and a
//! request body read from the connection as it is polled.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Frame, SizeHint};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::connection::ConnWatch;
use crate::h1::server::CONTINUE;
use crate::h1::{self, BoxError, Decoded, Decoder, ReadError};

/// A downstream byte stream: TCP, or TLS over TCP.
pub(crate) type DownstreamIo = moat_tls::MaybeTls<tokio_rustls::server::TlsStream<TcpStream>>;

/// The connection as the HTTP/1.1 loop and a streaming request body share it: the
/// body owns it while it is read (see [`H1Body`]).
#[derive(Debug)]
pub(crate) struct ConnIo {
    pub(crate) io: DownstreamIo,
    /// Bytes read and not yet consumed (the next request head, pipelined requests).
    pub(crate) rbuf: BytesMut,
    /// Where writes to the client report progress (see `gateway::watchdog`).
    pub(crate) watch: Arc<ConnWatch>,
}

impl ConnIo {
    /// Writes all of `buf` to the client, reporting each write that makes progress: the
    /// connection's watchdog closes a connection whose client stopped reading.
    pub(crate) async fn send(&mut self, mut buf: &[u8]) -> io::Result<()> {
        self.watch.set_sending(true);
        let result = async {
            while !buf.is_empty() {
                let n = self.io.write(buf).await?;
                if n == 0 {
                    return Err(io::ErrorKind::WriteZero.into());
                }
                self.watch.sent();
                buf = &buf[n..];
            }
            Ok(())
        }
        .await;
        self.watch.set_sending(false);
        result
    }

    /// Flushes what TLS holds back, watched like [`ConnIo::send`].
    pub(crate) async fn flush(&mut self) -> io::Result<()> {
        self.watch.set_sending(true);
        let result = self.io.flush().await;
        self.watch.set_sending(false);
        result
    }
}

/// Where a streamed request body gives the connection back when it is dropped, and
/// whether it was read to its end (else the connection cannot carry another request).
#[derive(Debug, Default)]
pub(crate) struct BodyHome(parking_lot::Mutex<Option<(Box<ConnIo>, bool)>>);

impl BodyHome {
    /// The connection the body gave back, and whether it was read to its end.
    pub(crate) fn take(&self) -> Option<(Box<ConnIo>, bool)> {
        self.0.lock().take()
    }
}

/// A request body read from the downstream HTTP/1.1 connection as it is polled (the
/// part of it that was not already read with the head).
#[derive(Debug)]
pub struct H1Body {
    pub(crate) conn: Option<Box<ConnIo>>,
    pub(crate) decoder: Decoder,
    /// Bytes of `100 Continue` still to write before the body is read.
    pub(crate) continue_left: usize,
    /// `100 Continue` was written and still has to be flushed.
    pub(crate) continue_flush: bool,
    pub(crate) home: Arc<BodyHome>,
}

impl Drop for H1Body {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            *self.home.0.lock() = Some((conn, self.decoder.is_done()));
        }
    }
}

impl http_body::Body for H1Body {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let Some(conn) = this.conn.as_mut() else {
            return Poll::Ready(None);
        };
        // The client waits for this before it sends the body.
        while this.continue_left > 0 {
            let from = CONTINUE.len() - this.continue_left;
            match ready!(Pin::new(&mut conn.io).poll_write(cx, &CONTINUE[from..])) {
                Ok(0) => {
                    return Poll::Ready(Some(Err(io::Error::from(io::ErrorKind::WriteZero).into())))
                }
                Ok(n) => this.continue_left -= n,
                Err(e) => return Poll::Ready(Some(Err(e.into()))),
            }
            this.continue_flush = this.continue_left == 0;
        }
        if this.continue_flush {
            if let Err(e) = ready!(Pin::new(&mut conn.io).poll_flush(cx)) {
                return Poll::Ready(Some(Err(e.into())));
            }
            this.continue_flush = false;
        }
        if this.decoder.is_done() {
            return Poll::Ready(None);
        }
        match ready!(h1::poll_body(
            &mut this.decoder,
            &mut conn.rbuf,
            &mut conn.io,
            cx,
            &mut false,
        )) {
            Ok(Decoded::Data(d)) => Poll::Ready(Some(Ok(Frame::data(d)))),
            Ok(Decoded::Trailers(t)) => Poll::Ready(Some(Ok(Frame::trailers(t)))),
            Ok(Decoded::End | Decoded::NeedMore) => Poll::Ready(None),
            Err(ReadError::Framing(e)) => Poll::Ready(Some(Err(Box::new(e)))),
            Err(ReadError::Io(e)) => Poll::Ready(Some(Err(Box::new(e)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.decoder.is_done()
    }

    fn size_hint(&self) -> SizeHint {
        match self.decoder.remaining() {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}
