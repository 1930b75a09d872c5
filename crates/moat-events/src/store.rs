//! The persistent event store: SQLite in WAL mode.
//!
//! One table, `events(id, ts, kind, engine, route, action, request_id, data, rule,
//! client_ip_hash, request_id_hash, event_id_hash)`, where `data` is the record's JSON
//! line and the other columns are copies of the fields queries filter on, one index on
//! `(ts, id, client_ip_hash, request_id_hash, event_id_hash)`, and the per-slice counts
//! of [`rollup`] for the timeline and the other filters; see the private `schema`
//! module (and docs/events.md) for why, and for the upgrade of a store written by an
//! older moat.
//! The background writer inserts one transaction per batch; retention deletes by age
//! and, past the size limit, the oldest rows, then returns free pages to the OS with
//! `PRAGMA incremental_vacuum`.
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

pub mod rollup;
mod schema;

use rollup::{stored_ts, BatchCounts};
use schema::{key_hash, SchemaError};

/// Default number of events a query returns.
pub const DEFAULT_QUERY_LIMIT: usize = 100;
/// Largest number of events a query returns.
pub const MAX_QUERY_LIMIT: usize = 10_000;

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
    /// Rule, detector or policy of a security event (`sqli`, `ns/policy[rule 0]`), or
    /// the deciding policy of a tcp record.
    pub rule: Option<String>,
    /// Client IP, as recorded.
    pub client_ip: Option<String>,
    /// Request id.
    pub request_id: Option<String>,
    /// Event id of a security event (the `x-moat-event-id` of a refusal, the id on a
    /// block page).
    pub event_id: Option<String>,
    /// Only events after the one with this store id in the listing order (newest
    /// first): the next page of a listing (keyset pagination: each page costs the same
    /// however deep it is).
    pub before_id: Option<i64>,
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
            rule: None,
            client_ip: None,
            request_id: None,
            event_id: None,
            before_id: None,
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

    /// Sets one parameter by name (`since`, `until`, `type`, `route`, `action`, `rule`,
    /// `client_ip`, `request_id`, `event_id`, `before`, `limit`).
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
            "rule" => self.rule = Some(nonempty(value)?),
            "client_ip" | "ip" => self.client_ip = Some(nonempty(value)?),
            "request_id" => self.request_id = Some(nonempty(value)?),
            "event_id" => self.event_id = Some(nonempty(value)?),
            "before" => {
                let n: i64 = value
                    .parse()
                    .map_err(|_| bad(format!("`{value}` is not an event id")))?;
                self.before_id = Some(n);
            }
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
                    message: "unknown parameter (expected since, until, type, route, action, \
                              rule, client_ip, request_id, event_id, before, limit)"
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
    /// Opens (creating if needed) the database for reading and writing, upgrading a
    /// store written by an older moat (see `schema`): this is what the event writer calls.
    pub fn open(path: &Path) -> Result<EventStore, EventsError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|source| EventsError::Io {
                path: dir.to_path_buf(),
                source,
            })?;
        }
        let err = store_err(path);
        let mut conn = Connection::open(path).map_err(err)?;
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
        schema::prepare(&mut conn).map_err(schema_err(path))?;
        Ok(EventStore {
            path: path.to_path_buf(),
            conn: Mutex::new(conn),
        })
    }

    /// Opens an existing database for queries only (`moat events`, the admin API, the
    /// console). A store of another schema version is refused with a message naming it.
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
        schema::check(&conn).map_err(schema_err(path))?;
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

    /// Inserts already serialized records (record, its JSON) in one transaction, and
    /// adds them to the timeline's counts.
    pub fn insert_serialized(&self, rows: &[(&Record, &str)]) -> Result<usize, EventsError> {
        let err = store_err(&self.path);
        let mut conn = self.lock();
        let tx = conn.transaction().map_err(err)?;
        let mut counts = BatchCounts::default();
        {
            let mut stmt = tx
                .prepare_cached(
                    "INSERT INTO events (ts, kind, engine, route, action, request_id, data,
                                         rule, client_ip_hash, request_id_hash, event_id_hash)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
                )
                .map_err(err)?;
            for (rec, json) in rows {
                stmt.execute(rusqlite::params![
                    stored_ts(rec.ts()),
                    rec.kind(),
                    rec.engine(),
                    rec.route(),
                    rec.action(),
                    rec.request_id(),
                    json,
                    rec.rule(),
                    rec.client_ip().map(key_hash),
                    rec.request_id().map(key_hash),
                    rec.event_id().map(key_hash),
                ])
                .map_err(err)?;
                counts.add(rec);
            }
        }
        counts.write(&tx).map_err(err)?;
        tx.commit().map_err(err)?;
        Ok(rows.len())
    }

    /// Deletes records older than `max_age` before `now_ms`, then the oldest
    /// records until the live data fits in `max_bytes`, and returns freed
    /// pages to the OS. Returns the number of deleted records.
    ///
    /// Both cuts go by time (the size cut in `(ts, id)` order), so the timeline's
    /// counts stay exact: the slices before the oldest remaining record are dropped
    /// and the one it is in is recounted.
    pub fn apply_retention(
        &self,
        now_ms: u64,
        max_age: Duration,
        max_bytes: u64,
    ) -> Result<u64, EventsError> {
        let err = store_err(&self.path);
        let mut conn = self.lock();
        let cutoff = now_ms.saturating_sub(max_age.as_millis().min(u64::MAX as u128) as u64);
        let tx = conn.transaction().map_err(err)?;
        let mut deleted = tx
            .execute("DELETE FROM events WHERE ts < ?1", [stored_ts(cutoff)])
            .map_err(err)? as u64;
        // Size: live pages (page_count - freelist_count) x page_size.
        for _ in 0..64 {
            let used = used_bytes(&tx).map_err(err)?;
            if used <= max_bytes {
                break;
            }
            let rows: i64 = tx
                .query_row("SELECT count(*) FROM events", [], |r| r.get(0))
                .map_err(err)?;
            if rows == 0 {
                break;
            }
            // Delete the oldest share of rows that brings the size to 90% of the limit.
            let target = (max_bytes as u128) * 9 / 10;
            let excess = (used as u128).saturating_sub(target);
            let n = ((rows as u128 * excess).div_ceil(used.max(1) as u128)).clamp(1, rows as u128);
            deleted += tx
                .execute(
                    "DELETE FROM events WHERE id IN \
                     (SELECT id FROM events ORDER BY ts, id LIMIT ?1)",
                    [n as i64],
                )
                .map_err(err)? as u64;
        }
        if deleted > 0 {
            rollup::trim(&tx).map_err(err)?;
        }
        tx.commit().map_err(err)?;
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
    ///
    /// A filter on the columns the counts have (type or engine, rule, action, route) may
    /// match a few rows scattered among many: the counts name the time spans holding its
    /// newest matches, and only the rows of those spans are read.
    pub fn query(&self, q: &EventQuery) -> Result<Vec<serde_json::Value>, EventsError> {
        let limit = q.limit.clamp(1, MAX_QUERY_LIMIT);
        let err = store_err(&self.path);
        let conn = self.lock();
        let mut out = Vec::new();
        if !q.counts_answer_where() {
            select(&conn, q, limit, &mut out).map_err(err)?;
            return Ok(out);
        }
        for (from, to) in rollup::matching_spans(&conn, q, limit).map_err(err)? {
            let span = EventQuery {
                since: Some(from),
                until: Some(to),
                ..q.clone()
            };
            select(&conn, &span, limit - out.len(), &mut out).map_err(err)?;
            if out.len() >= limit {
                break;
            }
        }
        Ok(out)
    }

    /// The record with this store id, if it is still stored.
    pub fn get(&self, id: i64) -> Result<Option<serde_json::Value>, EventsError> {
        let err = store_err(&self.path);
        let conn = self.lock();
        let mut stmt = conn
            .prepare_cached("SELECT data FROM events WHERE id = ?1")
            .map_err(err)?;
        let mut rows = stmt.query([id]).map_err(err)?;
        match rows.next().map_err(err)? {
            Some(r) => Ok(Some(with_id(id, r.get::<_, String>(0).map_err(err)?))),
            None => Ok(None),
        }
    }

    /// Counts the records matching `q` (its time bounds, limit and `before` ignored)
    /// over `[since, until)` in at most `max_slices + 1` equal slices aligned on their
    /// width (see [`rollup`]): the timeline of a listing.
    ///
    /// Without a client IP or request id filter, the counts come from the per-slice
    /// counts table (a few hundred rows for an hour, whatever the traffic); with one,
    /// from the rows of the time range in the `events_scan` index.
    pub fn timeline(
        &self,
        q: &EventQuery,
        since: u64,
        until: u64,
        max_slices: usize,
    ) -> Result<Timeline, EventsError> {
        let (start, width, n) =
            rollup::layout(since, until, max_slices.clamp(1, MAX_TIMELINE_SLICES));
        let end = start.saturating_add(width.saturating_mul(n as u64));
        let mut args: Vec<rusqlite::types::Value> =
            vec![stored_ts(start).into(), stored_ts(width).into()];
        let q = EventQuery {
            since: Some(start),
            until: Some(end),
            before_id: None,
            ..q.clone()
        };
        let sql = if !q.counts_answer_filters() {
            let (mut sql, more) = q.where_clause("SELECT (ts - ?) / ?, count(*) FROM events");
            args.extend(more);
            sql.push_str(" GROUP BY 1");
            sql
        } else {
            let slice = rollup::SLICE_MS as i64;
            let mut sql = format!(
                "SELECT (slice * {slice} - ?) / ?, sum(n) FROM event_counts \
                 WHERE slice >= ? AND slice < ?"
            );
            args.push((stored_ts(start) / slice).into());
            args.push((stored_ts(end) / slice).into());
            q.push_column_filters(&mut sql, &mut args);
            sql.push_str(" GROUP BY 1");
            sql
        };
        let err = store_err(&self.path);
        let conn = self.lock();
        let mut stmt = conn.prepare_cached(&sql).map_err(err)?;
        let rows = stmt
            .query_map(params_from_iter(args), |r| {
                Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?))
            })
            .map_err(err)?;
        let mut counts = vec![0u64; n];
        for row in rows {
            let (b, c) = row.map_err(err)?;
            if let Some(slot) = usize::try_from(b).ok().and_then(|b| counts.get_mut(b)) {
                *slot += c.max(0) as u64;
            }
        }
        Ok(Timeline {
            start,
            width,
            counts,
        })
    }

    /// Security records from `since` (unix ms, rounded down to a count slice of
    /// [`rollup::SLICE_MS`]), counted by `(engine, action)`.
    pub fn count_security(&self, since: u64) -> Result<Vec<(String, String, u64)>, EventsError> {
        let err = store_err(&self.path);
        let conn = self.lock();
        let mut stmt = conn
            .prepare_cached(
                "SELECT engine, action, sum(n) FROM event_counts
                 WHERE slice >= ?1 AND kind = 'security' GROUP BY engine, action",
            )
            .map_err(err)?;
        let rows = stmt
            .query_map([stored_ts(since) / rollup::SLICE_MS as i64], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, i64>(2)?.max(0) as u64,
                ))
            })
            .map_err(err)?;
        rows.collect::<Result<_, _>>().map_err(err)
    }
}

