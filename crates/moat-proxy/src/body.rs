//! The body type moat sends in both directions, without boxing.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Body as _, Frame, SizeHint};
use hyper::body::Incoming;

/// Boxed error used by [`ProxyBody`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The request body exceeded the route's limit while streaming.
#[derive(Debug)]
pub struct BodyTooLarge;

impl std::fmt::Display for BodyTooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("request body exceeds the route limit")
    }
}
impl std::error::Error for BodyTooLarge {}

/// A body forwarded by moat.
#[derive(Debug)]
pub enum ProxyBody {
    /// No body.
    Empty,
    /// A complete body in memory (moat's own replies, buffered and rewritten bodies).
    Full(Option<Bytes>),
    /// A body streamed from the peer.
    Stream(Incoming),
    /// An upstream response body; its connection goes back to the pool at the end.
    Upstream(Incoming, Option<crate::upstream::PoolReturn>),
    /// A buffered prefix followed by the rest of the body (limit policy `forward`,
    /// or a phase that inspected only a prefix).
    Prefixed(Option<Bytes>, Box<ProxyBody>),
    /// A stream that fails once more than `remaining` bytes pass (limit policy `reject`,
    /// length unknown in advance). `tripped` is set when it fails.
    Limited {
        /// The stream.
        inner: Incoming,
        /// Bytes still allowed.
        remaining: u64,
        /// Set when the limit was exceeded.
        tripped: Arc<AtomicBool>,
    },
}

impl ProxyBody {
    /// A complete body.
    pub fn full(b: impl Into<Bytes>) -> Self {
        let b = b.into();
        if b.is_empty() {
            ProxyBody::Empty
        } else {
            ProxyBody::Full(Some(b))
        }
    }
}

fn poll_incoming(
    inc: &mut Incoming,
    cx: &mut Context<'_>,
) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
    match Pin::new(inc).poll_frame(cx) {
        Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(Box::new(e)))),
        Poll::Ready(Some(Ok(f))) => Poll::Ready(Some(Ok(f))),
        Poll::Ready(None) => Poll::Ready(None),
        Poll::Pending => Poll::Pending,
    }
}

impl http_body::Body for ProxyBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            ProxyBody::Empty => Poll::Ready(None),
            ProxyBody::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            ProxyBody::Stream(inc) => poll_incoming(inc, cx),
            ProxyBody::Upstream(inc, ret) => {
                let r = poll_incoming(inc, cx);
                // Hyper stops polling once `is_end_stream` is true, so release as soon as
                // the last frame is out, not only on the final `None`.
                let done = match &r {
                    Poll::Ready(None) => true,
                    Poll::Ready(Some(Ok(_))) => inc.is_end_stream(),
                    _ => false,
                };
                if done {
                    if let Some(ret) = ret.take() {
                        ret.release();
                    }
                }
                r
            }
            ProxyBody::Prefixed(prefix, rest) => match prefix.take() {
                Some(p) if !p.is_empty() => Poll::Ready(Some(Ok(Frame::data(p)))),
                _ => Pin::new(rest.as_mut()).poll_frame(cx),
            },
            ProxyBody::Limited {
                inner,
                remaining,
                tripped,
            } => match poll_incoming(inner, cx) {
                Poll::Ready(Some(Ok(f))) => {
                    if let Some(d) = f.data_ref() {
                        let n = d.len() as u64;
                        if n > *remaining {
                            tripped.store(true, Ordering::Release);
                            return Poll::Ready(Some(Err(Box::new(BodyTooLarge))));
                        }
                        *remaining -= n;
                    }
                    Poll::Ready(Some(Ok(f)))
                }
                other => other,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ProxyBody::Empty => true,
            ProxyBody::Full(b) => b.is_none(),
            ProxyBody::Stream(i) | ProxyBody::Upstream(i, _) => i.is_end_stream(),
            ProxyBody::Prefixed(p, i) => p.is_none() && i.is_end_stream(),
            ProxyBody::Limited { inner, .. } => inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ProxyBody::Empty => SizeHint::with_exact(0),
            ProxyBody::Full(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            ProxyBody::Stream(i) | ProxyBody::Upstream(i, _) => i.size_hint(),
            ProxyBody::Prefixed(p, i) => {
                let extra = p.as_ref().map_or(0, |b| b.len() as u64);
                let h = i.size_hint();
                let mut out = SizeHint::new();
                out.set_lower(h.lower() + extra);
                if let Some(u) = h.upper() {
                    out.set_upper(u + extra);
                }
                out
            }
            ProxyBody::Limited { inner, .. } => inner.size_hint(),
        }
    }
}

/// Result of [`read_prefix`].
pub struct Buffered {
    /// The bytes read (at most `limit`).
    pub data: Bytes,
    /// True when the body continues beyond `data`.
    pub truncated: bool,
    /// Bytes read past the limit in the last frame (forwarded before the remaining stream).
    pub overflow: Bytes,
}

/// Reads a body into memory, stopping once more than `limit` bytes arrived.
pub async fn read_prefix(body: &mut Incoming, limit: usize) -> Result<Buffered, hyper::Error> {
    use http_body_util::BodyExt;
    let mut buf = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame?;
        if let Ok(data) = frame.into_data() {
            if buf.len() + data.len() > limit {
                let take = limit - buf.len();
                buf.extend_from_slice(&data[..take]);
                return Ok(Buffered {
                    data: buf.freeze(),
                    truncated: true,
                    overflow: data.slice(take..),
                });
            }
            buf.extend_from_slice(&data);
        }
    }
    Ok(Buffered {
        data: buf.freeze(),
        truncated: false,
        overflow: Bytes::new(),
    })
}
