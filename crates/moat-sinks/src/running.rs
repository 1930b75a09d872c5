//! The running sinks and span exporter, and how a reload changes them (see
//! [`Telemetry`]).

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::Mutex;

use crate::config::{self, SinkConfig, TelemetryConfig, TracingConfig};
use crate::outbox::{spawn, Encoder, Outbox, SinkStats, Warner};
use crate::{format, kafka, net, syslog, SinkError, SinkMetrics, Tracer};

/// The running sinks and span exporter of a gateway.
///
/// [`Telemetry`] owns the sinks (behind the one [`SinkSet`] the event writer
/// offers its batches to) and the current [`Tracer`]. A reload is two steps, so
/// that a configuration refused later (by another section) changes nothing:
///
/// - [`Telemetry::prepare`] starts what is new: a sink whose entry was added or
///   changed (compared field by field, its position in the file aside), and a
///   new tracer when `telemetry.tracing` changed. Nothing running is touched.
/// - [`Change::commit`] swaps them in under one short lock the writer thread
///   takes once per batch: an unchanged sink keeps its buffer, its thread and
///   its connection (nothing it holds is lost or resent); a changed or removed
///   sink is closed, so its thread delivers what it holds (within its
///   `buffer.shutdown_timeout`) and ends. Dropping a `Change` instead stops
///   what `prepare` started.
///
/// The request path never waits for any of this: it reads the tracer from the
/// configuration snapshot the proxy swaps atomically, and records reach the
/// sinks through the event queue as before. An old tracer keeps exporting the
/// spans of requests that started before the reload and stops once the last of
/// them is done (when its last reference goes).
pub struct Telemetry {
    /// Held from [`prepare`](Telemetry::prepare) to the end of the [`Change`]:
    /// one reload at a time.
    serial: Mutex<()>,
    sinks: Arc<Mutex<Vec<OutboxSink>>>,
    /// The tracing section in force and its tracer (none when tracing is off).
    tracer: Mutex<(TracingConfig, Option<Arc<Tracer>>)>,
    metrics: SinkMetrics,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry")
            .field("sinks", &self.sinks.lock().len())
            .finish_non_exhaustive()
    }
}

impl Telemetry {
    /// Starts every sink and the tracer of `cfg` (validated by the caller;
    /// relative CA files resolve against `base_dir`). Nothing connects yet:
    /// each sink connects on its first batch and reconnects as needed, so a
    /// destination that is down at start does not stop moat.
    pub fn start(cfg: &TelemetryConfig, base_dir: &Path) -> Result<Telemetry, SinkError> {
        let t = Telemetry {
            serial: Mutex::new(()),
            sinks: Arc::default(),
            tracer: Mutex::new((TracingConfig::default(), None)),
            metrics: SinkMetrics::default(),
        };
        t.prepare(cfg, base_dir)?.commit();
        Ok(t)
    }

    /// The [`RecordSink`](moat_events::RecordSink) to give the event writer: it
    /// offers each batch to the sinks running at that moment.
    pub fn record_sink(&self) -> SinkSet {
        SinkSet {
            sinks: self.sinks.clone(),
        }
    }

    /// Whether any sink is running.
    pub fn has_sinks(&self) -> bool {
        !self.sinks.lock().is_empty()
    }

    /// The current tracer; `None` when tracing is off.
    pub fn tracer(&self) -> Option<Arc<Tracer>> {
        self.tracer.lock().1.clone()
    }

    /// The counters of every sink and of the tracer, following reloads.
    pub fn metrics(&self) -> &SinkMetrics {
        &self.metrics
    }

