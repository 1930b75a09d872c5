//! The bounded queue and the background writer thread.
//!
//! The writer must cost the request threads as little as possible. Pushing a
//! record is a `send` into a lock-free linked-block channel, bounded by an
//! atomic count of waiting records: the channel allocates its blocks as records
//! arrive and frees them as they are read, so an idle queue holds no memory
//! (a preallocated array of `queue_capacity` records would pin tens of MB of
//! RSS for a queue that is almost always nearly empty). What would cost
//! more is waking the writer for every record (a futex call by the producer
//! and two context switches, on a core the proxy shares with the writer). So
//! the writer is woken only for the first record after it went idle; it then
//! naps for one batch interval while records pile up, and writes them all as
//! one batch. A producer wakes it early only when the queue is half full, so
//! it cannot overflow while the writer naps. Each record thus waits at most one
//! batch interval (plus the time to write the batch before it) between `push`
//! and its write.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, select, unbounded, Receiver, Sender, TryRecvError};

use crate::aggregate::{Admit, Aggregator, Counted};
use crate::config::EventsConfig;
use crate::record::{now_ms, Record};
use crate::sink::{Lines, RecordSink, Sink};
use crate::store::EventStore;
use crate::EventsError;

/// How often the writer applies store retention.
pub const RETENTION_EVERY: Duration = Duration::from_secs(10);

/// How often the writer closes ended aggregation windows (at most this late).
const EXPIRE_EVERY: Duration = Duration::from_millis(250);

/// How long the writer waits without records before it gives memory back
/// (its batch buffers, SQLite's page cache, the C allocator's free pages).
const RELEASE_AFTER_IDLE: Duration = Duration::from_secs(1);

/// Batch capacity kept while idle; a flood grows it, going idle shrinks it back.
const BATCH_KEEP: usize = 1024;

#[derive(Debug, Default)]
struct Stats {
    /// Records pushed and not yet taken by the writer: the queue's bound.
    queued: AtomicUsize,
    dropped: AtomicU64,
    written: AtomicU64,
    failed: AtomicU64,
}

/// The producer side: cheap to clone, never blocks.
#[derive(Clone)]
pub struct EventQueue {
    tx: Sender<Record>,
    /// Flood control before the queue; `None` when `aggregate.window` is 0.
    aggregator: Option<Arc<Aggregator>>,
    /// Wakes the napping writer early (a token channel of capacity 1).
    wake: Sender<()>,
    /// Queue depth at which a push wakes the writer before its interval is over.
    wake_depth: usize,
    stats: Arc<Stats>,
    capacity: usize,
}

impl std::fmt::Debug for EventQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventQueue")
            .field("depth", &self.depth())
            .field("capacity", &self.capacity)
            .field("dropped", &self.dropped())
            .field("written", &self.written())
            .finish()
    }
}

impl EventQueue {
    /// Enqueues a record. Never blocks: when the queue is full (or the writer
    /// has stopped) the record is dropped, counted in [`dropped`](Self::dropped),
    /// and `false` is returned.
    ///
    /// A repeat of a recent security event, or a record over its client's cap,
    /// is counted by the flood-control stage instead of queued; `true` is
    /// returned (it is not lost: its count is written).
    pub fn push(&self, record: Record) -> bool {
        if let Some(agg) = &self.aggregator {
            if agg.admit(&record) != Admit::Pass {
                return true;
            }
        }
        // Reserve a place first (never past the bound, even for a moment, so
        // `depth` never reads more than `capacity`), then send.
        let reserved = self
            .stats
            .queued
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < self.capacity).then_some(n + 1)
            });
        let Ok(depth) = reserved else {
            self.stats.dropped.fetch_add(1, Ordering::Relaxed);
            return false;
        };
        if self.tx.send(record).is_err() {
            // The writer has stopped.
            self.stats.queued.fetch_sub(1, Ordering::Relaxed);
            self.stats.dropped.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        // An idle writer waits on the channel itself and was woken by `send`;
        // a napping one is woken only when the queue fills up.
        if depth + 1 >= self.wake_depth {
            // Full token channel: a wake-up is already pending.
            let _ = self.wake.try_send(());
        }
        true
    }

    /// Records waiting in the queue now.
    pub fn depth(&self) -> usize {
        self.stats.queued.load(Ordering::Relaxed)
    }

    /// Maximum number of waiting records.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Records refused because the queue was full, since start.
    pub fn dropped(&self) -> u64 {
        self.stats.dropped.load(Ordering::Relaxed)
    }

    /// Records the writer has handed to the sink and the store, since start.
    pub fn written(&self) -> u64 {
        self.stats.written.load(Ordering::Relaxed)
    }

    /// Records that could not be written (sink or store I/O error), since start.
    pub fn failed(&self) -> u64 {
        self.stats.failed.load(Ordering::Relaxed)
    }

    /// Repeats counted into an aggregate instead of queued, since start.
    pub fn aggregated(&self) -> u64 {
        self.aggregator.as_deref().map_or(0, Aggregator::aggregated)
    }

    /// Records over their client's cap, counted instead of queued, since start.
    pub fn capped(&self) -> u64 {
        self.aggregator.as_deref().map_or(0, Aggregator::capped)
    }
}

