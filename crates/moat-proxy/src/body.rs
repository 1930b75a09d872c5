//! The body type moat sends in both directions, without boxing.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;

use bytes::{Bytes, BytesMut};
use http_body::{Body as _, Frame, SizeHint};
use hyper::body::Incoming;

pub use crate::h1::BoxError;

/// The request body exceeded the route's limit while streaming.
#[derive(Debug)]
pub struct BodyTooLarge;

impl std::fmt::Display for BodyTooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("request body exceeds the route limit")
    }
}
impl std::error::Error for BodyTooLarge {}

/// The request body did not arrive in time (see [`BodyPace`]).
#[derive(Debug)]
pub struct BodyTimedOut;

impl std::fmt::Display for BodyTimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("request body not received in time")
    }
}
impl std::error::Error for BodyTimedOut {}

/// How fast a request body must arrive: within `timeout`, plus one second for every
/// `min_rate` bytes received (`routes[].body.read_timeout` and `min_rate`). A client
/// that trickles a byte every few seconds is cut once it falls behind; a large upload
/// at any reasonable rate is not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyPace {
    /// Time allowed before any extension.
    pub timeout: Duration,
    /// Bytes per second that earn one more second (0: no extension).
    pub min_rate: u64,
}

/// The deadline of one streamed body. The timer is created on the first read that has
/// to wait, and moved only when it fires (the deadline grows with every byte received,
/// but is checked lazily), so a body that keeps flowing costs no timer updates.
#[derive(Debug)]
pub struct BodyClock {
    pace: BodyPace,
    started: Instant,
    received: u64,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl BodyClock {
    fn deadline(&self) -> Instant {
        let earned = match self.pace.min_rate {
            0 => Duration::ZERO,
            rate => Duration::from_millis(self.received.saturating_mul(1000) / rate),
        };
        self.started + self.pace.timeout + earned
    }

    /// True once the deadline has passed; else the waker is registered with the timer.
    fn poll_expired(&mut self, cx: &mut Context<'_>) -> bool {
        loop {
            let deadline = self.deadline();
            let timer = self
                .timer
                .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
            if std::future::Future::poll(timer.as_mut(), cx).is_pending() {
                return false;
            }
            if Instant::now() >= deadline {
                return true;
            }
            // Bytes arrived since the timer was set: wait for the later deadline.
            timer.as_mut().reset(deadline);
        }
    }
}

/// A request body as the downstream connection delivers it.
#[derive(Debug)]
pub enum RequestBody {
    /// No body.
    Empty,
    /// An HTTP/1.1 body that arrived whole with its head.
    Full(Option<Bytes>),
    /// An HTTP/1.1 body read from the connection as it is polled.
    H1(crate::downstream_conn::H1Body),
    /// An HTTP/2 stream's body.
    H2(Incoming),
    /// A streamed body (`H1` or `H2`) that must arrive at the route's pace.
    Paced(Box<RequestBody>, BodyClock),
}

impl RequestBody {
    /// This body, held to `pace` from now on when it is still to be read from the
    /// connection (a body that arrived with its head is complete already).
    pub fn paced(self, pace: BodyPace) -> RequestBody {
        match self {
            RequestBody::H1(_) | RequestBody::H2(_) if !self.is_end_stream() => RequestBody::Paced(
                Box::new(self),
                BodyClock {
                    pace,
                    started: Instant::now(),
                    received: 0,
                    timer: None,
                },
            ),
            other => other,
        }
    }
}

impl http_body::Body for RequestBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match self.get_mut() {
            RequestBody::Empty => Poll::Ready(None),
            RequestBody::Full(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            RequestBody::H1(b) => Pin::new(b).poll_frame(cx),
            RequestBody::H2(inc) => match Pin::new(inc).poll_frame(cx) {
                Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(Box::new(e)))),
                Poll::Ready(Some(Ok(f))) => Poll::Ready(Some(Ok(f))),
                Poll::Ready(None) => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            },
            RequestBody::Paced(inner, clock) => match Pin::new(&mut **inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    if let Some(d) = frame.data_ref() {
                        clock.received += d.len() as u64;
                    }
                    Poll::Ready(Some(Ok(frame)))
                }
                Poll::Pending if clock.poll_expired(cx) => {
                    Poll::Ready(Some(Err(Box::new(BodyTimedOut))))
                }
                other => other,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            RequestBody::Empty => true,
            RequestBody::Full(b) => b.is_none(),
            RequestBody::H1(b) => b.is_end_stream(),
            RequestBody::H2(b) => b.is_end_stream(),
            RequestBody::Paced(b, _) => b.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            RequestBody::Empty => SizeHint::with_exact(0),
            RequestBody::Full(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            RequestBody::H1(b) => b.size_hint(),
            RequestBody::H2(b) => b.size_hint(),
            RequestBody::Paced(b, _) => b.size_hint(),
        }
    }
}