/// Record counts in equal time slices: what [`EventStore::timeline`] returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timeline {
    /// Start of the first slice, unix ms.
    pub start: u64,
    /// Width of every slice, ms.
    pub width: u64,
    /// Records in each slice, oldest first.
    pub counts: Vec<u64>,
}

impl Timeline {
    /// End of the last slice, unix ms.
    pub fn end(&self) -> u64 {
        self.start
            .saturating_add(self.width.saturating_mul(self.counts.len() as u64))
    }
}

/// Largest number of slices of [`EventStore::timeline`] (plus one: see there).
pub const MAX_TIMELINE_SLICES: usize = 1_000;

impl EventQuery {
    /// `base` followed by the WHERE clause of the filters, and its arguments.
    fn where_clause(&self, base: &str) -> (String, Vec<rusqlite::types::Value>) {
        let mut sql = format!("{base} WHERE 1=1");
        let mut args: Vec<rusqlite::types::Value> = Vec::new();
        if let Some(s) = self.since {
            sql.push_str(" AND ts >= ?");
            args.push(stored_ts(s).into());
        }
        if let Some(u) = self.until {
            sql.push_str(" AND ts < ?");
            args.push(stored_ts(u).into());
        }
        self.push_column_filters(&mut sql, &mut args);
        // The hash is in the index: only the rows it matches are read and compared.
        let hashed = [
            (
                &self.client_ip,
                "client_ip_hash",
                "json_extract(data, '$.client_ip')",
            ),
            (&self.request_id, "request_id_hash", "request_id"),
            (
                &self.event_id,
                "event_id_hash",
                "json_extract(data, '$.event.id')",
            ),
        ];
        for (value, hash_column, stored) in hashed {
            if let Some(v) = value {
                sql.push_str(&format!(" AND {hash_column} = ? AND {stored} = ?"));
                args.push(key_hash(v).into());
                args.push(v.clone().into());
            }
        }
        if let Some(b) = self.before_id {
            // After record `b` in the listing order (ts, id descending); the plain `ts`
            // bound lets the time index skip the newer rows.
            sql.push_str(
                " AND ts <= (SELECT ts FROM events WHERE id = ?) \
                 AND (ts, id) < (SELECT ts, id FROM events WHERE id = ?)",
            );
            args.push(b.into());
            args.push(b.into());
        }
        (sql, args)
    }

