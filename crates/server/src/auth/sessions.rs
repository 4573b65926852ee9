//! Logging in: a user's password gives an access token (a short-lived JWT) and a refresh token.
//! A refresh token is used once: refreshing gives a new pair and the old refresh token is
//! gone, so a stolen one that its owner used since is refused. Logging out removes it.

use serde::Serialize;

use super::credentials::{self, REFRESH_TOKEN_PREFIX};
use super::throttle::FAILURE_DELAY;
use super::{Auth, AuthError};

/// How long a refresh token is valid (seconds).
const REFRESH_LIFETIME: i64 = 7 * 24 * 3600;

/// What a login or a refresh answers. Holds the tokens themselves: it is the one place they
/// are serialized, to their owner, once.
#[derive(Serialize)]
pub struct Session {
    /// The JWT to send as `Authorization: Bearer …`.
    pub access_token: String,
    /// Always `Bearer`.
    pub token_type: &'static str,
    /// Seconds the access token is valid.
    pub expires_in: u64,
    /// Exchange it at `/api/auth/refresh` for a new pair; valid once.
    pub refresh_token: String,
    /// Seconds the refresh token is valid.
    pub refresh_expires_in: i64,
    /// The user.
    pub user: String,
    /// Their role.
    pub role: &'static str,
}

impl Auth {
    /// Check a user's password; a session when it matches. A failure waits before it answers,
    /// and repeated failures lock the name for a while.
    pub async fn login(&self, user: &str, password: &str) -> Result<Session, AuthError> {
        if let Some(left) = self.inner.throttle.locked(user) {
            return Err(AuthError::Locked(left));
        }
        let stored = self.inner.accounts.users().await?.into_iter().find(|u| u.name == user);
        let hash = stored.as_ref().and_then(|u| u.password_hash.clone());
        let given = password.to_string();
        let matches = self.hashing(move || credentials::verify_password(&given, hash.as_deref())).await?;
        if !matches {
            self.inner.throttle.failed(user);
            tracing::warn!(user = %user, "Login refused.");
            tokio::time::sleep(FAILURE_DELAY).await;
            return Err(AuthError::Refused("wrong user or password"));
        }
        self.inner.throttle.succeeded(user);
        tracing::info!(user = %user, "User logged in.");
        self.session(user).await
    }

    /// A new session for the user of a valid refresh token, which is used up.
    pub async fn refresh(&self, refresh_token: &str) -> Result<Session, AuthError> {
        let refused = AuthError::Refused("the refresh token is unknown, used or expired; log in again");
        if !refresh_token.starts_with(REFRESH_TOKEN_PREFIX) {
            return Err(refused);
        }
        let hash = self.inner.keys.hash_token(refresh_token);
        let Some(user) = self.inner.accounts.take_refresh(hash).await? else {
            return Err(refused);
        };
        self.session(&user).await
    }

    /// End the session of a refresh token (its access token ends with its lifetime).
    pub async fn logout(&self, refresh_token: &str) -> Result<(), AuthError> {
        self.inner.accounts.take_refresh(self.inner.keys.hash_token(refresh_token)).await?;
        Ok(())
    }

    async fn session(&self, user: &str) -> Result<Session, AuthError> {
        let role =
            self.directory_read().users.get(user).copied().ok_or(AuthError::Refused("the user no longer exists"))?;
        let lifetime = self.inner.settings.access_token_lifetime.as_secs().max(1);
        let access_token = self
            .inner
            .keys
            .access_token(user, role.as_str(), lifetime)
            .map_err(|e| AuthError::Crypto(e.to_string()))?;
        let refresh_token = credentials::generate(REFRESH_TOKEN_PREFIX);
        let hash = self.inner.keys.hash_token(&refresh_token);
        self.inner.accounts.add_refresh(hash, user.to_string(), REFRESH_LIFETIME).await?;
        Ok(Session {
            access_token,
            token_type: "Bearer",
            expires_in: lifetime,
            refresh_token,
            refresh_expires_in: REFRESH_LIFETIME,
            user: user.to_string(),
            role: role.as_str(),
        })
    }
}
