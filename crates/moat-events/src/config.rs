//! Configuration of the event pipeline (the `events:` section of moat.yaml).

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::EventsError;

/// Records the writer holds at most while writing one batch when no store is
/// configured (with a store, [`StoreConfig::batch_max`] applies).
pub const DEFAULT_BATCH_MAX: usize = 8192;

/// Largest accepted `queue_capacity`.
pub const MAX_QUEUE_CAPACITY: usize = 1 << 24;

/// The `events:` section.
///
/// ```yaml
/// events:
///   queue_capacity: 65536
///   sink: { type: file, path: moat-events.jsonl, max_bytes: 100MiB, max_files: 5 }
///   store: { path: moat-events.db, batch_interval: 200ms, retention_age: 7d, retention_max_bytes: 1GiB }
/// ```
///
/// Memory bound: at most `queue_capacity` records wait in the queue plus one
/// batch (`store.batch_max`, default 16384, or 8192 without a store) in the
/// writer, plus SQLite's page cache (32 MiB). A queued record costs about
/// 1 KiB of heap (its strings and, for security records, the event details),
/// so the default configuration stays near 110 MiB at the very worst; the
/// overload benchmark measured a peak RSS of 104 MiB (docs/events.md).
/// Lower `queue_capacity` to lower the bound.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EventsConfig {
    /// Maximum number of records waiting to be written; pushes beyond it are dropped and counted.
    pub queue_capacity: usize,
    /// Where JSON lines go.
    pub sink: SinkConfig,
    /// The persistent SQLite store; off when absent.
    pub store: Option<StoreConfig>,
    /// Flood control: aggregation of repeated events and per-client caps.
    pub aggregate: AggregateConfig,
}

impl Default for EventsConfig {
    fn default() -> Self {
        EventsConfig {
            queue_capacity: 65536,
            sink: SinkConfig::default(),
            store: None,
            aggregate: AggregateConfig::default(),
        }
    }
}

impl EventsConfig {
    /// The configuration the quickstart uses: no JSON-lines sink, store on with defaults.
    pub fn quickstart() -> Self {
        EventsConfig {
            store: Some(StoreConfig::default()),
            ..EventsConfig::default()
        }
    }

    /// Checks every limit; [`crate::EventWriter::start`] calls it.
    pub fn validate(&self) -> Result<(), EventsError> {
        let err = |m: String| Err(EventsError::Config(m));
        if self.queue_capacity == 0 || self.queue_capacity > MAX_QUEUE_CAPACITY {
            return err(format!(
                "queue_capacity must be between 1 and {MAX_QUEUE_CAPACITY}, got {}",
                self.queue_capacity
            ));
        }
        if self.sink.kind == SinkKind::File {
            if self.sink.path.as_os_str().is_empty() {
                return err("sink.path must not be empty for a file sink".into());
            }
            if self.sink.max_bytes < 4096 {
                return err(format!(
                    "sink.max_bytes must be at least 4096, got {}",
                    self.sink.max_bytes
                ));
            }
            if self.sink.max_files > 1000 {
                return err(format!(
                    "sink.max_files must be at most 1000, got {}",
                    self.sink.max_files
                ));
            }
        }
        let agg = &self.aggregate;
        if agg.window > MAX_AGGREGATE_WINDOW {
            return err(format!(
                "aggregate.window must be at most 1h (0s turns aggregation off), got {}",
                humantime::format_duration(agg.window)
            ));
        }
        if agg.client_cap == 0 {
            return err("aggregate.client_cap must be at least 1".into());
        }
        if agg.max_keys == 0 || agg.max_keys > MAX_AGGREGATE_KEYS {
            return err(format!(
                "aggregate.max_keys must be between 1 and {MAX_AGGREGATE_KEYS}, got {}",
                agg.max_keys
            ));
        }
        if let Some(store) = &self.store {
            if store.path.as_os_str().is_empty() {
                return err("store.path must not be empty".into());
            }
            if store.batch_interval < Duration::from_millis(1)
                || store.batch_interval > Duration::from_secs(10)
            {
                return err(format!(
                    "store.batch_interval must be between 1ms and 10s, got {}",
                    humantime::format_duration(store.batch_interval)
                ));
            }
            if store.retention_age < Duration::from_secs(60) {
                return err("store.retention_age must be at least 1m".into());
            }
            if store.retention_max_bytes < (1 << 20) {
                return err(format!(
                    "store.retention_max_bytes must be at least 1MiB, got {}",
                    store.retention_max_bytes
                ));
            }
            if store.batch_max == 0 || store.batch_max > 1 << 20 {
                return err(format!(
                    "store.batch_max must be between 1 and {}, got {}",
                    1 << 20,
                    store.batch_max
                ));
            }
        }
        Ok(())
    }

