//! TLS: protocol versions, cipher suites and key exchange groups of the audited
//! handshakes (the event store's TLS records), and the expiry of the certificates the
//! listeners serve.

use std::collections::BTreeMap;

use http::StatusCode;
use maud::{html, Markup};
use moat_events::EventQuery;
use moat_proxy::AdminResponse;

use crate::chart;
use crate::ctx::{Console, Req};
use crate::layout;
use crate::web;

/// Handshakes read (the newest): enough for the mix, bounded.
const SAMPLE: usize = 10_000;

fn version_name(v: u64) -> String {
    match v {
        0x0304 => "TLS 1.3".into(),
        0x0303 => "TLS 1.2".into(),
        0x0302 => "TLS 1.1".into(),
        0x0301 => "TLS 1.0".into(),
        other => format!("0x{other:04x}"),
    }
}

/// A certificate's subject and not-after time (unix seconds), or why it was not read.
type Expiry = Result<(String, i64), String>;

/// One entry per listener certificate: listener, file, expiry.
fn certificates(req: &Req) -> Vec<(String, String, Expiry)> {
    let snap = req.admin.gateway.snapshot();
    let mut out = Vec::new();
    for l in &snap.config.listeners {
        let Some(tls) = &l.tls else { continue };
        for c in &tls.certificates {
            let path = snap.source.base_dir.join(&c.cert);
            out.push((
                l.name.value.clone(),
                c.cert.display().to_string(),
                leaf_expiry(&path),
            ));
        }
    }
    out
}

fn leaf_expiry(path: &std::path::Path) -> Expiry {
    let pem = std::fs::read(path).map_err(|e| e.to_string())?;
    let der = rustls_pemfile::certs(&mut pem.as_slice())
        .next()
        .ok_or("no certificate in the file")?
        .map_err(|e| e.to_string())?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der).map_err(|e| e.to_string())?;
    Ok((
        cert.subject().to_string(),
        cert.validity().not_after.timestamp(),
    ))
}

fn counts(title: &str, id: &str, m: BTreeMap<String, u64>) -> Markup {
    let rows: Vec<(String, u64)> = m.into_iter().collect();
    html! { div.card { h2 { (title) } (chart::bars(id, &rows)) } }
}

type Counts = BTreeMap<String, u64>;

/// Handshakes by protocol version, cipher suite and key exchange group.
fn mix(rows: &[serde_json::Value]) -> (Counts, Counts, Counts) {
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
                p { (rows.len()) " audited handshakes (the newest " (SAMPLE) " at most)." }
                section.cards {
                    (counts("Protocol versions", "tls-versions", v))
                    (counts("Cipher suites", "tls-ciphers", cs))
                    (counts("Key exchange groups", "tls-groups", g))
                }
            }
        }
        h2 { "Listener certificates" }
        table #certs {
            thead { tr { th { "listener" } th { "file" } th { "subject" } th { "expires (UTC)" } th { "days left" } } }
            tbody {
                @for (listener, file, info) in certificates(req) {
                    tr {
                        td { (listener) } td.mono { (file) }
                        @match info {
                            Ok((subject, not_after)) => {
                                @let days = (not_after - now_s) / 86_400;
                                td { (subject) }
                                td { (layout::time((not_after.max(0) as u64) * 1000)) }
                                td class=(if days < 14 { "bad" } else { "good" }) { (days) }
                            }
                            Err(e) => { td colspan="3" class="bad" { (e) } }
                        }
                    }
                }
            }
        }
    };
    web::html(
        StatusCode::OK,
        layout::page("TLS", "/console/tls", &req.csrf, body),
    )
}
