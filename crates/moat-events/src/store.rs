//! The persistent event store: SQLite in WAL mode.
//!
//! One table, `events(id, ts, kind, engine, route, action, request_id, data)`,
//! where `data` is the record's JSON line and the other columns are indexed
//! copies used by queries. The background writer inserts one transaction per
//! batch; retention deletes by age and, past the size limit, the oldest rows,
//! then returns free pages to the OS with `PRAGMA incremental_vacuum`.
//!
//! Durability: `journal_mode=WAL` with `synchronous=NORMAL` makes a committed
//! batch survive the death of the process (kill -9); an OS crash or power loss
//! may lose the last commits (not corrupt the database).

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use rusqlite::{params_from_iter, Connection, OpenFlags};

use crate::record::Record;
use crate::EventsError;

/// Default number of events a query returns.
pub const DEFAULT_QUERY_LIMIT: usize = 100;
/// Largest number of events a query returns.
pub const MAX_QUERY_LIMIT: usize = 10_000;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY,
    ts INTEGER NOT NULL,
    kind TEXT NOT NULL,
    engine TEXT,
    route TEXT,
    action TEXT,
    request_id TEXT,
    data TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_ts ON events(ts);
";

/// A handle on the event database. Shareable between threads (`Arc<EventStore>`);
/// each handle has its own SQLite connection, so readers never wait for the writer's batches.
pub struct EventStore {
    path: PathBuf,
    conn: Mutex<Connection>,
}

impl std::fmt::Debug for EventStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventStore")
            .field("path", &self.path)
            .finish()
    }
}

/// Filters of [`EventStore::query`]. Every filter is optional; results are newest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventQuery {
    /// Only events at or after this time (unix ms).
    pub since: Option<u64>,
    /// Only events before this time (unix ms).
    pub until: Option<u64>,
    /// Record type (`access`, `security`, `tls`) or engine (`waf`, `authz`, `authn`, `secrets`, `limits`).
    pub kind: Option<String>,
    /// Route name.
    pub route: Option<String>,
    /// Decision or action: `allow`, `block`, `monitor`, `error`, `redact`, `bypass`.
    pub action: Option<String>,
    /// Maximum number of events returned (1..=10000, default 100).
    pub limit: usize,
}

impl Default for EventQuery {
    fn default() -> Self {
        EventQuery {
            since: None,
            until: None,
            kind: None,
            route: None,
            action: None,
            limit: DEFAULT_QUERY_LIMIT,
        }
    }
}

/// A query parameter that could not be understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{param}: {message}")]
pub struct QueryError {
    /// The parameter name.
    pub param: String,
    /// What is wrong with it.
    pub message: String,
}

impl EventQuery {
    /// Parses a URL query string such as `since=1h&type=waf&route=api&limit=100`.
    /// Unknown parameters are an error. `now_ms` is the reference for relative times.
    pub fn from_query_string(qs: &str, now_ms: u64) -> Result<EventQuery, QueryError> {
        let mut q = EventQuery::default();
        for pair in qs.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let k = decode_component(k);
            let v = decode_component(v);
            q.set(&k, &v, now_ms)?;
        }
        Ok(q)
    }

    /// Sets one parameter by name (`since`, `until`, `type`, `route`, `action`, `limit`).
    pub fn set(&mut self, key: &str, value: &str, now_ms: u64) -> Result<(), QueryError> {
        let bad = |m: String| QueryError {
            param: key.to_string(),
            message: m,
        };
        let nonempty = |v: &str| -> Result<String, QueryError> {
            if v.is_empty() {
                Err(bad("must not be empty".into()))
            } else if v.len() > 256 {
                Err(bad("longer than 256 bytes".into()))
            } else {
                Ok(v.to_string())
            }
        };
        match key {
            "since" => self.since = Some(parse_time(value, now_ms).map_err(bad)?),
            "until" => self.until = Some(parse_time(value, now_ms).map_err(bad)?),
            "type" | "engine" => self.kind = Some(nonempty(value)?),
            "route" => self.route = Some(nonempty(value)?),
            "action" | "decision" => self.action = Some(nonempty(value)?),
            "limit" => {
                let n: usize = value
                    .parse()
                    .map_err(|_| bad(format!("`{value}` is not a number")))?;
                if n == 0 || n > MAX_QUERY_LIMIT {
                    return Err(bad(format!("must be between 1 and {MAX_QUERY_LIMIT}")));
                }
                self.limit = n;
            }
            other => {
                return Err(QueryError {
                    param: other.to_string(),
                    message:
                        "unknown parameter (expected since, until, type, route, action, limit)"
                            .into(),
                })
            }
        }
        Ok(())
    }
}

