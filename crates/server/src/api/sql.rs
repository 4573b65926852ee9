//! `POST /api/sql`: one read-only statement, rows as JSON, within the server's limits.

use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;
use sluice_connectors::workspace::{QueryErrorKind, QueryLimits};
use tokio_util::sync::CancellationToken;

use super::{ApiError, AppState};

/// The server's limits on user SQL (`sluice serve` flags).
#[derive(Debug, Clone)]
pub struct SqlLimits {
    /// Longest a query may run; a request may ask for less.
    pub timeout: Duration,
    /// Most bytes of JSON rows in one answer.
    pub max_result_bytes: usize,
    /// Cancelled when the server shuts down: running queries are interrupted.
    pub shutdown: CancellationToken,
}

/// The request body.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SqlRequest {
    sql: String,
    #[serde(default = "default_limit")]
    limit: usize,
    /// A shorter time limit than the server's, in milliseconds.
    timeout_ms: Option<u64>,
}

fn default_limit() -> usize {
    10_000
}

/// Run a SELECT or WITH statement. 400 for anything else, 403 for an internal table, 413 past
/// the result size limit, 422 past the time or memory limit, 503 while shutting down.
pub async fn query(State(state): State<AppState>, req: Result<Json<SqlRequest>, JsonRejection>) -> Response {
    let Json(req) = match req {
        Ok(req) => req,
        Err(rejection) => return ApiError::from(rejection).into_response(),
    };
    let limits = &state.sql;
    let limit = req.limit.clamp(1, 1_000_000);
    let timeout = match req.timeout_ms {
        Some(0) => return ApiError::new(StatusCode::BAD_REQUEST, "timeout_ms: must be above 0").into_response(),
        Some(ms) => Duration::from_millis(ms).min(limits.timeout),
        None => limits.timeout,
    };
    let shutdown = limits.shutdown.clone().cancelled_owned();
    let query_limits = QueryLimits { rows: limit, max_bytes: limits.max_result_bytes };
    // Dropping this future (the client went away) interrupts the query.
    match state.query.run(req.sql, query_limits, timeout, shutdown).await {
        Ok(result) => ([(header::CONTENT_TYPE, "application/json")], result.json).into_response(),
        Err(e) => {
            let (status, limit) = match e.kind {
                QueryErrorKind::Invalid => (StatusCode::BAD_REQUEST, None),
                QueryErrorKind::Forbidden => (StatusCode::FORBIDDEN, None),
                QueryErrorKind::TooLarge => (StatusCode::PAYLOAD_TOO_LARGE, Some("result_bytes")),
                QueryErrorKind::Timeout => (StatusCode::UNPROCESSABLE_ENTITY, Some("time")),
                QueryErrorKind::OutOfMemory => (StatusCode::UNPROCESSABLE_ENTITY, Some("memory")),
                QueryErrorKind::Stopped => (StatusCode::SERVICE_UNAVAILABLE, None),
                QueryErrorKind::Unavailable => {
                    let error = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.message).with_retry_after(5);
                    return error.with_details(json!({ "limit": "disk" })).into_response();
                }
                QueryErrorKind::Failed => {
                    tracing::error!(error = %e, "SQL query failed.");
                    (StatusCode::INTERNAL_SERVER_ERROR, None)
                }
            };
            let error = ApiError::new(status, e.message);
            match limit {
                Some(limit) => error.with_details(json!({ "limit": limit })).into_response(),
                None => error.into_response(),
            }
        }
    }
}
