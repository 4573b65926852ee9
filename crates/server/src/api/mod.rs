//! The HTTP API: one router, one file per resource, one error type.

mod accounts;
mod connections;
mod error;
mod feed;
mod lineage;
mod metrics;
mod push;
mod rejects;
mod schema;
mod sql;
mod streams;
mod syncs;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};

use sluice_connectors::workspace::Query;

use crate::auth::Auth;
use crate::syncs::Syncs;

use crate::supervisor::{Lookup, RunningStream, Supervisor};
pub use error::ApiError;
pub use push::PushBudget;
pub use sql::SqlLimits;

/// Shared state of every handler.
#[derive(Clone)]
pub struct AppState {
    /// The streams.
    pub supervisor: Supervisor,
    /// Bytes of push bodies held at once, server-wide.
    pub push_budget: PushBudget,
    /// The reverse ETL syncs.
    pub syncs: Syncs,
    /// Limits on `/api/sql`.
    pub sql: SqlLimits,
    /// Read-only SQL on the workspace, for `/api/sql`.
    pub query: Query,
    /// Users and tokens: who may call which route.
    pub auth: Auth,
    /// Events one client of a live feed gets a second at most.
    pub feed_max_events_per_sec: u32,
}

/// A running stream by name: 404 when there is none, 503 while it restarts.
pub async fn running_stream(state: &AppState, id: &str) -> Result<std::sync::Arc<RunningStream>, ApiError> {
    match state.supervisor.lookup(id).await {
        Lookup::Running(stream) => Ok(stream),
        Lookup::Restarting(_) => Err(ApiError::restarting(id)),
        Lookup::Missing => Err(ApiError::no_stream(id)),
    }
}

/// The whole API.
pub fn router(state: AppState) -> Router {
    let api = Router::new()
        .route("/api/streams", get(streams::list).post(streams::create))
        .route("/api/streams/{id}", get(streams::get).patch(streams::patch).delete(streams::delete))
        .route("/api/streams/{id}/metrics", get(metrics::stream))
        .route("/api/streams/{id}/metrics/history", get(feed::metrics_history))
        .route("/api/streams/{id}/rejects", get(rejects::list))
        .route("/api/streams/{id}/feed", get(feed::stream))
        .route("/api/streams/{id}/schema", get(feed::schema))
        .route("/api/activity", get(feed::activity))
        .route("/api/lineage", get(lineage::lineage))
        .route("/api/streams/{id}/resnapshot", post(streams::resnapshot))
        .route("/api/streams/{id}/replay", post(streams::replay))
        .route("/api/streams/{id}/pause", post(streams::pause))
        .route("/api/streams/{id}/resume", post(streams::resume))
        .route("/api/streams/{id}/compact", post(streams::compact))
        .route("/api/sources/test", post(streams::test))
        .route("/api/schema/{kind}", get(schema::schema))
        .route("/api/connections", get(connections::list).post(connections::create))
        .route("/api/connections/test", post(connections::test))
        .route("/api/connections/{name}", get(connections::get).put(connections::replace).delete(connections::delete))
        .route("/api/destinations/test", post(connections::test_destination))
        .route("/api/syncs", get(syncs::list).post(syncs::create))
        .route("/api/syncs/{id}", get(syncs::get).put(syncs::replace).delete(syncs::delete))
        .route("/api/syncs/{id}/runs", get(syncs::runs).post(syncs::run))
        .route("/api/syncs/{id}/preview", get(syncs::preview))
        .route("/api/syncs/{id}/reset", post(syncs::reset))
        .route("/api/runs/{run_id}", get(syncs::run_status))
        .route("/api/runs/{run_id}/approve", post(syncs::approve))
        .route("/api/runs/{run_id}/reject", post(syncs::reject))
        .route("/api/auth/login", post(accounts::login))
        .route("/api/auth/refresh", post(accounts::refresh))
        .route("/api/auth/logout", post(accounts::logout))
        .route("/api/auth/me", get(accounts::me))
        .route("/api/users", get(accounts::users).post(accounts::create_user))
        .route("/api/users/{name}", get(accounts::user).patch(accounts::patch_user).delete(accounts::delete_user))
        .route("/api/tokens", get(accounts::tokens).post(accounts::create_token))
        .route("/api/tokens/{id}", axum::routing::delete(accounts::delete_token))
        .route("/api/sql", post(sql::query))
        .route("/api/metrics", get(metrics::all))
        .route("/metrics", get(metrics::prometheus))
        .route("/health", get(|| async { "ok" }))
        .route("/", get(crate::page::index))
        .route("/ui/{*path}", get(crate::page::asset))
        .layer(axum::middleware::from_fn(crate::listener::read_body_in_time))
        // After routing, so the guard sees the matched route (`/api/streams/{id}`).
        .route_layer(axum::middleware::from_fn_with_state(state.auth.clone(), crate::auth::guard::require));
    // The push route enforces each stream's own body limit and its own timeout while reading,
    // and checks its stream's push key instead of a user's or API token.
    api.route("/api/streams/{id}/push", post(push::push).layer(DefaultBodyLimit::disable())).with_state(state)
}