    /// Records the writer takes from the queue before it writes a batch.
    pub fn batch_max(&self) -> usize {
        self.store
            .as_ref()
            .map(|s| s.batch_max)
            .unwrap_or(DEFAULT_BATCH_MAX)
    }

    /// Longest time a record waits in the writer before it is written.
    pub fn batch_interval(&self) -> Duration {
        self.store
            .as_ref()
            .map(|s| s.batch_interval)
            .unwrap_or(Duration::from_millis(200))
    }
}

/// Longest accepted `aggregate.window`.
pub const MAX_AGGREGATE_WINDOW: Duration = Duration::from_secs(3600);

/// Largest accepted `aggregate.max_keys`.
pub const MAX_AGGREGATE_KEYS: usize = 1 << 20;

/// The `events.aggregate` section: flood control (see [`crate::aggregate`]).
///
/// ```yaml
/// events:
///   aggregate: { window: 10s, client_cap: 100, max_keys: 8192 }
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AggregateConfig {
    /// Identical events within this window are one record with a count
    /// (default 10s, at most 1h; 0s turns aggregation and the cap off). It is
    /// also the longest a repeat's count waits before it is written.
    #[serde(with = "moat_config::duration")]
    pub window: Duration,
    /// New (not aggregated) security and refused-request records one client may
    /// cause per window; the rest are counted in one record (default 100).
    pub client_cap: u32,
    /// Open aggregation keys, and client windows, kept at most (default 8192;
    /// each holds one record, about 1 KiB).
    pub max_keys: usize,
}

impl Default for AggregateConfig {
    fn default() -> Self {
        AggregateConfig {
            window: Duration::from_secs(10),
            client_cap: 100,
            max_keys: 8192,
        }
    }
}

/// Kind of JSON-lines sink.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SinkKind {
    /// One JSON object per line on standard output.
    Stdout,
    /// One JSON object per line in a size-rotated file.
    File,
    /// No JSON-lines output.
    None,
}

/// The `events.sink` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SinkConfig {
    /// `stdout`, `file` or `none` (default).
    #[serde(rename = "type")]
    pub kind: SinkKind,
    /// File sink path, relative to the config file's directory (default `moat-events.jsonl`).
    pub path: PathBuf,
    /// Rotate when the active file would exceed this size (default 100MiB, at least 4096).
    #[serde(with = "moat_config::byte_size")]
    pub max_bytes: u64,
    /// Rotated files kept besides the active one: `path.1` (newest) .. `path.N` (default 5; 0 = truncate on rotation).
    pub max_files: u32,
}

impl Default for SinkConfig {
    fn default() -> Self {
        SinkConfig {
            kind: SinkKind::None,
            path: PathBuf::from("moat-events.jsonl"),
            max_bytes: 100 << 20,
            max_files: 5,
        }
    }
}

