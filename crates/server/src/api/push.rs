//! `POST /api/streams/:id/push`: JSON in, 202 once durable.

use std::io::Read;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use sluice_connectors::SourceHandle;
use sluice_connectors::http_push::{Claim, PushError, PushHandle};
use sluice_core::batch::now_us;
use sluice_core::format::json::{BodyError, check_body, parse_body};
use sluice_core::{ChunkReport, IdempotencyKey, Payload, Record, RecordMeta};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::{ApiError, AppState};
use crate::keys;
use crate::supervisor::Lookup;

/// How long a client has to send its whole body once the headers are in.
const BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// Bodies up to this size are parsed into events at the edge; larger ones lazily by the stream.
const EAGER_PARSE_BYTES: usize = 1 << 20;
/// Memory of parsed JSON values per byte of body, reserved for a body parsed at the edge.
const PARSED_PER_BYTE: usize = 8;

/// How long a push waits for room in the memory budget before it is told to come back.
const BUDGET_WAIT: Duration = Duration::from_secs(10);

/// Bytes of push bodies the server holds at once, from the first byte read until the answer:
/// what bounds memory under load, whatever the number of clients or streams.
#[derive(Clone)]
pub struct PushBudget {
    bytes: Arc<Semaphore>,
    total: usize,
}

impl PushBudget {
    /// A budget of `total` bytes.
    pub fn new(total: usize) -> Self {
        let total = total.clamp(1 << 20, Semaphore::MAX_PERMITS);
        Self { bytes: Arc::new(Semaphore::new(total)), total }
    }

    /// Room for `bytes` (at most the whole budget), waiting up to [`BUDGET_WAIT`].
    async fn reserve(&self, bytes: usize) -> Result<OwnedSemaphorePermit, ApiError> {
        let want = u32::try_from(bytes.clamp(1, self.total)).unwrap_or(u32::MAX);
        match tokio::time::timeout(BUDGET_WAIT, self.bytes.clone().acquire_many_owned(want)).await {
            Ok(Ok(permit)) => Ok(permit),
            _ => Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "the server holds as many push bodies as its memory budget allows; nothing was stored, retry",
            )
            .with_retry_after(1)),
        }
    }
}

