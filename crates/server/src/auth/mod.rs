//! Users and tokens: who may call the API, and with which role.
//!
//! [`Auth`] keeps the users' roles and the API tokens' hashes in memory (loaded from the
//! workspace's `sluice.users` and `sluice.api_tokens` at start, written through on every
//! change), so checking a request's token needs no database: an access token (JWT) is checked
//! by its signature and its user's current role, an API token by its keyed hash. Revoking a
//! token or removing a user takes effect at the next request.
//!
//! - `roles`: the roles and the table of what each route needs;
//! - `credentials`: password hashes, opaque tokens, access tokens;
//! - `sessions`: login, refresh (rotating), logout;
//! - `directory`: users and API tokens (create, list, change, remove);
//! - `setup`: the first start (the admin and its token file) and the CLI's token;
//! - `guard`: the middleware that answers 401 and 403;
//! - `approvals`: agents' run requests, approved or rejected by an editor;
//! - `throttle`: failed logins slow down and lock a name.

pub mod approvals;
mod credentials;
mod directory;
pub mod guard;
mod roles;
mod sessions;
pub mod setup;
mod throttle;

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use sluice_connectors::workspace::{Accounts, Workspace};
use tokio::sync::{Mutex, Semaphore};

pub use credentials::API_TOKEN_PREFIX;
pub use directory::{TokenView, UserView};
pub use roles::Role;
pub use sessions::Session;

use credentials::Keys;
use throttle::LoginThrottle;

/// Settings of `sluice serve`.
#[derive(Debug, Clone)]
pub struct AuthSettings {
    /// How long an access token is valid.
    pub access_token_lifetime: Duration,
    /// Whether `/metrics` is open to anyone.
    pub open_metrics: bool,
}

/// Who made a request.
#[derive(Debug, Clone)]
pub struct Principal {
    /// A user's name, or an API token's name.
    pub name: String,
    /// The role that applies now.
    pub role: Role,
    /// How the request authenticated.
    pub via: Via,
}

/// How a request authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Via {
    /// A user's access token (after a login).
    Session,
    /// An API token, by id.
    ApiToken(String),
}

/// Why an account operation failed.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// The workspace failed.
    #[error(transparent)]
    Store(#[from] sluice_core::Error),
    /// Wrong user or password, or an unknown, used or expired refresh token.
    #[error("{0}")]
    Refused(&'static str),
    /// Too many failed logins for this user.
    #[error("too many failed logins for this user; retry in {} s", .0.as_secs().max(1))]
    Locked(Duration),
    /// A request that cannot be met as given.
    #[error("{0}")]
    Invalid(String),
    /// A name that is taken, or a change that would leave no admin.
    #[error("{0}")]
    Conflict(String),
    /// No such user or token.
    #[error("{0}")]
    NotFound(String),
    /// Password hashing or token signing failed.
    #[error("cannot create credentials: {0}")]
    Crypto(String),
}

/// A token that is valid now, as the guard keeps it.
#[derive(Clone)]
struct TokenEntry {
    id: String,
    name: String,
    role: Role,
}

/// Users and API tokens in memory.
#[derive(Default)]
struct Directory {
    users: HashMap<String, Role>,
    /// By keyed hash.
    tokens: HashMap<String, TokenEntry>,
}

/// Users, tokens and sessions. Cheap to clone.
#[derive(Clone)]
pub struct Auth {
    inner: Arc<Inner>,
}

struct Inner {
    accounts: Accounts,
    keys: Keys,
    settings: AuthSettings,
    directory: RwLock<Directory>,
    /// Serializes changes to users, so the last admin cannot be removed by two requests at once.
    changes: Mutex<()>,
    /// Password hashing is CPU-heavy by design: at most two at once.
    hashing: Semaphore,
    throttle: LoginThrottle,
}

impl Auth {
    /// Load the users and tokens of `workspace`; keys are derived from its secrets key.
    pub async fn open(workspace: &Workspace, settings: AuthSettings) -> Result<Self, AuthError> {
        let keys = Keys::new(
            workspace.derived_key("sluice access tokens v1")?,
            workspace.derived_key("sluice api token hashes v1")?,
        );
        let accounts = workspace.accounts().clone();
        let mut directory = Directory::default();
        for user in accounts.users().await? {
            if let Some(role) = Role::parse(&user.role) {
                directory.users.insert(user.name, role);
            }
        }
        for token in accounts.tokens().await? {
            if let Some(role) = Role::parse(&token.role) {
                directory.tokens.insert(token.token_hash, TokenEntry { id: token.id, name: token.name, role });
            }
        }
        Ok(Self {
            inner: Arc::new(Inner {
                accounts,
                keys,
                settings,
                directory: RwLock::new(directory),
                changes: Mutex::new(()),
                hashing: Semaphore::new(2),
                throttle: LoginThrottle::default(),
            }),
        })
    }

    /// The settings it runs with.
    pub fn settings(&self) -> &AuthSettings {
        &self.inner.settings
    }

    /// Who a bearer token stands for, if it is valid now.
    pub fn authenticate(&self, token: &str) -> Option<Principal> {
        let directory = self.inner.directory.read().ok()?;
        if token.starts_with(API_TOKEN_PREFIX) {
            let entry = directory.tokens.get(&self.inner.keys.hash_token(token))?;
            return Some(Principal {
                name: entry.name.clone(),
                role: entry.role,
                via: Via::ApiToken(entry.id.clone()),
            });
        }
        let claims = self.inner.keys.verify_access(token)?;
        // The user's role now, not when the token was issued; a removed user's tokens end.
        let role = *directory.users.get(&claims.sub)?;
        Some(Principal { name: claims.sub, role, via: Via::Session })
    }

    /// Run the blocking password job `job` on a blocking thread, two at most at once.
    async fn hashing<T: Send + 'static>(&self, job: impl FnOnce() -> T + Send + 'static) -> Result<T, AuthError> {
        let _permit = self.inner.hashing.acquire().await.map_err(|e| AuthError::Crypto(e.to_string()))?;
        tokio::task::spawn_blocking(job).await.map_err(|e| AuthError::Crypto(e.to_string()))
    }

    fn directory_write(&self) -> std::sync::RwLockWriteGuard<'_, Directory> {
        // A panic while the lock was held leaves plain maps behind: still consistent.
        self.inner.directory.write().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn directory_read(&self) -> std::sync::RwLockReadGuard<'_, Directory> {
        self.inner.directory.read().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
