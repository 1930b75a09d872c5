//! moat's event pipeline: a bounded, never-blocking queue filled by the proxy,
//! drained by one background OS thread into a JSON-lines sink (stdout or a
//! rotating file) and, optionally, a persistent SQLite store.
//!
//! ```text
//! request threads --push()--> Aggregator (repeats counted, per-client cap)
//!                                   |
//!                              EventQueue (bounded, drop when full)
//!                                   |
//!                        writer thread (batches)
//!                          |                  |
//!                JSON lines sink        SQLite store (WAL, one
//!              (stdout / rotating file)  transaction per batch)
//!                          |
//!                further [`RecordSink`]s (moat-sinks: Kafka, syslog, HTTP)
//! ```
//!
//! Before the queue, [`aggregate`] turns floods of identical security events into
//! one record with a count per window and caps the records one client can cause.
//!
//! Memory is bounded under any load: at most `queue_capacity` records wait in
//! the queue and at most [`StoreConfig::batch_max`] (or [`DEFAULT_BATCH_MAX`]
//! without a store) are held by the writer while it writes a batch. A push on a
//! full queue returns `false` at once and is counted in [`EventQueue::dropped`].

#![warn(missing_docs)]

pub mod aggregate;
pub mod config;
pub mod http_api;
pub mod record;
pub mod sink;
pub mod store;
pub mod text;
mod writer;

pub use aggregate::Counted;
pub use config::{
    AggregateConfig, EventsConfig, SinkConfig, SinkKind, StoreConfig, DEFAULT_BATCH_MAX,
};
pub use record::{
    now_ms, AccessRecord, Record, RequestSummary, SecurityRecord, TcpRecord, TlsRecord,
};
pub use sink::RecordSink;
pub use store::{EventQuery, EventStore, QueryError, Timeline};
pub use writer::{EventQueue, EventWriter};

use std::path::PathBuf;

/// Why the event pipeline could not start or a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum EventsError {
    /// The configuration is out of its allowed range.
    #[error("events config: {0}")]
    Config(String),
    /// A sink or store file could not be created or written.
    #[error("{path}: {source}")]
    Io {
        /// The file involved.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// SQLite reported an error.
    #[error("event store {path}: {source}")]
    Store {
        /// The database file.
        path: PathBuf,
        /// The underlying error.
        source: rusqlite::Error,
    },
    /// The writer thread could not be spawned.
    #[error("cannot start the event writer thread: {0}")]
    Thread(std::io::Error),
}