    /// Starts what `cfg` adds or changes, without touching what runs; see
    /// [`Telemetry`]. Fails (and starts nothing) when a new
    /// sink or tracer cannot start (an unreadable CA file).
    pub fn prepare(&self, cfg: &TelemetryConfig, base_dir: &Path) -> Result<Change<'_>, SinkError> {
        let serial = self.serial.lock();
        let running: Vec<SinkConfig> = self.sinks.lock().iter().map(|s| s.cfg.clone()).collect();
        let mut started = Vec::new();
        for s in &cfg.sinks {
            if !running.iter().any(|r| same_sink(r, s)) {
                // On error, `started` drops: what it started stops.
                started.push(start_sink(s, base_dir).map_err(|e| SinkError::Sink {
                    name: s.name.value.clone(),
                    error: Box::new(e),
                })?);
            }
        }
        let tracer = {
            let current = self.tracer.lock();
            if current.0 == cfg.tracing && (current.1.is_some() || !cfg.tracing.enabled) {
                None
            } else {
                Some(Tracer::start(&cfg.tracing, base_dir)?)
            }
        };
        Ok(Change {
            _serial: serial,
            telemetry: self,
            order: cfg.sinks.iter().map(|s| s.name.value.clone()).collect(),
            started,
            tracing: cfg.tracing.clone(),
            tracer,
        })
    }

    /// Closes every sink and the tracer, waiting (up to each one's
    /// `buffer.shutdown_timeout`) for them to deliver what they hold. The
    /// event writer's own [`close`](moat_events::RecordSink::close) does the
    /// same for the sinks; this is for when the writer was never started.
    pub fn shutdown(&self) {
        let sinks = std::mem::take(&mut *self.sinks.lock());
        close_all(sinks);
        let tracer = self.tracer.lock().1.take();
        if let Some(t) = tracer {
            t.shutdown();
        }
    }
}

/// What a reload starts, waiting to be [committed](Change::commit) (or dropped).
pub struct Change<'a> {
    _serial: parking_lot::MutexGuard<'a, ()>,
    telemetry: &'a Telemetry,
    /// The sinks of the new configuration, by name, in its order.
    order: Vec<String>,
    /// The sinks `prepare` started.
    started: Vec<OutboxSink>,
    tracing: TracingConfig,
    /// The new tracer when tracing changed (`Some(None)`: turned off).
    tracer: Option<Option<Arc<Tracer>>>,
}

impl std::fmt::Debug for Change<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Change")
            .field("sinks", &self.order)
            .field("started", &self.started.len())
            .finish_non_exhaustive()
    }
}

impl Change<'_> {
    /// The tracer requests should use once this change is committed.
    pub fn tracer(&self) -> Option<Arc<Tracer>> {
        match &self.tracer {
            Some(t) => t.clone(),
            None => self.telemetry.tracer(),
        }
    }

    /// Installs the change: see [`Telemetry`]. Returns
    /// the names of the sinks it started and stopped, for the log.
    pub fn commit(self) -> (Vec<String>, Vec<String>) {
        let Change {
            _serial,
            telemetry,
            order,
            mut started,
            tracing,
            tracer,
        } = self;
        let added: Vec<String> = started.iter().map(|s| s.name().to_string()).collect();
        let retired = {
            let mut sinks = telemetry.sinks.lock();
            let mut old = std::mem::take(&mut *sinks);
            for name in &order {
                // A started sink replaces a running one of the same name.
                let next = match started.iter().position(|s| s.name() == name) {
                    Some(i) => started.swap_remove(i),
                    None => match old.iter().position(|s| s.name() == name) {
                        Some(i) => old.swap_remove(i),
                        None => continue,
                    },
                };
                sinks.push(next);
            }
            old
        };
        let removed = retired.iter().map(|s| s.name().to_string()).collect();
        // Dropping closes: each retired thread delivers what it holds and ends. It
        // is not joined here, so the reload does not wait for a slow destination.
        drop(retired);
        let tracer_stats = {
            let mut current = telemetry.tracer.lock();
            if let Some(t) = tracer {
                // The old tracer stops when the requests still holding it are done.
                *current = (tracing, t);
            }
            current.1.as_ref().map(|t| t.stats().clone())
        };
        let mut stats: Vec<(String, Arc<SinkStats>)> = telemetry
            .sinks
            .lock()
            .iter()
            .map(|s| (s.name().to_string(), s.outbox.stats.clone()))
            .collect();
        stats.extend(tracer_stats.map(|s| ("tracing".to_string(), s)));
        telemetry.metrics.set(stats);
        (added, removed)
    }
}

/// Whether two sink entries configure the same sink (their place in the file aside).
fn same_sink(a: &SinkConfig, b: &SinkConfig) -> bool {
    a.name.value == b.name.value
        && *a
            == SinkConfig {
                name: a.name.clone(),
                ..b.clone()
            }
}

