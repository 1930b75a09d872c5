//! What every sink shares: the bounded buffer between the event writer and the
//! network, and the delivery loop (batching, retries with backoff, shutdown).
//!
//! ```text
//! event writer thread --offer()--> Outbox (bounded: records and bytes; full: drop, count)
//!                                     |
//!                     sink thread (current-thread tokio runtime)
//!                     take a batch -> Transport::send -> retry with backoff until it goes
//! ```
//!
//! The writer thread encodes each record once (the sink's mapping) and appends
//! it under one short lock per batch; it never waits for the network. A batch
//! that fails is retried, doubling the wait from `retry_backoff` up to
//! `retry_backoff_max`, until it is delivered: records keep their order, and
//! while the destination is down new records fill the buffer and, once it is
//! full, are dropped and counted. When the destination returns, delivery
//! resumes with the oldest buffered record.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use moat_events::Record;
use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::config::{BufferConfig, BufferDefaults, Format, RecordKind};
use crate::format::Entry;
use crate::SinkError;

/// Syslog severity of a record (RFC 5424 numbering), also used by other mappings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    /// 4: a blocked request or connection.
    Warning = 4,
    /// 5: a finding that did not block (monitor, redact, bypass).
    Notice = 5,
    /// 6: activity (access, TLS, allowed connections).
    Info = 6,
}

/// One encoded record waiting for delivery.
#[derive(Debug, Clone)]
pub struct Message {
    /// The kind of record.
    pub kind: RecordKind,
    /// Time of the record, unix milliseconds.
    pub ts_ms: u64,
    /// Severity for syslog.
    pub severity: Severity,
    /// The Kafka key, when the sink keys records and the record has the field.
    pub key: Option<Box<str>>,
    /// The JSON object (no newline).
    pub body: Vec<u8>,
}

impl Message {
    /// Bytes the message holds, for the buffer's byte bound.
    fn cost(&self) -> usize {
        self.body.len() + self.key.as_ref().map_or(0, |k| k.len()) + 64
    }
}

/// Per-sink counters, rendered on `/metrics`.
#[derive(Debug, Default)]
pub struct SinkStats {
    /// Records in the buffer now.
    pub depth: AtomicUsize,
    /// Encoded bytes in the buffer now.
    pub bytes: AtomicUsize,
    /// Records refused because the buffer was full (or given up at shutdown).
    pub dropped: AtomicU64,
    /// Records delivered.
    pub delivered: AtomicU64,
    /// Records the destination refused for good (an HTTP 4xx, a record too large).
    pub rejected: AtomicU64,
    /// Failed delivery attempts (each retried).
    pub send_errors: AtomicU64,
    /// Records that could not be encoded.
    pub encode_errors: AtomicU64,
    /// 1 while the last delivery attempt failed, 0 once one succeeds.
    pub down: AtomicBool,
}

/// Why a delivery attempt failed.
#[derive(Debug)]
pub enum SendError {
    /// Worth retrying: connection refused or lost, timeout, 5xx, 429.
    Retry(String),
    /// The destination refused the batch for good: retrying would not help.
    Reject(String),
}

/// A destination: delivers batches in order. Called only from the sink's own thread.
pub(crate) trait Transport: Send + 'static {
    /// Delivers `batch`. On error, the transport may have delivered and removed
    /// a part of it already (Kafka, per partition); what is left is retried.
    async fn send(&mut self, batch: &mut Vec<Message>) -> Result<(), SendError>;

    /// The sink is stopping: ends its connection cleanly (a TLS `close_notify`).
    async fn close(&mut self) {}
}

/// The state shared by the producer side and the sink thread.
pub(crate) struct Outbox {
    queue: Mutex<VecDeque<Message>>,
    notify: Notify,
    closing: AtomicBool,
    pub(crate) stats: Arc<SinkStats>,
    max_records: usize,
    max_bytes: usize,
    batch_max: usize,
}

