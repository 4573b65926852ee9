//! The HTTP API: one router, one file per resource, one error type.

mod error;
mod metrics;
mod push;
mod sql;
mod streams;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};

use crate::supervisor::Supervisor;
pub use error::ApiError;

/// Shared state of every handler.
#[derive(Clone)]
pub struct AppState {
    /// The streams.
    pub supervisor: Supervisor,
}

/// The whole API.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/api/streams", get(streams::list).post(streams::create))
        .route("/api/streams/{id}", get(streams::get).patch(streams::patch).delete(streams::delete))
        .route("/api/streams/{id}/metrics", get(metrics::stream))
        .route("/api/streams/{id}/resnapshot", post(streams::resnapshot))
        // The push route enforces each stream's own body limit while reading.
        .route("/api/streams/{id}/push", post(push::push).layer(DefaultBodyLimit::disable()))
        .route("/api/sources/test", post(streams::test))
        .route("/api/sql", post(sql::query))
        .route("/api/metrics", get(metrics::all))
        .route("/metrics", get(metrics::prometheus))
        .route("/health", get(|| async { "ok" }))
        .with_state(state)
}
