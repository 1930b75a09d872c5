//! API discovery for moat.
//!
//! - [`schema`]: the libddwaf `extract_schema` encoding (type codes, arrays with
//!   `len`/`truncated`, records, limits 18/10/255), built while JSON is parsed;
//! - [`scanner`]: sensitive-data scanners that tag string nodes (email, cards
//!   with Luhn, IBAN with mod 97, phone, US SSN, Canadian SIN, UK NIN,
//!   passport, VIN, JWT, bearer/basic/digest credentials, IP addresses);
//! - [`template`](mod@template): path templating (`/users/123` -> `/users/{id}`);
//! - [`discovery`]: the sampled after-response phase, its worker and the inventory;
//! - [`inventory`]: endpoints with merged schemas, persisted in SQLite;
//! - [`openapi`]: OpenAPI 3.1 export.

#![warn(missing_docs)]

pub mod discovery;
pub mod inventory;
pub mod openapi;
pub mod scanner;
pub mod schema;
pub mod template;

pub use discovery::{apis_endpoint, Discovery, DiscoveryConfig, DiscoveryStats};
pub use inventory::{Endpoint, InventoryStore, SensitiveField};
pub use scanner::{Scanner, Scanners, Tags};
pub use schema::{from_json, Node};
pub use template::template;

use std::path::{Path, PathBuf};

/// Why discovery could not start or the inventory could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    /// The configuration is out of its allowed range.
    #[error("discovery config: {0}")]
    Config(String),
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
pub fn load_inventory(path: &Path) -> Result<Vec<Endpoint>, DiscoveryError> {
    InventoryStore::open_read_only(path)?.load()
}
