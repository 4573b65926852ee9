//! `POST /api/streams/:id/push`: JSON in, 202 once durable.

use std::io::Read;
use std::time::Instant;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use serde_json::{Value, json};
use sluice_connectors::SourceHandle;
use sluice_connectors::http_push::PushError;
use sluice_core::batch::now_us;
use sluice_core::format::json::split_body;
use sluice_core::{Payload, Record, RecordMeta};

use super::{ApiError, AppState};
use crate::keys;

/// Accept a JSON object, an array of objects or NDJSON (optionally gzip-encoded), and answer
/// 202 `{"accepted": n, "rejected": m}` only once every event is durable.
pub async fn push(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let arrived = Instant::now();
    let stream = state.supervisor.get(&id).await.ok_or_else(|| ApiError::no_stream(&id))?;
    authorize(&headers, &stream.key_hash)?;
    let SourceHandle::Push(handle) = &stream.handle else {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("stream '{id}' reads from its own source; it does not take pushes"),
        ));
    };
    let limit = handle.max_body_bytes;
    let too_large = || {
        ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, format!("body exceeds this stream's limit of {limit} bytes"))
            .with_details(json!({ "limit_bytes": limit }))
    };
    if let Some(length) = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<usize>().ok())
        && length > limit
    {
        return Err(too_large());
    }
    let raw = axum::body::to_bytes(body, limit).await.map_err(|e| {
        if std::error::Error::source(&e).is_some_and(|s| s.to_string().contains("length limit")) {
            too_large()
        } else {
            ApiError::new(StatusCode::BAD_REQUEST, format!("could not read the body: {e}"))
        }
    })?;
    let gzip = headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("gzip"));
    let content = if gzip {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(&raw[..])
            .take(limit as u64 + 1)
            .read_to_end(&mut out)
            .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("body is not valid gzip: {e}")))?;
        if out.len() > limit {
            return Err(too_large());
        }
        bytes::Bytes::from(out)
    } else {
        raw
    };
    let bytes = content.len();
    let payloads = split_body(&content).map_err(|e| {
        ApiError::new(StatusCode::BAD_REQUEST, e.to_string())
            .with_details(json!({ "line": e.line, "column": e.column, "byte": e.byte }))
    })?;
    let rejected = payloads.iter().filter(|p| matches!(p, Payload::Invalid { .. })).count();
    let accepted = payloads.len() - rejected;
    let received_us = now_us();
    let records: Vec<Record> = payloads
        .into_iter()
        .map(|payload| Record { payload, meta: RecordMeta { received_us, ..RecordMeta::default() } })
        .collect();
    handle.push(records, bytes, arrived).await.map_err(|e| match e {
        PushError::Unavailable => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
        PushError::WriteFailed(_) => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    })?;
    Ok((StatusCode::ACCEPTED, Json(json!({ "accepted": accepted, "rejected": rejected }))))
}

fn authorize(headers: &HeaderMap, key_hash: &str) -> Result<(), ApiError> {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Err(ApiError::new(StatusCode::UNAUTHORIZED, "missing Authorization: Bearer <push key>"));
    };
    let key = value.to_str().ok().and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")));
    match key {
        Some(key) if keys::verify(key.trim(), key_hash) => Ok(()),
        _ => Err(ApiError::new(StatusCode::UNAUTHORIZED, "wrong push key for this stream")),
    }
}