/// Starts one sink's thread.
fn start_sink(s: &SinkConfig, base_dir: &Path) -> Result<OutboxSink, SinkError> {
    let name = &s.name.value;
    let outbox = Outbox::new(&s.buffer);
    let mut kinds = [false; 4];
    for k in &s.records {
        kinds[k.index()] = true;
    }
    let encoder = Encoder {
        format: s.format,
        kinds,
        key: s.kafka.as_ref().map(|k| k.key),
    };
    let thread = if let Some(k) = &s.kafka {
        let tls = k
            .tls
            .as_ref()
            .map(|t| net::client_config(t, base_dir))
            .transpose()?;
        spawn(
            name,
            outbox.clone(),
            &s.buffer,
            kafka::KafkaSink::new(k, tls, s.buffer.timeout),
        )?
    } else if let Some(sl) = &s.syslog {
        let tls = match sl.transport {
            config::SyslogTransport::Tls => Some(net::client_config(
                sl.tls
                    .as_ref()
                    .unwrap_or(&config::ClientTlsConfig::default()),
                base_dir,
            )?),
            _ => None,
        };
        let server_name = sl.tls.as_ref().and_then(|t| t.server_name.as_deref());
        let endpoint = net::Endpoint::new(&sl.address, tls.map(|c| (c, server_name)))?;
        let facility = config::facility_code(&sl.facility)
            .ok_or_else(|| SinkError::Config(format!("syslog.facility `{}`", sl.facility)))?;
        spawn(
            name,
            outbox.clone(),
            &s.buffer,
            syslog::SyslogSink::new(sl, endpoint, facility),
        )?
    } else if let Some(h) = &s.http {
        spawn(
            name,
            outbox.clone(),
            &s.buffer,
            crate::http::HttpSink::new(h, base_dir)?,
        )?
    } else {
        return Err(SinkError::Config("no destination".into()));
    };
    Ok(OutboxSink {
        cfg: s.clone(),
        warner: Warner::new(name),
        encoder,
        outbox,
        thread: Some(thread),
    })
}

/// The event writer's handle on the running sinks (see [`Telemetry::record_sink`]).
pub struct SinkSet {
    sinks: Arc<Mutex<Vec<OutboxSink>>>,
}

impl std::fmt::Debug for SinkSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SinkSet").finish_non_exhaustive()
    }
}

impl moat_events::RecordSink for SinkSet {
    fn offer(
        &mut self,
        batch: &[moat_events::Record],
        json: &[Option<&[u8]>],
        counted: &[moat_events::Counted],
    ) {
        // One lock per batch; a reload holds it only to swap the list.
        for s in self.sinks.lock().iter_mut() {
            s.offer(batch, json, counted);
        }
    }

    fn close(&mut self) {
        let sinks = std::mem::take(&mut *self.sinks.lock());
        close_all(sinks);
    }
}

/// Closes every sink first, then waits for each: their shutdown timeouts run together.
fn close_all(mut sinks: Vec<OutboxSink>) {
    for s in &sinks {
        s.outbox.close();
    }
    for s in &mut sinks {
        if let Some(t) = s.thread.take() {
            if t.join().is_err() {
                tracing::error!(sink = %s.name(), "an event sink thread panicked");
            }
        }
    }
}

/// One running sink: its settings, encoder, buffer and thread.
struct OutboxSink {
    cfg: SinkConfig,
    encoder: Encoder,
    outbox: Arc<Outbox>,
    warner: Warner,
    thread: Option<JoinHandle<()>>,
}

impl OutboxSink {
    fn name(&self) -> &str {
        &self.cfg.name.value
    }

    fn offer(
        &mut self,
        batch: &[moat_events::Record],
        json: &[Option<&[u8]>],
        counted: &[moat_events::Counted],
    ) {
        let mut encode_errors = 0u64;
        let ones = batch
            .iter()
            .enumerate()
            .map(|(i, r)| (format::Entry::One(r), json.get(i).copied().flatten()));
        let msgs = ones
            .chain(counted.iter().map(|c| (format::Entry::Counted(c), None)))
            .filter_map(|(e, j)| self.encoder.encode(e, j))
            .filter_map(|m| m.map_err(|_| encode_errors += 1).ok())
            .collect::<Vec<_>>();
        let dropped = self.outbox.push(msgs.into_iter());
        if encode_errors > 0 {
            self.outbox
                .stats
                .encode_errors
                .fetch_add(encode_errors, Ordering::Relaxed);
        }
        if dropped > 0 {
            self.warner
                .warn(&format!("buffer full, {dropped} records dropped"));
        }
    }
}

impl Drop for OutboxSink {
    /// A sink dropped without [`close_all`] (a retired or never-committed one)
    /// still delivers what it holds: its thread ends on its own.
    fn drop(&mut self) {
        self.outbox.close();
    }
}
