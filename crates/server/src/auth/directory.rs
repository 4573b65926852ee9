//! Users and API tokens: create, list, change, remove. Each change is stored first, then
//! applied to the in-memory directory the guard reads. What the API shows ([`UserView`],
//! [`TokenView`]) has no hash; a new token is shown once, in [`NewToken`].

use serde::Serialize;
use sluice_connectors::workspace::{StoredToken, UserChange};

use super::credentials::{self, API_TOKEN_PREFIX};
use super::{Auth, AuthError, Role, TokenEntry};

/// Shortest password accepted.
const MIN_PASSWORD: usize = 8;

/// A user as the API shows it.
#[derive(Debug, Serialize)]
pub struct UserView {
    /// The login name.
    pub name: String,
    /// The role.
    pub role: Role,
    /// Whether a password is set (a user without one cannot log in).
    pub has_password: bool,
    /// When it was created.
    pub created_at: String,
    /// When it last changed.
    pub updated_at: String,
}

/// An API token as the API lists it: never the token or its hash.
#[derive(Debug, Serialize)]
pub struct TokenView {
    /// Its id, for `DELETE /api/tokens/:id`.
    pub id: String,
    /// Its name.
    pub name: String,
    /// The role it grants.
    pub role: Role,
    /// Who created it.
    pub created_by: String,
    /// When.
    pub created_at: String,
}

/// A token just created: the one time it is shown.
#[derive(Serialize)]
pub struct NewToken {
    /// What the list shows.
    #[serde(flatten)]
    pub view: TokenView,
    /// The token; only its hash is kept.
    pub token: String,
}

/// A user name: 1 to 64 letters, digits, `_`, `-`, `.` or `@`.
fn check_name(what: &str, name: &str) -> Result<(), AuthError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '@'));
    if ok { Ok(()) } else { Err(AuthError::Invalid(format!("{what}: 1 to 64 letters, digits, '_', '-', '.' or '@'"))) }
}

fn check_password(password: &str) -> Result<(), AuthError> {
    if password.chars().count() < MIN_PASSWORD {
        return Err(AuthError::Invalid(format!("password: at least {MIN_PASSWORD} characters")));
    }
    Ok(())
}

impl Auth {
    /// Every user.
    pub async fn users(&self) -> Result<Vec<UserView>, AuthError> {
        let users = self.inner.accounts.users().await?;
        Ok(users
            .into_iter()
            .filter_map(|u| {
                Some(UserView {
                    role: Role::parse(&u.role)?,
                    has_password: u.password_hash.is_some(),
                    name: u.name,
                    created_at: u.created_at,
                    updated_at: u.updated_at,
                })
            })
            .collect())
    }

    /// One user.
    pub async fn user(&self, name: &str) -> Result<UserView, AuthError> {
        self.users()
            .await?
            .into_iter()
            .find(|u| u.name == name)
            .ok_or_else(|| AuthError::NotFound(format!("no user named '{name}'")))
    }

    /// The stored hash of a new password, checked first; `None` for none.
    async fn new_password_hash(&self, password: Option<String>) -> Result<Option<String>, AuthError> {
        let Some(password) = password else { return Ok(None) };
        check_password(&password)?;
        let hash = self.hashing(move || credentials::hash_password(&password)).await?;
        Ok(Some(hash.map_err(|e| AuthError::Crypto(e.to_string()))?))
    }

    /// Add a user; a password is optional (without one the user cannot log in yet).
    pub async fn add_user(&self, name: &str, role: Role, password: Option<String>) -> Result<UserView, AuthError> {
        check_name("name", name)?;
        let hash = self.new_password_hash(password).await?;
        let _changing = self.inner.changes.lock().await;
        if !self.inner.accounts.add_user(name.to_string(), role.as_str().to_string(), hash).await? {
            return Err(AuthError::Conflict(format!("a user named '{name}' exists")));
        }
        self.directory_write().users.insert(name.to_string(), role);
        tracing::info!(user = %name, role = %role, "User created.");
        self.user(name).await
    }