/// The consumer side: owns the background thread.
pub struct EventWriter {
    queue: EventQueue,
    stop: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
    store_path: Option<PathBuf>,
}

impl std::fmt::Debug for EventWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventWriter")
            .field("queue", &self.queue)
            .field("store_path", &self.store_path)
            .finish()
    }
}

struct Worker {
    rx: Receiver<Record>,
    stop: Receiver<()>,
    wake: Receiver<()>,
    stats: Arc<Stats>,
    aggregator: Option<Arc<Aggregator>>,
    /// Records of closed aggregation windows, written with the next batch.
    counted: Vec<Counted>,
    sink: Sink,
    store: Option<EventStore>,
    /// Further destinations (moat-sinks' Kafka, syslog, HTTP), offered every batch.
    extra: Vec<Box<dyn RecordSink>>,
    store_access: bool,
    retention_age: Duration,
    retention_max_bytes: u64,
    batch_max: usize,
    interval: Duration,
    /// The serialized batch, reused from batch to batch.
    lines: Lines,
    last_warning: Option<Instant>,
}

impl EventWriter {
    /// Validates `cfg`, opens the sink and the store (relative paths resolve
    /// against `base_dir`, normally the config file's directory) and starts the
    /// writer thread.
    pub fn start(
        cfg: &EventsConfig,
        base_dir: &Path,
    ) -> Result<(EventQueue, EventWriter), EventsError> {
        Self::start_with(cfg, base_dir, Vec::new())
    }

    /// [`start`](Self::start), also offering every batch to `extra` sinks
    /// (after the JSON-lines sink and the store, on the writer thread).
    pub fn start_with(
        cfg: &EventsConfig,
        base_dir: &Path,
        extra: Vec<Box<dyn RecordSink>>,
    ) -> Result<(EventQueue, EventWriter), EventsError> {
        cfg.validate()?;
        let sink = Sink::open(&cfg.sink, base_dir)?;
        let (store, store_path) = match &cfg.store {
            Some(s) => {
                let path = base_dir.join(&s.path);
                let store = EventStore::open(&path)?;
                store.apply_retention(now_ms(), s.retention_age, s.retention_max_bytes)?;
                (Some(store), Some(path))
            }
            None => (None, None),
        };
        let (tx, rx) = unbounded();
        let (stop_tx, stop_rx) = bounded(1);
        let (wake_tx, wake_rx) = bounded(1);
        let stats = Arc::new(Stats::default());
        let aggregator = Aggregator::new(&cfg.aggregate).map(Arc::new);
        let queue = EventQueue {
            tx,
            aggregator: aggregator.clone(),
            wake: wake_tx,
            wake_depth: (cfg.queue_capacity / 2).max(1),
            stats: stats.clone(),
            capacity: cfg.queue_capacity,
        };
        let worker = Worker {
            rx,
            stop: stop_rx,
            wake: wake_rx,
            stats,
            aggregator,
            counted: Vec::new(),
            sink,
            store,
            extra,
            store_access: cfg.store.as_ref().map(|s| s.access).unwrap_or(true),
            retention_age: cfg
                .store
                .as_ref()
                .map(|s| s.retention_age)
                .unwrap_or_default(),
            retention_max_bytes: cfg
                .store
                .as_ref()
                .map(|s| s.retention_max_bytes)
                .unwrap_or(u64::MAX),
            batch_max: cfg.batch_max(),
            interval: cfg.batch_interval(),
            lines: Lines::default(),
            last_warning: None,
        };
        let thread = std::thread::Builder::new()
            .name("moat-events".into())
            .spawn(move || worker.run())
            .map_err(EventsError::Thread)?;
        Ok((
            queue.clone(),
            EventWriter {
                queue,
                stop: Some(stop_tx),
                thread: Some(thread),
                store_path,
            },
        ))
    }

