//! Where `moat events` and `moat apis` find their databases.
//!
//! In order: `--db FILE`; `--data-dir DIR` or `MOAT_DATA_DIR` (then `DIR/<name>`);
//! `./<name>` when it exists; `./moat-quickstart/<name>` (where `moat serve` without
//! --config keeps its data) when it exists. Nothing found is an error naming every
//! path tried.

use std::path::{Path, PathBuf};

/// The directory the quickstart keeps its data in by default.
pub const QUICKSTART_DIR: &str = "moat-quickstart";

/// The event store's file name (the quickstart's `events.store.path`).
pub const EVENTS_DB: &str = "moat-events.db";

/// The API inventory's file name (the default `discovery.inventory`).
pub const APIS_DB: &str = "moat-apis.db";

/// Finds the database `name` as described in the module documentation.
pub fn resolve(db: Option<&Path>, data_dir: Option<&Path>, name: &str) -> Result<PathBuf, String> {
    if let Some(db) = db {
        return Ok(db.to_path_buf());
    }
    if let Some(dir) = data_dir {
        let p = dir.join(name);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!("{} does not exist", p.display()))
        };
    }
    let candidates = [PathBuf::from(name), Path::new(QUICKSTART_DIR).join(name)];
    if let Some(p) = candidates.iter().find(|p| p.is_file()) {
        return Ok(p.clone());
    }
    Err(format!(
        "no {name} found: tried ./{} and ./{} (pass --db FILE or --data-dir DIR, the directory `moat serve` printed)",
        candidates[0].display(),
        candidates[1].display()
    ))
}
