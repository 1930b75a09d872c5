//! The store's tables, and the upgrade of a store written by an older moat.
//!
//! Version 1 (`user_version` 0, before versions were recorded) kept the rule and the
//! client IP in the JSON only, so filtering on them parsed every row, and its only
//! index was on `ts`, so every filter read the wide rows of its time range. Version 2:
//!
//! - a `rule` column (the rule filter compares it instead of parsing the JSON);
//! - `client_ip_hash` and `request_id_hash`, 32-bit hashes of the two values a client
//!   chooses, in the time index: `events_scan(ts, id, client_ip_hash, request_id_hash)`.
//!   A filter on them reads the index entries of its time range (about 20 bytes each)
//!   and only the rows whose hash matches, where the value itself is compared. The
//!   full values in the index would have made each entry five times larger, and the
//!   writer's insert 35-45% dearer (measured); separate indexes on them, a B-tree
//!   insert at a random place per record;
//! - `event_counts`, the per-slice counts the timeline and the other filters read (see
//!   [`super::rollup`]).
//!
//! Version 3 adds `event_id_hash`, the hash of a security record's event id (the
//! `x-moat-event-id` of a refusal, the id on a block page), to the same index: the
//! event id a denied user quotes is found as the request id is. Access, TLS and tcp
//! records leave it NULL (one byte in the index entry).
//!
//! The index is ordered by `(ts, id)` first: records arrive in time order, so each
//! insert appends to it, even when a burst shares one millisecond, and it is the
//! listing's order, which then needs no sort.

use rusqlite::types::Value;
use rusqlite::{params_from_iter, Connection, Transaction};

/// The schema version this build writes (`PRAGMA user_version`).
pub const VERSION: i64 = 3;

/// Tables and indexes of a version 3 store.
const TABLES: &str = "
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY,
    ts INTEGER NOT NULL,
    kind TEXT NOT NULL,
    engine TEXT,
    route TEXT,
    action TEXT,
    request_id TEXT,
    data TEXT NOT NULL,
    rule TEXT,
    client_ip_hash INTEGER,
    request_id_hash INTEGER,
    event_id_hash INTEGER
);
CREATE INDEX IF NOT EXISTS events_scan
    ON events(ts, id, client_ip_hash, request_id_hash, event_id_hash);
CREATE TABLE IF NOT EXISTS event_counts (
    slice INTEGER NOT NULL,
    kind TEXT NOT NULL,
    engine TEXT NOT NULL,
    rule TEXT NOT NULL,
    action TEXT NOT NULL,
    route TEXT NOT NULL,
    n INTEGER NOT NULL,
    PRIMARY KEY (slice, kind, engine, rule, action, route)
) WITHOUT ROWID;
";

/// The hash stored for a client IP, a request id or an event id: 32-bit FNV-1a, fixed
/// forever (it is in the file). Collisions only cost reading a row that is then
/// rejected.
pub(crate) fn key_hash(value: &str) -> i64 {
    let mut h: u32 = 0x811c_9dc5;
    for b in value.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    i64::from(h)
}

/// Why a store cannot be used.
#[derive(Debug)]
pub(crate) enum SchemaError {
    /// SQLite failed.
    Sql(rusqlite::Error),
    /// The file says it was written by a newer moat.
    Newer(i64),
    /// A read-only handle found an older schema, which only the writer upgrades.
    Older(i64),
}

impl From<rusqlite::Error> for SchemaError {
    fn from(e: rusqlite::Error) -> Self {
        SchemaError::Sql(e)
    }
}

fn version(conn: &Connection) -> rusqlite::Result<i64> {
    conn.query_row("PRAGMA user_version", [], |r| r.get(0))
}

fn has_column(conn: &Connection, table: &str, column: &str) -> rusqlite::Result<bool> {
    conn.query_row(
        "SELECT count(*) FROM pragma_table_info(?1) WHERE name = ?2",
        [table, column],
        |r| r.get::<_, i64>(0),
    )
    .map(|n| n > 0)
}

