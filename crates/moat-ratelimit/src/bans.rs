//! IP bans: automatic (N blocks within a window), by hand (admin API), and allow/deny
//! lists of IPs and CIDRs read from files.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use ipnet::IpNet;
use parking_lot::{Mutex, RwLock};

use crate::bucket::{Limit, State};
use crate::config::{Algorithm, BanConfig};
use crate::table::Table;

/// Most entries an allow or deny list file may hold.
pub const MAX_LIST_ENTRIES: usize = 1_000_000;

/// Most bans held at once; beyond it the ban closest to its end is dropped.
pub const MAX_BANS: usize = 100_000;

/// A set of IPs and CIDRs as sorted, merged ranges (IPv4 as IPv4-mapped IPv6), so a
/// lookup is a binary search whatever the size of the list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IpSet {
    ranges: Vec<(u128, u128)>,
}

fn ip_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u128::from(a.to_ipv6_mapped()),
        IpAddr::V6(a) => match a.to_ipv4_mapped() {
            Some(v4) => u128::from(v4.to_ipv6_mapped()),
            None => u128::from(a),
        },
    }
}

impl IpSet {
    /// Parses a list: one IP or CIDR a line, `#` starts a comment, blank lines skipped.
    /// An error names the 1-based line.
    pub fn parse(text: &str) -> Result<Self, (usize, String)> {
        let mut nets = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let entry = line.split('#').next().unwrap_or("").trim();
            if entry.is_empty() {
                continue;
            }
            if nets.len() >= MAX_LIST_ENTRIES {
                return Err((i + 1, format!("more than {MAX_LIST_ENTRIES} entries")));
            }
            let net = entry
                .parse::<IpNet>()
                .or_else(|_| entry.parse::<IpAddr>().map(IpNet::from))
                .map_err(|_| (i + 1, format!("`{entry}` is not an IP address or CIDR")))?;
            nets.push(net);
        }
        Ok(Self::from_nets(&nets))
    }

    /// The set of these networks.
    pub fn from_nets(nets: &[IpNet]) -> Self {
        let mut ranges: Vec<(u128, u128)> = nets
            .iter()
            .map(|n| (ip_u128(n.network()), ip_u128(n.broadcast())))
            .collect();
        ranges.sort_unstable();
        let mut merged: Vec<(u128, u128)> = Vec::with_capacity(ranges.len());
        for (lo, hi) in ranges {
            match merged.last_mut() {
                Some(last) if lo <= last.1.saturating_add(1) => last.1 = last.1.max(hi),
                _ => merged.push((lo, hi)),
            }
        }
        IpSet { ranges: merged }
    }

    /// True when `ip` is in the set.
    #[inline]
    pub fn contains(&self, ip: IpAddr) -> bool {
        if self.ranges.is_empty() {
            return false;
        }
        let x = ip_u128(ip);
        let i = self.ranges.partition_point(|r| r.0 <= x);
        i > 0 && self.ranges[i - 1].1 >= x
    }

    /// Number of merged ranges.
    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }
}

/// A list file and the set last read from it.
#[derive(Debug)]
struct ListFile {
    path: PathBuf,
    modified: Mutex<Option<SystemTime>>,
    set: RwLock<Arc<IpSet>>,
}

impl ListFile {
    fn load(path: PathBuf) -> Result<Self, String> {
        let f = ListFile {
            path,
            modified: Mutex::new(None),
            set: RwLock::new(Arc::default()),
        };
        f.reload()?;
        Ok(f)
    }

    /// Re-reads the file when its modification time changed; returns whether it did.
    fn reload(&self) -> Result<bool, String> {
        let meta =
            std::fs::metadata(&self.path).map_err(|e| format!("{}: {e}", self.path.display()))?;
        let modified = meta.modified().ok();
        let mut last = self.modified.lock();
        if last.is_some() && *last == modified {
            return Ok(false);
        }
        let text = std::fs::read_to_string(&self.path)
            .map_err(|e| format!("{}: {e}", self.path.display()))?;
        let set = IpSet::parse(&text)
            .map_err(|(line, m)| format!("{}:{line}: {m}", self.path.display()))?;
        *self.set.write() = Arc::new(set);
        *last = modified;
        Ok(true)
    }
}

