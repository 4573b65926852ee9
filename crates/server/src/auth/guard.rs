//! The middleware in front of every route but push: the route's need (`roles::need`), the
//! bearer token's principal, and a 401 that says how to get a token or a 403 that names the
//! role needed. The principal goes into the request's extensions for the handler.

use axum::extract::{MatchedPath, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::roles::{Need, need};
use super::{Auth, Principal};
use crate::api::ApiError;

/// How to get a token, for a 401.
const HOW: &str = "send 'Authorization: Bearer <token>': log in with POST /api/auth/login {\"user\", \"password\"} \
                   for an access token, or use an API token (POST /api/tokens, or the admin token that the first start \
                   wrote to admin.token in the data dir)";

/// Let the request through when its token's role grants what the route needs.
pub async fn require(State(auth): State<Auth>, mut request: Request, next: Next) -> Response {
    let path = request.extensions().get::<MatchedPath>().map(|p| p.as_str().to_string()).unwrap_or_default();
    let needed = need(request.method(), &path, auth.settings().open_metrics);
    if needed == Need::Open {
        return next.run(request).await;
    }
    let bearer = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .map(str::trim);
    let Some(bearer) = bearer else {
        return ApiError::new(StatusCode::UNAUTHORIZED, format!("this route needs a token: {HOW}")).into_response();
    };
    let Some(principal) = auth.authenticate(bearer) else {
        return ApiError::new(
            StatusCode::UNAUTHORIZED,
            format!("the token is invalid, expired or revoked (an access token is refreshed at POST /api/auth/refresh): {HOW}"),
        )
        .into_response();
    };
    if !principal.role.grants(needed) {
        return forbidden(&principal, needed).into_response();
    }
    request.extensions_mut().insert(principal);
    next.run(request).await
}

fn forbidden(principal: &Principal, needed: Need) -> ApiError {
    ApiError::new(
        StatusCode::FORBIDDEN,
        format!("this route needs {}; '{}' has the {} role", needed.describe(), principal.name, principal.role),
    )
    .with_details(json!({ "role": principal.role }))
}