    /// Another producer handle.
    pub fn queue(&self) -> EventQueue {
        self.queue.clone()
    }

    /// The store database file, when a store is configured (open it with
    /// [`EventStore::open_read_only`] to serve queries).
    pub fn store_path(&self) -> Option<&Path> {
        self.store_path.as_deref()
    }

    /// Stops the writer after it has written everything queued at this point,
    /// and flushes the sink and the store.
    pub fn shutdown(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            if t.join().is_err() {
                tracing::error!("the event writer thread panicked");
            }
        }
    }
}

impl Drop for EventWriter {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

impl Worker {
    fn run(mut self) {
        let mut batch: Vec<Record> = Vec::with_capacity(self.batch_max.min(BATCH_KEEP));
        let mut last_retention = Instant::now();
        let mut last_expire = Instant::now();
        // `None`: the queue was found empty, wait for its next record.
        // `Some(t)`: the queue was empty at `t`, so no queued record is older.
        let mut since: Option<Instant> = None;
        // When the writer last went idle, and whether it wrote since it last
        // gave memory back.
        let mut idle_since = Instant::now();
        let mut dirty = false;
        loop {
            let retention_at = last_retention + RETENTION_EVERY;
            let mut stopping = false;
            let mut drain = false;
            match since {
                None => {
                    let open = self.aggregator.as_ref().is_some_and(|a| a.open() > 0);
                    let tick = if open {
                        EXPIRE_EVERY
                    } else {
                        RELEASE_AFTER_IDLE
                    };
                    let wake_at = retention_at.min(Instant::now() + tick);
                    select! {
                        // The first record wakes the writer; the next ones do not
                        // (nobody waits on the channel while it naps).
                        recv(self.rx) -> msg => match msg {
                            Ok(r) => {
                                self.stats.queued.fetch_sub(1, Ordering::Relaxed);
                                batch.push(r);
                                since = Some(Instant::now());
                                dirty = true;
                            }
                            Err(_) => stopping = true,
                        },
                        recv(self.stop) -> _ => stopping = true,
                        default(wake_at.saturating_duration_since(Instant::now())) => {
                            if dirty && idle_since.elapsed() >= RELEASE_AFTER_IDLE {
                                self.release_memory(&mut batch);
                                dirty = false;
                            }
                        }
                    }
                }
                Some(t) => {
                    let deadline = (t + self.interval).min(retention_at);
                    select! {
                        recv(self.stop) -> _ => stopping = true,
                        recv(self.wake) -> _ => drain = true,
                        default(deadline.saturating_duration_since(Instant::now())) => {
                            drain = t.elapsed() >= self.interval;
                        }
                    }
                }
            }
            if stopping {
                // Write what is queued now, in batches, then the open aggregates, then stop.
                loop {
                    self.fill(&mut batch);
                    if batch.is_empty() {
                        break;
                    }
                    self.write(&mut batch);
                }
                if let Some(agg) = &self.aggregator {
                    agg.expire(u64::MAX, &mut self.counted);
                    self.write(&mut batch);
                }
                self.apply_retention();
                for s in &mut self.extra {
                    s.close();
                }
                return;
            }
            if drain {
                loop {
                    self.fill(&mut batch);
                    let emptied = batch.len() < self.batch_max;
                    let at = Instant::now();
                    if !batch.is_empty() {
                        self.write(&mut batch);
                    }
                    if emptied {
                        since = if self.rx.is_empty() { None } else { Some(at) };
                        idle_since = at;
                        break;
                    }
                }
            }
            if last_expire.elapsed() >= EXPIRE_EVERY {
                last_expire = Instant::now();
                if let Some(agg) = &self.aggregator {
                    agg.expire(now_ms(), &mut self.counted);
                }
                // While the writer naps, they go with the next batch.
                if since.is_none() && !self.counted.is_empty() {
                    self.write(&mut batch);
                    dirty = true;
                }
            }
            if last_retention.elapsed() >= RETENTION_EVERY {
                self.apply_retention();
                last_retention = Instant::now();
            }
        }
    }

