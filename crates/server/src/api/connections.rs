//! Named connections (`/api/connections`): a Postgres or MySQL server, a Kafka cluster, an AWS
//! account, defined once and named by streams and syncs; and Test connection for connections
//! and destinations.

use std::collections::BTreeSet;

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde_json::{Value, json};
use sluice_connectors::workspace::{StoredStream, StoredSync};
use sluice_connectors::{ConnectionConfig, DestinationConfig, StreamConfig, SyncConfig, connections_named_in};

use crate::connections::Connections;

use super::{ApiError, AppState};

fn parse(body: Value) -> Result<ConnectionConfig, ApiError> {
    serde_json::from_value(body).map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("invalid connection: {e}")))
}

fn no_connection(name: &str) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, format!("no connection named '{name}'"))
}

/// The streams and syncs that name `name`, as stored: a stream that could not start is a user
/// too.
async fn stored_users(state: &AppState, name: &str) -> Result<(Vec<StoredStream>, Vec<StoredSync>), ApiError> {
    let names = |config: &Value| connections_named_in(config).iter().any(|n| n == name);
    let registry = state.supervisor.workspace().registry();
    let streams = registry.streams().await?.into_iter().filter(|s| names(&s.config)).collect();
    let syncs = registry.syncs().await?.into_iter().filter(|s| names(&s.config)).collect();
    Ok((streams, syncs))
}

async fn users(state: &AppState, name: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    match stored_users(state, name).await {
        Ok((streams, syncs)) => {
            (streams.into_iter().map(|s| s.name).collect(), syncs.into_iter().map(|s| s.name).collect())
        }
        Err(_) => (BTreeSet::new(), BTreeSet::new()),
    }
}

/// Whether every stored user of `name` still reads as a valid config with `new` filled in;
/// the ones that do not, each with why.
fn refusals(
    connections: &Connections,
    new: &ConnectionConfig,
    streams: &[StoredStream],
    syncs: &[StoredSync],
) -> Vec<String> {
    let lookup = |n: &str| if n == new.name() { Some(new.clone()) } else { connections.get(n) };
    let mut refused = Vec::new();
    for s in streams {
        let mut config = s.config.clone();
        let checked = sluice_connectors::fill_connections(&mut config, lookup).and_then(|()| {
            let mut c: StreamConfig = serde_json::from_value(config)
                .map_err(|e| sluice_core::Error::new(sluice_core::ErrorKind::Config, e.to_string()))?;
            c.restore_secrets(&s.secrets);
            c.validate()
        });
        if let Err(e) = checked {
            refused.push(format!("stream '{}': {e}", s.name));
        }
    }
    for s in syncs {
        let mut config = s.config.clone();
        let checked = sluice_connectors::fill_connections(&mut config, lookup).and_then(|()| {
            let mut c: SyncConfig = serde_json::from_value(config)
                .map_err(|e| sluice_core::Error::new(sluice_core::ErrorKind::Config, e.to_string()))?;
            c.restore_secrets(&s.secrets);
            c.validate()
        });
        if let Err(e) = checked {
            refused.push(format!("sync '{}': {e}", s.name));
        }
    }
    refused
}

async fn describe(state: &AppState, config: &ConnectionConfig) -> Value {
    let (streams, syncs) = users(state, config.name()).await;
    json!({ "id": config.name(), "config": config, "used_by": { "streams": streams, "syncs": syncs } })
}

/// `GET /api/connections`
pub async fn list(State(state): State<AppState>) -> Json<Value> {
    let mut out = Vec::new();
    for c in state.supervisor.connections().list() {
        out.push(describe(&state, &c).await);
    }
    Json(json!({ "connections": out }))
}

/// `GET /api/connections/:name`
pub async fn get(State(state): State<AppState>, Path(name): Path<String>) -> Result<Json<Value>, ApiError> {
    let config = state.supervisor.connections().get(&name).ok_or_else(|| no_connection(&name))?;
    Ok(Json(describe(&state, &config).await))
}

/// `POST /api/connections`
pub async fn create(
    State(state): State<AppState>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let config = parse(body?.0)?;
    config.validate()?;
    let _changing = state.supervisor.lock_changes().await;
    let connections = state.supervisor.connections();
    if connections.get(config.name()).is_some() {
        return Err(ApiError::new(StatusCode::CONFLICT, format!("a connection named '{}' exists", config.name())));
    }
    connections.save(config.clone()).await?;
    state.supervisor.feeds().activity().record("connection_created", config.name(), "connection created", Value::Null);
    Ok((StatusCode::CREATED, Json(describe(&state, &config).await)))
}

