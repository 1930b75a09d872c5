//! API inventory: the endpoints discovery learned, their schemas, sensitive data, auth
//! kinds, first/last seen and counts; the OpenAPI document as a download.

use http::StatusCode;
use maud::html;
use moat_proxy::AdminResponse;
use moat_schema::Endpoint;

use crate::ctx::{Console, Req};
use crate::layout;
use crate::web;

fn endpoints(req: &Req) -> Option<Vec<Endpoint>> {
    let snap = req.admin.gateway.snapshot();
    let d = snap.pipeline.engines.discovery.as_ref()?;
    let mut eps = d.engine().endpoints();
    eps.sort_by(|a, b| (&a.path, &a.method).cmp(&(&b.path, &b.method)));
    Some(eps)
}

/// `GET /console/apis`.
pub fn page(_c: &Console, req: &Req) -> AdminResponse {
    let body = match endpoints(req) {
        None => layout::notice(
            "muted",
            "API discovery is off (set discovery.enabled: true).",
        ),
        Some(eps) => html! {
            p { (eps.len()) " endpoints. " a #openapi href="/console/openapi.json" { "Download the OpenAPI document" } }
            table #apis {
                thead { tr { th { "method" } th { "path" } th { "route" } th { "requests" } th { "auth" } th { "sensitive data" } th { "first seen" } th { "last seen" } th { "statuses" } } }
                tbody {
                    @for e in &eps {
                        @let sensitive = e.sensitive();
                        tr {
                            td.mono { (e.method) } td.mono.path { (e.path) } td { (e.route) }
                            td { (e.count) }
                            td { @for (k, n) in &e.auth { span.tag { (k) " " (n) } " " } }
                            td { @for f in &sensitive {
                                span.tag.bad title=(format!("{} {}", f.location, f.path)) {
                                    (f.tags.keys().cloned().collect::<Vec<_>>().join(",")) " @ " (f.location) (f.path)
                                } " "
                            } }
                            td { (layout::time(e.first_seen)) } td { (layout::time(e.last_seen)) }
                            td { (e.responses.keys().map(|s| s.to_string()).collect::<Vec<_>>().join(" ")) }
                        }
                        tr.schema { td colspan="9" { details {
                            summary { "Schemas" }
                            pre { (serde_json::to_string_pretty(&serde_json::json!({
                                "request": e.request, "responses": e.responses,
                            })).unwrap_or_default()) }
                        } } }
                    }
                }
            }
        },
    };
    web::html(
        StatusCode::OK,
        layout::page("API inventory", "/console/apis", &req.csrf, body),
    )
}

/// `GET /console/openapi.json`.
pub fn openapi(_c: &Console, req: &Req) -> AdminResponse {
    match endpoints(req) {
        None => web::plain(StatusCode::NOT_FOUND, "API discovery is off\n"),
        Some(eps) => {
            let doc = moat_schema::openapi::openapi(&eps, "moat API inventory");
            web::download(
                "application/json",
                "attachment; filename=\"openapi.json\"",
                serde_json::to_string_pretty(&doc).unwrap_or_default(),
            )
        }
    }
}
