//! Config: the running configuration (secrets redacted) and the reload history.

use http::StatusCode;
use maud::html;
use moat_proxy::AdminResponse;

use crate::ctx::{Console, Req};
use crate::layout;
use crate::web;

/// `GET /console/config`.
pub fn page(_c: &Console, req: &Req) -> AdminResponse {
    let gw = &req.admin.gateway;
    let snap = gw.snapshot();
    let mut v = serde_json::to_value(&*snap.config).unwrap_or_default();
    moat_proxy::admin::redact(&mut v);
    let running = serde_json::to_string_pretty(&v).unwrap_or_default();
    let history = gw.reloads.newest_first();
    let body = html! {
        @if req.q("applied").is_some() {
            p.good #applied { "Applied: the new configuration is serving." }
        }
        p { "From " span.mono { (snap.source.file.display()) } ". Secret values are shown as <redacted>." }
        h2 #history { "Reload history" }
        @if history.is_empty() { p.muted { "No reload since start." } }
        table #reloads {
            thead { tr { th { "time (UTC)" } th { "origin" } th { "result" } th { "change" } } }
            tbody {
                @for r in &history {
                    tr {
                        td { (layout::time(r.at_ms)) }
                        td { (r.origin) }
                        @if r.ok { td.good { "applied" } } @else { td.bad { "refused: " (r.error.as_deref().unwrap_or("")) } }
                        td { @if let Some(d) = &r.diff { details { summary { "diff" } pre.diff { (d) } } } }
                    }
                }
            }
        }
        h2 { "Running configuration" }
        pre #running { (running) }
    };
    web::html(
        StatusCode::OK,
        layout::page("Config", "/console/config", &req.csrf, body),
    )
}
