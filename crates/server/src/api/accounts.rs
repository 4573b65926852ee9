//! Logging in, users and API tokens: `/api/auth/*` (open: the body is the credential, except
//! `me`), `/api/users` and `/api/tokens` (admin). No answer holds a password or a hash; a
//! session's tokens and a new API token are shown to their owner once.

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{ApiError, AppState};
use crate::auth::{Principal, Role, Session, TokenView, UserView, Via};

/// `POST /api/auth/login` body.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Login {
    user: String,
    password: String,
}

/// `POST /api/auth/refresh` and `/api/auth/logout` body.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Refresh {
    refresh_token: String,
}

/// `POST /api/users` body.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewUser {
    name: String,
    role: Role,
    #[serde(default)]
    password: Option<String>,
}

/// `PATCH /api/users/{name}` body.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserPatch {
    #[serde(default)]
    role: Option<Role>,
    #[serde(default)]
    password: Option<String>,
}

/// `POST /api/tokens` body.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewTokenRequest {
    name: String,
    role: Role,
}

/// `POST /api/auth/login`: an access token and a refresh token. 401 for a wrong user or
/// password (answered after a delay), 429 while the name is locked after repeated failures.
pub async fn login(
    State(state): State<AppState>,
    body: Result<Json<Login>, JsonRejection>,
) -> Result<Json<Session>, ApiError> {
    let Json(body) = body?;
    Ok(Json(state.auth.login(&body.user, &body.password).await?))
}

/// `POST /api/auth/refresh`: a new pair; the refresh token sent is used up.
pub async fn refresh(
    State(state): State<AppState>,
    body: Result<Json<Refresh>, JsonRejection>,
) -> Result<Json<Session>, ApiError> {
    let Json(body) = body?;
    Ok(Json(state.auth.refresh(&body.refresh_token).await?))
}

/// `POST /api/auth/logout`: the refresh token is removed.
pub async fn logout(
    State(state): State<AppState>,
    body: Result<Json<Refresh>, JsonRejection>,
) -> Result<StatusCode, ApiError> {
    let Json(body) = body?;
    state.auth.logout(&body.refresh_token).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /api/auth/me`: who the token stands for.
pub async fn me(Extension(principal): Extension<Principal>) -> Json<Value> {
    let kind = match &principal.via {
        Via::Session => json!({ "kind": "user" }),
        Via::ApiToken(id) => json!({ "kind": "api_token", "token_id": id }),
    };
    let mut body = json!({ "name": principal.name, "role": principal.role });
    if let (Some(body), Value::Object(kind)) = (body.as_object_mut(), kind) {
        body.extend(kind);
    }
    Json(body)
}

/// `GET /api/users`
pub async fn users(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let users: Vec<UserView> = state.auth.users().await?;
    Ok(Json(json!({ "users": users })))
}

/// `GET /api/users/{name}`
pub async fn user(State(state): State<AppState>, Path(name): Path<String>) -> Result<Json<UserView>, ApiError> {
    Ok(Json(state.auth.user(&name).await?))
}

/// `POST /api/users`: 201; 409 for a name that exists.
pub async fn create_user(
    State(state): State<AppState>,
    body: Result<Json<NewUser>, JsonRejection>,
) -> Result<(StatusCode, Json<UserView>), ApiError> {
    let Json(body) = body?;
    Ok((StatusCode::CREATED, Json(state.auth.add_user(&body.name, body.role, body.password).await?)))
}

/// `PATCH /api/users/{name}`: a new role or password (a new password ends the user's sessions).
pub async fn patch_user(
    State(state): State<AppState>,
    Path(name): Path<String>,
    body: Result<Json<UserPatch>, JsonRejection>,
) -> Result<Json<UserView>, ApiError> {
    let Json(body) = body?;
    Ok(Json(state.auth.change_user(&name, body.role, body.password).await?))
}

/// `DELETE /api/users/{name}`: 204; 409 for the last admin.
pub async fn delete_user(State(state): State<AppState>, Path(name): Path<String>) -> Result<StatusCode, ApiError> {
    state.auth.remove_user(&name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /api/tokens`: without the tokens.
pub async fn tokens(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let tokens: Vec<TokenView> = state.auth.tokens().await?;
    Ok(Json(json!({ "tokens": tokens })))
}

/// `POST /api/tokens`: 201 with the token, shown this once.
pub async fn create_token(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    body: Result<Json<NewTokenRequest>, JsonRejection>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let Json(body) = body?;
    let created = state.auth.add_token(&body.name, body.role, &principal.name).await?;
    Ok((StatusCode::CREATED, Json(json!(created))))
}

/// `DELETE /api/tokens/{id}`: 204; the token is refused from now on.
pub async fn delete_token(State(state): State<AppState>, Path(id): Path<String>) -> Result<StatusCode, ApiError> {
    state.auth.revoke_token(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}
