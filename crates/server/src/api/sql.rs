//! `POST /api/sql`: one read-only statement, rows as JSON.

use axum::Json;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use serde::Deserialize;
use sluice_connectors::workspace::QueryResult;

use super::{ApiError, AppState};

/// The request body.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SqlRequest {
    sql: String,
    #[serde(default = "default_limit")]
    limit: usize,
}

fn default_limit() -> usize {
    10_000
}

/// Run a SELECT or WITH statement; anything else is a 400 with the reason.
pub async fn query(
    State(state): State<AppState>,
    req: Result<Json<SqlRequest>, JsonRejection>,
) -> Result<Json<QueryResult>, ApiError> {
    let Json(req) = req?;
    let limit = req.limit.clamp(1, 1_000_000);
    Ok(Json(state.supervisor.workspace().query(req.sql, limit).await?))
}
