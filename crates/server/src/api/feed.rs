//! What the page watches: a stream's live feed, the activity feed, a stream's schema with its
//! history, and its metrics over the last hour.
//!
//! The live feeds are server-sent events. They take the token in the `Authorization` header
//! like every route; the page reads them with `fetch()` streaming, which can send it (an
//! `EventSource` cannot, and a token in a URL ends up in logs).

use std::collections::HashMap;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::response::sse::{KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::{ApiError, AppState};
use crate::feed;

/// `GET /api/streams/:id/feed`: the rows the stream commits (at most 20 per batch), its schema
/// changes and rejects, as server-sent events `rows`, `schema`, `rejects` and `skipped`.
pub async fn stream(State(state): State<AppState>, Path(id): Path<String>) -> Result<Response, ApiError> {
    super::running_stream(&state, &id).await?;
    let rx = state.supervisor.feeds().subscribe(&id);
    let rate = state.feed_max_events_per_sec;
    let opening = json!({ "stream": id, "rows_per_batch": feed::ROWS_PER_UNIT, "max_events_per_sec": rate });
    Ok(Sse::new(feed::events(rx, opening.to_string(), rate)).keep_alive(KeepAlive::default()).into_response())
}

/// `GET /api/activity`: the server's activity as server-sent events; with `?recent`, the
/// newest 200 events as JSON instead.
pub async fn activity(State(state): State<AppState>, Query(q): Query<HashMap<String, String>>) -> Response {
    let activity = state.supervisor.feeds().activity();
    let rate = state.feed_max_events_per_sec;
    if q.contains_key("recent") {
        return Json(json!({ "events": activity.recent() })).into_response();
    }
    let opening = json!({ "recent": feed::RECENT });
    Sse::new(feed::events(activity.subscribe(), opening.to_string(), rate))
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// `GET /api/streams/:id/schema`: the tables' columns now (workspace tables) and every recorded
/// change, oldest first.
pub async fn schema(State(state): State<AppState>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let stream = super::running_stream(&state, &id).await?;
    let workspace = state.supervisor.workspace();
    let mut tables = serde_json::Map::new();
    if stream.config.destination.is_none() {
        let resume = workspace.state().resume(&id, &stream.config.table).await?;
        let mut names: Vec<&String> = resume.schemas.keys().collect();
        names.sort();
        for name in names {
            let columns: Vec<Value> =
                resume.schemas[name].columns().iter().map(|c| json!({ "name": c.name, "type": c.ty.sql() })).collect();
            tables.insert(name.clone(), Value::Array(columns));
        }
    }
    let history = workspace.schema_history().of_stream(&id).await?;
    Ok(Json(json!({ "stream": id, "tables": tables, "history": history })))
}

/// `GET /api/streams/:id/metrics/history`: msg/s, lag and latency, sampled every
/// `--history-sample-ms` over the last hour, oldest first.
pub async fn metrics_history(State(state): State<AppState>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    super::running_stream(&state, &id).await?;
    let (every, samples) = state.supervisor.feeds().history().of(&id);
    Ok(Json(json!({ "stream": id, "every_ms": every.as_millis() as u64, "samples": samples })))
}
