//! The SQLite file behind the API inventory: one row per endpoint (method,
//! path template, the endpoint as JSON), WAL mode, upserted in one transaction
//! per flush.

use std::path::{Path, PathBuf};
use std::time::Duration;

use moat_schema::{Endpoint, InventorySink};
use rusqlite::{Connection, OpenFlags};

use crate::InventoryError;

/// The SQLite file behind the inventory.
pub struct InventoryStore {
    path: PathBuf,
    conn: Connection,
}

impl std::fmt::Debug for InventoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InventoryStore")
            .field("path", &self.path)
            .finish()
    }
}

fn store_err(path: &Path) -> impl Fn(rusqlite::Error) -> InventoryError + '_ {
    move |source| InventoryError::Store {
        path: path.to_path_buf(),
        source,
    }
}

impl InventoryStore {
    /// Opens (creating) the inventory database.
    pub fn open(path: &Path) -> Result<InventoryStore, InventoryError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|source| InventoryError::Io {
                path: dir.to_path_buf(),
                source,
            })?;
        }
        let err = store_err(path);
        let conn = Connection::open(path).map_err(&err)?;
        conn.busy_timeout(Duration::from_secs(5)).map_err(&err)?;
        conn.execute_batch(
            "PRAGMA journal_mode=WAL;
             PRAGMA synchronous=NORMAL;
             CREATE TABLE IF NOT EXISTS endpoints (
                 method TEXT NOT NULL,
                 path TEXT NOT NULL,
                 data TEXT NOT NULL,
                 PRIMARY KEY (method, path)
             );",
        )
        .map_err(&err)?;
        Ok(InventoryStore {
            path: path.to_path_buf(),
            conn,
        })
    }

    /// Opens an existing inventory for reading (`moat apis export`).
    pub fn open_read_only(path: &Path) -> Result<InventoryStore, InventoryError> {
        let err = store_err(path);
        let conn =
            Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY).map_err(&err)?;
        conn.busy_timeout(Duration::from_secs(5)).map_err(&err)?;
        Ok(InventoryStore {
            path: path.to_path_buf(),
            conn,
        })
    }

    /// Every stored endpoint (rows that do not parse are skipped), sorted by path then method.
    pub fn load(&self) -> Result<Vec<Endpoint>, InventoryError> {
        let err = store_err(&self.path);
        let mut stmt = self
            .conn
            .prepare("SELECT data FROM endpoints ORDER BY path, method")
            .map_err(&err)?;
        let rows = stmt
            .query_map([], |r| r.get::<_, String>(0))
            .map_err(&err)?;
        let mut out = Vec::new();
        for r in rows {
            if let Ok(ep) = serde_json::from_str::<Endpoint>(&r.map_err(&err)?) {
                out.push(ep);
            }
        }
        Ok(out)
    }

    /// Upserts endpoints in one transaction.
    pub fn save(&mut self, endpoints: &[Endpoint]) -> Result<(), InventoryError> {
        let err = store_err(&self.path);
        let tx = self.conn.transaction().map_err(&err)?;
        {
            let mut stmt = tx
                .prepare_cached(
                    "INSERT INTO endpoints (method, path, data) VALUES (?1, ?2, ?3)
                     ON CONFLICT(method, path) DO UPDATE SET data = excluded.data",
                )
                .map_err(&err)?;
            for ep in endpoints {
                let data = serde_json::to_string(ep).unwrap_or_default();
                stmt.execute(rusqlite::params![ep.method, ep.path, data])
                    .map_err(&err)?;
            }
        }
        tx.commit().map_err(&err)
    }
}

impl InventorySink for InventoryStore {
    type Error = InventoryError;

    fn save(&mut self, endpoints: &[Endpoint]) -> Result<(), InventoryError> {
        InventoryStore::save(self, endpoints)
    }
}