/// A body forwarded by moat.
#[derive(Debug)]
pub enum ProxyBody {
    /// No body.
    Empty,
    /// A complete body in memory (moat's own replies, buffered and rewritten bodies).
    Full(Option<Bytes>),
    /// A request body streamed from the client.
    Stream(RequestBody),
    /// An upstream response body; its connection goes back to the pool at the end.
    Upstream(crate::upstream_conn::UpstreamBody),
    /// A buffered prefix followed by the rest of the body (limit policy `forward`,
    /// or a phase that inspected only a prefix).
    Prefixed(Option<Bytes>, Box<ProxyBody>),
    /// The trailers of a body whose data was gathered in memory.
    Trailers(Option<Box<http::HeaderMap>>),
    /// A streamed request body whose trailers are dropped: they arrive after the rest
    /// was forwarded, too late for the phases that inspect trailer fields.
    Untrailed(Box<ProxyBody>),
    /// A stream that fails once more than `remaining` bytes pass (limit policy `reject`,
    /// length unknown in advance). `tripped` is set when it fails.
    Limited {
        /// The stream (boxed: this rare variant would otherwise size every body).
        inner: Box<RequestBody>,
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
            ProxyBody::Stream(inc) => Pin::new(inc).poll_frame(cx),
            ProxyBody::Upstream(up) => Pin::new(up).poll_frame(cx),
            ProxyBody::Trailers(t) => Poll::Ready(t.take().map(|t| Ok(Frame::trailers(*t)))),
            ProxyBody::Untrailed(inner) => loop {
                match Pin::new(inner.as_mut()).poll_frame(cx) {
                    Poll::Ready(Some(Ok(f))) if f.is_trailers() => continue,
                    other => break other,
                }
            },
            ProxyBody::Prefixed(prefix, rest) => match prefix.take() {
                Some(p) if !p.is_empty() => Poll::Ready(Some(Ok(Frame::data(p)))),
                _ => Pin::new(rest.as_mut()).poll_frame(cx),
            },
            ProxyBody::Limited {
                inner,
                remaining,
                tripped,
            } => match Pin::new(inner.as_mut()).poll_frame(cx) {
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
            ProxyBody::Trailers(t) => t.is_none(),
            ProxyBody::Untrailed(i) => i.is_end_stream(),
            ProxyBody::Stream(i) => i.is_end_stream(),
            ProxyBody::Upstream(up) => up.is_end_stream(),
            ProxyBody::Prefixed(p, i) => p.is_none() && i.is_end_stream(),
            ProxyBody::Limited { inner, .. } => inner.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ProxyBody::Empty => SizeHint::with_exact(0),
            ProxyBody::Full(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            // Unknown: keeps the response chunked so the trailers can follow.
            ProxyBody::Trailers(_) => SizeHint::default(),
            ProxyBody::Stream(i) => i.size_hint(),
            ProxyBody::Untrailed(i) => i.size_hint(),
            ProxyBody::Upstream(up) => up.size_hint(),
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
    /// The trailers that ended a body read whole.
    pub trailers: Option<Box<http::HeaderMap>>,
    /// True when the body was to be read only if text and its first frame, `data`, is
    /// binary ([`moat_core::starts_binary`]): reading stopped there.
    pub binary: bool,
}

/// Reads a body into memory, stopping once more than `limit` bytes arrived. With
/// `text_only` ([`BodyNeed::BufferText`]), it stops at the first data frame when that
/// frame is binary ([`Buffered::binary`]): an upload goes on streamed from there,
/// without waiting for more than the peer sent. A peer that sends a text body a byte
/// at a time has it read whole.
///
/// [`BodyNeed::BufferText`]: moat_core::BodyNeed::BufferText
pub async fn read_prefix<B>(
    body: &mut B,
    limit: usize,
    text_only: bool,
) -> Result<Buffered, BoxError>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    use http_body_util::BodyExt;
    let mut buf = BytesMut::new();
    let mut trailers = None;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(Into::into)?;
        match frame.into_data() {
            Ok(data) => {
                if text_only && buf.is_empty() && moat_core::starts_binary(&data) {
                    return Ok(Buffered {
                        data,
                        truncated: true,
                        overflow: Bytes::new(),
                        trailers: None,
                        binary: true,
                    });
                }
                if buf.len() + data.len() > limit {
                    let take = limit - buf.len();
                    buf.extend_from_slice(&data[..take]);
                    return Ok(Buffered {
                        data: buf.freeze(),
                        truncated: true,
                        overflow: data.slice(take..),
                        trailers: None,
                        binary: false,
                    });
                }
                buf.extend_from_slice(&data);
            }
            // Trailers end the body.
            Err(frame) => trailers = frame.into_trailers().ok().map(Box::new),
        }
    }
    Ok(Buffered {
        data: buf.freeze(),
        truncated: false,
        overflow: Bytes::new(),
        trailers,
        binary: false,
    })
}

/// Result of [`gather_ready`].
#[derive(Debug, Default)]
pub struct Gathered {
    /// The data frames taken, concatenated (copied only when there were several).
    pub data: Bytes,
    /// True when the body ended: `data` (and `trailers`) is all of it.
    pub complete: bool,
    /// Trailers, when the body carried some.
    pub trailers: Option<Box<http::HeaderMap>>,
}

/// Takes the frames of `body` that are available without waiting for the peer, up to
/// about `max` bytes (a frame that crosses `max` is still taken whole).
///
/// A small upstream response is usually read whole with its head (a chunked one with
/// its last chunk): taking it here lets it leave downstream in one write with its head
/// (a `Content-Length` response) instead of head, data and chunked end in separate
/// writes, and returns its connection to the pool at once.
pub async fn gather_ready<B>(body: &mut B, max: usize) -> Result<Gathered, BoxError>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let mut out = Gathered::default();
    let mut joined: Option<BytesMut> = None;
    loop {
        if body.is_end_stream() {
            out.complete = true;
            break;
        }
        let len = joined.as_ref().map_or(out.data.len(), |j| j.len());
        if len >= max {
            break;
        }
        let polled =
            std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut *body).poll_frame(cx))).await;
        match polled {
            Poll::Ready(None) => {
                out.complete = true;
                break;
            }
            Poll::Ready(Some(frame)) => match frame.map_err(Into::into)?.into_data() {
                Ok(d) => {
                    if let Some(j) = joined.as_mut() {
                        j.extend_from_slice(&d);
                    } else if out.data.is_empty() {
                        out.data = d;
                    } else {
                        let mut j = BytesMut::with_capacity(out.data.len() + d.len());
                        j.extend_from_slice(&out.data);
                        j.extend_from_slice(&d);
                        joined = Some(j);
                    }
                }
                Err(frame) => {
                    // Trailers end the body.
                    out.trailers = frame.into_trailers().ok().map(Box::new);
                    out.complete = true;
                    break;
                }
            },
            Poll::Pending => break,
        }
    }
    if let Some(j) = joined {
        out.data = j.freeze();
    }
    Ok(out)
}

impl Gathered {
    /// The body to forward: the gathered bytes, then (unless complete) `rest`.
    pub fn into_body(self, rest: impl FnOnce() -> ProxyBody) -> ProxyBody {
        if self.complete {
            match self.trailers {
                None => ProxyBody::full(self.data),
                Some(t) => {
                    ProxyBody::Prefixed(Some(self.data), Box::new(ProxyBody::Trailers(Some(t))))
                }
            }
        } else if self.data.is_empty() {
            rest()
        } else {
            ProxyBody::Prefixed(Some(self.data), Box::new(rest()))
        }
    }
}
