//! Flood control: the stage between the proxy and the queue that keeps an attack
//! flood from filling the queue, the disk and the memory.
//!
//! Two mechanisms, both applied in [`EventQueue::push`](crate::EventQueue::push)
//! on the request thread, before a record is queued:
//!
//! * **Aggregation.** Identical security records (same client, route, engine,
//!   rule, action and location) and identical refused requests (access records
//!   whose decision is not `allow`, same client, route, method, path, status and
//!   decision) within a window are one stored record. The first occurrence goes
//!   through at once, so an operator sees an attack start within one batch
//!   interval; the repeats of each window are counted and written as one record
//!   when the window closes: the first repeat as it was pushed (its own request
//!   and event ids and `ts`), carrying `count` and `last_ts`.
//!   A key stays open while it keeps repeating, so a sustained flood of one key
//!   writes one record per window.
//! * **Per-client cap.** A client may cause at most `client_cap` new records
//!   (first occurrences) per window; the rest are counted, not queued, and
//!   written as one `events/client_cap` record per client and window with their
//!   count. An attacker varying the payload to defeat aggregation thus writes at
//!   most `client_cap` records per window.
//!
//! Nothing is lost: the sum of `count` over the written records (1 when absent)
//! equals the number of records the proxy pushed. Access records of allowed
//! requests, TLS and tcp records are never aggregated.
//!
//! Memory is bounded by `max_keys` open keys and as many client windows (each
//! holds at most two records, about 1 KiB each). When the table is full, new keys go through
//! unaggregated (still under the client cap while the client table has room).
//! Collisions of the 64-bit key hash never merge two different records: the
//! full key is compared, and a colliding record goes through on its own.

use std::collections::hash_map::{Entry, HashMap};
use std::hash::{BuildHasher, Hash, Hasher, RandomState};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use moat_core::{EventAction, SecurityEvent};
use serde::Serialize;

use crate::config::AggregateConfig;
use crate::record::{action_name, Record, SecurityRecord};

/// Lock shards: request threads admitting different keys rarely wait on each other.
const SHARDS: usize = 16;

/// A record that stands for `count` occurrences, the first at `record.ts()`, the
/// last at `last_ts`. Serialized as the record's JSON object plus `count` and `last_ts`.
#[derive(Debug, Clone)]
pub struct Counted {
    /// The first of the counted occurrences, as pushed (its own ids and `ts`).
    pub record: Record,
    /// How many occurrences this record stands for.
    pub count: u64,
    /// Time of the last one, unix milliseconds.
    pub last_ts: u64,
}

impl Serialize for Counted {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Flat<'a> {
            #[serde(flatten)]
            record: &'a Record,
            count: u64,
            last_ts: u64,
        }
        Flat {
            record: &self.record,
            count: self.count,
            last_ts: self.last_ts,
        }
        .serialize(s)
    }
}

/// What [`Aggregator::admit`] decided for a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Queue it: a first occurrence, or a record that is never aggregated.
    Pass,
    /// Counted in an open aggregate; do not queue it.
    Absorbed,
    /// Over the client's cap: counted in its overflow record; do not queue it.
    Capped,
}

/// An open key: the repeats of the current window.
struct Pending {
    /// The first occurrence (a copy: the original went to the queue): the key.
    record: Record,
    window_end: u64,
    /// Repeats since the last written record and the time of the last one.
    count: u64,
    last_ts: u64,
    /// The first repeat since the last written record, as it was pushed: the
    /// written record is a real occurrence of the ones it counts (its own
    /// request and event ids, so a block page's ids find it).
    first_repeat: Option<Record>,
}

/// A client's window: records admitted and records over the cap.
struct ClientWindow {
    client_ip: String,
    window_end: u64,
    admitted: u32,
    overflow: u64,
    first_ts: u64,
    last_ts: u64,
    /// Route of the first record over the cap (the overflow record's route).
    route: String,
}

/// The flood-control stage (see the module documentation). Shared by every
/// producer; the writer thread calls [`expire`](Self::expire).
pub struct Aggregator {
    window_ms: u64,
    client_cap: u32,
    /// Open keys (and, separately, client windows) allowed per shard.
    shard_max: usize,
    hasher: RandomState,
    /// Open keys by key hash, and client windows by client hash: two arrays,
    /// so that holding a key shard while taking a client shard cannot deadlock.
    keys: [Mutex<HashMap<u64, Pending>>; SHARDS],
    clients: [Mutex<HashMap<u64, ClientWindow>>; SHARDS],
    /// Open keys plus client windows, so an idle writer knows whether to tick.
    open: AtomicUsize,
    aggregated: AtomicU64,
    capped: AtomicU64,
}

