//! moat's web console, served by the admin listener under `/console`.
//!
//! Pages are rendered on the server ([maud] templates, which escape every value by
//! default) from the gateway's own state: the current snapshot (config, engines,
//! clusters), the metrics, the event store, the API inventory and the reload history.
//! A little plain JavaScript (`assets/console.js`, no framework) redraws the live
//! request rate. Assets are compiled into the binary: nothing is fetched from elsewhere,
//! the console works offline.
//!
//! Security of the console itself:
//! - login with the admin token (`admin.token`), then a random session id in an
//!   `HttpOnly; SameSite=Strict` cookie (see [`session`]);
//! - every POST carries the session's CSRF token and, from a browser, an `Origin` naming
//!   the console's own host;
//! - `Content-Security-Policy` allows scripts and styles from the console only (no
//!   inline script or style), no framing ([`web::CSP`]);
//! - loopback peers only, and a `Host` that is an address or `localhost` (DNS
//!   rebinding), unless `admin.console.allow_remote`;
//! - the config is shown with secrets redacted, events carry no secret values.
//!
//! Modules, bottom to top: [`web`], [`session`], [`ctx`], [`layout`], [`chart`],
//! [`yaml_edit`], then `pages`, then this file (the routes).

#![warn(missing_docs)]

pub mod chart;
pub mod ctx;
pub mod layout;
mod pages;
pub mod session;
pub mod web;
pub mod yaml_edit;

use std::path::PathBuf;
use std::sync::Arc;

use http::{Method, StatusCode};
use moat_proxy::{AdminRequest, AdminResponse, AdminRouter};

use crate::ctx::{Console, Req};
use crate::session::{session_cookie, token_hash, COOKIE};

/// A page: what it answers to GET and POST.
type Page = fn(&Console, &Req) -> AdminResponse;

/// The console's pages: path, GET handler, POST handler.
const PAGES: &[(&str, Option<Page>, Option<Page>)] = &[
    ("/console", Some(pages::overview::page), None),
    ("/console/api/stats", Some(pages::overview::stats), None),
    ("/console/events", Some(pages::events::list), None),
    ("/console/event", Some(pages::events::detail), None),
    (
        "/console/exclude",
        Some(pages::exclude::preview),
        Some(pages::exclude::apply),
    ),
    ("/console/apis", Some(pages::apis::page), None),
    ("/console/openapi.json", Some(pages::apis::openapi), None),
    (
        "/console/policy",
        Some(pages::policy::page),
        Some(pages::policy::check),
    ),
    ("/console/tls", Some(pages::tls::page), None),
    ("/console/config", Some(pages::config::page), None),
];

const CSS: &str = include_str!("../assets/console.css");
const JS: &str = include_str!("../assets/console.js");

/// Adds the console's routes to `router`. `event_store` is the SQLite file the event
/// writer fills, if any (the Events and TLS pages read it).
pub fn console_routes(router: AdminRouter, event_store: Option<PathBuf>) -> AdminRouter {
    let console = Arc::new(Console::new(event_store));
    let mut router = router;
    let mut paths: Vec<&str> = PAGES.iter().map(|(p, _, _)| *p).collect();
    paths.extend([
        "/console/login",
        "/console/logout",
        "/console/assets/console.css",
        "/console/assets/console.js",
    ]);
    for path in paths {
        let c = console.clone();
        router = router.route_self_authenticated(
            path,
            Arc::new(move |req| {
                let c = c.clone();
                Box::pin(async move {
                    // Pages read SQLite and compile engines on apply: off the async workers.
                    tokio::task::spawn_blocking(move || handle(&c, req))
                        .await
                        .unwrap_or_else(|_| {
                            web::plain(StatusCode::INTERNAL_SERVER_ERROR, "console error\n")
                        })
                })
            }),
        );
    }
    router
}

