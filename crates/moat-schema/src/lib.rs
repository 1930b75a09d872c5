//! API discovery for moat.
//!
//! - [`schema`]: the libddwaf `extract_schema` encoding (type codes, arrays with
//!   `len`/`truncated`, records, limits 18/10/255), built while JSON is parsed;
//! - [`scanner`]: sensitive-data scanners that tag string nodes (email, cards
//!   with Luhn, IBAN with mod 97, phone, US SSN, Canadian SIN, UK NIN,
//!   passport, VIN, JWT, bearer/basic/digest credentials, IP addresses);
//! - [`template`](mod@template): path templating (`/users/123` -> `/users/{id}`);
//! - [`discovery`]: the sampled after-response phase, and the extraction and
//!   merging done on its samples off the request path;
//! - [`inventory`]: endpoints with merged schemas, in memory;
//! - [`openapi`]: OpenAPI 3.1 export.
//!
//! The crate is pure: no thread, no file, no database. Sampled exchanges leave
//! through a [`SampleQueue`] and changed endpoints through an
//! [`InventorySink`]; moat-inventory provides both (a worker thread and a
//! SQLite file).

#![warn(missing_docs)]

pub mod discovery;
pub mod inventory;
pub mod openapi;
pub mod scanner;
pub mod schema;
pub mod template;

pub use discovery::{
    apis_endpoint, Discovery, DiscoveryConfig, DiscoveryStats, InventorySink, SampleQueue,
};
pub use inventory::{Endpoint, SensitiveField};
pub use scanner::{Scanner, Scanners, Tags};
pub use schema::{from_json, Node};
pub use template::template;

/// A discovery configuration out of its allowed range.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    /// The configuration is out of its allowed range.
    #[error("discovery config: {0}")]
    Config(String),
}
