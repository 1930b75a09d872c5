//! Access control: the Istio policies that apply to each workload (as `moat policy
//! explain` prints them), and a form answering "would this request be allowed, by which
//! policy and rule?" with the running engine and `moat policy check`'s evaluator.

use http::StatusCode;
use maud::{html, Markup};
use moat_authz::check::{self, CheckArgs};
use moat_proxy::AdminResponse;

use crate::ctx::{Console, Req};
use crate::layout;
use crate::web;

/// The workloads: each cluster's name, namespace and labels.
fn workloads(req: &Req) -> Vec<(String, String, Vec<String>)> {
    let snap = req.admin.gateway.snapshot();
    snap.config
        .clusters
        .iter()
        .map(|c| {
            (
                c.name.value.clone(),
                c.namespace.clone(),
                c.labels.iter().map(|(k, v)| format!("{k}={v}")).collect(),
            )
        })
        .collect()
}

fn render(req: &Req, result: Option<Markup>) -> AdminResponse {
    let snap = req.admin.gateway.snapshot();
    let Some(engine) = snap.pipeline.engines.authz.clone() else {
        let body = layout::notice("muted", "Access control is off (set authz.enabled: true).");
        return web::html(
            StatusCode::OK,
            layout::page("Access control", "/console/policy", &req.csrf, body),
        );
    };
    let wl = workloads(req);
    let f = |k: &str, d: &'static str| {
        req.f(k)
            .map(str::to_string)
            .unwrap_or_else(|| d.to_string())
    };
    let body = html! {
        h2 { "Would this request be allowed?" }
        form.policy method="post" action="/console/policy" {
            input type="hidden" name="csrf" value=(req.csrf);
            label { "workload"
                select name="workload" id="p-workload" {
                    @for (name, ns, labels) in &wl {
                        option value=(name) selected[req.f("workload") == Some(name.as_str())] { (name) " (" (ns) ": " (labels.join(",")) ")" }
                    }
                }
            }
            label { "method" input type="text" name="method" id="p-method" value=(f("method", "GET")); }
            label.wide { "URL" input type="text" name="url" id="p-url" value=(f("url", "http://example.com/")); }
            label { "source IP" input type="text" name="source_ip" id="p-source-ip" value=(f("source_ip", "")); }
            label.wide { "headers (Name: value, one per line)" textarea name="headers" id="p-headers" { (f("headers", "")) } }
            button type="submit" id="p-check" { "Check" }
        }
        @if let Some(r) = result { (r) }
        h2 { "Policies per workload" }
        @for (name, ns, labels) in &wl {
            @let args = CheckArgs { namespace: ns.clone(), labels: labels.clone(), ..CheckArgs::default() };
            details open {
                summary { (name) " (" (ns) ")" }
                @match check::parse_labels(&args) {
                    Ok(l) => pre { (moat_authz::explain::to_text(&moat_authz::explain::explain(&engine, ns, &l))) }
                    Err(e) => (layout::notice("error", &e)),
                }
            }
        }
    };
    web::html(
        StatusCode::OK,
        layout::page("Access control", "/console/policy", &req.csrf, body),
    )
}

/// `GET /console/policy`.
pub fn page(_c: &Console, req: &Req) -> AdminResponse {
    render(req, None)
}

/// `POST /console/policy`: evaluates the form's request (no state changes, but a POST
/// keeps tokens in headers out of URLs and history).
pub fn check(_c: &Console, req: &Req) -> AdminResponse {
    let snap = req.admin.gateway.snapshot();
    let result = match &snap.pipeline.engines.authz {
        None => None,
        Some(engine) => {
            let wl = workloads(req);
            let chosen = req
                .f("workload")
                .and_then(|w| wl.iter().find(|(n, _, _)| n == w))
                .or(wl.first());
            let authz = &snap.config.authz;
            let args = CheckArgs {
                url: req.f("url").unwrap_or("").trim().to_string(),
                method: req.f("method").unwrap_or("GET").trim().to_string(),
                headers: req
                    .f("headers")
                    .unwrap_or("")
                    .lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty())
                    .map(str::to_string)
                    .collect(),
                source_ip: req.f("source_ip").map(str::to_string),
                namespace: chosen
                    .map(|w| w.1.clone())
                    .unwrap_or_else(|| "default".into()),
                labels: chosen.map(|w| w.2.clone()).unwrap_or_default(),
                root_namespace: authz.root_namespace.clone(),
                trusted_proxies: authz.trusted_proxies.unwrap_or(0),
                path_normalization: authz.path_normalization,
                ..CheckArgs::default()
            };
            Some(match check::check_with(engine, &args) {
                Ok(d) => html! {
                    div #p-result class=(if d.allowed { "result good" } else { "result bad" }) {
                        p.big #p-decision { (d.status) " " (check::decision_word(&d)) }
                        pre #p-text { (check::to_text(&d)) }
                    }
                },
                Err(e) => layout::notice("error", &e),
            })
        }
    };
    render(req, result)
}
