//! The discovery worker: a bounded queue of sampled exchanges (the engine's
//! [`SampleQueue`]) and the thread that drains it, extracts the samples'
//! schemas and writes the inventory.
//!
//! Only the first sample after the worker went idle wakes it; it then takes
//! the queue every [`DRAIN_INTERVAL`] until the queue stays empty, and a push
//! that finds the queue half full wakes it early.

use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, select, Receiver, Sender};
use moat_core::Exchange;
use moat_schema::{Discovery, DiscoveryConfig, SampleQueue};

use crate::store::InventoryStore;
use crate::InventoryError;

/// How long the busy worker lets exchanges pile up in the queue before taking them all.
pub const DRAIN_INTERVAL: Duration = Duration::from_millis(50);

/// The request threads' end of the queue.
struct ChannelQueue {
    tx: Sender<Arc<Exchange>>,
    /// Wakes the napping worker early (a token channel of capacity 1).
    wake: Sender<()>,
    /// Queue depth at which a push wakes the worker early.
    wake_depth: usize,
}

impl SampleQueue for ChannelQueue {
    fn try_push(&self, sample: Arc<Exchange>) -> bool {
        if self.tx.try_send(sample).is_err() {
            return false;
        }
        if self.tx.len() >= self.wake_depth {
            // Full token channel: a wake-up is already pending.
            let _ = self.wake.try_send(());
        }
        true
    }

    fn depth(&self) -> usize {
        self.tx.len()
    }
}

/// API discovery running: the engine, its worker thread and its inventory
/// file. Dereferences to the engine ([`Discovery`]: stats, endpoints, the
/// phase itself); register [`DiscoveryWorker::engine`] as the proxy's
/// `Arc<dyn AfterResponsePhase>` and keep this value alive as long as it
/// serves. Dropping it stops the worker ([`DiscoveryWorker::shutdown`]).
pub struct DiscoveryWorker {
    engine: Arc<Discovery>,
    inventory_path: PathBuf,
    stop: Mutex<Option<Sender<()>>>,
    worker: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for DiscoveryWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiscoveryWorker")
            .field("inventory_path", &self.inventory_path)
            .field("stats", &self.engine.stats())
            .finish()
    }
}

impl DiscoveryWorker {
    /// Validates `cfg`, loads the inventory (relative path resolved against
    /// `base_dir`) and starts the worker thread.
    pub fn start(
        cfg: &DiscoveryConfig,
        base_dir: &Path,
    ) -> Result<Arc<DiscoveryWorker>, InventoryError> {
        cfg.validate()?;
        let inventory_path = base_dir.join(&cfg.inventory);
        let store = InventoryStore::open(&inventory_path)?;
        let loaded = store.load()?;
        let (tx, rx) = bounded(cfg.queue_capacity);
        let (stop_tx, stop_rx) = bounded(1);
        let (wake_tx, wake_rx) = bounded(1);
        let queue = Arc::new(ChannelQueue {
            tx,
            wake: wake_tx,
            wake_depth: (cfg.queue_capacity / 2).max(1),
        });
        let engine = Arc::new(Discovery::new(cfg, loaded, queue)?);
        let worker = Worker {
            rx,
            stop: stop_rx,
            wake: wake_rx,
            engine: engine.clone(),
            store,
            flush_interval: cfg.flush_interval,
            queue_capacity: cfg.queue_capacity,
        };
        let handle = std::thread::Builder::new()
            .name("moat-discovery".into())
            .spawn(move || worker.run())
            .map_err(InventoryError::Thread)?;
        Ok(Arc::new(DiscoveryWorker {
            engine,
            inventory_path,
            stop: Mutex::new(Some(stop_tx)),
            worker: Mutex::new(Some(handle)),
        }))
    }

    /// The engine: the after-response phase to register, and what `GET /v1/apis` reads.
    pub fn engine(&self) -> &Arc<Discovery> {
        &self.engine
    }

    /// The inventory database file.
    pub fn inventory_path(&self) -> &Path {
        &self.inventory_path
    }

    /// Stops the worker after it has processed everything queued and written
    /// the inventory. Later samples are dropped and counted. Idempotent.
    pub fn shutdown(&self) {
        drop(self.stop.lock().unwrap_or_else(|p| p.into_inner()).take());
        let handle = self.worker.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(h) = handle {
            if h.join().is_err() {
                tracing::error!("the discovery worker panicked");
            }
        }
    }
}

impl Deref for DiscoveryWorker {
    type Target = Discovery;

    fn deref(&self) -> &Discovery {
        &self.engine
    }
}

impl Drop for DiscoveryWorker {
    fn drop(&mut self) {
        self.shutdown();
    }
}

struct Worker {
    rx: Receiver<Arc<Exchange>>,
    stop: Receiver<()>,
    wake: Receiver<()>,
    engine: Arc<Discovery>,
    store: InventoryStore,
    flush_interval: Duration,
    queue_capacity: usize,
}

impl Worker {
    fn run(mut self) {
        let mut last_flush = Instant::now();
        // Samples arrived since the worker last found the queue empty.
        let mut busy = false;
        loop {
            let flush_in = self.flush_interval.saturating_sub(last_flush.elapsed());
            let mut stopping = false;
            if busy {
                // Nap: nobody waits on the queue, so pushes do not wake the worker.
                select! {
                    recv(self.stop) -> _ => stopping = true,
                    recv(self.wake) -> _ => {}
                    default(DRAIN_INTERVAL.min(flush_in)) => {}
                }
                // At most one queue's worth, so a flood cannot hold off the flush.
                let mut taken = 0;
                while taken < self.queue_capacity {
                    let Ok(ex) = self.rx.try_recv() else { break };
                    self.engine.process(&ex);
                    taken += 1;
                }
                busy = taken > 0;
            } else {
                // Idle: the first sample wakes the worker.
                select! {
                    recv(self.rx) -> msg => match msg {
                        Ok(ex) => {
                            self.engine.process(&ex);
                            busy = true;
                        }
                        Err(_) => stopping = true,
                    },
                    recv(self.stop) -> _ => stopping = true,
                    default(flush_in) => {}
                }
            }
            if stopping {
                while let Ok(ex) = self.rx.try_recv() {
                    self.engine.process(&ex);
                }
                self.flush();
                return;
            }
            if last_flush.elapsed() >= self.flush_interval {
                self.flush();
                last_flush = Instant::now();
            }
        }
    }

    /// Folds the counted requests into the inventory and writes what changed
    /// (a failure is counted by the engine and written again next time).
    fn flush(&mut self) {
        if let Err(e) = self.engine.flush(&mut self.store) {
            tracing::warn!("API inventory: {e}");
        }
    }
}
