//! Overview: live request rate, blocks per engine, phase latency, upstream health,
//! event queue drops.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use http::StatusCode;
use maud::html;
use moat_proxy::metrics::{Decision, PHASES};
use moat_proxy::AdminResponse;

use crate::chart;
use crate::ctx::{Console, Req};
use crate::layout;
use crate::web;

/// Window of the "blocks per engine" chart.
const BLOCKS_WINDOW_MS: u64 = 3_600_000;

/// Requests by decision since start, over every route.
fn totals(req: &Req) -> [u64; 4] {
    let snap = req.admin.gateway.snapshot();
    let mut t = [0u64; 4];
    for r in &snap.routes {
        for (i, d) in [
            Decision::Allow,
            Decision::Block,
            Decision::Limit,
            Decision::Error,
        ]
        .into_iter()
        .enumerate()
        {
            t[i] += r.metrics.total(d);
        }
    }
    t
}

/// `GET /console/api/stats`: the counters `console.js` turns into rates.
pub fn stats(_c: &Console, req: &Req) -> AdminResponse {
    let [allow, block, limit, error] = totals(req);
    web::json(&serde_json::json!({
        "t": moat_events::now_ms(),
        "requests": allow + block + limit + error,
        "blocked": block + limit,
    }))
}

/// `GET /console`.
pub fn page(c: &Console, req: &Req) -> AdminResponse {
    let gw = &req.admin.gateway;
    let snap = gw.snapshot();
    let [allow, block, limit, error] = totals(req);
    let since = moat_events::now_ms().saturating_sub(BLOCKS_WINDOW_MS);
    let blocks = c.with_events(|s| s.count_security(since));
    let mut by_engine: BTreeMap<String, u64> = BTreeMap::new();
    if let Ok(rows) = &blocks {
        for (engine, action, n) in rows {
            if action == "block" {
                *by_engine.entry(engine.clone()).or_default() += n;
            }
        }
    }
    let by_engine: Vec<(String, u64)> = by_engine.into_iter().collect();
    let phases: Vec<(&str, u64, Option<f64>, Option<f64>)> = PHASES
        .iter()
        .map(|p| {
            let h = gw.metrics.phase(*p);
            let ms = |q| h.quantile_upper_bound(q).map(|d| d.as_secs_f64() * 1e3);
            (p.name(), h.count(), ms(0.5), ms(0.99))
        })
        .collect();
    let p99: Vec<(String, u64)> = phases
        .iter()
        .map(|(n, _, _, p99)| (n.to_string(), p99.map_or(0, |v| (v * 1000.0) as u64)))
        .collect();
    let queue = gw.events.as_ref().and_then(|e| e.gauge());
    let dropped_by_proxy = gw.metrics.events_dropped.load(Ordering::Relaxed);
    let mut clusters: Vec<&moat_proxy::upstream::Cluster> = Vec::new();
    for r in &snap.routes {
        if !clusters.iter().any(|c| c.name == r.cluster.name) {
            clusters.push(&r.cluster);
        }
    }
    let body = html! {
        section.cards {
            div.card { h2 { "Requests/s" } p.big id="rps" { "…" } (chart::live_line("rps-chart", "requests")) }
            div.card { h2 { "Blocked/s" } p.big id="bps" { "…" } (chart::live_line("bps-chart", "blocked")) }
            div.card {
                h2 { "Since start" }
                table { tbody {
                    tr { th { "allowed" } td { (allow) } }
                    tr { th { "blocked" } td { (block) } }
                    tr { th { "refused by a limit" } td { (limit) } }
                    tr { th { "errors" } td { (error) } }
                } }
            }
            div.card {
                h2 { "Event queue" }
                @match queue {
                    Some(q) => {
                        table { tbody {
                            tr { th { "depth" } td { (q.depth) " / " (q.capacity) } }
                            tr { th { "dropped" } td id="queue-dropped" { (q.dropped + dropped_by_proxy) } }
                        } }
                    }
                    None => p.muted { "no event pipeline configured" }
                }
            }
        }
        section {
            h2 { "Blocks per engine (last hour)" }
            @match &blocks {
                Ok(_) => (chart::bars("blocks-chart", &by_engine)),
                Err(e) => (layout::notice("muted", e)),
            }
        }
        section {
            h2 { "Phase latency, p99 (µs, bucket bound)" }
            (chart::bars("phase-chart", &p99))
            table {
                thead { tr { th { "phase" } th { "count" } th { "p50 ≤ ms" } th { "p99 ≤ ms" } } }
                tbody {
                    @for (name, count, p50, p99) in &phases {
                        tr {
                            td { (name) } td { (count) }
                            td { (p50.map(|v| format!("{v:.3}")).unwrap_or_else(|| "-".into())) }
                            td { (p99.map(|v| format!("{v:.3}")).unwrap_or_else(|| "-".into())) }
                        }
                    }
                }
            }
        }
        section {
            h2 { "Upstream health" }
            table #upstreams {
                thead { tr { th { "cluster" } th { "endpoint" } th { "state" } th { "connect errors" } th { "timeouts" } th { "ejections" } } }
                tbody {
                    @for c in &clusters {
                        @for (i, ep) in c.endpoints.iter().enumerate() {
                            tr {
                                td { (c.name) } td { (ep.authority) }
                                @if c.is_ejected(i) { td.bad { "ejected" } } @else { td.good { "in rotation" } }
                                td { (c.metrics.connect_errors.load(Ordering::Relaxed)) }
                                td { (c.metrics.timeouts.load(Ordering::Relaxed)) }
                                td { (c.metrics.ejections.load(Ordering::Relaxed)) }
                            }
                        }
                    }
                }
            }
        }
    };
    web::html(
        StatusCode::OK,
        layout::page("Overview", "/console", &req.csrf, body),
    )
}