/// `PUT /api/connections/:name`: replace it (secrets left out are kept); every stream that
/// names it restarts with it, and every sync uses it from its next run.
pub async fn replace(
    State(state): State<AppState>,
    Path(name): Path<String>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let mut body = body?.0;
    if let Some(map) = body.as_object_mut() {
        map.entry("name").or_insert(Value::String(name.clone()));
    }
    let mut config = parse(body)?;
    if config.name() != name {
        return Err(ApiError::new(StatusCode::BAD_REQUEST, "name: cannot be changed; create a new connection"));
    }
    let _changing = state.supervisor.lock_changes().await;
    let connections = state.supervisor.connections().clone();
    let old = connections.get(&name).ok_or_else(|| no_connection(&name))?;
    if old.kind() != config.kind() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!(
                "kind: connection '{name}' is a {} connection; create a new one for a {}",
                old.kind(),
                config.kind()
            ),
        ));
    }
    config.restore_secrets(&old.secrets());
    config.validate()?;
    // All or nothing: every stream and sync that names it must still read as a valid config.
    let (stored_streams, stored_syncs) = stored_users(&state, &name).await?;
    let refused = refusals(&connections, &config, &stored_streams, &stored_syncs);
    if !refused.is_empty() {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("connection '{name}' was not changed: {}", refused.join("; ")),
        )
        .with_details(json!({ "refused": refused })));
    }
    connections.save(config.clone()).await?;
    let streams: Vec<String> = stored_streams.into_iter().map(|s| s.name).collect();
    let syncs: Vec<String> = stored_syncs.into_iter().map(|s| s.name).collect();
    let mut failed = Vec::new();
    for stream in &streams {
        let (connections, old, name) = (connections.clone(), old.clone(), name.clone());
        let changed = state
            .supervisor
            .while_stopped(stream, |config| async move {
                let mut secrets = config.secrets();
                let mut value = serde_json::to_value(&config).unwrap_or_default();
                connections.refill(&mut value, &mut secrets, &name, &old)?;
                let mut config: StreamConfig = serde_json::from_value(value)
                    .map_err(|e| sluice_core::Error::new(sluice_core::ErrorKind::Config, format!("connection: {e}")))?;
                config.restore_secrets(&secrets);
                config.validate()?;
                Ok((config, ()))
            })
            .await;
        if let Err(e) = changed {
            failed.push(format!("stream '{stream}': {e}"));
        }
    }
    for sync in &syncs {
        let Some(entry) = state.syncs.get(sync).await else { continue };
        let mut secrets = entry.config.secrets();
        let mut value = serde_json::to_value(&entry.config).unwrap_or_default();
        let refilled = connections.refill(&mut value, &mut secrets, &name, &old).and_then(|()| {
            serde_json::from_value::<SyncConfig>(value)
                .map_err(|e| sluice_core::Error::new(sluice_core::ErrorKind::Config, format!("connection: {e}")))
        });
        let saved = match refilled {
            Ok(mut config) => {
                config.restore_secrets(&secrets);
                state.syncs.save(config).await
            }
            Err(e) => Err(e),
        };
        if let Err(e) = saved {
            failed.push(format!("sync '{sync}': {e}"));
        }
    }
    state.supervisor.feeds().activity().record("connection_changed", &name, "connection changed", Value::Null);
    let mut answer = describe(&state, &config).await;
    if !failed.is_empty() {
        // Saved, but some users could not take it (a new password the destination refuses):
        // they keep running as they were, and the answer says which.
        answer["not_applied"] = json!(failed);
    }
    Ok(Json(answer))
}

/// `DELETE /api/connections/:name`: refused (409) while a stream or sync names it.
pub async fn delete(State(state): State<AppState>, Path(name): Path<String>) -> Result<StatusCode, ApiError> {
    let _changing = state.supervisor.lock_changes().await;
    let (streams, syncs) = users(&state, &name).await;
    if !streams.is_empty() || !syncs.is_empty() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!(
                "connection '{name}' is used by streams {streams:?} and syncs {syncs:?}; change or remove them first"
            ),
        )
        .with_details(json!({ "used_by": { "streams": streams, "syncs": syncs } })));
    }
    if !state.supervisor.connections().remove(&name).await? {
        return Err(no_connection(&name));
    }
    state.supervisor.feeds().activity().record("connection_removed", &name, "connection removed", Value::Null);
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /api/connections/test`: a connection's config (a stored one's secrets are used when
/// left out); logs in and says what it found.
pub async fn test(
    State(state): State<AppState>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let mut config = parse(body?.0)?;
    // The stored secrets stand in for ones left out only when everything else is the stored
    // connection's: they never go to a host or endpoint the request chose.
    if let Some(stored) = state.supervisor.connections().get(config.name())
        && serde_json::to_value(&stored).ok() == serde_json::to_value(&config).ok()
    {
        config.restore_secrets(&stored.secrets());
    }
    let checks = sluice_connectors::test_connection(&config).await;
    let ok = checks.iter().all(|c| c.ok);
    Ok(Json(json!({ "ok": ok, "checks": checks })))
}

/// `POST /api/destinations/test`: `{"destination": {...}}`; connects and checks it takes writes.
pub async fn test_destination(
    State(state): State<AppState>,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let mut body = body?.0;
    state.supervisor.connections().fill(&mut body)?;
    let destination: DestinationConfig =
        serde_json::from_value(body.get("destination").cloned().unwrap_or_default())
            .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("destination: {e}")))?;
    let result = async { sluice_connectors::build_destination(&destination)?.check().await }.await;
    let check = match result {
        Ok(()) => json!({ "name": "connect", "ok": true, "message": "connected; it takes writes" }),
        Err(e) => json!({ "name": "connect", "ok": false, "message": e.to_string() }),
    };
    Ok(Json(json!({ "ok": check["ok"], "checks": [check] })))
}