/// Why an IP is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// On the deny list.
    DenyList,
    /// Banned until this time (milliseconds since the Unix epoch).
    Banned(u64),
}

/// One ban, as the admin API shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Ban {
    /// The banned address.
    pub ip: IpAddr,
    /// End of the ban, milliseconds since the Unix epoch.
    pub until_ms: u64,
}

/// Bans and lists, shared by every reload of the engine (bans are not forgotten on reload).
pub struct Bans {
    /// The configuration they were built from.
    pub(crate) config: BanConfig,
    allow: Option<ListFile>,
    deny: Option<ListFile>,
    /// IP -> end of the ban (Unix ms).
    banned: RwLock<HashMap<IpAddr, u64>>,
    /// Blocks per IP, as a token bucket of `after_blocks` per `within`.
    blocks: Table<State>,
    block_limit: Limit,
}

impl std::fmt::Debug for Bans {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bans")
            .field("config", &self.config)
            .finish()
    }
}

/// Milliseconds since the Unix epoch (bans' expiry times).
pub use moat_core::clock::unix_millis as unix_ms;

impl Bans {
    /// Bans configured by `cfg`; list files resolve against `base_dir`.
    pub fn new(cfg: &BanConfig, base_dir: &std::path::Path) -> Result<Self, String> {
        let list = |p: &Option<String>| -> Result<Option<ListFile>, String> {
            p.as_ref()
                .map(|p| ListFile::load(base_dir.join(p)))
                .transpose()
        };
        let window = u64::try_from(cfg.within.as_nanos()).unwrap_or(u64::MAX);
        Ok(Bans {
            config: cfg.clone(),
            allow: list(&cfg.allow_file)?,
            deny: list(&cfg.deny_file)?,
            banned: RwLock::new(HashMap::new()),
            blocks: Table::new(MAX_BANS),
            // `after_blocks` blocks in `within` pass; the next one bans.
            block_limit: Limit::new(
                Algorithm::TokenBucket,
                cfg.after_blocks.max(1),
                window,
                cfg.after_blocks.max(1),
            ),
        })
    }

    /// True when the IP is on the allow list.
    #[inline]
    pub fn allowed(&self, ip: IpAddr) -> bool {
        self.allow
            .as_ref()
            .is_some_and(|l| l.set.read().contains(ip))
    }

    /// Why the IP is refused, if it is.
    #[inline]
    pub fn refused(&self, ip: IpAddr, now_ms: u64) -> Option<Refusal> {
        if self
            .deny
            .as_ref()
            .is_some_and(|l| l.set.read().contains(ip))
        {
            return Some(Refusal::DenyList);
        }
        let banned = self.banned.read();
        if banned.is_empty() {
            return None;
        }
        banned
            .get(&ip)
            .filter(|until| **until > now_ms)
            .map(|until| Refusal::Banned(*until))
    }

    /// Counts a block of `ip` at `now` (monotonic ns); returns the ban it earned, if any.
    pub fn count_block(&self, ip: IpAddr, now: u64, now_ms: u64) -> Option<Ban> {
        if self.config.after_blocks == 0 || self.allowed(ip) {
            return None;
        }
        let mut h = std::hash::DefaultHasher::new();
        std::hash::Hash::hash(&ip, &mut h);
        let hash = std::hash::Hasher::finish(&h);
        let limit = &self.block_limit;
        let over = self.blocks.with(
            hash,
            || State::new(limit, now),
            |s| s.idle(limit, now),
            |s| !s.take(limit, now, 1).allowed,
        );
        if !over || self.refused(ip, now_ms).is_some() {
            return None;
        }
        let ban = Ban {
            ip,
            until_ms: now_ms.saturating_add(self.config.ban_for.as_millis() as u64),
        };
        self.add(&ban);
        Some(ban)
    }