    /// Whether the counts table can count the matches: no filter on the client IP, the
    /// request id or the event id (which the counts do not have).
    fn counts_answer_filters(&self) -> bool {
        self.client_ip.is_none() && self.request_id.is_none() && self.event_id.is_none()
    }

    /// Whether the counts table can say where the matches are: a filter on its columns,
    /// and none it does not have.
    fn counts_answer_where(&self) -> bool {
        self.counts_answer_filters()
            && (self.kind.is_some()
                || self.route.is_some()
                || self.action.is_some()
                || self.rule.is_some())
    }

    /// The filters on the columns `events` and `event_counts` share: type or engine,
    /// route, action, rule.
    fn push_column_filters(&self, sql: &mut String, args: &mut Vec<rusqlite::types::Value>) {
        if let Some(k) = &self.kind {
            sql.push_str(" AND (kind = ? OR engine = ?)");
            args.push(k.clone().into());
            args.push(k.clone().into());
        }
        for (column, value) in [
            ("route", &self.route),
            ("action", &self.action),
            ("rule", &self.rule),
        ] {
            if let Some(v) = value {
                sql.push_str(" AND ");
                sql.push_str(column);
                sql.push_str(" = ?");
                args.push(v.clone().into());
            }
        }
    }
}

/// Appends the newest `limit` records matching `q` to `out`.
fn select(
    conn: &Connection,
    q: &EventQuery,
    limit: usize,
    out: &mut Vec<serde_json::Value>,
) -> rusqlite::Result<()> {
    let (mut sql, mut args) = q.where_clause("SELECT id, data FROM events");
    sql.push_str(" ORDER BY ts DESC, id DESC LIMIT ?");
    args.push((limit as i64).into());
    let mut stmt = conn.prepare_cached(&sql)?;
    let rows = stmt.query_map(params_from_iter(args), |r| {
        Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?))
    })?;
    for row in rows {
        let (id, data) = row?;
        out.push(with_id(id, data));
    }
    Ok(())
}