    /// Moves queued records into the batch without waiting, up to `batch_max`.
    fn fill(&self, batch: &mut Vec<Record>) {
        while batch.len() < self.batch_max {
            match self.rx.try_recv() {
                Ok(r) => {
                    self.stats.queued.fetch_sub(1, Ordering::Relaxed);
                    batch.push(r);
                }
                Err(TryRecvError::Empty) | Err(TryRecvError::Disconnected) => break,
            }
        }
    }

    /// Serializes the batch and the closed aggregates once into one buffer,
    /// writes it to the sink with one write, and inserts it into the store in
    /// one transaction.
    fn write(&mut self, batch: &mut Vec<Record>) {
        let n = (batch.len() + self.counted.len()) as u64;
        let mut failed = 0u64;
        self.lines.clear();
        // Records the store takes, with the index of their line.
        let mut rows: Vec<(&Record, usize)> = Vec::new();
        let counted = self.counted.iter().map(|c| (&c.record, Some(c)));
        for (rec, count) in batch.iter().map(|r| (r, None)).chain(counted) {
            let line = match count {
                Some(c) => self.lines.push(c),
                None => self.lines.push(rec),
            };
            match line {
                Ok(i) => {
                    if self.store.is_some()
                        && (self.store_access || !matches!(rec, Record::Access(_)))
                    {
                        rows.push((rec, i));
                    }
                }
                Err(_) => failed += 1,
            }
        }
        let mut error: Option<String> = None;
        if let Err(e) = self.sink.write_batch(&self.lines) {
            error = Some(format!("event sink: {e}"));
        }
        if let Some(store) = &self.store {
            // serde_json writes UTF-8, so this check passes; it is what lets
            // the store borrow the lines as text without copying them.
            let res = match std::str::from_utf8(self.lines.as_bytes()) {
                Ok(text) => {
                    let rows: Vec<(&Record, &str)> = rows
                        .iter()
                        .map(|&(r, i)| (r, &text[self.lines.span(i)]))
                        .collect();
                    store.insert_serialized(&rows).map_err(|e| e.to_string())
                }
                Err(e) => Err(format!("event store: serialized records: {e}")),
            };
            if let Err(e) = res {
                failed += rows.len() as u64;
                error = Some(e);
            }
        }
        drop(rows);
        for s in &mut self.extra {
            s.offer(batch, &self.counted);
        }
        batch.clear();
        self.counted.clear();
        self.stats.failed.fetch_add(failed, Ordering::Relaxed);
        self.stats
            .written
            .fetch_add(n - failed.min(n), Ordering::Relaxed);
        if let Some(e) = error {
            self.warn(&e);
        }
    }

    /// Gives back what a flood made the writer hold: batch capacity, the
    /// serialized lines, SQLite's page cache, and the C allocator's free pages
    /// (SQLite allocates with `malloc`, not with the Rust global allocator).
    fn release_memory(&mut self, batch: &mut Vec<Record>) {
        batch.shrink_to(BATCH_KEEP);
        self.counted = Vec::new();
        self.lines.release();
        if let Some(store) = &self.store {
            if let Err(e) = store.release_memory() {
                let msg = format!("event store: {e}");
                self.warn(&msg);
            }
        }
        trim_c_heap();
    }

    fn apply_retention(&mut self) {
        if let Some(store) = &self.store {
            if let Err(e) =
                store.apply_retention(now_ms(), self.retention_age, self.retention_max_bytes)
            {
                let msg = format!("event store retention: {e}");
                self.warn(&msg);
            }
        }
    }

    /// Logs at most one warning per 10 seconds.
    fn warn(&mut self, msg: &str) {
        if self
            .last_warning
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(10))
        {
            tracing::warn!("{msg}");
            self.last_warning = Some(Instant::now());
        }
    }
}

/// Returns the C allocator's free pages to the OS. glibc keeps what a thread's
/// arena freed mapped (it trims only the top of the main heap by itself), so
/// SQLite's page cache, once shrunk, would otherwise stay resident.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn trim_c_heap() {
    // SAFETY: malloc_trim takes no pointer and only releases memory the
    // allocator holds free; glibc makes it safe to call from any thread.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Other C allocators return memory by themselves.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim_c_heap() {}