    /// Change a user's role or password. The last admin keeps the admin role.
    pub async fn change_user(
        &self,
        name: &str,
        role: Option<Role>,
        password: Option<String>,
    ) -> Result<UserView, AuthError> {
        let password_hash = self.new_password_hash(password).await?;
        let _changing = self.inner.changes.lock().await;
        if role.is_some_and(|r| r != Role::Admin) {
            self.keep_an_admin(name)?;
        }
        let change = UserChange { role: role.map(|r| r.as_str().to_string()), password_hash };
        if !self.inner.accounts.change_user(name.to_string(), change).await? {
            return Err(AuthError::NotFound(format!("no user named '{name}'")));
        }
        if let Some(role) = role {
            self.directory_write().users.insert(name.to_string(), role);
        }
        tracing::info!(user = %name, "User changed.");
        self.user(name).await
    }

    /// Remove a user and end their sessions. The last admin stays.
    pub async fn remove_user(&self, name: &str) -> Result<(), AuthError> {
        let _changing = self.inner.changes.lock().await;
        self.keep_an_admin(name)?;
        if !self.inner.accounts.remove_user(name.to_string()).await? {
            return Err(AuthError::NotFound(format!("no user named '{name}'")));
        }
        self.directory_write().users.remove(name);
        tracing::info!(user = %name, "User removed.");
        Ok(())
    }

    /// Refuse a change that would leave no admin user when `name` stops being one.
    fn keep_an_admin(&self, name: &str) -> Result<(), AuthError> {
        let directory = self.directory_read();
        let admins = directory.users.iter().filter(|(_, role)| **role == Role::Admin).count();
        if admins == 1 && directory.users.get(name) == Some(&Role::Admin) {
            return Err(AuthError::Conflict(format!("'{name}' is the last admin; make another user admin first")));
        }
        Ok(())
    }

    /// Every API token, without secrets.
    pub async fn tokens(&self) -> Result<Vec<TokenView>, AuthError> {
        let tokens = self.inner.accounts.tokens().await?;
        Ok(tokens.into_iter().filter_map(view).collect())
    }

    /// A new API token named `name` with `role`, created by `by`; the token is in the answer
    /// only.
    pub async fn add_token(&self, name: &str, role: Role, by: &str) -> Result<NewToken, AuthError> {
        if name.is_empty() || name.len() > 128 || name.chars().any(char::is_control) {
            return Err(AuthError::Invalid("name: 1 to 128 characters, no control characters".into()));
        }
        let token = credentials::generate(API_TOKEN_PREFIX);
        let stored = StoredToken {
            id: credentials::new_id("tok_"),
            name: name.to_string(),
            role: role.as_str().to_string(),
            token_hash: self.inner.keys.hash_token(&token),
            created_by: by.to_string(),
            created_at: String::new(),
        };
        let entry = TokenEntry { id: stored.id.clone(), name: stored.name.clone(), role };
        let hash = stored.token_hash.clone();
        let created_at = self.inner.accounts.add_token(stored.clone()).await?;
        self.directory_write().tokens.insert(hash, entry);
        tracing::info!(token = %stored.id, name = %name, role = %role, "API token created.");
        let view = TokenView { id: stored.id, name: stored.name, role, created_by: stored.created_by, created_at };
        Ok(NewToken { view, token })
    }

    /// Revoke an API token: refused from the next request on.
    pub async fn revoke_token(&self, id: &str) -> Result<(), AuthError> {
        if !self.inner.accounts.remove_token(id.to_string()).await? {
            return Err(AuthError::NotFound(format!("no token with id '{id}'")));
        }
        self.directory_write().tokens.retain(|_, entry| entry.id != id);
        tracing::info!(token = %id, "API token revoked.");
        Ok(())
    }
}

fn view(token: StoredToken) -> Option<TokenView> {
    Some(TokenView {
        role: Role::parse(&token.role)?,
        id: token.id,
        name: token.name,
        created_by: token.created_by,
        created_at: token.created_at,
    })
}
