//! The web UI: four static files compiled into the binary and served at `/ui`, with `/`
//! redirecting there. The pages draw everything from the JSON API in the browser, so this
//! module only serves bytes: it reads no state and may not grow handlers of its own.
//!
//! Every answer carries a Content-Security-Policy that lets the page load nothing but these
//! files and talk to nothing but this agent: a guest's string that slipped into the page as
//! markup still could not run a script or send data elsewhere.

use super::routes::Routes;
use crate::acl::Permission;
use axum::http::{Method, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;

const INDEX_HTML: &str = include_str!("ui/index.html");
const APP_JS: &str = include_str!("ui/app.js");
const PLOTS_JS: &str = include_str!("ui/plots.js");
const STYLE_CSS: &str = include_str!("ui/style.css");
const FAVICON_SVG: &str = include_str!("ui/favicon.svg");

const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; img-src 'self'; connect-src 'self'; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

/// The UI's routes, added to the API's: public, as the page asks for a token itself.
pub(super) fn routes<S: Clone + Send + Sync + 'static>(api: Routes<S>) -> Routes<S> {
    let public = Permission::Public;
    api.at(
        public,
        Method::GET,
        "/",
        get(|| async { Redirect::temporary("/ui") }),
    )
    .at(
        public,
        Method::GET,
        "/ui",
        get(|| async { page("text/html; charset=utf-8", INDEX_HTML) }),
    )
    .at(
        public,
        Method::GET,
        "/ui/",
        get(|| async { Redirect::permanent("/ui") }),
    )
    .at(
        public,
        Method::GET,
        "/ui/app.js",
        get(|| async { page("text/javascript; charset=utf-8", APP_JS) }),
    )
    .at(
        public,
        Method::GET,
        "/ui/plots.js",
        get(|| async { page("text/javascript; charset=utf-8", PLOTS_JS) }),
    )
    .at(
        public,
        Method::GET,
        "/ui/style.css",
        get(|| async { page("text/css; charset=utf-8", STYLE_CSS) }),
    )
    .at(
        public,
        Method::GET,
        "/ui/favicon.svg",
        get(|| async { page("image/svg+xml", FAVICON_SVG) }),
    )
}

fn page(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
            // A new agent's UI is seen at once after an upgrade.
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}