/// Accept a JSON object, an array of objects or NDJSON (optionally gzip-encoded), and answer
/// 202 `{"accepted": n, "rejected": m}` only once every event is durable. With an
/// `Idempotency-Key` header, a retry of a stored push gets the same answer and stores nothing.
pub async fn push(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(query): Query<PushQuery>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    // The key is checked before anything else is said about the stream, so a client without
    // one cannot tell a stream that exists from one that does not.
    let stream = match state.supervisor.lookup(&id).await {
        Lookup::Running(stream) => {
            authorize(&headers, Some(&stream.key_hash))?;
            stream
        }
        Lookup::Restarting(key_hash) => {
            authorize(&headers, key_hash.as_deref())?;
            return Err(ApiError::restarting(&id));
        }
        Lookup::Missing => {
            authorize(&headers, None)?;
            return Err(ApiError::no_stream(&id));
        }
    };
    if stream.config.paused {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("stream '{id}' is paused; nothing was stored. Resume it (POST /api/streams/{id}/resume) and retry"),
        )
        .with_retry_after(30));
    }
    // A full disk: answered at once, before the body is read (the workspace reopens by itself).
    if stream.config.destination.is_none()
        && let Some(fault) = state.supervisor.workspace().storage_fault()
    {
        return Err(ApiError::no_space(&fault));
    }
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
    let length = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
    if length.is_some_and(|length| length > limit) {
        return Err(too_large());
    }
    let gzip = match headers.get(header::CONTENT_ENCODING).and_then(|v| v.to_str().ok()) {
        None => false,
        Some(v) if v.eq_ignore_ascii_case("gzip") => true,
        Some(v) if v.eq_ignore_ascii_case("identity") => false,
        Some(v) => {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!("Content-Encoding '{v}' is not supported; send gzip or no encoding"),
            ));
        }
    };
    // Room for the body before a byte of it is read: what Content-Length announces (or the
    // limit), and for a small body the values it is parsed into. A gzip body's decoded size is
    // known only once it is decoded: room for that is taken then.
    let announced = length.unwrap_or(limit);
    let parsed = |bytes: usize| if bytes <= EAGER_PARSE_BYTES { bytes * PARSED_PER_BYTE } else { 0 };
    let _room = state.push_budget.reserve(announced + if gzip { 0 } else { parsed(announced) }).await?;
    let raw = match tokio::time::timeout(BODY_TIMEOUT, axum::body::to_bytes(body, limit)).await {
        Ok(Ok(raw)) => raw,
        Ok(Err(e)) if std::error::Error::source(&e).is_some_and(|s| s.to_string().contains("length limit")) => {
            return Err(too_large());
        }
        Ok(Err(e)) => return Err(ApiError::new(StatusCode::BAD_REQUEST, format!("could not read the body: {e}"))),
        Err(_) => {
            return Err(ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                format!("the body did not arrive within {} s; nothing was stored", BODY_TIMEOUT.as_secs()),
            ));
        }
    };
    // A gzip body gets room for up to 16 times its compressed size before it is decoded, and is
    // decoded no further than that; only a body that decodes larger waits for room up to the
    // limit and is decoded again. So a small bomb cannot grow past what the budget holds.
    let mut _decoded_room = Vec::new();
    let content = if gzip {
        let guess = announced.saturating_mul(16).max(1 << 20).min(limit);
        _decoded_room.push(state.push_budget.reserve(guess + parsed(guess)).await?);
        match gunzip(&raw, guess)? {
            Some(content) => content,
            None if guess < limit => {
                _decoded_room.push(state.push_budget.reserve(limit - guess).await?);
                gunzip(&raw, limit)?.ok_or_else(|| {
                    ApiError::new(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        format!("body exceeds this stream's limit of {limit} bytes once decompressed"),
                    )
                    .with_details(json!({ "limit_bytes": limit }))
                })?
            }
            None => {
                return Err(ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("body exceeds this stream's limit of {limit} bytes once decompressed"),
                )
                .with_details(json!({ "limit_bytes": limit })));
            }
        }
    } else {
        raw
    };
    let bad_body = |e: BodyError| {
        ApiError::new(StatusCode::BAD_REQUEST, e.to_string())
            .with_details(json!({ "line": e.line, "column": e.column, "byte": e.byte }))
    };
    let bytes = content.len();
    // The message key of every event of the body (a Debezium key, for one event), as Kafka
    // would carry it.
    let message_key = match headers.get("message-key").map(|v| v.to_str()) {
        None => None,
        Some(Ok(key)) => Some(key.to_string()),
        Some(Err(_)) => return Err(ApiError::new(StatusCode::BAD_REQUEST, "Message-Key must be visible ASCII text")),
    };
    let meta = RecordMeta { received_us: now_us(), key: message_key, ..RecordMeta::default() };
    // A small body is decoded here, on this request's task, so decoding runs on every core:
    // into columns when the stream's schemas allow it, else split into events; a large one is
    // checked without building it and parsed by the stream one event at a time, so it is never
    // held as values all at once.
    let (payload, summary) = if bytes <= EAGER_PARSE_BYTES {
        match handle.edge.decode_body(&content, &meta) {
            Some(decoded) => decoded.map_err(bad_body)?,
            None => {
                let (events, summary) = parse_body(&content).map_err(bad_body)?;
                (Payload::Events(events), summary)
            }
        }
    } else {
        let summary = check_body(&content).map_err(bad_body)?;
        (Payload::Body(content), summary)
    };
    if summary.invalid > handle.max_invalid_events {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!(
                "{} of the body's {} events are not JSON objects, more than this stream's limit of {} \
                 (source.max_invalid_events); nothing was stored",
                summary.invalid, summary.events, handle.max_invalid_events
            ),
        )
        .with_details(json!({ "events": summary.events, "invalid": summary.invalid })));
    }
    let answer = json!({ "accepted": summary.events - summary.invalid, "rejected": summary.invalid });
    let Some(key) = idempotency_key(&headers)? else {
        let report = store(handle, payload, bytes, meta, arrived).await?;
        return Ok(accepted(outcome(&report, query.details), false));
    };
    match handle.keys.claim(&key) {
        Claim::Replay(stored) => {
            // Stored before: the answer it got, and nothing stored again.
            let stored = serde_json::from_str(&stored).unwrap_or(answer);
            return Ok(accepted(stored, true));
        }
        Claim::InFlight => {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "a push with this Idempotency-Key is being stored right now; retry to get its answer",
            )
            .with_retry_after(1));
        }
        Claim::New => {}
    }
    // The answer kept with the key is the push's own 202 (the run loop puts it there once the
    // push is decoded, before the write): a retry of a stored push gets the same answer.
    let record = IdempotencyKey { key: key.clone(), answer: answer.to_string() };
    let meta = RecordMeta { idempotency: Some(record), ..meta };
    let stored = store(handle, payload, bytes, meta, arrived).await;
    handle.keys.settle(&key, stored.as_ref().ok().map(|report| report.answer(false).to_string()));
    Ok(accepted(outcome(&stored?, query.details), false))
}

