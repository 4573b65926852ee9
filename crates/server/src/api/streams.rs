//! Stream management: list, create, get, patch, delete.

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use serde::Deserialize;
use serde_json::{Value, json};
use sluice_connectors::{SourceConfig, StreamConfig};

use super::{ApiError, AppState};
use crate::keys;
use crate::supervisor::{RunningStream, SaveError};

fn describe(stream: &RunningStream) -> Value {
    json!({
        "id": stream.config.name,
        "config": stream.config,
        "push_url": format!("/api/streams/{}/push", stream.config.name),
        "metrics": stream.metrics.snapshot(),
    })
}

fn parse_config(body: Value) -> Result<StreamConfig, ApiError> {
    serde_json::from_value(body).map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("invalid stream: {e}")))
}

fn validate(config: &StreamConfig) -> Result<(), ApiError> {
    config.validate().map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("invalid stream: {e}")))
}

/// `GET /api/streams`
pub async fn list(State(state): State<AppState>) -> Json<Value> {
    let streams: Vec<Value> = state.supervisor.list().await.iter().map(|s| describe(s)).collect();
    Json(json!({ "streams": streams }))
}

/// `POST /api/streams`: returns the push key, once.
pub async fn create(
    State(state): State<AppState>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let mut body = body?.0;
    state.supervisor.connections().fill(&mut body)?;
    let mut config = parse_config(body)?;
    validate(&config)?;
    // Test connection before anything is created.
    let failed: Vec<_> =
        sluice_connectors::test_source(&config.source, &config.name).await?.into_iter().filter(|c| !c.ok).collect();
    if !failed.is_empty() {
        let message = failed.iter().map(|c| c.message.as_str()).collect::<Vec<_>>().join("; ");
        return Err(ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, format!("the source is not ready: {message}"))
            .with_details(json!({ "checks": failed })));
    }
    let _changing = state.supervisor.lock_changes().await;
    if state.supervisor.get(&config.name).await.is_some() {
        return Err(ApiError::new(StatusCode::CONFLICT, format!("a stream named '{}' exists", config.name)));
    }
    // Only push streams have a key; the others read by themselves.
    let key = match &config.source {
        SourceConfig::HttpPush(_) => {
            Some(config.push_key.take().map_or_else(keys::generate, |k| k.expose().to_string()))
        }
        _ => None,
    };
    let key_hash = key.as_deref().map(keys::hash).unwrap_or_default();
    // A table another stream writes is 409; a valid config that cannot start as asked (say, a
    // destination table without a key) is 422.
    state.supervisor.save_and_start(config.clone(), key_hash).await.map_err(|e| match e {
        SaveError::Failed(e) if e.kind() == sluice_core::ErrorKind::Config => {
            ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, e.to_string())
        }
        other => other.into(),
    })?;
    let stream = state.supervisor.get(&config.name).await.ok_or_else(|| ApiError::no_stream(&config.name))?;
    let mut body = describe(&stream);
    let activity = state.supervisor.feeds().activity();
    activity.record("stream_created", &config.name, format!("stream created, writing {}", config.table), Value::Null);
    if let Some(key) = key {
        body["push_key"] = Value::String(key);
    }
    Ok((StatusCode::CREATED, Json(body)))
}

/// `GET /api/streams/:id`
pub async fn get(State(state): State<AppState>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let stream = super::running_stream(&state, &id).await?;
    Ok(Json(describe(&stream)))
}

/// `PATCH /api/streams/:id`: a JSON merge patch over the config; the name cannot change.
pub async fn patch(
    State(state): State<AppState>,
    Path(id): Path<String>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let body = body?;
    let _changing = state.supervisor.lock_changes().await;
    let stream = super::running_stream(&state, &id).await?;
    let Value::Object(_) = &body.0 else {
        return Err(ApiError::new(StatusCode::BAD_REQUEST, "the patch must be a JSON object"));
    };
    if body.0.get("name").is_some_and(|n| n != &Value::String(id.clone())) {
        return Err(ApiError::new(StatusCode::BAD_REQUEST, "name: a stream cannot be renamed"));
    }
    if body.0.get("push_key").is_some() {
        return Err(ApiError::new(StatusCode::BAD_REQUEST, "push_key: keys cannot be changed by PATCH"));
    }
    let mut merged = serde_json::to_value(&stream.config)
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    // The patch applies to the stream's own part; its connections fill in the rest again (a
    // patch may name another connection).
    let connections = state.supervisor.connections();
    let mut own_secrets = stream.config.secrets();
    connections.strip(&mut merged, &mut own_secrets);
    merge(&mut merged, body.0);
    connections.fill(&mut merged)?;
    let mut config = parse_config(merged)?;
    // The serialized config has no secrets: keep the running stream's unless the patch sets new ones.
    config.restore_secrets(&own_secrets);
    validate(&config)?;
    state.supervisor.save_and_start(config, stream.key_hash.clone()).await?;
    let stream = state.supervisor.get(&id).await.ok_or_else(|| ApiError::no_stream(&id))?;
    state.supervisor.feeds().activity().record("stream_changed", &id, "stream changed and restarted", Value::Null);
    Ok(Json(describe(&stream)))
}

/// RFC 7386 JSON merge patch.
fn merge(target: &mut Value, patch: Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(&k);
                } else {
                    merge(t.entry(k).or_insert(Value::Null), v);
                }
            }
        }
        (t, p) => *t = p,
    }
}

#[derive(Deserialize)]
pub struct DeleteQuery {
    #[serde(default)]
    drop_table: bool,
}

