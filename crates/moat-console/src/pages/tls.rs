//! TLS: protocol versions, cipher suites and key exchange groups of the audited
//! handshakes, and the expiry of the certificates seen in them (the event store's
//! TLS records: the certificate each listener served, the client certificates of
//! mTLS, the upstream servers' certificates).

use std::collections::{BTreeMap, BTreeSet};

use http::StatusCode;
use maud::{html, Markup};
use moat_events::EventQuery;
use moat_proxy::AdminResponse;
use serde_json::Value;

use crate::chart;
use crate::ctx::{Console, Req};
use crate::layout;
use crate::web;

/// Handshakes read (the newest): enough for the mix, bounded.
const SAMPLE: usize = 10_000;

/// A certificate expiring within this many days is flagged.
pub const EXPIRY_WARNING_DAYS: i64 = 30;

/// Most names listed per certificate (the rest are counted).
const MAX_NAMES: usize = 8;

fn version_name(v: u64) -> String {
    match v {
        0x0304 => "TLS 1.3".into(),
        0x0303 => "TLS 1.2".into(),
        0x0302 => "TLS 1.1".into(),
        0x0301 => "TLS 1.0".into(),
        other => format!("0x{other:04x}"),
    }
}

fn counts(title: &str, id: &str, m: BTreeMap<String, u64>) -> Markup {
    let rows: Vec<(String, u64)> = m.into_iter().collect();
    html! { div.card { h2 { (title) } (chart::bars(id, &rows)) } }
}

type Counts = BTreeMap<String, u64>;

/// Handshakes by protocol version, cipher suite and key exchange group.
fn mix(rows: &[Value]) -> (Counts, Counts, Counts) {
    let (mut v, mut cs, mut g) = (Counts::new(), Counts::new(), Counts::new());
    for r in rows {
        let h = &r["handshake"];
        *v.entry(version_name(h["protocol_version"].as_u64().unwrap_or(0)))
            .or_default() += 1;
        *cs.entry(h["ciphersuite_name"].as_str().unwrap_or("?").to_string())
            .or_default() += 1;
        *g.entry(
            h["key_exchange_group"]
                .as_str()
                .unwrap_or("none")
                .to_string(),
        )
        .or_default() += 1;
    }
    (v, cs, g)
}

/// One certificate seen in the handshakes.
#[derive(Debug, Default, PartialEq)]
struct Seen<'a> {
    /// Whose certificate: `served` (by a listener), `client` (mTLS), `upstream`.
    role: &'a str,
    subject: &'a str,
    /// The SNIs it was used for.
    names: BTreeSet<&'a str>,
    /// `notAfter`, unix seconds.
    not_after: Option<i64>,
    handshakes: u64,
    /// The newest handshake, unix ms.
    last_seen: u64,
}

/// The certificates of the records, by SHA-256 fingerprint, soonest expiry first.
fn certificates(rows: &[Value]) -> Vec<(&str, Seen<'_>)> {
    let mut by_fp: BTreeMap<&str, Seen<'_>> = BTreeMap::new();
    for r in rows {
        let h = &r["handshake"];
        let ts = r["ts"].as_u64().unwrap_or(0);
        let server = h["role"].as_str() == Some("server");
        let peer_role = if server { "client" } else { "upstream" };
        for (cert, role) in [(&h["certificate"], "served"), (&h["peer"], peer_role)] {
            let Some(fp) = cert["fingerprint_sha256"].as_str() else {
                continue;
            };
            let seen = by_fp.entry(fp).or_insert_with(|| Seen {
                role,
                subject: cert["subject"].as_str().unwrap_or(""),
                not_after: cert["not_after"].as_i64(),
                ..Seen::default()
            });
            seen.handshakes += 1;
            seen.last_seen = seen.last_seen.max(ts);
            if role != "client" {
                if let Some(sni) = h["sni"].as_str() {
                    seen.names.insert(sni);
                }
            }
        }
    }
    let mut out: Vec<_> = by_fp.into_iter().collect();
    out.sort_by_key(|(_, s)| (s.not_after.is_none(), s.not_after));
    out
}

/// The days left before `not_after`, rounded down, and the cell's class.
fn days_left(not_after: i64, now_s: i64) -> (i64, &'static str) {
    let days = (not_after - now_s).div_euclid(86_400);
    (
        days,
        if days < EXPIRY_WARNING_DAYS {
            "bad"
        } else {
            "good"
        },
    )
}