/// `?details=true` lists the ledger rows of the push's events.
#[derive(Debug, Default, serde::Deserialize)]
pub struct PushQuery {
    #[serde(default)]
    details: bool,
}

/// The 202's body: events stored as rows, events with a ledger row, events the stream's filter
/// skipped, and with `details` which were refused.
fn outcome(report: &ChunkReport, details: bool) -> Value {
    report.answer(details)
}

/// The 202, marked when it repeats an earlier push's answer.
fn accepted(answer: Value, replayed: bool) -> Response {
    let mut response = (StatusCode::ACCEPTED, Json(answer)).into_response();
    if replayed {
        response.headers_mut().insert("idempotent-replayed", axum::http::HeaderValue::from_static("true"));
    }
    response
}

/// Hand a checked body to the stream and wait until it is durable.
async fn store(
    handle: &PushHandle,
    payload: Payload,
    bytes: usize,
    meta: RecordMeta,
    arrived: Instant,
) -> Result<ChunkReport, ApiError> {
    let record = Record { payload, meta };
    handle.push(vec![record], bytes, arrived).await.map_err(|e| match e {
        PushError::Unavailable => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string()).with_retry_after(1),
        PushError::WriteFailed(_) => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        PushError::NoSpace(message) => ApiError::no_space(&message),
    })
}

/// The `Idempotency-Key` header, if any: 1 to 255 visible ASCII characters.
fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(value) = headers.get("idempotency-key") else { return Ok(None) };
    match value.to_str() {
        Ok(key) if !key.is_empty() && key.len() <= 255 && key.bytes().all(|b| b.is_ascii_graphic()) => {
            Ok(Some(key.to_string()))
        }
        _ => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "Idempotency-Key must be 1 to 255 visible ASCII characters (a UUID is a good choice)",
        )),
    }
}

/// Decode a gzip body of one or more members (`cat a.gz b.gz` is valid gzip); anything after
/// the last member that is not another member is an error, never ignored.
/// `None` when the body decodes to more than `cap` bytes (decoding stops there).
fn gunzip(raw: &[u8], cap: usize) -> Result<Option<bytes::Bytes>, ApiError> {
    let mut out = Vec::new();
    flate2::read::MultiGzDecoder::new(raw)
        .take(cap as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("body is not valid gzip: {e}")))?;
    Ok((out.len() <= cap).then(|| bytes::Bytes::from(out)))
}

/// Check the push key against the stream's `key_hash`; `None` (no such stream) refuses every
/// key with the same answer a wrong key gets, after the same work.
fn authorize(headers: &HeaderMap, key_hash: Option<&str>) -> Result<(), ApiError> {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Err(ApiError::new(StatusCode::UNAUTHORIZED, "missing Authorization: Bearer <push key>"));
    };
    let key = value.to_str().ok().and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")));
    let stored = key_hash.unwrap_or(keys::NO_STREAM);
    match key {
        Some(key) if keys::verify(key.trim(), stored) && key_hash.is_some() => Ok(()),
        _ => Err(ApiError::new(StatusCode::UNAUTHORIZED, "wrong push key for this stream, or no stream of that name")),
    }
}