impl std::fmt::Debug for Aggregator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Aggregator")
            .field("window_ms", &self.window_ms)
            .field("client_cap", &self.client_cap)
            .field("open", &self.open())
            .finish()
    }
}

impl Aggregator {
    /// A stage for a validated config; `None` when aggregation is off (`window: 0s`).
    pub fn new(cfg: &AggregateConfig) -> Option<Aggregator> {
        let window_ms = cfg.window.as_millis().min(u64::MAX as u128) as u64;
        (window_ms > 0).then(|| Aggregator {
            window_ms,
            client_cap: cfg.client_cap,
            shard_max: cfg.max_keys.div_ceil(SHARDS).max(1),
            hasher: RandomState::new(),
            keys: Default::default(),
            clients: Default::default(),
            open: AtomicUsize::new(0),
            aggregated: AtomicU64::new(0),
            capped: AtomicU64::new(0),
        })
    }

    /// Decides whether `rec` is queued. Cost for a repeat: one hash of its key
    /// fields and one short lock; the caller drops the record.
    pub fn admit(&self, rec: &Record) -> Admit {
        let Some(client_ip) = client_of(rec) else {
            return Admit::Pass;
        };
        let ts = rec.ts();
        let mut h = self.hasher.build_hasher();
        hash_key(rec, &mut h);
        let key = h.finish();
        let mut keys = lock(&self.keys[key as usize % SHARDS]);
        match keys.get_mut(&key) {
            Some(p) if same_key(&p.record, rec) => {
                if p.count == 0 {
                    p.first_repeat = Some(rec.clone());
                }
                p.count += 1;
                p.last_ts = p.last_ts.max(ts);
                self.aggregated.fetch_add(1, Ordering::Relaxed);
                return Admit::Absorbed;
            }
            // A hash collision with another key: goes through on its own.
            Some(_) => return self.client_admit(client_ip, rec),
            None => {}
        }
        // Lock order: key shard, then client shard (never the other way round).
        let admit = self.client_admit(client_ip, rec);
        if admit == Admit::Pass && keys.len() < self.shard_max {
            keys.insert(
                key,
                Pending {
                    record: rec.clone(),
                    window_end: ts.saturating_add(self.window_ms),
                    count: 0,
                    last_ts: ts,
                    first_repeat: None,
                },
            );
            self.open.fetch_add(1, Ordering::Relaxed);
        }
        admit
    }

    fn client_admit(&self, client_ip: &str, rec: &Record) -> Admit {
        let ts = rec.ts();
        let h = self.hasher.hash_one(client_ip);
        let mut clients = lock(&self.clients[h as usize % SHARDS]);
        let full = clients.len() >= self.shard_max;
        let w = match clients.entry(h) {
            Entry::Occupied(o) => o.into_mut(),
            // No room to track this client: it is not capped.
            Entry::Vacant(_) if full => return Admit::Pass,
            Entry::Vacant(v) => {
                self.open.fetch_add(1, Ordering::Relaxed);
                v.insert(ClientWindow {
                    client_ip: client_ip.to_string(),
                    window_end: ts.saturating_add(self.window_ms),
                    admitted: 0,
                    overflow: 0,
                    first_ts: ts,
                    last_ts: ts,
                    route: String::new(),
                })
            }
        };
        if w.client_ip != client_ip {
            // Two clients with one hash: the second one is not capped.
            return Admit::Pass;
        }
        if w.admitted < self.client_cap {
            w.admitted += 1;
            return Admit::Pass;
        }
        if w.overflow == 0 {
            w.first_ts = ts;
            w.route = rec.route().unwrap_or_default().to_string();
        }
        w.overflow += 1;
        w.last_ts = w.last_ts.max(ts);
        self.capped.fetch_add(1, Ordering::Relaxed);
        Admit::Capped
    }