fn certificate_table(certs: &[(&str, Seen<'_>)], now_s: i64) -> Markup {
    html! {
        table #certs {
            thead { tr {
                th { "role" } th { "subject" } th { "names (SNI)" } th { "expires (UTC)" }
                th { "days left" } th { "handshakes" } th { "last seen (UTC)" } th { "SHA-256" }
            } }
            tbody {
                @for (fp, c) in certs {
                    tr {
                        td { (c.role) } td.mono { (c.subject) }
                        td.mono {
                            @for n in c.names.iter().take(MAX_NAMES) { (n) " " }
                            @if c.names.len() > MAX_NAMES { "(+" (c.names.len() - MAX_NAMES) ")" }
                        }
                        @match c.not_after {
                            Some(t) => {
                                @let (days, class) = days_left(t, now_s);
                                td { (layout::time((t.max(0) as u64).saturating_mul(1000))) }
                                td class=(class) {
                                    @if days < 0 { "expired" } @else { (days) }
                                }
                            }
                            None => { td colspan="2" class="bad" { "unreadable certificate" } }
                        }
                        td { (c.handshakes) } td { (layout::time(c.last_seen)) }
                        td.mono title=(fp) { (fp.get(..16).unwrap_or(fp)) "…" }
                    }
                }
            }
        }
    }
}

/// `GET /console/tls`.
pub fn page(c: &Console, req: &Req) -> AdminResponse {
    let q = EventQuery {
        kind: Some("tls".into()),
        limit: SAMPLE,
        ..EventQuery::default()
    };
    let records = c.with_events(|s| s.query(&q));
    let now_s = (moat_events::now_ms() / 1000) as i64;
    let body = html! {
        @match &records {
            Err(e) => (layout::notice("muted", e)),
            Ok(rows) => {
                @let (v, cs, g) = mix(rows);
                @let certs = certificates(rows);
                @let expiring = certs.iter().filter(|(_, c)| c.not_after.is_some_and(|t| days_left(t, now_s).0 < EXPIRY_WARNING_DAYS)).count();
                p { (rows.len()) " audited handshakes (the newest " (SAMPLE) " at most)." }
                section.cards {
                    (counts("Protocol versions", "tls-versions", v))
                    (counts("Cipher suites", "tls-ciphers", cs))
                    (counts("Key exchange groups", "tls-groups", g))
                }
                h2 { "Certificates" }
                @if expiring > 0 {
                    p.bad #expiring { (expiring) " certificate(s) expire within " (EXPIRY_WARNING_DAYS) " days or have expired." }
                }
                @if certs.is_empty() {
                    p.muted { "No certificate in the audited handshakes yet." }
                } @else {
                    (certificate_table(&certs, now_s))
                }
            }
        }
    };
    web::html(
        StatusCode::OK,
        layout::page("TLS", "/console/tls", &req.csrf, body),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn certificates_are_grouped_and_flagged() {
        let now = 1_800_000_000i64;
        let rec = |ts: u64, role: &str, sni: Option<&str>, cert: Value, peer: Value| {
            serde_json::json!({"type": "tls", "ts": ts, "handshake": {
                "role": role, "sni": sni, "certificate": cert, "peer": peer}})
        };
        let cert = |fp: &str, days: i64| {
            serde_json::json!({"subject": format!("CN={fp}"), "fingerprint_sha256": fp,
                "not_after": now + days * 86_400})
        };
        let rows = vec![
            rec(1, "server", Some("a.test"), cert("aa", 400), cert("cc", 10)),
            rec(2, "server", Some("b.test"), cert("aa", 400), Value::Null),
            rec(3, "server", None, cert("bb", 29), Value::Null),
            rec(4, "client", Some("up.test"), Value::Null, cert("dd", -1)),
            // A malformed record is skipped, not a panic.
            serde_json::json!({"type": "tls", "handshake": {"certificate": {"not_after": "x"}}}),
        ];
        let certs = certificates(&rows);
        let order: Vec<&str> = certs.iter().map(|(fp, _)| *fp).collect();
        assert_eq!(order, ["dd", "cc", "bb", "aa"], "soonest expiry first");
        let aa = &certs[3].1;
        assert_eq!((aa.role, aa.handshakes, aa.last_seen), ("served", 2, 2));
        assert_eq!(aa.names, BTreeSet::from(["a.test", "b.test"]));
        assert_eq!(certs[1].1.role, "client");
        assert!(
            certs[1].1.names.is_empty(),
            "a client certificate has no SNI"
        );
        assert_eq!(certs[0].1.role, "upstream");
        let flags: Vec<_> = certs
            .iter()
            .map(|(_, c)| days_left(c.not_after.unwrap(), now))
            .collect();
        assert_eq!(
            flags,
            [(-1, "bad"), (10, "bad"), (29, "bad"), (400, "good")]
        );
        let html = certificate_table(&certs, now).into_string();
        assert!(html.contains("expired"));
    }
}