impl Outbox {
    pub(crate) fn new<D: BufferDefaults>(cfg: &BufferConfig<D>) -> Arc<Outbox> {
        Arc::new(Outbox {
            queue: Mutex::new(VecDeque::new()),
            notify: Notify::new(),
            closing: AtomicBool::new(false),
            stats: Arc::new(SinkStats::default()),
            max_records: cfg.max_records,
            max_bytes: usize::try_from(cfg.max_bytes).unwrap_or(usize::MAX),
            batch_max: cfg.batch_max,
        })
    }

    /// Appends messages that fit, drops (and counts) the others; returns how many were dropped.
    ///
    /// Wakes the sink thread only when it has something new to do: the queue was empty
    /// (the thread waits for a first record) or now holds a full batch (a lingering
    /// thread sends it early). The thread drains the queue before it waits again, so no
    /// other push needs a wake-up, which saves a system call per push at high rates.
    pub(crate) fn push(&self, msgs: impl Iterator<Item = Message>) -> u64 {
        let mut dropped = 0;
        let mut pushed = 0;
        let mut q = self.queue.lock();
        let before = q.len();
        let mut bytes = self.stats.bytes.load(Ordering::Relaxed);
        for m in msgs {
            let cost = m.cost();
            if q.len() >= self.max_records || bytes + cost > self.max_bytes {
                dropped += 1;
                continue;
            }
            bytes += cost;
            q.push_back(m);
            pushed += 1;
        }
        let after = q.len();
        self.stats.depth.store(after, Ordering::Relaxed);
        self.stats.bytes.store(bytes, Ordering::Relaxed);
        drop(q);
        if dropped > 0 {
            self.stats.dropped.fetch_add(dropped, Ordering::Relaxed);
        }
        if pushed > 0 && (before == 0 || (before < self.batch_max && after >= self.batch_max)) {
            self.notify.notify_one();
        }
        dropped
    }

    /// Records waiting.
    fn len(&self) -> usize {
        self.queue.lock().len()
    }

    /// Waits, at most `linger`, until a full batch is waiting or the outbox is closing.
    async fn linger(&self, linger: Duration) {
        let until = tokio::time::Instant::now() + linger;
        // A wake-up may be stale (a permit left by an earlier push): check again.
        while !self.is_closing() && self.len() < self.batch_max {
            if tokio::time::timeout_at(until, self.notify.notified())
                .await
                .is_err()
            {
                return;
            }
        }
    }

    /// Moves up to `max` messages into `batch`.
    fn take(&self, batch: &mut Vec<Message>, max: usize) {
        let mut q = self.queue.lock();
        let n = q.len().min(max);
        let mut freed = 0;
        for m in q.drain(..n) {
            freed += m.cost();
            batch.push(m);
        }
        self.stats.depth.store(q.len(), Ordering::Relaxed);
        self.stats.bytes.fetch_sub(freed, Ordering::Relaxed);
    }

    /// Asks the sink thread to deliver what is left and stop.
    pub(crate) fn close(&self) {
        self.closing.store(true, Ordering::Release);
        self.notify.notify_one();
    }

    fn is_closing(&self) -> bool {
        self.closing.load(Ordering::Acquire)
    }

    /// Counts everything still buffered as dropped (shutdown deadline passed).
    fn abandon(&self) -> u64 {
        let mut q = self.queue.lock();
        let n = q.len() as u64;
        q.clear();
        self.stats.depth.store(0, Ordering::Relaxed);
        self.stats.bytes.store(0, Ordering::Relaxed);
        self.stats.dropped.fetch_add(n, Ordering::Relaxed);
        n
    }
}

/// Logs at most one warning per 10 seconds per sink.
pub(crate) struct Warner {
    name: String,
    last: Option<Instant>,
    suppressed: u64,
}

impl Warner {
    pub(crate) fn new(name: &str) -> Self {
        Warner {
            name: name.to_string(),
            last: None,
            suppressed: 0,
        }
    }

