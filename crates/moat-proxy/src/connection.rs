//! One downstream connection's lifecycle: the data its requests share, the watchdog
//! that closes idle, slow and stalled connections, and the drain signal of a graceful
//! shutdown.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use moat_core::{Connection, TlsSession};
use tokio::sync::watch;

/// Per-connection data shared by its requests.
pub(crate) struct ConnInfo {
    pub(crate) conn: Arc<Connection>,
    pub(crate) xff_hops: u32,
    /// The listener's `headers_with_underscores`.
    pub(crate) underscores: crate::config::UnderscoreHeaders,
    /// The peer IP formatted once, for `X-Forwarded-For`.
    pub(crate) xff: http::HeaderValue,
    /// Progress counters read by the connection's [`watchdog`].
    pub(crate) watch: Arc<ConnWatch>,
}

/// Progress of one downstream connection, read by its [`watchdog`].
#[derive(Debug, Default)]
pub(crate) struct ConnWatch {
    /// Requests whose head was read.
    heads: AtomicU64,
    /// An exchange is in progress: from the request head until the response body is
    /// written.
    active: AtomicBool,
    /// Set on the first HTTP/2 request: the watchdog is for HTTP/1 only.
    h2: AtomicBool,
    /// A write to the client is waiting for it to read.
    sending: AtomicBool,
    /// Writes to the client that made progress.
    sends: AtomicU64,
}

impl ConnWatch {
    /// Marks the start and the end of a write to the client. Like the other counters,
    /// written only by the connection's own task: plain stores.
    pub(crate) fn set_sending(&self, on: bool) {
        self.sending.store(on, Ordering::Relaxed);
    }

    /// Counts a write to the client that made progress.
    pub(crate) fn sent(&self) {
        self.sends
            .store(self.sends.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }
}

/// Check period of the connection watchdog that replaces hyper's per-request
/// header-read timer (which allocates and arms a timer for every request).
const WATCH_TICK: Duration = Duration::from_secs(10);
/// An HTTP/1 connection with nothing in flight that completes no request head for this
/// many ticks in a row (30 to 40 s) is closed: idle keep-alive and slow-head clients.
/// So is one whose write to the client makes no progress for as many ticks: a client
/// that stopped reading its response.
const WATCH_IDLE_TICKS: u32 = 3;
/// While the gateway drains, how often a connection with an exchange in flight is
/// checked again.
const DRAIN_CHECK: Duration = Duration::from_millis(50);

impl ConnInfo {
    /// Marks the start of an HTTP/1 exchange (its request head was read).
    ///
    /// Only the connection's own task writes these counters, one exchange at a time, so
    /// a plain load and store is enough: no atomic read-modify-write per request.
    pub(crate) fn h1_exchange_started(&self) {
        let w = &self.watch;
        w.heads
            .store(w.heads.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        w.active.store(true, Ordering::Relaxed);
    }

    /// Marks the end of an HTTP/1 exchange (its response was written, or failed).
    pub(crate) fn h1_exchange_ended(&self) {
        self.watch.active.store(false, Ordering::Relaxed);
    }

    /// What the connection's watchdog reads.
    pub(crate) fn watch(&self) -> &Arc<ConnWatch> {
        &self.watch
    }

    /// Marks the connection as HTTP/2, which the watchdog leaves to hyper.
    pub(crate) fn h2_exchange(&self) {
        if !self.watch.h2.load(Ordering::Relaxed) {
            self.watch.h2.store(true, Ordering::Relaxed);
        }
    }
}

/// Returns when an HTTP/1 connection has completed no request head for
/// [`WATCH_IDLE_TICKS`] ticks in a row while nothing was in flight (idle keep-alive
/// connections, clients that send their head or their TLS handshake too slowly), when a
/// write to the client made no progress for as many ticks (a client that stopped
/// reading; waiting for the upstream's next bytes does not count), or once the gateway
/// drains and nothing is in flight; the caller then drops the
/// connection (an exchange in flight finishes first and its response says
/// `connection: close`). Never returns for HTTP/2 connections, which hyper's keep-alive
/// pings watch and which drain with a GOAWAY.
///
/// It is polled inside the connection's own task, so its one timer goes away with the
/// connection: as a task of its own it outlived every connection by up to a tick and
/// held the finished connection's task memory (several KiB) through its abort handle,
/// which grew RSS by gigabytes under a load of short connections. Watching the drain
/// signal here, once per tick, keeps that off the per-request path.
pub(crate) async fn watchdog(watch: Arc<ConnWatch>, mut drain: watch::Receiver<bool>) {
    let mut last_heads = 0;
    let mut idle_ticks = 0;
    let mut last_sends = 0;
    let mut stalled_ticks = 0;
    let mut draining = false;
    loop {
        if draining {
            tokio::time::sleep(DRAIN_CHECK).await;
        } else {
            tokio::select! {
                () = tokio::time::sleep(WATCH_TICK) => {}
                _ = drain.wait_for(|d| *d) => draining = true,
            }
        }
        if watch.h2.load(Ordering::Relaxed) {
            return std::future::pending().await;
        }
        let idle = !watch.active.load(Ordering::Relaxed);
        if draining {
            if idle {
                return;
            }
            continue;
        }
        let sends = watch.sends.load(Ordering::Relaxed);
        if watch.sending.load(Ordering::Relaxed) && sends == last_sends {
            stalled_ticks += 1;
            if stalled_ticks >= WATCH_IDLE_TICKS {
                tracing::debug!("closing a connection whose client stopped reading");
                return;
            }
        } else {
            stalled_ticks = 0;
            last_sends = sends;
        }
        let heads = watch.heads.load(Ordering::Relaxed);
        if heads == last_heads && idle {
            idle_ticks += 1;
            if idle_ticks >= WATCH_IDLE_TICKS {
                return;
            }
        } else {
            idle_ticks = 0;
            last_heads = heads;
        }
    }
}

/// A future polled only when its own waker fired (and on its first poll).
///
/// The connection's watchdog shares its task with the connection, which is woken
/// several times per request (reads, writes, the upstream); polling the watchdog each
/// time re-registers its timer and takes the lock of the drain signal's waiter list.
/// Wrapped, it costs a flag check on those polls.
pub(crate) struct OnOwnWake<F> {
    inner: std::pin::Pin<Box<F>>,
    wake: Arc<OwnWake>,
    /// The task waker last registered in `wake.task` (compared, not re-registered).
    registered: Option<std::task::Waker>,
}

#[derive(Default)]
struct OwnWake {
    woken: AtomicBool,
    task: futures_util::task::AtomicWaker,
}

impl std::task::Wake for OwnWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.task.wake();
    }
}

