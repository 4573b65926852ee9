//! Reverse ETL syncs: create, list, get, replace, delete, run, wait, preview, reset.

use std::time::Duration;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{Value, json};
use sluice_connectors::SyncConfig;

use super::{ApiError, AppState};
use crate::auth::approvals::{self, Decision};
use crate::auth::{Principal, Role};
use crate::syncs::SyncEntry;

fn describe(entry: &SyncEntry) -> Value {
    let next = entry.config.schedule.as_ref().and_then(|s| s.next_after(chrono::Utc::now()).ok());
    json!({
        "id": entry.config.name,
        "config": entry.config,
        // Header values are secrets: only their names are ever shown.
        "header_names": entry.config.header_names(),
        "next_run_at": next.map(|t| t.to_rfc3339()),
    })
}

fn no_sync(name: &str) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, format!("no sync named '{name}'"))
}

fn parse(body: Value) -> Result<SyncConfig, ApiError> {
    let config = parse_unchecked(body)?;
    validate(&config)?;
    Ok(config)
}

fn parse_unchecked(body: Value) -> Result<SyncConfig, ApiError> {
    serde_json::from_value(body).map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("invalid sync: {e}")))
}

fn validate(config: &SyncConfig) -> Result<(), ApiError> {
    config.validate().map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("invalid sync: {e}")))
}

/// Save after the query and destination checks: a refused query is a 400, an unreachable or
/// read-only destination a 422.
async fn save(state: &AppState, config: SyncConfig) -> Result<(), ApiError> {
    state.syncs.save(config).await.map_err(|e| match e.kind() {
        sluice_core::ErrorKind::Data => {
            ApiError::new(StatusCode::BAD_REQUEST, format!("query refused: {}", e.message()))
        }
        sluice_core::ErrorKind::Config | sluice_core::ErrorKind::Connect => {
            ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, format!("the destination is not ready: {e}"))
        }
        _ => e.into(),
    })
}

/// `GET /api/syncs`
pub async fn list(State(state): State<AppState>) -> Json<Value> {
    let syncs: Vec<Value> = state.syncs.list().await.iter().map(|e| describe(e)).collect();
    Json(json!({ "syncs": syncs }))
}

/// `POST /api/syncs`
pub async fn create(
    State(state): State<AppState>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let mut body = body?.0;
    // Connections change under this lock: a sync cannot name one that is going away.
    let _changing = state.supervisor.lock_changes().await;
    state.syncs.connections().fill(&mut body)?;
    let config = parse(body)?;
    if state.syncs.get(&config.name).await.is_some() {
        return Err(ApiError::new(StatusCode::CONFLICT, format!("a sync named '{}' exists", config.name)));
    }
    let name = config.name.clone();
    save(&state, config).await?;
    let entry = state.syncs.get(&name).await.ok_or_else(|| no_sync(&name))?;
    state.supervisor.feeds().activity().record("sync_created", &name, "sync created", Value::Null);
    Ok((StatusCode::CREATED, Json(describe(&entry))))
}

/// `GET /api/syncs/{id}`
pub async fn get(State(state): State<AppState>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    let entry = state.syncs.get(&id).await.ok_or_else(|| no_sync(&id))?;
    Ok(Json(describe(&entry)))
}

/// `PUT /api/syncs/{id}`: replace the config. Secrets left out are kept.
pub async fn replace(
    State(state): State<AppState>,
    Path(id): Path<String>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let mut body = body?.0;
    if let Some(map) = body.as_object_mut() {
        map.entry("name").or_insert(Value::String(id.clone()));
    }
    let _changing = state.supervisor.lock_changes().await;
    let connections = state.syncs.connections();
    connections.fill(&mut body)?;
    let mut config = parse_unchecked(body)?;
    if config.name != id {
        return Err(ApiError::new(StatusCode::BAD_REQUEST, "name: cannot be changed; create a new sync"));
    }
    let existing = state.syncs.get(&id).await.ok_or_else(|| no_sync(&id))?;
    // Checked once the secrets are back: a password shown as `***` stands for the stored one.
    // Only the sync's own: what its connection gave comes from the connection.
    let mut own_secrets = existing.config.secrets();
    let mut own = serde_json::to_value(&existing.config).unwrap_or_default();
    connections.strip(&mut own, &mut own_secrets);
    config.restore_secrets(&own_secrets);
    validate(&config)?;
    save(&state, config).await?;
    let entry = state.syncs.get(&id).await.ok_or_else(|| no_sync(&id))?;
    state.supervisor.feeds().activity().record("sync_changed", &id, "sync changed", Value::Null);
    Ok(Json(describe(&entry)))
}

/// `DELETE /api/syncs/{id}`
pub async fn delete(State(state): State<AppState>, Path(id): Path<String>) -> Result<StatusCode, ApiError> {
    if !state.syncs.remove(&id).await? {
        return Err(no_sync(&id));
    }
    state.supervisor.feeds().activity().record("sync_removed", &id, "sync removed", Value::Null);
    Ok(StatusCode::NO_CONTENT)
}

/// Options of a run request.
#[derive(Debug, Deserialize)]
pub struct RunOptions {
    /// Wait for the run to end (at most this many seconds) and return its record.
    #[serde(default)]
    wait_seconds: Option<u64>,
    /// How the run is recorded: `api` (default) or `manual` (the CLI).
    #[serde(default)]
    trigger: Option<String>,
}