/// Creates the tables of a new store, or upgrades a store of an older version, in one
/// transaction (a crash midway leaves the old store as it was).
pub(crate) fn prepare(conn: &mut Connection) -> Result<(), SchemaError> {
    let v = version(conn)?;
    if v > VERSION {
        return Err(SchemaError::Newer(v));
    }
    if v == VERSION {
        return Ok(());
    }
    let tx = conn.transaction()?;
    let stored = has_column(&tx, "events", "data")?;
    let v1 = stored && !has_column(&tx, "events", "rule")?;
    if v1 {
        upgrade_v1(&tx)?;
    }
    if stored && !has_column(&tx, "events", "event_id_hash")? {
        upgrade_v2(&tx)?;
    }
    tx.execute_batch(TABLES)?;
    if v1 {
        super::rollup::rebuild(&tx, 0, i64::MAX)?;
    }
    tx.execute_batch(&format!("PRAGMA user_version = {VERSION};"))?;
    tx.commit()?;
    Ok(())
}

/// Rows read and updated at a time by the upgrade.
const UPGRADE_CHUNK: usize = 10_000;

/// Version 1 to 2, before `TABLES` makes the new index and table: the new columns
/// from the JSON (the hashes computed here: SQLite has no FNV-1a), the old index dropped.
fn upgrade_v1(tx: &Transaction<'_>) -> rusqlite::Result<()> {
    tx.execute_batch(
        "DROP INDEX IF EXISTS events_ts;
         ALTER TABLE events ADD COLUMN rule TEXT;
         ALTER TABLE events ADD COLUMN client_ip_hash INTEGER;
         ALTER TABLE events ADD COLUMN request_id_hash INTEGER;
         UPDATE events SET
             rule = coalesce(json_extract(data, '$.event.rule'), json_extract(data, '$.rule'));",
    )?;
    fill_hashes(
        tx,
        "SELECT id, json_extract(data, '$.client_ip'), request_id FROM events
         WHERE id > ?1 ORDER BY id LIMIT ?2",
        "UPDATE events SET client_ip_hash = ?2, request_id_hash = ?3 WHERE id = ?1",
    )
}

/// Version 2 to 3, before `TABLES` makes the new index: the event ids' hashes, the
/// old index dropped.
fn upgrade_v2(tx: &Transaction<'_>) -> rusqlite::Result<()> {
    tx.execute_batch(
        "DROP INDEX IF EXISTS events_scan;
         ALTER TABLE events ADD COLUMN event_id_hash INTEGER;",
    )?;
    fill_hashes(
        tx,
        "SELECT id, json_extract(data, '$.event.id') FROM events
         WHERE kind = 'security' AND id > ?1 ORDER BY id LIMIT ?2",
        "UPDATE events SET event_id_hash = ?2 WHERE id = ?1",
    )
}

/// Hash columns filled in chunks of rows: `read` selects `id` and the values to hash
/// for the rows after id `?1` (at most `?2`, in id order); `write` sets the hashes of
/// row `?1` from `?2` on, in the order of `read`'s values.
fn fill_hashes(tx: &Transaction<'_>, read: &str, write: &str) -> rusqlite::Result<()> {
    let mut read = tx.prepare(read)?;
    let mut write = tx.prepare(write)?;
    let values = read.column_count() - 1;
    let mut after = i64::MIN;
    loop {
        let chunk = read
            .query_map((after, UPGRADE_CHUNK as i64), |r| {
                let mut row = vec![Value::Integer(r.get(0)?)];
                for i in 1..=values {
                    let value: Option<String> = r.get(i)?;
                    row.push(value.as_deref().map(key_hash).into());
                }
                Ok(row)
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        for row in &chunk {
            write.execute(params_from_iter(row))?;
        }
        match chunk.last().map(|row| &row[0]) {
            Some(Value::Integer(id)) if chunk.len() == UPGRADE_CHUNK => after = *id,
            _ => return Ok(()),
        }
    }
}

/// Checks that a store opened read-only has this build's schema (a read-only handle
/// cannot upgrade it: the writer of `moat serve` does when it opens the store).
pub(crate) fn check(conn: &Connection) -> Result<(), SchemaError> {
    match version(conn)? {
        VERSION => Ok(()),
        v if v > VERSION => Err(SchemaError::Newer(v)),
        v => Err(SchemaError::Older(v)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_hash_is_fnv1a() {
        // The published FNV-1a 32 test vectors: stored hashes must never change.
        assert_eq!(key_hash(""), 0x811c_9dc5);
        assert_eq!(key_hash("a"), 0xe40c_292c);
        assert_eq!(key_hash("foobar"), 0xbf9c_f968);
    }
}