    /// Adds (or extends) a ban.
    pub fn add(&self, ban: &Ban) {
        let mut banned = self.banned.write();
        if banned.len() >= MAX_BANS && !banned.contains_key(&ban.ip) {
            let now = unix_ms();
            banned.retain(|_, until| *until > now);
            if banned.len() >= MAX_BANS {
                let soonest = banned.iter().min_by_key(|(_, u)| **u).map(|(ip, _)| *ip);
                if let Some(ip) = soonest {
                    banned.remove(&ip);
                }
            }
        }
        let until = banned.entry(ban.ip).or_insert(0);
        *until = (*until).max(ban.until_ms);
    }

    /// Lifts a ban; returns whether there was one.
    pub fn remove(&self, ip: IpAddr) -> bool {
        self.banned.write().remove(&ip).is_some()
    }

    /// The bans in force, soonest end first.
    pub fn list(&self, now_ms: u64) -> Vec<Ban> {
        let mut v: Vec<Ban> = self
            .banned
            .read()
            .iter()
            .filter(|(_, u)| **u > now_ms)
            .map(|(ip, u)| Ban {
                ip: *ip,
                until_ms: *u,
            })
            .collect();
        v.sort_by_key(|b| (b.until_ms, b.ip));
        v
    }

    /// Replaces the bans with those the shared store holds (the store is the truth
    /// when there is one; local bans not yet written to it come back with its next
    /// answer).
    pub fn replace(&self, bans: impl IntoIterator<Item = Ban>) {
        let mut map: HashMap<IpAddr, u64> = HashMap::new();
        for b in bans.into_iter().take(MAX_BANS) {
            map.insert(b.ip, b.until_ms);
        }
        *self.banned.write() = map;
    }

    /// Re-reads list files that changed. Returns the errors (a bad file keeps its
    /// previous list).
    pub fn reload_lists(&self) -> Vec<String> {
        [&self.allow, &self.deny]
            .into_iter()
            .flatten()
            .filter_map(|l| l.reload().err())
            .collect()
    }

    /// Drops expired bans and idle block counters.
    pub fn sweep(&self, now: u64, now_ms: u64) {
        self.banned.write().retain(|_, until| *until > now_ms);
        let limit = &self.block_limit;
        self.blocks.sweep(|s| s.idle(limit, now));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_merge_and_search() {
        let s = IpSet::parse(
            "# office\n10.0.0.0/8\n10.1.0.0/16 # inside\n192.0.2.7\n2001:db8::/32\n\n",
        )
        .unwrap();
        assert_eq!(s.len(), 3);
        for ip in ["10.2.3.4", "192.0.2.7", "2001:db8::1", "::ffff:10.0.0.1"] {
            assert!(s.contains(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["11.0.0.0", "192.0.2.8", "2001:db9::", "::1"] {
            assert!(!s.contains(ip.parse().unwrap()), "{ip}");
        }
        let e = IpSet::parse("10.0.0.1\nnot-an-ip\n").unwrap_err();
        assert_eq!(e.0, 2);
        assert!(e.1.contains("not-an-ip"));
        assert!(IpSet::parse("10.0.0.0/33").is_err());
    }

    #[test]
    fn blocks_ban_and_bans_expire() {
        let cfg = BanConfig {
            after_blocks: 3,
            within: std::time::Duration::from_secs(60),
            ban_for: std::time::Duration::from_millis(100),
            allow_file: None,
            deny_file: None,
        };
        let b = Bans::new(&cfg, std::path::Path::new(".")).unwrap();
        let ip: IpAddr = "198.51.100.1".parse().unwrap();
        let now_ms = 1_000_000;
        for i in 0..3 {
            assert!(b.count_block(ip, i, now_ms).is_none());
        }
        let ban = b.count_block(ip, 3, now_ms).unwrap();
        assert_eq!(ban.until_ms, now_ms + 100);
        assert_eq!(
            b.refused(ip, now_ms + 99),
            Some(Refusal::Banned(now_ms + 100))
        );
        assert_eq!(b.refused(ip, now_ms + 100), None);
        assert_eq!(b.list(now_ms).len(), 1);
        b.sweep(4, now_ms + 100);
        assert!(b.list(0).is_empty());
    }
}