/// `POST /api/syncs/{id}/runs`: starts a run; 202 with its id, or its record when waited on.
/// An agent's run is recorded as `awaiting_approval` and answered at once: it sends nothing
/// until an editor approves it.
pub async fn run(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(options): Query<RunOptions>,
    principal: Option<Extension<Principal>>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    if state.syncs.get(&id).await.is_none() {
        return Err(no_sync(&id));
    }
    if let Some(Extension(agent)) = principal.filter(|p| p.role == Role::Agent) {
        let record = approvals::request(&state.syncs, &id, &agent.name).await?;
        let run_id = record.id;
        return Ok((
            StatusCode::ACCEPTED,
            Json(json!({ "run_id": run_id, "status": record.status, "url": format!("/api/runs/{run_id}"),
                         "approve": format!("/api/runs/{run_id}/approve") })),
        ));
    }
    let trigger = match options.trigger.as_deref() {
        None | Some("api") => "api",
        Some("manual") => "manual",
        Some(other) => {
            return Err(ApiError::new(StatusCode::BAD_REQUEST, format!("trigger: '{other}' is not api or manual")));
        }
    };
    let run_id = state.syncs.start(&id, trigger).await?;
    started(&state, &run_id, "running", options.wait_seconds).await
}

/// The answer for a run that started: its record once it ends when the client waits, else 202
/// with its id and where to ask.
async fn started(
    state: &AppState,
    run_id: &str,
    status: &str,
    wait_seconds: Option<u64>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    match wait_seconds {
        Some(seconds) => {
            let record = state.syncs.wait(run_id, Duration::from_secs(seconds.min(3600))).await?;
            Ok((StatusCode::OK, Json(json!(record))))
        }
        None => Ok((
            StatusCode::ACCEPTED,
            Json(json!({ "run_id": run_id, "status": status, "url": format!("/api/runs/{run_id}") })),
        )),
    }
}

/// `GET /api/syncs/{id}/runs`: the newest runs first.
pub async fn runs(State(state): State<AppState>, Path(id): Path<String>) -> Result<Json<Value>, ApiError> {
    if state.syncs.get(&id).await.is_none() {
        return Err(no_sync(&id));
    }
    let runs = state.syncs.registry().runs(id, 100).await?;
    Ok(Json(json!({ "runs": runs })))
}

/// `GET /api/runs/{run_id}?wait_seconds=N`: a run's record, after waiting for it to end.
pub async fn run_status(
    State(state): State<AppState>,
    Path(run_id): Path<String>,
    Query(options): Query<RunOptions>,
) -> Result<Json<Value>, ApiError> {
    let wait = Duration::from_secs(options.wait_seconds.unwrap_or(0).min(3600));
    match state.syncs.wait(&run_id, wait).await? {
        Some(record) => Ok(Json(json!(record))),
        None => Err(ApiError::new(StatusCode::NOT_FOUND, format!("no run '{run_id}'"))),
    }
}

/// Options of a preview.
#[derive(Debug, Deserialize)]
pub struct PreviewOptions {
    #[serde(default = "default_sample")]
    sample: usize,
}

fn default_sample() -> usize {
    10
}

/// `GET /api/syncs/{id}/preview`: what the next run would send; nothing is sent.
pub async fn preview(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(options): Query<PreviewOptions>,
) -> Result<Json<Value>, ApiError> {
    if state.syncs.get(&id).await.is_none() {
        return Err(no_sync(&id));
    }
    let preview = state.syncs.preview(&id, options.sample.min(1000)).await?;
    Ok(Json(json!(preview)))
}

/// `POST /api/syncs/{id}/reset`: forget the row hashes; the next run sends every row.
pub async fn reset(State(state): State<AppState>, Path(id): Path<String>) -> Result<StatusCode, ApiError> {
    if state.syncs.get(&id).await.is_none() {
        return Err(no_sync(&id));
    }
    state.syncs.planner().reset(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /api/runs/{run_id}/approve[?wait_seconds=N]`: start a run that waits for approval;
/// 202 with its id, or its record when waited on. 409 when it is not waiting.
pub async fn approve(
    State(state): State<AppState>,
    Path(run_id): Path<String>,
    Query(options): Query<RunOptions>,
    Extension(principal): Extension<Principal>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let record = decided(approvals::approve(&state.syncs, &run_id, &principal.name).await?, &run_id)?;
    started(&state, &run_id, &record.status, options.wait_seconds).await
}

/// `POST /api/runs/{run_id}/reject`: end a run that waits for approval without sending
/// anything. 409 when it is not waiting.
pub async fn reject(
    State(state): State<AppState>,
    Path(run_id): Path<String>,
    Extension(principal): Extension<Principal>,
) -> Result<Json<Value>, ApiError> {
    let record = decided(approvals::reject(&state.syncs, &run_id, &principal.name).await?, &run_id)?;
    Ok(Json(json!(record)))
}

fn decided(decision: Decision, run_id: &str) -> Result<sluice_connectors::workspace::RunRecord, ApiError> {
    match decision {
        Decision::Done(record) => Ok(*record),
        Decision::Missing => Err(ApiError::new(StatusCode::NOT_FOUND, format!("no run '{run_id}'"))),
        Decision::NotWaiting(status) => {
            Err(ApiError::new(StatusCode::CONFLICT, format!("run '{run_id}' is {status}, not awaiting approval")))
        }
    }
}