/// The `events.store` section: the persistent SQLite event store.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// Database file, relative to the config file's directory (default `moat-events.db`).
    pub path: PathBuf,
    /// Longest time an accepted record waits before its batch is committed
    /// (default 200ms, 1ms..10s). A kill -9 loses at most this much.
    #[serde(with = "moat_config::duration")]
    pub batch_interval: Duration,
    /// Records older than this are deleted (default 7d, at least 1m).
    #[serde(with = "moat_config::duration")]
    pub retention_age: Duration,
    /// The database is kept under this size by deleting the oldest records (default 1GiB, at least 1MiB).
    #[serde(with = "moat_config::byte_size")]
    pub retention_max_bytes: u64,
    /// Largest batch (records per transaction) (default 16384).
    pub batch_max: usize,
    /// Whether access records are stored too (default true); security and TLS records always are.
    pub access: bool,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            path: PathBuf::from("moat-events.db"),
            batch_interval: Duration::from_millis(200),
            retention_age: Duration::from_secs(7 * 24 * 3600),
            retention_max_bytes: 1 << 30,
            batch_max: 16384,
            access: true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn yaml_round_trip_and_defaults() {
        let text = "queue_capacity: 1000\nsink:\n  type: file\n  path: ev.jsonl\n  max_bytes: 1MiB\n  max_files: 3\nstore:\n  batch_interval: 100ms\n  retention_age: 2d\n";
        let c: EventsConfig = moat_config::from_str(Path::new("moat.yaml"), text).unwrap();
        assert_eq!(c.queue_capacity, 1000);
        assert_eq!(c.sink.kind, SinkKind::File);
        assert_eq!(c.sink.max_bytes, 1 << 20);
        let s = c.store.as_ref().unwrap();
        assert_eq!(s.batch_interval, Duration::from_millis(100));
        assert_eq!(s.retention_age, Duration::from_secs(2 * 86400));
        assert_eq!(s.path, PathBuf::from("moat-events.db"));
        assert_eq!(s.retention_max_bytes, 1 << 30);
        c.validate().unwrap();
        let d = EventsConfig::default();
        assert_eq!(d.queue_capacity, 65536);
        assert_eq!(d.sink.kind, SinkKind::None);
        assert!(d.store.is_none());
        assert_eq!(d.aggregate.window, Duration::from_secs(10));
        let c: EventsConfig = moat_config::from_str(
            Path::new("moat.yaml"),
            "aggregate: { window: 0s, client_cap: 5 }\n",
        )
        .unwrap();
        assert_eq!(
            (c.aggregate.window, c.aggregate.client_cap),
            (Duration::ZERO, 5)
        );
    }

    #[test]
    fn unknown_field_is_located() {
        let e = moat_config::from_str::<EventsConfig>(
            Path::new("moat.yaml"),
            "sink:\n  type: file\n  rotate: 3\n",
        )
        .unwrap_err();
        assert!(e.message.contains("unknown field `rotate`"), "{e}");
        assert_eq!(e.line, 3);
    }

    #[test]
    fn limits_are_checked() {
        let mut c = EventsConfig {
            queue_capacity: 0,
            ..EventsConfig::default()
        };
        assert!(c.validate().is_err());
        c.queue_capacity = 10;
        c.store = Some(StoreConfig {
            batch_interval: Duration::from_secs(11),
            ..StoreConfig::default()
        });
        assert!(c.validate().is_err());
        c.store = Some(StoreConfig {
            retention_max_bytes: 1000,
            ..StoreConfig::default()
        });
        assert!(c.validate().is_err());
        c.store = None;
        c.aggregate.window = Duration::from_secs(7200);
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("aggregate.window"));
        c.aggregate = AggregateConfig {
            client_cap: 0,
            ..AggregateConfig::default()
        };
        assert!(c.validate().is_err());
        c.aggregate = AggregateConfig {
            max_keys: usize::MAX,
            ..AggregateConfig::default()
        };
        assert!(c.validate().is_err());
        c.aggregate = AggregateConfig::default();
        c.validate().unwrap();
        c.sink.kind = SinkKind::File;
        c.sink.max_bytes = 10;
        assert!(c.validate().is_err());
        EventsConfig::quickstart().validate().unwrap();
    }
}