    /// Closes every window that ended at or before `now_ms` (all of them when
    /// `now_ms` is `u64::MAX`, at shutdown), appending one record per window
    /// that counted something. A key that repeated stays open for another window.
    pub fn expire(&self, now_ms: u64, out: &mut Vec<Counted>) {
        let mut closed = 0;
        for shard in &self.keys {
            let mut keys = lock(shard);
            let before = keys.len();
            keys.retain(|_, p| {
                if p.window_end > now_ms {
                    return true;
                }
                let Some(record) = p.first_repeat.take().filter(|_| p.count > 0) else {
                    return false;
                };
                out.push(Counted {
                    record,
                    count: p.count,
                    last_ts: p.last_ts,
                });
                p.count = 0;
                p.window_end = now_ms.saturating_add(self.window_ms);
                true
            });
            closed += before - keys.len();
        }
        for shard in &self.clients {
            let mut clients = lock(shard);
            let before = clients.len();
            clients.retain(|_, w| {
                if w.window_end > now_ms {
                    return true;
                }
                if w.overflow > 0 {
                    out.push(self.overflow_record(w));
                }
                false
            });
            closed += before - clients.len();
        }
        self.open.fetch_sub(closed, Ordering::Relaxed);
    }

    fn overflow_record(&self, w: &ClientWindow) -> Counted {
        let event = SecurityEvent::new(
            "events",
            "client_cap",
            EventAction::Monitor,
            format!(
                "records from this client over the cap of {} per {} ms window: counted, not stored one by one",
                self.client_cap, self.window_ms
            ),
        );
        Counted {
            record: Record::Security(SecurityRecord {
                ts: w.first_ts,
                request_id: String::new(),
                route: w.route.clone(),
                client_ip: w.client_ip.clone(),
                method: String::new(),
                path: String::new(),
                request: None,
                event,
            }),
            count: w.overflow,
            last_ts: w.last_ts,
        }
    }

    /// Open keys and client windows (0: nothing to expire).
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// Records absorbed into an aggregate, since start.
    pub fn aggregated(&self) -> u64 {
        self.aggregated.load(Ordering::Relaxed)
    }