impl<F: std::future::Future> OnOwnWake<F> {
    pub(crate) fn new(inner: F) -> Self {
        let wake = Arc::new(OwnWake::default());
        wake.woken.store(true, Ordering::Relaxed);
        OnOwnWake {
            inner: Box::pin(inner),
            wake,
            registered: None,
        }
    }
}

impl<F: std::future::Future> std::future::Future for OnOwnWake<F> {
    type Output = F::Output;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        let this = self.get_mut();
        if !this
            .registered
            .as_ref()
            .is_some_and(|w| w.will_wake(cx.waker()))
        {
            this.wake.task.register(cx.waker());
            this.registered = Some(cx.waker().clone());
        }
        if !this.wake.woken.swap(false, Ordering::AcqRel) {
            return std::task::Poll::Pending;
        }
        // The wake-up that set the flag took the task's waker out of `wake.task`: put it
        // back before the inner future arms anything that wakes it again, or that
        // wake-up would be lost (an idle connection's watchdog never fired twice).
        this.wake.task.register(cx.waker());
        let waker = std::task::Waker::from(this.wake.clone());
        this.inner
            .as_mut()
            .poll(&mut std::task::Context::from_waker(&waker))
    }
}

/// The data of a new connection from `peer` to `local`.
pub(crate) fn conn_info(
    peer: SocketAddr,
    local: SocketAddr,
    tls: Option<TlsSession>,
    (xff_hops, underscores): (u32, crate::config::UnderscoreHeaders),
    watch: Arc<ConnWatch>,
) -> Arc<ConnInfo> {
    let xff = http::HeaderValue::from_maybe_shared(bytes::Bytes::from(peer.ip().to_string()))
        .unwrap_or_else(|_| http::HeaderValue::from_static("unknown"));
    Arc::new(ConnInfo {
        xff,
        watch,
        conn: Arc::new(Connection {
            remote_addr: peer,
            local_addr: local,
            tls,
        }),
        xff_hops,
        underscores,
    })
}

/// Signals draining to connections; [`Drain::wait`] returns once all of them ended.
#[derive(Debug)]
pub(crate) struct Drain(watch::Sender<bool>);

impl Drain {
    pub(crate) fn new() -> Self {
        Drain(watch::channel(false).0)
    }

    /// What a connection watches.
    pub(crate) fn watcher(&self) -> watch::Receiver<bool> {
        self.0.subscribe()
    }

    /// Tells every connection to finish its exchange in flight and close, then
    /// waits until they all did.
    pub(crate) async fn wait(&self) {
        self.0.send_replace(true);
        self.0.closed().await;
    }
}