    pub(crate) fn warn(&mut self, msg: &str) {
        if self
            .last
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(10))
        {
            tracing::warn!(
                sink = %self.name,
                suppressed = self.suppressed,
                "event sink: {msg}"
            );
            self.last = Some(Instant::now());
            self.suppressed = 0;
        } else {
            self.suppressed += 1;
        }
    }
}

/// The delivery loop of one sink; returns when the outbox is closed and empty,
/// or when the shutdown deadline has passed.
pub(crate) async fn deliver<T: Transport, D: BufferDefaults>(
    outbox: Arc<Outbox>,
    mut transport: T,
    cfg: BufferConfig<D>,
    name: String,
) {
    let stats = outbox.stats.clone();
    let mut warner = Warner::new(&name);
    let mut batch: Vec<Message> = Vec::with_capacity(cfg.batch_max.min(4096));
    let mut deadline: Option<Instant> = None;
    loop {
        if deadline.is_none() && outbox.is_closing() {
            deadline = Some(Instant::now() + cfg.shutdown_timeout);
        }
        if deadline.is_none() && !cfg.linger.is_zero() && outbox.len() > 0 {
            // Let the batch fill: the oldest record waits at most `linger`.
            outbox.linger(cfg.linger).await;
        }
        outbox.take(&mut batch, cfg.batch_max);
        if batch.is_empty() {
            if deadline.is_some() {
                transport.close().await;
                return;
            }
            // A notify_one without a waiter leaves a permit: no wake-up is lost.
            outbox.notify.notified().await;
            continue;
        }
        let mut backoff = cfg.retry_backoff;
        while !batch.is_empty() {
            let before = batch.len();
            let res = match tokio::time::timeout(cfg.timeout, transport.send(&mut batch)).await {
                Ok(r) => r,
                Err(_) => Err(SendError::Retry(format!(
                    "no answer within {}",
                    humantime::format_duration(cfg.timeout)
                ))),
            };
            let sent = if res.is_ok() {
                before
            } else {
                before - batch.len()
            };
            stats.delivered.fetch_add(sent as u64, Ordering::Relaxed);
            match res {
                Ok(()) => {
                    batch.clear();
                    if stats.down.swap(false, Ordering::Relaxed) {
                        tracing::info!(sink = %name, "event sink: delivering again");
                    }
                }
                Err(SendError::Reject(e)) => {
                    stats
                        .rejected
                        .fetch_add(batch.len() as u64, Ordering::Relaxed);
                    batch.clear();
                    warner.warn(&format!("records refused: {e}"));
                }
                Err(SendError::Retry(e)) => {
                    stats.send_errors.fetch_add(1, Ordering::Relaxed);
                    stats.down.store(true, Ordering::Relaxed);
                    warner.warn(&format!(
                        "delivery failed, retrying in {}: {e}",
                        humantime::format_duration(backoff)
                    ));
                    if deadline.is_none() && outbox.is_closing() {
                        deadline = Some(Instant::now() + cfg.shutdown_timeout);
                    }
                    if deadline.is_some_and(|d| Instant::now() + backoff > d) {
                        let n = batch.len() as u64 + outbox.abandon();
                        stats
                            .dropped
                            .fetch_add(batch.len() as u64, Ordering::Relaxed);
                        batch.clear();
                        tracing::warn!(sink = %name, records = n, "event sink: shutdown deadline passed, records dropped");
                        return;
                    }
                    // Closing wakes the wait early, to set the deadline.
                    let _ = tokio::time::timeout(backoff, outbox.notify.notified()).await;
                    backoff = (backoff * 2).min(cfg.retry_backoff_max);
                }
            }
        }
    }
}