/// `DELETE /api/streams/:id[?drop_table=true]`: the table stays unless asked.
pub async fn delete(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<DeleteQuery>,
) -> Result<StatusCode, ApiError> {
    let _changing = state.supervisor.lock_changes().await;
    if !state.supervisor.remove(&id, q.drop_table).await? {
        return Err(ApiError::no_stream(&id));
    }
    let feeds = state.supervisor.feeds();
    feeds.forget(&id);
    if let Err(e) = state.supervisor.workspace().schema_history().forget(&id).await {
        tracing::warn!(stream = %id, error = %e, "Could not forget the stream's schema history.");
    }
    feeds.activity().record("stream_removed", &id, "stream removed", Value::Null);
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /api/sources/test`: `{"name": "stream", "source": {...}}`; every check with its result.
pub async fn test(
    State(state): State<AppState>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let mut body = body?.0;
    state.supervisor.connections().fill(&mut body)?;
    let name = body.get("name").and_then(Value::as_str).unwrap_or("test").to_string();
    let source: sluice_connectors::SourceConfig =
        serde_json::from_value(body.get("source").cloned().unwrap_or(Value::Null))
            .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("source: {e}")))?;
    let checks = sluice_connectors::probe_source(&source, &name).await?;
    let ok = checks.iter().all(|c| c.ok);
    Ok(Json(json!({ "ok": ok, "checks": checks })))
}

/// `POST /api/streams/:id/replay`: `{"from": "offsets" | "timestamp" | "ledger", ...}`.
pub async fn replay(
    State(state): State<AppState>,
    Path(id): Path<String>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let request: sluice_connectors::workspace::ReplayRequest = serde_json::from_value(body?.0)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("invalid replay: {e}")))?;
    request.validate().map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("invalid replay: {e}")))?;
    let _changing = state.supervisor.lock_changes().await;
    match crate::replay::replay(&state.supervisor, &id, request).await {
        Ok(Some(answer)) => Ok(Json(answer)),
        Ok(None) => Err(ApiError::no_stream(&id)),
        Err(e) if e.kind() == sluice_core::ErrorKind::Config => {
            Err(ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, e.to_string()))
        }
        Err(e) => Err(e.into()),
    }
}

/// `POST /api/streams/:id/resnapshot`: start the stream over from its source.
pub async fn resnapshot(State(state): State<AppState>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let _changing = state.supervisor.lock_changes().await;
    if !state.supervisor.resnapshot(&id).await? {
        return Err(ApiError::no_stream(&id));
    }
    state.supervisor.feeds().activity().record(
        "stream_changed",
        &id,
        "stream started over from its source",
        Value::Null,
    );
    Ok(Json(json!({ "resnapshot": id })))
}

/// `POST /api/streams/:id/pause`: stop reading until resumed; the pause is stored, so it holds
/// across restarts of the server.
pub async fn pause(State(state): State<AppState>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    set_paused(&state, &id, true).await
}

/// `POST /api/streams/:id/resume`: read again from where the stream stopped.
pub async fn resume(State(state): State<AppState>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    set_paused(&state, &id, false).await
}

async fn set_paused(state: &AppState, id: &str, paused: bool) -> Result<Json<Value>, ApiError> {
    let _changing = state.supervisor.lock_changes().await;
    let changed = state
        .supervisor
        .while_stopped(id, |mut config| async move {
            let changed = config.paused != paused;
            config.paused = paused;
            Ok((config, changed))
        })
        .await?;
    let Some(changed) = changed else { return Err(ApiError::no_stream(id)) };
    if changed {
        let what = if paused { "stream paused" } else { "stream resumed" };
        state.supervisor.feeds().activity().record("stream_changed", id, what, Value::Null);
    }
    let stream = super::running_stream(state, id).await?;
    Ok(Json(describe(&stream)))
}

/// `POST /api/streams/:id/compact`: compact a lake destination's tables now. DuckLake: rewrite
/// much-deleted files, merge small ones, expire old snapshots, remove unread files. Delta: merge
/// small files, write a checkpoint, delete what the retention no longer keeps. Iceberg: the
/// live rows into one file (a `replace` snapshot), old snapshots expired. The stream goes on
/// meanwhile. 409 for other destinations.
pub async fn compact(State(state): State<AppState>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let stream = super::running_stream(&state, &id).await?;
    let (report, what) = match &stream.config.destination {
        Some(sluice_connectors::DestinationConfig::Ducklake(lake)) => {
            let report = sluice_connectors::ducklake::compact(lake).await?;
            sluice_connectors::ducklake::record(&stream.metrics, &report);
            let what = format!("DuckLake compacted: {} files to {}", report.before.files, report.after.files);
            (json!(report), what)
        }
        Some(sluice_connectors::DestinationConfig::Delta(delta)) => {
            let report = sluice_connectors::delta::compact(delta, std::slice::from_ref(&stream.config.table)).await?;
            stream.metrics.set_destination("files", report.after.files as f64);
            stream.metrics.set_destination("file_bytes", report.after.bytes as f64);
            stream.metrics.add_destination("compactions", 1.0);
            let what = format!("Delta compacted: {} files to {}", report.before.files, report.after.files);
            (json!(report), what)
        }
        Some(sluice_connectors::DestinationConfig::Iceberg(ice)) => {
            let report = sluice_connectors::iceberg::compact(ice, std::slice::from_ref(&stream.config.table)).await?;
            sluice_connectors::iceberg::record(&stream.metrics, &report);
            let what = format!("Iceberg compacted: {} files to {}", report.before.files, report.after.files);
            (json!(report), what)
        }
        _ => {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                format!("stream '{id}' does not write a DuckLake, Delta or Iceberg table; only those are compacted"),
            ));
        }
    };
    state.supervisor.feeds().activity().record("stream_changed", &id, what, report.clone());
    Ok(Json(report))
}
