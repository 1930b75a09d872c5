//! The false-positive workflow: from a WAF event, the exclusion that lets the same
//! request through, the config change it makes (validated, shown as a diff) and, on
//! confirmation, the change applied through the reload path and recorded in the
//! reload history.

use http::StatusCode;
use maud::html;
use moat_proxy::config::{self, GatewayConfig};
use moat_proxy::AdminResponse;
use moat_waf::config::WafExclusion;
use moat_waf::triage::{self, Scope};
use sha2::{Digest, Sha256};

use crate::ctx::{Console, Req};
use crate::layout;
use crate::web;
use crate::yaml_edit;

/// A change ready to apply.
struct Plan {
    exclusion: WafExclusion,
    snippet: String,
    /// The new config file text, `None` when the config does not come from a file
    /// (the quickstart): the change is then applied in memory only.
    new_text: Option<String>,
    /// Hash of the file text the change was computed from (a concurrent edit refuses
    /// the apply).
    base: String,
    diff: String,
    /// The new configuration, validated.
    config: GatewayConfig,
}

fn hash(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

fn plan(c: &Console, req: &Req, id: i64, whole_route: bool) -> Result<Plan, String> {
    let rec = c
        .with_events(|s| s.get(id))?
        .ok_or("no such event (it may have been deleted by retention)")?;
    if rec["type"] != "security" || rec["event"]["engine"] != "waf" {
        return Err("this event is not a WAF finding".into());
    }
    let er = triage::request_from_record(&rec).ok_or("this event is not a WAF finding")?;
    let scope = if whole_route {
        Scope::Route
    } else {
        Scope::Narrow
    };
    let exclusion = triage::exclusion_for(&er, scope);
    let frag = rec["event"]["details"]["fragment"].as_str().unwrap_or("");
    let snippet = triage::render_snippet(
        &exclusion,
        Some(&format!(
            "from event {}; matched {frag:?}",
            rec["event"]["id"].as_str().unwrap_or("")
        )),
    );
    let snap = req.admin.gateway.snapshot();
    let src = snap.source.clone();
    if src.file.is_file() {
        let text = std::fs::read_to_string(&src.file)
            .map_err(|e| format!("{}: {e}", src.file.display()))?;
        let new_text = yaml_edit::insert_exclusion(&text, &exclusion)?;
        let config = config::parse(&src, &new_text).map_err(|e| e.to_string())?;
        moat_waf::WafEngine::build(&config.waf).map_err(|e| e.to_string())?;
        let diff = yaml_edit::diff(&text, &new_text, &src.file.display().to_string());
        Ok(Plan {
            exclusion,
            snippet,
            base: hash(&text),
            new_text: Some(new_text),
            diff,
            config,
        })
    } else {
        let mut config = (*snap.config).clone();
        let before = triage_list(&config.waf.exclusions);
        config.waf.exclusions.push(exclusion.clone());
        config::validate(&src, &config).map_err(|e| e.to_string())?;
        moat_waf::WafEngine::build(&config.waf).map_err(|e| e.to_string())?;
        let after = triage_list(&config.waf.exclusions);
        Ok(Plan {
            exclusion,
            snippet,
            new_text: None,
            base: hash(&before),
            diff: yaml_edit::diff(&before, &after, "waf.exclusions (in memory)"),
            config,
        })
    }
}

/// The exclusions as the YAML items a config file would hold.
fn triage_list(list: &[WafExclusion]) -> String {
    list.iter().map(|e| triage::render_item(e, 0)).collect()
}

fn args(req: &Req, form: bool) -> Option<(i64, bool)> {
    let get = |k| if form { req.f(k) } else { req.q(k) };
    let id = get("id")?.parse().ok()?;
    Some((id, get("scope") == Some("route")))
}

fn error_page(req: &Req, status: StatusCode, msg: &str) -> AdminResponse {
    web::html(
        status,
        layout::page(
            "Exclude",
            "/console/events",
            &req.csrf,
            layout::notice("error", msg),
        ),
    )
}

/// `GET /console/exclude?id=N[&scope=route]`: the snippet and the diff, and the
/// confirmation form.
pub fn preview(c: &Console, req: &Req) -> AdminResponse {
    let Some((id, whole_route)) = args(req, false) else {
        return web::plain(StatusCode::BAD_REQUEST, "id: expected an event id\n");
    };
    let p = match plan(c, req, id, whole_route) {
        Ok(p) => p,
        Err(e) => return error_page(req, StatusCode::UNPROCESSABLE_ENTITY, &e),
    };
    let scope = if whole_route { "route" } else { "narrow" };
    let body = html! {
        p { "The exclusion that lets this request through (and nothing wider: the route, the path, the field and the detector):" }
        pre #snippet { (p.snippet) }
        p {
            @if whole_route {
                a href={"/console/exclude?id=" (id)} { "Only this path" }
            } @else {
                a href={"/console/exclude?id=" (id) "&scope=route"} { "Every path of the route" }
            }
        }
        h2 { "The change" }
        @if p.new_text.is_none() {
            p.note { "This configuration does not come from a file: the change is applied in memory and lost on restart. Add the snippet to your config file to keep it." }
        }
        pre.diff #diff { (p.diff) }
        p.good { "Validated: the new configuration loads." }
        form method="post" action="/console/exclude" {
            input type="hidden" name="csrf" value=(req.csrf);
            input type="hidden" name="id" value=(id);
            input type="hidden" name="scope" value=(scope);
            input type="hidden" name="base" value=(p.base);
            button type="submit" id="apply" { "Apply and reload" }
        }
    };
    web::html(
        StatusCode::OK,
        layout::page(
            "Exclude a false positive",
            "/console/events",
            &req.csrf,
            body,
        ),
    )
}

/// `POST /console/exclude`: writes the change and reloads.
pub fn apply(c: &Console, req: &Req) -> AdminResponse {
    let Some((id, whole_route)) = args(req, true) else {
        return web::plain(StatusCode::BAD_REQUEST, "id: expected an event id\n");
    };
    let p = match plan(c, req, id, whole_route) {
        Ok(p) => p,
        Err(e) => return error_page(req, StatusCode::UNPROCESSABLE_ENTITY, &e),
    };
    if req.f("base") != Some(p.base.as_str()) {
        return error_page(
            req,
            StatusCode::CONFLICT,
            "The configuration changed since the preview: review the change again.",
        );
    }
    let gw = &req.admin.gateway;
    let origin = format!(
        "console: WAF exclusion for event {id} ({} on {})",
        p.exclusion.detector.as_deref().unwrap_or("?"),
        p.exclusion.location.as_deref().unwrap_or("any location")
    );
    let snap = gw.snapshot();
    let result = match &p.new_text {
        Some(text) => {
            let file = &snap.source.file;
            let old = std::fs::read_to_string(file).unwrap_or_default();
            if let Err(e) = write_atomically(file, text) {
                return error_page(
                    req,
                    StatusCode::INTERNAL_SERVER_ERROR,
                    &format!("{}: {e}", file.display()),
                );
            }
            let r = gw.reload_from_file_recorded(&origin, Some(p.diff.clone()));
            if r.is_err() {
                // Validated above, so only a race gets here: put the file back.
                let _ = write_atomically(file, &old);
            }
            r
        }
        None => gw.apply_recorded(p.config, snap.source.clone(), &origin, Some(p.diff.clone())),
    };
    match result {
        Ok(()) => web::redirect("/console/config?applied=1#history", None),
        Err(e) => error_page(req, StatusCode::UNPROCESSABLE_ENTITY, &e.to_string()),
    }
}

/// Replaces `file` by a new file with `text` (written beside it, then renamed): the
/// gateway's file watcher never reads a half-written config.
fn write_atomically(file: &std::path::Path, text: &str) -> std::io::Result<()> {
    let tmp = file.with_extension("console-tmp");
    std::fs::write(&tmp, text)?;
    if let Ok(meta) = std::fs::metadata(file) {
        let _ = std::fs::set_permissions(&tmp, meta.permissions());
    }
    std::fs::rename(&tmp, file)
}
