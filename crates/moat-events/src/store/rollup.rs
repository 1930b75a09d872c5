//! Per-slice event counts: what the timeline reads instead of the rows.
//!
//! The writer adds each batch's counts to `event_counts`, one UPSERT per batch and
//! key `(slice, kind, engine, rule, action, route)`: a batch holds a few keys (a
//! flood repeats the same ones), so this costs the writer a hash per record and a
//! handful of statements per batch, where an index on those columns cost a B-tree
//! insert per record. The key's columns are the filters whose values come from the
//! config (engines, rules, routes, actions), so the table stays small whatever the
//! traffic; the client IP and the request id (values an attacker chooses) are not in
//! it: a timeline filtered on them reads the `events_scan` index (which has their
//! hashes) and the rows it matches.
//!
//! A timeline's slices are whole multiples of [`SLICE_MS`], aligned on it (as a
//! dashboard aligns its intervals on its step), so the counts and the rows give the
//! same answer.

use std::collections::HashMap;

use rusqlite::{params_from_iter, Connection, OptionalExtension};

use super::EventQuery;
use crate::record::Record;

/// Width of a count slice, milliseconds. A timeline slice is a whole number of them;
/// an hour's 60-slice timeline reads 360 rows per key.
pub const SLICE_MS: u64 = 10_000;

/// `(slice, kind, engine, rule, action, route)`, absent values as `""`.
type Key<'a> = (i64, &'a str, &'a str, &'a str, &'a str, &'a str);

/// Keys looked up by comparison before the hash map: a batch rarely has more.
const FEW_KEYS: usize = 8;

/// The counts of one batch of records.
#[derive(Debug, Default)]
pub(crate) struct BatchCounts<'a> {
    /// The first keys of the batch: comparing a few short strings costs less than
    /// hashing them, and a batch (a flood above all) repeats a few keys.
    few: Vec<(Key<'a>, i64)>,
    more: HashMap<Key<'a>, i64>,
}

/// A record's time as stored (SQLite integers are signed).
pub(crate) fn stored_ts(ts: u64) -> i64 {
    ts.min(i64::MAX as u64) as i64
}

impl<'a> BatchCounts<'a> {
    /// Counts one record.
    pub(crate) fn add(&mut self, rec: &'a Record) {
        let key = (
            stored_ts(rec.ts()) / SLICE_MS as i64,
            rec.kind(),
            rec.engine().unwrap_or(""),
            rec.rule().unwrap_or(""),
            rec.action().unwrap_or(""),
            rec.route().unwrap_or(""),
        );
        if let Some((_, n)) = self.few.iter_mut().find(|(k, _)| *k == key) {
            *n += 1;
        } else if self.few.len() < FEW_KEYS {
            self.few.push((key, 1));
        } else {
            *self.more.entry(key).or_default() += 1;
        }
    }

    /// Adds the counts to the table (inside the batch's transaction).
    pub(crate) fn write(&self, conn: &Connection) -> rusqlite::Result<()> {
        let mut stmt = conn.prepare_cached(
            "INSERT INTO event_counts (slice, kind, engine, rule, action, route, n)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
             ON CONFLICT DO UPDATE SET n = n + excluded.n",
        )?;
        for (&(slice, kind, engine, rule, action, route), &n) in
            self.few.iter().map(|(k, n)| (k, n)).chain(&self.more)
        {
            stmt.execute(rusqlite::params![
                slice, kind, engine, rule, action, route, n
            ])?;
        }
        Ok(())
    }
}

/// Recounts the slices of `[from_ts, to_ts)` (milliseconds, rounded out to whole
/// slices) from the rows: after a version 1 store is upgraded, and for the slice
/// retention cut in two.
pub(crate) fn rebuild(conn: &Connection, from_ts: i64, to_ts: i64) -> rusqlite::Result<()> {
    let slice = SLICE_MS as i64;
    let (from, to) = (from_ts.div_euclid(slice), to_ts.div_euclid(slice));
    conn.execute(
        "DELETE FROM event_counts WHERE slice >= ?1 AND slice <= ?2",
        [from, to],
    )?;
    conn.execute(
        "INSERT INTO event_counts (slice, kind, engine, rule, action, route, n)
         SELECT ts / ?3, kind, coalesce(engine, ''), coalesce(rule, ''),
                coalesce(action, ''), coalesce(route, ''), count(*)
         FROM events WHERE ts >= ?1 AND ts < ?2
         GROUP BY 1, 2, 3, 4, 5, 6",
        [
            from.saturating_mul(slice),
            to.saturating_add(1).saturating_mul(slice),
            slice,
        ],
    )?;
    Ok(())
}

/// Drops the counts of slices wholly before the oldest stored row and recounts the
/// slice it is in, after retention deleted rows.
pub(crate) fn trim(conn: &Connection) -> rusqlite::Result<()> {
    let oldest: Option<i64> = conn.query_row("SELECT min(ts) FROM events", [], |r| r.get(0))?;
    match oldest {
        None => conn.execute("DELETE FROM event_counts", []).map(drop),
        Some(ts) => {
            conn.execute(
                "DELETE FROM event_counts WHERE slice < ?1",
                [ts.div_euclid(SLICE_MS as i64)],
            )?;
            rebuild(conn, ts, ts)
        }
    }
}

