//! The API inventory at run time: what moat-schema's pure discovery engine
//! needs from outside.
//!
//! - [`DiscoveryWorker`]: starts the engine ([`moat_schema::Discovery`]) over
//!   the stored inventory, with a bounded queue of sampled exchanges drained by
//!   one background thread; the thread extracts and merges each sample
//!   ([`moat_schema::Discovery::process`]) and writes the changed endpoints
//!   every `flush_interval` ([`moat_schema::Discovery::flush`]);
//! - [`InventoryStore`]: the SQLite file the endpoints are written to, and
//!   read back at start and by `moat apis`.

#![warn(missing_docs)]

mod store;
mod worker;

pub use store::InventoryStore;
pub use worker::{DiscoveryWorker, DRAIN_INTERVAL};

use std::path::{Path, PathBuf};

use moat_schema::{DiscoveryError, Endpoint};

/// Why discovery could not start or the inventory could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    /// The configuration is out of its allowed range.
    #[error(transparent)]
    Config(#[from] DiscoveryError),
    /// A directory could not be created.
    #[error("{path}: {source}")]
    Io {
        /// The path involved.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// SQLite reported an error.
    #[error("API inventory {path}: {source}")]
    Store {
        /// The database file.
        path: PathBuf,
        /// The underlying error.
        source: rusqlite::Error,
    },
    /// The worker thread could not be spawned.
    #[error("cannot start the discovery worker thread: {0}")]
    Thread(std::io::Error),
}

/// Reads a persisted inventory (for `moat apis export` while or after the proxy runs).
pub fn load_inventory(path: &Path) -> Result<Vec<Endpoint>, InventoryError> {
    InventoryStore::open_read_only(path)?.load()
}
