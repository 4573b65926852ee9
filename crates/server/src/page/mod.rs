//! The page: plain HTML, JavaScript modules and CSS, embedded in the binary (no build step, no
//! Node at run time). `GET /` is the page; `GET /ui/<file>` its assets. They hold no data and
//! are open; everything they show comes from the API with the user's token.

use axum::extract::Path;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

/// The page's files: name, content type, contents.
const ASSETS: &[(&str, &str, &str)] = &[
    ("style.css", "text/css; charset=utf-8", include_str!("assets/style.css")),
    ("app.js", JS, include_str!("assets/app.js")),
    ("api.js", JS, include_str!("assets/api.js")),
    ("pipelines.js", JS, include_str!("assets/pipelines.js")),
    ("stream.js", JS, include_str!("assets/stream.js")),
    ("create.js", JS, include_str!("assets/create.js")),
    ("form.js", JS, include_str!("assets/form.js")),
    ("connections.js", JS, include_str!("assets/connections.js")),
    ("sql.js", JS, include_str!("assets/sql.js")),
    ("syncs.js", JS, include_str!("assets/syncs.js")),
    ("lineage.js", JS, include_str!("assets/lineage.js")),
    ("users.js", JS, include_str!("assets/users.js")),
];

const JS: &str = "text/javascript; charset=utf-8";

/// `GET /`
pub async fn index() -> Response {
    file("text/html; charset=utf-8", include_str!("assets/index.html"))
}

/// `GET /ui/{*path}`
pub async fn asset(Path(path): Path<String>) -> Response {
    match ASSETS.iter().find(|(name, _, _)| *name == path) {
        Some((_, content_type, body)) => file(content_type, body),
        None => (StatusCode::NOT_FOUND, "no such file").into_response(),
    }
}

fn file(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::X_FRAME_OPTIONS, "DENY"),
        ],
        body,
    )
        .into_response()
}
