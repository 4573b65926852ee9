//! `GET /api/schema/:kind`: the JSON Schema of a config type (`stream`, `sync`, `connection`), derived from
//! the Rust types the API and the YAML file deserialize, so the page's forms cannot drift from
//! them.

use axum::Json;
use axum::extract::Path;
use sluice_connectors::{ConnectionConfig, StreamConfig, SyncConfig};

use super::ApiError;

/// `GET /api/schema/:kind`
pub async fn schema(Path(kind): Path<String>) -> Result<Json<schemars::Schema>, ApiError> {
    match kind.as_str() {
        "stream" => Ok(Json(schemars::schema_for!(StreamConfig))),
        "sync" => Ok(Json(schemars::schema_for!(SyncConfig))),
        "connection" => Ok(Json(schemars::schema_for!(ConnectionConfig))),
        other => Err(ApiError::new(
            axum::http::StatusCode::NOT_FOUND,
            format!("no config type '{other}'; there are 'stream', 'sync' and 'connection'"),
        )),
    }
}
