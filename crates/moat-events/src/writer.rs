//! The bounded queue and the background writer thread.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, select, Receiver, Sender, TryRecvError};

use crate::config::EventsConfig;
use crate::record::{now_ms, Record};
use crate::sink::Sink;
use crate::store::EventStore;
use crate::EventsError;

/// How often the writer applies store retention.
pub const RETENTION_EVERY: Duration = Duration::from_secs(10);

#[derive(Debug, Default)]
struct Stats {
    dropped: AtomicU64,
    written: AtomicU64,
    failed: AtomicU64,
}

/// The producer side: cheap to clone, never blocks.
#[derive(Clone)]
pub struct EventQueue {
    tx: Sender<Record>,
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
    pub fn push(&self, record: Record) -> bool {
        match self.tx.try_send(record) {
            Ok(()) => true,
            Err(_) => {
                self.stats.dropped.fetch_add(1, Ordering::Relaxed);
                false
            }
        }
    }

    /// Records waiting in the queue now.
    pub fn depth(&self) -> usize {
        self.tx.len()
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
    stats: Arc<Stats>,
    sink: Sink,
    store: Option<EventStore>,
    store_access: bool,
    retention_age: Duration,
    retention_max_bytes: u64,
    batch_max: usize,
    interval: Duration,
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
        let (tx, rx) = bounded(cfg.queue_capacity);
        let (stop_tx, stop_rx) = bounded(1);
        let stats = Arc::new(Stats::default());
        let queue = EventQueue {
            tx,
            stats: stats.clone(),
            capacity: cfg.queue_capacity,
        };
        let worker = Worker {
            rx,
            stop: stop_rx,
            stats,
            sink,
            store,
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
        let mut batch: Vec<Record> = Vec::with_capacity(self.batch_max.min(4096));
        let mut first_at: Option<Instant> = None;
        let mut last_retention = Instant::now();
        loop {
            let timeout = match first_at {
                Some(t) => (t + self.interval).saturating_duration_since(Instant::now()),
                None => RETENTION_EVERY,
            };
            let mut stopping = false;
            select! {
                recv(self.rx) -> msg => match msg {
                    Ok(r) => {
                        if batch.is_empty() {
                            first_at = Some(Instant::now());
                        }
                        batch.push(r);
                        self.fill(&mut batch);
                    }
                    Err(_) => stopping = true,
                },
                recv(self.stop) -> _ => stopping = true,
                default(timeout) => {}
            }
            if stopping {
                // Drain what is queued now, in batches, then stop.
                loop {
                    self.fill(&mut batch);
                    if batch.is_empty() {
                        break;
                    }
                    self.write(&mut batch);
                }
                self.apply_retention();
                return;
            }
            let due = first_at.is_some_and(|t| t.elapsed() >= self.interval);
            if !batch.is_empty() && (due || batch.len() >= self.batch_max) {
                self.write(&mut batch);
                first_at = None;
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
                Ok(r) => batch.push(r),
                Err(TryRecvError::Empty) | Err(TryRecvError::Disconnected) => break,
            }
        }
    }

    fn write(&mut self, batch: &mut Vec<Record>) {
        let n = batch.len() as u64;
        let mut rows: Vec<(&Record, String)> = Vec::with_capacity(batch.len());
        let mut failed = 0u64;
        for rec in batch.iter() {
            match serde_json::to_string(rec) {
                Ok(s) => rows.push((rec, s)),
                Err(_) => failed += 1,
            }
        }
        let mut error: Option<String> = None;
        if self.sink.enabled() {
            let res = rows
                .iter()
                .try_for_each(|(_, line)| self.sink.write_line(line))
                .and_then(|_| self.sink.flush());
            if let Err(e) = res {
                error = Some(format!("event sink: {e}"));
            }
        }
        if let Some(store) = &self.store {
            if !self.store_access {
                rows.retain(|(r, _)| !matches!(r, Record::Access(_)));
            }
            if let Err(e) = store.insert_serialized(&rows) {
                failed += rows.len() as u64;
                error = Some(e.to_string());
            }
        }
        drop(rows);
        batch.clear();
        self.stats.failed.fetch_add(failed, Ordering::Relaxed);
        self.stats
            .written
            .fetch_add(n - failed.min(n), Ordering::Relaxed);
        if let Some(e) = error {
            self.warn(&e);
        }
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