fn decode_component(s: &str) -> String {
    let plus = s.replace('+', " ");
    percent_encoding::percent_decode_str(&plus)
        .decode_utf8_lossy()
        .into_owned()
}

/// Parses a point in time: a duration ago (`90s`, `1h`, `7d`), an RFC 3339
/// timestamp (`2026-11-21T10:00:00Z`), or unix milliseconds.
pub fn parse_time(s: &str, now_ms: u64) -> Result<u64, String> {
    let s = s.trim();
    if s.is_empty() {
        return Err("empty time".into());
    }
    if s.bytes().all(|b| b.is_ascii_digit()) {
        return s
            .parse::<u64>()
            .map_err(|_| format!("`{s}` is out of range"));
    }
    if let Ok(d) = humantime::parse_duration(s) {
        return Ok(now_ms.saturating_sub(d.as_millis().min(u64::MAX as u128) as u64));
    }
    if let Ok(t) = humantime::parse_rfc3339_weak(s) {
        return Ok(t
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0));
    }
    Err(format!(
        "`{s}` is neither a duration (`1h`), an RFC 3339 time nor unix milliseconds"
    ))
}

impl EventStore {
    /// Opens (creating if needed) the database for reading and writing.
    pub fn open(path: &Path) -> Result<EventStore, EventsError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|source| EventsError::Io {
                path: dir.to_path_buf(),
                source,
            })?;
        }
        let err = store_err(path);
        let conn = Connection::open(path).map_err(err)?;
        conn.busy_timeout(Duration::from_secs(5)).map_err(err)?;
        // auto_vacuum must be chosen before the first table exists.
        conn.execute_batch(
            "PRAGMA auto_vacuum=INCREMENTAL;
             PRAGMA journal_mode=WAL;
             PRAGMA synchronous=NORMAL;
             PRAGMA journal_size_limit=67108864;
             PRAGMA cache_size=-32768;
             PRAGMA temp_store=MEMORY;",
        )
        .map_err(err)?;
        conn.execute_batch(SCHEMA).map_err(err)?;
        Ok(EventStore {
            path: path.to_path_buf(),
            conn: Mutex::new(conn),
        })
    }

    /// Opens an existing database for queries only (`moat events`, the admin API).
    pub fn open_read_only(path: &Path) -> Result<EventStore, EventsError> {
        let err = store_err(path);
        let conn = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(err)?;
        conn.busy_timeout(Duration::from_secs(5)).map_err(err)?;
        // Fails here, not at the first query, when the file is not an event store.
        conn.query_row(
            "SELECT count(*) FROM sqlite_master WHERE name='events'",
            [],
            |r| r.get::<_, i64>(0),
        )
        .map_err(err)
        .and_then(|n| {
            if n == 1 {
                Ok(())
            } else {
                Err(EventsError::Config(format!(
                    "{} is not a moat event store (no `events` table)",
                    path.display()
                )))
            }
        })?;
        Ok(EventStore {
            path: path.to_path_buf(),
            conn: Mutex::new(conn),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Connection> {
        // A panic while holding the lock cannot leave the connection inconsistent
        // (SQLite rolls back an unfinished transaction), so a poisoned lock is reused.
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Inserts records in one transaction, serializing each.
    pub fn insert(&self, records: &[Record]) -> Result<usize, EventsError> {
        let lines: Vec<(&Record, String)> = records
            .iter()
            .filter_map(|r| serde_json::to_string(r).ok().map(|s| (r, s)))
            .collect();
        let rows: Vec<(&Record, &str)> = lines.iter().map(|(r, s)| (*r, s.as_str())).collect();
        self.insert_serialized(&rows)
    }

    /// Inserts already serialized records (record, its JSON) in one transaction.
    pub fn insert_serialized(&self, rows: &[(&Record, &str)]) -> Result<usize, EventsError> {
        let err = store_err(&self.path);
        let mut conn = self.lock();
        let tx = conn.transaction().map_err(err)?;
        {
            let mut stmt = tx
                .prepare_cached(
                    "INSERT INTO events (ts, kind, engine, route, action, request_id, data)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                )
                .map_err(err)?;
            for (rec, json) in rows {
                stmt.execute(rusqlite::params![
                    rec.ts().min(i64::MAX as u64) as i64,
                    rec.kind(),
                    rec.engine(),
                    rec.route(),
                    rec.action(),
                    rec.request_id(),
                    json,
                ])
                .map_err(err)?;
            }
        }
        tx.commit().map_err(err)?;
        Ok(rows.len())
    }

    /// Deletes records older than `max_age` before `now_ms`, then the oldest
    /// records until the live data fits in `max_bytes`, and returns freed
    /// pages to the OS. Returns the number of deleted records.
    pub fn apply_retention(
        &self,
        now_ms: u64,
        max_age: Duration,
        max_bytes: u64,
    ) -> Result<u64, EventsError> {
        let err = store_err(&self.path);
        let conn = self.lock();
        let cutoff = now_ms.saturating_sub(max_age.as_millis().min(u64::MAX as u128) as u64);
        let mut deleted = conn
            .execute(
                "DELETE FROM events WHERE ts < ?1",
                [cutoff.min(i64::MAX as u64) as i64],
            )
            .map_err(err)? as u64;
        // Size: live pages (page_count - freelist_count) x page_size.
        for _ in 0..64 {
            let used = used_bytes(&conn).map_err(err)?;
            if used <= max_bytes {
                break;
            }
            let (min_id, max_id): (Option<i64>, Option<i64>) = conn
                .query_row("SELECT min(id), max(id) FROM events", [], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })
                .map_err(err)?;
            let (Some(min_id), Some(max_id)) = (min_id, max_id) else {
                break;
            };
            // Delete the oldest share of rows that brings the size to 90% of the limit.
            let span = (max_id - min_id + 1).max(1) as u128;
            let target = (max_bytes as u128) * 9 / 10;
            let excess = (used as u128).saturating_sub(target);
            let n = ((span * excess).div_ceil(used.max(1) as u128)).max(1) as i64;
            deleted += conn
                .execute("DELETE FROM events WHERE id < ?1", [min_id + n])
                .map_err(err)? as u64;
        }
        if deleted > 0 {
            conn.execute_batch("PRAGMA incremental_vacuum;")
                .map_err(err)?;
        }
        Ok(deleted)
    }

    /// Frees the connection's page cache (it refills as pages are read again),
    /// so an idle writer does not keep a flood's cache resident.
    pub fn release_memory(&self) -> Result<(), EventsError> {
        self.lock()
            .execute_batch("PRAGMA shrink_memory;")
            .map_err(store_err(&self.path))
    }

    /// Copies the write-ahead log into the database file and truncates it.
    pub fn checkpoint(&self) -> Result<(), EventsError> {
        self.lock()
            .execute_batch("PRAGMA wal_checkpoint(TRUNCATE);")
            .map_err(store_err(&self.path))
    }

    /// Bytes of the database holding live data (excludes free pages).
    pub fn used_bytes(&self) -> Result<u64, EventsError> {
        used_bytes(&self.lock()).map_err(store_err(&self.path))
    }

    /// Number of stored records.
    pub fn count(&self) -> Result<u64, EventsError> {
        self.lock()
            .query_row("SELECT count(*) FROM events", [], |r| r.get::<_, i64>(0))
            .map(|n| n.max(0) as u64)
            .map_err(store_err(&self.path))
    }

    /// Returns matching records, newest first, each as its JSON object plus its store `id`.
    pub fn query(&self, q: &EventQuery) -> Result<Vec<serde_json::Value>, EventsError> {
        let mut sql = String::from("SELECT id, data FROM events WHERE 1=1");
        let mut args: Vec<rusqlite::types::Value> = Vec::new();
        if let Some(s) = q.since {
            sql.push_str(" AND ts >= ?");
            args.push((s.min(i64::MAX as u64) as i64).into());
        }
        if let Some(u) = q.until {
            sql.push_str(" AND ts < ?");
            args.push((u.min(i64::MAX as u64) as i64).into());
        }
        if let Some(k) = &q.kind {
            sql.push_str(" AND (kind = ? OR engine = ?)");
            args.push(k.clone().into());
            args.push(k.clone().into());
        }
        if let Some(r) = &q.route {
            sql.push_str(" AND route = ?");
            args.push(r.clone().into());
        }
        if let Some(a) = &q.action {
            sql.push_str(" AND action = ?");
            args.push(a.clone().into());
        }
        sql.push_str(" ORDER BY ts DESC, id DESC LIMIT ?");
        args.push((q.limit.clamp(1, MAX_QUERY_LIMIT) as i64).into());

        let err = store_err(&self.path);
        let conn = self.lock();
        let mut stmt = conn.prepare_cached(&sql).map_err(err)?;
        let rows = stmt
            .query_map(params_from_iter(args), |r| {
                Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?))
            })
            .map_err(err)?;
        let mut out = Vec::new();
        for row in rows {
            let (id, data) = row.map_err(err)?;
            let mut v: serde_json::Value =
                serde_json::from_str(&data).unwrap_or(serde_json::Value::String(data));
            if let Some(obj) = v.as_object_mut() {
                obj.insert("id".into(), id.into());
            }
            out.push(v);
        }
        Ok(out)
    }
}

fn used_bytes(conn: &Connection) -> rusqlite::Result<u64> {
    let page_size: i64 = conn.query_row("PRAGMA page_size", [], |r| r.get(0))?;
    let page_count: i64 = conn.query_row("PRAGMA page_count", [], |r| r.get(0))?;
    let free: i64 = conn.query_row("PRAGMA freelist_count", [], |r| r.get(0))?;
    Ok(((page_count - free).max(0) as u64) * page_size.max(0) as u64)
}

fn store_err(path: &Path) -> impl Fn(rusqlite::Error) -> EventsError + Copy + '_ {
    move |source| EventsError::Store {
        path: path.to_path_buf(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_string_parses() {
        let now = 10_000_000;
        let q = EventQuery::from_query_string("since=1h&type=waf&route=api&limit=5", now).unwrap();
        assert_eq!(q.since, Some(now - 3_600_000));
        assert_eq!(q.kind.as_deref(), Some("waf"));
        assert_eq!(q.route.as_deref(), Some("api"));
        assert_eq!(q.limit, 5);
        let q = EventQuery::from_query_string("route=my%20api&action=block", now).unwrap();
        assert_eq!(q.route.as_deref(), Some("my api"));
        assert_eq!(q.limit, DEFAULT_QUERY_LIMIT);
        assert!(EventQuery::from_query_string("limit=0", now).is_err());
        assert!(EventQuery::from_query_string("limit=99999", now).is_err());
        assert!(EventQuery::from_query_string("since=yesterday", now).is_err());
        assert_eq!(
            EventQuery::from_query_string("bogus=1", now)
                .unwrap_err()
                .param,
            "bogus"
        );
        assert_eq!(parse_time("1234", now).unwrap(), 1234);
        assert_eq!(
            parse_time("2026-01-01T00:00:00Z", now).unwrap(),
            1_767_225_600_000
        );
    }
}
