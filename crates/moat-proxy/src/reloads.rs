//! The reload history: the last configuration reloads, applied or refused, with their
//! origin (file change, SIGHUP, the console), error and, when the caller knows it, the
//! change itself as a diff. Shown by the web console's Config page.

use std::collections::VecDeque;

use parking_lot::Mutex;

/// Reloads kept (the oldest is dropped first).
pub const RELOAD_HISTORY_LEN: usize = 64;

/// Longest diff kept per reload; a longer one is cut (and says so).
pub const MAX_RELOAD_DIFF_BYTES: usize = 64 << 10;

/// One reload attempt.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ReloadRecord {
    /// When it happened, unix milliseconds.
    pub at_ms: u64,
    /// What asked for it: `file` (a watched file changed or SIGHUP), `api`, or the
    /// console's description of the change.
    pub origin: String,
    /// True when the new configuration was installed.
    pub ok: bool,
    /// Why it was refused.
    pub error: Option<String>,
    /// The change as a unified diff, when the caller computed one.
    pub diff: Option<String>,
}

/// The bounded list of the last reloads, newest last.
#[derive(Debug, Default)]
pub struct ReloadHistory {
    records: Mutex<VecDeque<ReloadRecord>>,
}

impl ReloadHistory {
    /// Adds a record, dropping the oldest past [`RELOAD_HISTORY_LEN`].
    pub fn push(&self, mut r: ReloadRecord) {
        if let Some(d) = r.diff.as_mut() {
            if d.len() > MAX_RELOAD_DIFF_BYTES {
                let mut cut = MAX_RELOAD_DIFF_BYTES;
                while !d.is_char_boundary(cut) {
                    cut -= 1;
                }
                d.truncate(cut);
                d.push_str("\n... (diff cut)\n");
            }
        }
        let mut q = self.records.lock();
        if q.len() == RELOAD_HISTORY_LEN {
            q.pop_front();
        }
        q.push_back(r);
    }

    /// The records, newest first.
    pub fn newest_first(&self) -> Vec<ReloadRecord> {
        self.records.lock().iter().rev().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(i: usize, diff: Option<String>) -> ReloadRecord {
        ReloadRecord {
            at_ms: i as u64,
            origin: format!("r{i}"),
            ok: true,
            error: None,
            diff,
        }
    }

    #[test]
    fn bounded_newest_first_and_diff_cut() {
        let h = ReloadHistory::default();
        for i in 0..RELOAD_HISTORY_LEN + 5 {
            h.push(rec(i, None));
        }
        let all = h.newest_first();
        assert_eq!(all.len(), RELOAD_HISTORY_LEN);
        assert_eq!(all[0].origin, format!("r{}", RELOAD_HISTORY_LEN + 4));
        assert_eq!(all.last().unwrap().origin, "r5");
        // A hostile diff (huge, multi-byte at the cut) is bounded without panicking.
        h.push(rec(0, Some("é".repeat(MAX_RELOAD_DIFF_BYTES))));
        let d = h.newest_first()[0].diff.clone().unwrap();
        assert!(d.len() <= MAX_RELOAD_DIFF_BYTES + 20);
        assert!(d.ends_with("(diff cut)\n"));
    }
}
