//! One error type for every handler: a status and a message a person can act on.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use sluice_core::{Error, ErrorKind};

use crate::auth::AuthError;
use crate::supervisor::SaveError;

/// An API error.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
    details: Option<Value>,
    retry_after: Option<u32>,
}

impl ApiError {
    /// An error with a status and message.
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self { status, message: message.into(), details: None, retry_after: None }
    }

    /// Extra fields merged into the body.
    pub fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    /// 404 for a stream.
    pub fn no_stream(id: &str) -> Self {
        Self::new(StatusCode::NOT_FOUND, format!("no stream named '{id}'"))
    }

    /// 503 for a stream in the middle of a restart (a PATCH, a resnapshot).
    pub fn restarting(id: &str) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, format!("stream '{id}' is restarting; nothing was stored, retry"))
            .with_retry_after(1)
    }

    /// 507 for a request the workspace could not store because its disk is full: retry once
    /// there is room (the workspace reopens by itself).
    pub fn no_space(message: &str) -> Self {
        Self::new(StatusCode::INSUFFICIENT_STORAGE, message.to_string())
            .with_retry_after(5)
            .with_details(serde_json::json!({ "limit": "disk" }))
    }

    /// Ask the client to retry after `seconds`.
    pub fn with_retry_after(mut self, seconds: u32) -> Self {
        self.retry_after = Some(seconds);
        self
    }
}

impl From<axum::extract::rejection::JsonRejection> for ApiError {
    /// A body the JSON extractor refused: wrong content type, bad JSON, or a wrong field.
    fn from(rejection: axum::extract::rejection::JsonRejection) -> Self {
        Self::new(rejection.status(), rejection.body_text())
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> Self {
        let status = match e.kind() {
            ErrorKind::Config | ErrorKind::Data => StatusCode::BAD_REQUEST,
            ErrorKind::Connect | ErrorKind::Transient => StatusCode::SERVICE_UNAVAILABLE,
            ErrorKind::Storage => return Self::no_space(&e.to_string()),
            ErrorKind::Fatal => StatusCode::INTERNAL_SERVER_ERROR,
        };
        if status == StatusCode::INTERNAL_SERVER_ERROR {
            tracing::error!(error = %e, "Request failed.");
        }
        Self::new(status, e.to_string())
    }
}

impl From<SaveError> for ApiError {
    /// A table another stream writes is a conflict; the rest as the error says.
    fn from(e: SaveError) -> Self {
        match e {
            SaveError::TableTaken { .. } => Self::new(StatusCode::CONFLICT, e.to_string()),
            SaveError::Failed(e) => e.into(),
        }
    }
}

impl From<AuthError> for ApiError {
    fn from(e: AuthError) -> Self {
        match e {
            AuthError::Store(e) => e.into(),
            AuthError::Refused(_) => Self::new(StatusCode::UNAUTHORIZED, e.to_string()),
            AuthError::Locked(left) => Self::new(StatusCode::TOO_MANY_REQUESTS, e.to_string())
                .with_retry_after(left.as_secs().clamp(1, u64::from(u32::MAX)) as u32),
            AuthError::Invalid(_) => Self::new(StatusCode::BAD_REQUEST, e.to_string()),
            AuthError::Conflict(_) => Self::new(StatusCode::CONFLICT, e.to_string()),
            AuthError::NotFound(_) => Self::new(StatusCode::NOT_FOUND, e.to_string()),
            AuthError::Crypto(_) => {
                tracing::error!(error = %e, "Credentials failed.");
                Self::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut body = json!({ "error": self.message });
        if let (Some(Value::Object(extra)), Some(map)) = (self.details, body.as_object_mut()) {
            map.extend(extra);
        }
        let mut response = (self.status, Json(body)).into_response();
        if let Some(seconds) = self.retry_after {
            response.headers_mut().insert(axum::http::header::RETRY_AFTER, axum::http::HeaderValue::from(seconds));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert("www-authenticate", axum::http::HeaderValue::from_static("Bearer"));
        }
        response
    }
}
