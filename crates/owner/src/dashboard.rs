//! The web dashboard: `/ui`, static files embedded in the binary, and
//! `/ui/login`, which spends a one-time code for a login credential ([`crate::browser`]).
//!
//! The page is a plain ES module that speaks the same JSON-RPC over `/v1/ws` as every other
//! client: nothing here reads the ledger or a registry. Every response forbids framing (an
//! approval button must not be clickable through another site's page), sniffing, referrers and
//! caching, and its Content-Security-Policy lets the page load only its own files and talk only
//! to its own origin.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;
use axum::Router;

use crate::owner::Owner;

/// One embedded file: its path under `/ui/`, its content type and its bytes.
struct Asset {
    path: &'static str,
    content_type: &'static str,
    body: &'static str,
}

/// The dashboard's files (`crates/owner/ui/`), compiled in: no build step, no network.
const ASSETS: &[Asset] = &[
    Asset {
        path: "",
        content_type: "text/html; charset=utf-8",
        body: include_str!("../ui/index.html"),
    },
    Asset {
        path: "app.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("../ui/app.js"),
    },
    Asset {
        path: "markdown.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_str!("../ui/markdown.js"),
    },
    Asset {
        path: "style.css",
        content_type: "text/css; charset=utf-8",
        body: include_str!("../ui/style.css"),
    },
];

/// The dashboard's routes, for the daemon's router.
pub fn router<S: Clone + Send + Sync + 'static>(owner: Arc<Owner>) -> Router<S> {
    Router::new()
        .route("/ui", get(|| async { Redirect::to("/ui/") }))
        .route("/ui/", get(index))
        .route("/ui/login", get(login))
        .route("/ui/{file}", get(asset))
        .with_state(owner)
}

/// The headers every dashboard response carries.
fn guarded(owner: &Owner, status: StatusCode, content_type: &str, body: String) -> Response {
    let origin = owner.browser.origin();
    let ws_origin = origin.replacen("http", "ws", 1);
    let csp = format!(
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
         connect-src 'self' {ws_origin}; frame-ancestors 'none'; base-uri 'none'; \
         form-action 'none'"
    );
    let mut response = (status, body).into_response();
    let headers = response.headers_mut();
    let mut set = |name: HeaderName, value: &str| {
        if let Ok(v) = HeaderValue::from_str(value) {
            headers.insert(name, v);
        }
    };
    set(header::CONTENT_TYPE, content_type);
    set(header::CONTENT_SECURITY_POLICY, &csp);
    set(header::X_FRAME_OPTIONS, "DENY");
    set(header::X_CONTENT_TYPE_OPTIONS, "nosniff");
    set(header::REFERRER_POLICY, "no-referrer");
    set(header::CACHE_CONTROL, "no-store");
    response
}

fn file(owner: &Owner, path: &str) -> Response {
    match ASSETS.iter().find(|a| a.path == path) {
        Some(a) => guarded(owner, StatusCode::OK, a.content_type, a.body.to_string()),
        None => guarded(
            owner,
            StatusCode::NOT_FOUND,
            "text/plain; charset=utf-8",
            format!("no dashboard file {path:?}\n"),
        ),
    }
}

async fn index(State(owner): State<Arc<Owner>>) -> Response {
    file(&owner, "")
}

async fn asset(
    State(owner): State<Arc<Owner>>,
    axum::extract::Path(path): axum::extract::Path<String>,
) -> Response {
    file(&owner, &path)
}

/// `GET /ui/login?code=<code>`: a good code becomes a login credential, handed to the
/// dashboard in the fragment of the redirect to it; a used, expired or unknown one gets a page saying to run `drover ui` again.
async fn login(
    State(owner): State<Arc<Owner>>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let code = query.get("code").map(String::as_str).unwrap_or_default();
    match owner.browser.redeem(code) {
        Ok(credential) => {
            let mut response = guarded(
                &owner,
                StatusCode::SEE_OTHER,
                "text/plain; charset=utf-8",
                "logged in\n".into(),
            );
            // In the fragment: the browser keeps it, no server (nor a log) ever sees it.
            let location = format!("/ui/#/login/{}", credential.expose());
            if let Ok(v) = HeaderValue::from_str(&location) {
                response.headers_mut().insert(header::LOCATION, v);
            }
            tracing::info!("dashboard login: a browser spent a login code");
            response
        }
        Err(why) => {
            tracing::info!(%why, "dashboard login refused");
            let body = format!(
                "<!doctype html><meta charset=utf-8><title>drover: login refused</title>\
                 <link rel=stylesheet href=/ui/style.css>\
                 <main class=refused><h1>Login refused</h1><p id=refusal>{why}.</p>\
                 <p>Run <code>drover ui</code> again for a new link.</p></main>\n"
            );
            guarded(
                &owner,
                StatusCode::FORBIDDEN,
                "text/html; charset=utf-8",
                body,
            )
        }
    }
}