/// Starts a sink's thread: a current-thread tokio runtime running its delivery loop.
pub(crate) fn spawn<T: Transport, D: BufferDefaults>(
    name: &str,
    outbox: Arc<Outbox>,
    buffer: &BufferConfig<D>,
    transport: T,
) -> Result<JoinHandle<()>, SinkError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(SinkError::Thread)?;
    let buffer = buffer.clone();
    let task_name = name.to_string();
    std::thread::Builder::new()
        .name(format!("moat-sink-{name}"))
        .spawn(move || rt.block_on(deliver(outbox, transport, buffer, task_name)))
        .map_err(SinkError::Thread)
}

/// The producer half: encodes records on the event writer's thread into the outbox.
pub(crate) struct Encoder {
    pub(crate) format: Format,
    /// Which kinds this sink takes, by [`RecordKind::index`].
    pub(crate) kinds: [bool; 4],
    /// How the Kafka key is picked; `None` for sinks without keys.
    pub(crate) key: Option<crate::config::KafkaKey>,
}

impl Encoder {
    /// The message of an entry, or `None` when this sink does not take its kind.
    /// `json` is a single record as the event writer serialized it (moat's
    /// format): copied as is for `format: moat`, which saves serializing it a
    /// second time (about a fifth of a Kafka record's cost, docs/perf.md).
    pub(crate) fn encode(
        &self,
        entry: Entry<'_>,
        json: Option<&[u8]>,
    ) -> Option<Result<Message, serde_json::Error>> {
        let rec = entry.record();
        let kind = RecordKind::of(rec);
        if !self.kinds[kind.index()] {
            return None;
        }
        let body = match (self.format, json, entry) {
            (Format::Moat, Some(json), Entry::One(_)) => json.to_vec(),
            _ => {
                let mut body = Vec::with_capacity(512);
                if let Err(e) = crate::format::encode(self.format, entry, &mut body) {
                    return Some(Err(e));
                }
                body
            }
        };
        Some(Ok(Message {
            kind,
            ts_ms: rec.ts(),
            severity: severity(rec),
            key: self.key.and_then(|k| key_of(rec, k)).map(Into::into),
            body,
        }))
    }
}

fn severity(rec: &Record) -> Severity {
    match rec.action() {
        Some("block") => Severity::Warning,
        Some("monitor" | "redact" | "bypass") => Severity::Notice,
        _ => Severity::Info,
    }
}

/// The key of a record: its request id or client IP (a TLS record: the peer IP).
fn key_of(rec: &Record, k: crate::config::KafkaKey) -> Option<&str> {
    use crate::config::KafkaKey;
    match (rec, k) {
        (Record::Access(a), KafkaKey::RequestId) => Some(&a.request_id),
        (Record::Security(s), KafkaKey::RequestId) => Some(&s.request_id),
        (Record::Access(a), KafkaKey::ClientIp) => Some(&a.client_ip),
        (Record::Security(s), KafkaKey::ClientIp) => Some(&s.client_ip),
        (Record::Tcp(c), _) => Some(&c.client_ip),
        (Record::Tls(_), _) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(n: usize) -> Message {
        Message {
            kind: RecordKind::Access,
            ts_ms: 0,
            severity: Severity::Info,
            key: None,
            body: vec![b'x'; n],
        }
    }

    #[test]
    fn buffer_bounds_records_and_bytes() {
        let cfg: BufferConfig = BufferConfig {
            max_records: 3,
            max_bytes: 4096,
            ..BufferConfig::default()
        };
        let o = Outbox::new(&cfg);
        assert_eq!(o.push((0..5).map(|_| msg(10))), 2);
        assert_eq!(o.stats.depth.load(Ordering::Relaxed), 3);
        let mut b = Vec::new();
        o.take(&mut b, 2);
        assert_eq!((b.len(), o.stats.depth.load(Ordering::Relaxed)), (2, 1));
        // One message bigger than the whole byte budget is dropped, not stored.
        assert_eq!(o.push(std::iter::once(msg(5000))), 1);
        assert_eq!(o.stats.dropped.load(Ordering::Relaxed), 3);
        o.take(&mut b, 10);
        assert_eq!(o.stats.bytes.load(Ordering::Relaxed), 0);
    }
}