/// A stored JSON line as a value, with its store `id` added.
fn with_id(id: i64, data: String) -> serde_json::Value {
    let mut v: serde_json::Value =
        serde_json::from_str(&data).unwrap_or(serde_json::Value::String(data));
    if let Some(obj) = v.as_object_mut() {
        obj.insert("id".into(), id.into());
    }
    v
}

fn used_bytes(conn: &Connection) -> rusqlite::Result<u64> {
    let page_size: i64 = conn.query_row("PRAGMA page_size", [], |r| r.get(0))?;
    let page_count: i64 = conn.query_row("PRAGMA page_count", [], |r| r.get(0))?;
    let free: i64 = conn.query_row("PRAGMA freelist_count", [], |r| r.get(0))?;
    Ok(((page_count - free).max(0) as u64) * page_size.max(0) as u64)
}

fn schema_err(path: &Path) -> impl Fn(SchemaError) -> EventsError + '_ {
    move |e| {
        match e {
        SchemaError::Sql(source) => EventsError::Store {
            path: path.to_path_buf(),
            source,
        },
        SchemaError::Newer(v) => EventsError::Config(format!(
            "{}: event store schema version {v} was written by a newer moat (this one reads version {})",
            path.display(),
            schema::VERSION
        )),
        SchemaError::Older(v) => EventsError::Config(format!(
            "{}: event store schema version {} is older than this moat's ({}); the event writer \
             of `moat serve` upgrades it when it opens the store",
            path.display(),
            v.max(1),
            schema::VERSION
        )),
    }
    }
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