/// Most separate time spans a listing reads one by one; matches more scattered than
/// this are read in one span from the oldest one needed.
const MAX_SPANS: usize = 16;

/// The time spans `[from, to)` (ms, newest first) holding the newest `limit` records
/// matching `q`'s time bounds and column filters, from the counts: slices without a
/// match are skipped, adjacent ones merged. The rows of these spans, newest first,
/// begin with the answer of the listing.
pub(crate) fn matching_spans(
    conn: &Connection,
    q: &EventQuery,
    limit: usize,
) -> rusqlite::Result<Vec<(u64, u64)>> {
    let lower = q.since.map_or(0, stored_ts);
    let mut upper = q.until.map_or(i64::MAX, stored_ts);
    if let Some(before) = q.before_id {
        let ts: Option<i64> = conn
            .query_row("SELECT ts FROM events WHERE id = ?1", [before], |r| {
                r.get(0)
            })
            .optional()?;
        match ts {
            Some(ts) => upper = upper.min(ts.saturating_add(1)),
            // Gone (retention): the listing after it is empty, as the query says.
            None => return Ok(Vec::new()),
        }
    }
    if upper <= lower {
        return Ok(Vec::new());
    }
    let slice = SLICE_MS as i64;
    let mut sql =
        String::from("SELECT slice, sum(n) FROM event_counts WHERE slice >= ? AND slice <= ?");
    let mut args: Vec<rusqlite::types::Value> =
        vec![(lower / slice).into(), ((upper - 1) / slice).into()];
    q.push_column_filters(&mut sql, &mut args);
    sql.push_str(" GROUP BY slice ORDER BY slice DESC");
    let mut stmt = conn.prepare_cached(&sql)?;
    let mut rows = stmt.query(params_from_iter(args))?;
    let mut spans: Vec<(i64, i64)> = Vec::new();
    let mut found = 0u64;
    while let Some(row) = rows.next()? {
        let (s, n): (i64, i64) = (row.get(0)?, row.get(1)?);
        let (from, to) = ((s * slice).max(lower), (s * slice + slice).min(upper));
        match spans.last_mut() {
            Some(last) if last.0 == to => last.0 = from,
            _ => spans.push((from, to)),
        }
        // The slice of the upper bound may count matches past it (newer than
        // `before`, or from `until` on): they do not count towards the limit. (The
        // slice of the lower bound may too, but no older slice is left to read.)
        if s != (upper - 1) / slice {
            found += n.max(0) as u64;
        }
        if found >= limit as u64 {
            break;
        }
    }
    if spans.len() > MAX_SPANS {
        let oldest = spans.last().map_or(lower, |s| s.0);
        spans = vec![(oldest, upper)];
    }
    Ok(spans
        .into_iter()
        .map(|(from, to)| (from as u64, to as u64))
        .collect())
}

/// The slices of a timeline over `[since, until)`: the width (the span divided by
/// `max`, rounded up to whole count slices), the start (`since` rounded down to a
/// multiple of the width, as a dashboard aligns its intervals) and the number of
/// slices, which cover `until`: at most `max + 1` (the first and the last may be partly
/// outside the span).
pub(crate) fn layout(since: u64, until: u64, max: usize) -> (u64, u64, usize) {
    let since = since.min(i64::MAX as u64 - 1);
    let until = until.min(i64::MAX as u64).max(since + 1);
    let width = (until - since)
        .div_ceil(max.max(1) as u64)
        .div_ceil(SLICE_MS)
        .max(1)
        * SLICE_MS;
    let n = until.div_ceil(width) - since / width;
    (since / width * width, width, n as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_are_aligned_and_bounded() {
        // An hour from an unaligned start: one-minute slices on minute boundaries.
        assert_eq!(layout(3_600_123, 7_200_123, 60), (3_600_000, 60_000, 61));
        assert_eq!(layout(3_600_000, 7_200_000, 60), (3_600_000, 60_000, 60));
        // Five minutes: slices no narrower than a count slice.
        assert_eq!(layout(0, 300_000, 60), (0, 10_000, 30));
        // Hostile bounds: reversed, zero slices, the end of time.
        assert_eq!(layout(50_000, 10, 60), (50_000, 10_000, 1));
        assert_eq!(layout(0, 60_000, 0), (0, 60_000, 1));
        for (since, until, max) in [
            (u64::MAX, u64::MAX, 1000),
            (0, u64::MAX, 7),
            (u64::MAX - 5, 3, 1),
        ] {
            let (start, width, n) = layout(since, until, max);
            assert!(start <= i64::MAX as u64 && width >= SLICE_MS);
            assert!(n >= 1 && n <= max.max(1) + 1, "{since} {until} {max}: {n}");
        }
    }
}