    /// Records over a client's cap, since start.
    pub fn capped(&self) -> u64 {
        self.capped.load(Ordering::Relaxed)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The shard holds counters only; a panic elsewhere cannot leave it inconsistent.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The client of an aggregated record; `None` for records never aggregated.
fn client_of(rec: &Record) -> Option<&str> {
    match rec {
        Record::Security(r) => Some(&r.client_ip),
        Record::Access(r) if r.decision != "allow" => Some(&r.client_ip),
        _ => None,
    }
}

fn hash_key(rec: &Record, h: &mut impl Hasher) {
    match rec {
        Record::Security(r) => {
            (0u8, &r.client_ip, &r.route, r.event.engine, &r.event.rule).hash(h);
            (action_name(r.event.action), &r.event.location).hash(h);
        }
        Record::Access(r) => {
            (1u8, &r.client_ip, &r.route, &r.method, &r.path).hash(h);
            (r.status, &r.decision).hash(h);
        }
        Record::Tls(_) | Record::Tcp(_) => {}
    }
}

fn same_key(a: &Record, b: &Record) -> bool {
    match (a, b) {
        (Record::Security(a), Record::Security(b)) => {
            a.client_ip == b.client_ip
                && a.route == b.route
                && a.event.engine == b.event.engine
                && a.event.rule == b.event.rule
                && a.event.action == b.event.action
                && a.event.location == b.event.location
        }
        (Record::Access(a), Record::Access(b)) => {
            a.client_ip == b.client_ip
                && a.route == b.route
                && a.method == b.method
                && a.path == b.path
                && a.status == b.status
                && a.decision == b.decision
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::AccessRecord;
    use std::time::Duration;

    fn cfg(window_ms: u64, client_cap: u32, max_keys: usize) -> AggregateConfig {
        AggregateConfig {
            window: Duration::from_millis(window_ms),
            client_cap,
            max_keys,
        }
    }

    fn sqli(ts: u64, client: &str, location: &str) -> Record {
        Record::Security(SecurityRecord {
            ts,
            request_id: format!("r{ts}"),
            route: "api".into(),
            client_ip: client.into(),
            method: "GET".into(),
            path: "/s".into(),
            request: None,
            event: SecurityEvent::new("waf", "sqli", EventAction::Block, "SQL injection")
                .at(location),
        })
    }

    fn total(out: &[Counted]) -> u64 {
        out.iter().map(|c| c.count).sum()
    }

    #[test]
    fn repeats_are_one_record_per_window_and_counts_add_up() {
        let a = Aggregator::new(&cfg(1000, 100, 1024)).unwrap();
        assert_eq!(a.admit(&sqli(0, "10.0.0.1", "query:id")), Admit::Pass);
        for t in 1..500 {
            assert_eq!(a.admit(&sqli(t, "10.0.0.1", "query:id")), Admit::Absorbed);
        }
        // Another location, another client: new keys.
        assert_eq!(a.admit(&sqli(5, "10.0.0.1", "query:q")), Admit::Pass);
        assert_eq!(a.admit(&sqli(5, "10.0.0.2", "query:id")), Admit::Pass);
        let mut out = Vec::new();
        a.expire(999, &mut out);
        assert!(out.is_empty(), "no window has ended yet");
        a.expire(1000, &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(
            (out[0].count, out[0].record.ts(), out[0].last_ts),
            (499, 1, 499)
        );
        // The written record is the first repeat itself, not a copy of the key's.
        match &out[0].record {
            Record::Security(r) => assert_eq!(r.request_id, "r1"),
            other => panic!("unexpected record {other:?}"),
        }
        // The flood goes on: the key stays open, one record for the next window.
        for t in 1000..1700 {
            a.admit(&sqli(t, "10.0.0.1", "query:id"));
        }
        out.clear();
        a.expire(2000, &mut out);
        assert_eq!(total(&out), 700);
        // A quiet window closes the key; the next occurrence is a first one again.
        out.clear();
        a.expire(3000, &mut out);
        assert!(out.is_empty());
        assert_eq!(a.open(), 0);
        assert_eq!(a.admit(&sqli(3001, "10.0.0.1", "query:id")), Admit::Pass);
        assert_eq!(a.aggregated(), 499 + 700);
        let v = serde_json::to_value(&Counted {
            record: sqli(1, "10.0.0.1", "query:id"),
            count: 3,
            last_ts: 9,
        })
        .unwrap();
        assert_eq!(
            (&v["type"], &v["count"], &v["last_ts"], &v["event"]["rule"]),
            (
                &serde_json::json!("security"),
                &serde_json::json!(3),
                &serde_json::json!(9),
                &serde_json::json!("sqli")
            )
        );
    }

    #[test]
    fn client_cap_counts_the_overflow() {
        let a = Aggregator::new(&cfg(1000, 10, 1024)).unwrap();
        let mut passed = 0;
        for i in 0..100 {
            // A new location every time: aggregation cannot help, the cap does.
            match a.admit(&sqli(i, "10.0.0.9", &format!("query:p{i}"))) {
                Admit::Pass => passed += 1,
                Admit::Capped => {}
                Admit::Absorbed => panic!("distinct keys absorbed"),
            }
        }
        assert_eq!(passed, 10);
        assert_eq!(a.capped(), 90);
        // Another client is not affected.
        assert_eq!(a.admit(&sqli(5, "10.0.0.8", "query:x")), Admit::Pass);
        let mut out = Vec::new();
        a.expire(u64::MAX, &mut out);
        assert_eq!(out.len(), 1);
        let Record::Security(r) = &out[0].record else {
            panic!()
        };
        assert_eq!(
            (r.event.engine, r.event.rule.as_str()),
            ("events", "client_cap")
        );
        assert_eq!((out[0].count, r.ts, out[0].last_ts), (90, 10, 99));
        assert_eq!(r.client_ip, "10.0.0.9");
    }

    #[test]
    fn tables_are_bounded_and_allowed_access_is_never_aggregated() {
        let a = Aggregator::new(&cfg(1000, u32::MAX, 16)).unwrap();
        for i in 0..10_000 {
            assert_eq!(
                a.admit(&sqli(1, &format!("10.1.{}.{}", i / 256, i % 256), "q")),
                Admit::Pass
            );
        }
        // At most `max_keys` (rounded up to whole shards) keys and client windows.
        assert!(a.open() <= 2 * SHARDS, "{}", a.open());
        let ok = Record::Access(AccessRecord {
            ts: 1,
            client_ip: "10.0.0.1".into(),
            decision: "allow".into(),
            ..AccessRecord::default()
        });
        assert_eq!(a.admit(&ok), Admit::Pass);
        assert_eq!(a.admit(&ok), Admit::Pass);
        let blocked = Record::Access(AccessRecord {
            decision: "block".into(),
            status: 403,
            ..AccessRecord::default()
        });
        let a = Aggregator::new(&cfg(1000, 5, 64)).unwrap();
        assert_eq!(a.admit(&blocked), Admit::Pass);
        assert_eq!(a.admit(&blocked), Admit::Absorbed);
        assert!(Aggregator::new(&cfg(0, 5, 64)).is_none());
    }
}