fn handle(console: &Console, req: AdminRequest) -> AdminResponse {
    let snap = req.gateway.snapshot();
    let admin = &snap.config.admin;
    if !admin.console.enabled {
        return web::plain(StatusCode::NOT_FOUND, "not found\n");
    }
    if !admin.console.allow_remote {
        if !req.peer.ip().is_loopback() {
            return web::plain(
                StatusCode::FORBIDDEN,
                "the console answers loopback clients only (admin.console.allow_remote)\n",
            );
        }
        if !web::host_is_local_name(&req.parts.headers) {
            return web::plain(
                StatusCode::MISDIRECTED_REQUEST,
                "the console is served under an IP address or localhost only\n",
            );
        }
    }
    let path = req.parts.uri.path();
    match path {
        "/console/assets/console.css" => return web::asset("text/css; charset=utf-8", CSS),
        "/console/assets/console.js" => return web::asset("text/javascript; charset=utf-8", JS),
        _ => {}
    }
    let post = req.parts.method == Method::POST;
    if post && !web::same_origin(&req.parts.headers) {
        return web::plain(StatusCode::FORBIDDEN, "cross-origin request refused\n");
    }
    let form = if post {
        if req.body.len() > web::MAX_FORM_BYTES {
            return web::plain(StatusCode::PAYLOAD_TOO_LARGE, "form too large\n");
        }
        match std::str::from_utf8(&req.body)
            .ok()
            .and_then(web::decode_pairs)
        {
            Some(f) => f,
            None => return web::plain(StatusCode::BAD_REQUEST, "bad form\n"),
        }
    } else {
        Vec::new()
    };
    let Some(query) = web::decode_pairs(req.parts.uri.query().unwrap_or("")) else {
        return web::plain(StatusCode::BAD_REQUEST, "too many query parameters\n");
    };
    let token = admin.token.as_deref();
    let hash = token_hash(token);
    let ttl = admin.console.session_ttl;
    if path == "/console/login" {
        return login(console, post, &form, token, hash, ttl);
    }
    let session = session_cookie(&req.parts.headers).map(str::to_string);
    let Some(csrf) = session
        .as_deref()
        .and_then(|id| console.sessions.check(id, &hash))
    else {
        return web::redirect("/console/login", None);
    };
    if post {
        let sent = web::field(&form, "csrf").unwrap_or("");
        if !moat_proxy::admin::token_matches(sent, &csrf) {
            return web::plain(StatusCode::FORBIDDEN, "missing or wrong CSRF token\n");
        }
    }
    if path == "/console/logout" {
        if !post {
            return web::plain(StatusCode::METHOD_NOT_ALLOWED, "use POST\n");
        }
        if let Some(id) = &session {
            console.sessions.remove(id);
        }
        return web::redirect(
            "/console/login",
            Some(format!(
                "{COOKIE}=; Path=/console; HttpOnly; SameSite=Strict; Max-Age=0"
            )),
        );
    }
    let Some((_, get, on_post)) = PAGES.iter().find(|(p, _, _)| *p == path) else {
        return web::plain(StatusCode::NOT_FOUND, "not found\n");
    };
    let handler = if post { on_post } else { get };
    let Some(handler) = handler else {
        return web::plain(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
    };
    let r = Req {
        admin: req,
        query,
        form,
        csrf,
    };
    handler(console, &r)
}

fn login(
    console: &Console,
    post: bool,
    form: &[(String, String)],
    token: Option<&str>,
    hash: String,
    ttl: std::time::Duration,
) -> AdminResponse {
    if !post {
        return web::html(StatusCode::OK, layout::login(None, token.is_some()));
    }
    if let Some(t) = token {
        let sent = web::field(form, "token").unwrap_or("");
        if !moat_proxy::admin::token_matches(sent.trim(), t) {
            return web::html(
                StatusCode::UNAUTHORIZED,
                layout::login(Some("Wrong admin token."), true),
            );
        }
    }
    let (id, _csrf) = console.sessions.create(ttl, hash);
    web::redirect(
        "/console",
        Some(format!(
            "{COOKIE}={id}; Path=/console; HttpOnly; SameSite=Strict; Max-Age={}",
            ttl.as_secs()
        )),
    )
}
