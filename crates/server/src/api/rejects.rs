//! `GET /api/streams/:id/rejects`: a stream's newest ledger rows, for anyone who may read (the
//! page shows them to viewers, who may not run SQL).

use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use sluice_connectors::workspace::QueryLimits;

use super::{ApiError, AppState};
use crate::supervisor::Lookup;

/// `?limit=`: how many of the newest rows (1–1,000, default 50).
#[derive(Deserialize)]
pub struct RejectsQuery {
    #[serde(default = "default_limit")]
    limit: usize,
}

fn default_limit() -> usize {
    50
}

/// The stream's newest rejects, newest first: table, column, expected type, value, reason,
/// the event's position and when it was received and recorded.
pub async fn list(State(state): State<AppState>, Path(id): Path<String>, Query(q): Query<RejectsQuery>) -> Response {
    if matches!(state.supervisor.lookup(&id).await, Lookup::Missing) {
        return ApiError::no_stream(&id).into_response();
    }
    let limit = q.limit.clamp(1, 1_000);
    let sql = format!(
        "SELECT \"table\", \"column\", expected_type, value, reason, position, received_at, recorded_at \
         FROM sluice.rejects WHERE stream = '{}' ORDER BY recorded_at DESC, position DESC LIMIT {limit}",
        id.replace('\'', "''")
    );
    let limits = QueryLimits { rows: limit, max_bytes: state.sql.max_result_bytes };
    let shutdown = state.sql.shutdown.clone().cancelled_owned();
    match state.query.run(sql, limits, state.sql.timeout, shutdown).await {
        Ok(result) => ([(header::CONTENT_TYPE, "application/json")], result.json).into_response(),
        Err(e) => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.message).into_response(),
    }
}
