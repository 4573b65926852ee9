//! Who may use the API: users (with their password hashes), API tokens and refresh tokens,
//! stored in the internal schema like the streams and syncs. Only hashes are stored: argon2id
//! for passwords, keyed HMAC-SHA-256 for tokens (the server computes both). The tables are
//! internal, so user SQL cannot read them (see `access.rs`).
//!
//! None of these types derive `Debug` or `Serialize`: they carry hashes.

use duckdb::{Connection, params};
use sluice_core::Result;

use super::db::{Db, db_error, in_transaction};

/// The tables, created at open.
pub(crate) const BOOTSTRAP: &str = r#"
CREATE TABLE IF NOT EXISTS sluice.users (
    name VARCHAR NOT NULL, role VARCHAR NOT NULL, password_hash VARCHAR,
    created_at TIMESTAMPTZ NOT NULL, updated_at TIMESTAMPTZ NOT NULL);
CREATE TABLE IF NOT EXISTS sluice.api_tokens (
    id VARCHAR NOT NULL, name VARCHAR NOT NULL, role VARCHAR NOT NULL, token_hash VARCHAR NOT NULL,
    created_by VARCHAR NOT NULL, created_at TIMESTAMPTZ NOT NULL);
CREATE TABLE IF NOT EXISTS sluice.refresh_tokens (
    token_hash VARCHAR NOT NULL, "user" VARCHAR NOT NULL, expires_at TIMESTAMPTZ NOT NULL,
    created_at TIMESTAMPTZ NOT NULL);
"#;

/// Timestamps as the API shows them.
const UTC: &str = "'%Y-%m-%dT%H:%M:%SZ'";

/// A user as stored.
#[derive(Clone)]
pub struct StoredUser {
    /// The login name.
    pub name: String,
    /// `admin`, `editor`, `viewer` or `agent`.
    pub role: String,
    /// The argon2id hash (PHC string); `None` until a password is set.
    pub password_hash: Option<String>,
    /// When it was created (RFC 3339, UTC).
    pub created_at: String,
    /// When it last changed.
    pub updated_at: String,
}

/// An API token as stored: never the token itself.
#[derive(Clone)]
pub struct StoredToken {
    /// Its id, for listing and revoking.
    pub id: String,
    /// A name its creator chose.
    pub name: String,
    /// The role it grants.
    pub role: String,
    /// The keyed hash of the token.
    pub token_hash: String,
    /// Who created it.
    pub created_by: String,
    /// When (RFC 3339, UTC).
    pub created_at: String,
}

/// A change to a user; fields left `None` stay.
#[derive(Default)]
pub struct UserChange {
    /// A new role.
    pub role: Option<String>,
    /// A new password hash.
    pub password_hash: Option<String>,
}

/// The users and tokens. Cheap to clone.
#[derive(Clone)]
pub struct Accounts {
    db: Db,
}

impl Accounts {
    pub(crate) fn new(db: Db) -> Self {
        Self { db }
    }

    /// Every user, by name.
    pub async fn users(&self) -> Result<Vec<StoredUser>> {
        self.db
            .run(|c| {
                let sql = format!(
                    "SELECT name, role, password_hash, strftime(created_at AT TIME ZONE 'UTC', {UTC}), \
                     strftime(updated_at AT TIME ZONE 'UTC', {UTC}) FROM sluice.users ORDER BY name"
                );
                let mut stmt = c.prepare(&sql).map_err(db_error)?;
                let rows = stmt
                    .query_map([], |r| {
                        Ok(StoredUser {
                            name: r.get(0)?,
                            role: r.get(1)?,
                            password_hash: r.get(2)?,
                            created_at: r.get(3)?,
                            updated_at: r.get(4)?,
                        })
                    })
                    .map_err(db_error)?;
                rows.map(|r| r.map_err(db_error)).collect()
            })
            .await
    }

    /// Add a user; `false` when one of that name exists.
    pub async fn add_user(&self, name: String, role: String, password_hash: Option<String>) -> Result<bool> {
        self.db
            .run(move |c| {
                in_transaction(c, |c| {
                    if user_exists(c, &name)? {
                        return Ok(false);
                    }
                    c.execute(
                        "INSERT INTO sluice.users VALUES (?, ?, ?, now(), now())",
                        params![name, role, password_hash],
                    )
                    .map_err(db_error)?;
                    Ok(true)
                })
            })
            .await
    }

    /// Change a user's role or password; `false` when there is no such user. A new password
    /// ends the user's sessions (their refresh tokens).
    pub async fn change_user(&self, name: String, change: UserChange) -> Result<bool> {
        self.db
            .run(move |c| {
                in_transaction(c, |c| {
                    if !user_exists(c, &name)? {
                        return Ok(false);
                    }
                    if let Some(role) = &change.role {
                        c.execute(
                            "UPDATE sluice.users SET role = ?, updated_at = now() WHERE name = ?",
                            params![role, name],
                        )
                        .map_err(db_error)?;
                    }
                    if let Some(hash) = &change.password_hash {
                        c.execute(
                            "UPDATE sluice.users SET password_hash = ?, updated_at = now() WHERE name = ?",
                            params![hash, name],
                        )
                        .map_err(db_error)?;
                        c.execute("DELETE FROM sluice.refresh_tokens WHERE \"user\" = ?", [&name]).map_err(db_error)?;
                    }
                    Ok(true)
                })
            })
            .await
    }

    /// Remove a user and their sessions; `false` when there was none.
    pub async fn remove_user(&self, name: String) -> Result<bool> {
        self.db
            .run(move |c| {
                in_transaction(c, |c| {
                    c.execute("DELETE FROM sluice.refresh_tokens WHERE \"user\" = ?", [&name]).map_err(db_error)?;
                    let removed = c.execute("DELETE FROM sluice.users WHERE name = ?", [&name]).map_err(db_error)?;
                    Ok(removed > 0)
                })
            })
            .await
    }

    /// Every API token (hashes, never tokens), oldest first.
    pub async fn tokens(&self) -> Result<Vec<StoredToken>> {
        self.db
            .run(|c| {
                let sql = format!(
                    "SELECT id, name, role, token_hash, created_by, strftime(created_at AT TIME ZONE 'UTC', {UTC}) \
                     FROM sluice.api_tokens ORDER BY created_at, id"
                );
                let mut stmt = c.prepare(&sql).map_err(db_error)?;
                let rows = stmt
                    .query_map([], |r| {
                        Ok(StoredToken {
                            id: r.get(0)?,
                            name: r.get(1)?,
                            role: r.get(2)?,
                            token_hash: r.get(3)?,
                            created_by: r.get(4)?,
                            created_at: r.get(5)?,
                        })
                    })
                    .map_err(db_error)?;
                rows.map(|r| r.map_err(db_error)).collect()
            })
            .await
    }

    /// Store a new API token; its `created_at` is set here and returned.
    pub async fn add_token(&self, token: StoredToken) -> Result<String> {
        self.db
            .run(move |c| {
                c.execute(
                    "INSERT INTO sluice.api_tokens VALUES (?, ?, ?, ?, ?, now())",
                    params![token.id, token.name, token.role, token.token_hash, token.created_by],
                )
                .map_err(db_error)?;
                let sql = format!(
                    "SELECT strftime(created_at AT TIME ZONE 'UTC', {UTC}) FROM sluice.api_tokens WHERE id = ?"
                );
                c.query_row(&sql, [&token.id], |r| r.get(0)).map_err(db_error)
            })
            .await
    }

    /// Revoke an API token; `false` when there was none.
    pub async fn remove_token(&self, id: String) -> Result<bool> {
        self.db
            .run(move |c| {
                let removed = c.execute("DELETE FROM sluice.api_tokens WHERE id = ?", [&id]).map_err(db_error)?;
                Ok(removed > 0)
            })
            .await
    }

    /// Store a refresh token's hash for `user`, valid for `seconds`.
    pub async fn add_refresh(&self, token_hash: String, user: String, seconds: i64) -> Result<()> {
        self.db
            .run(move |c| {
                c.execute(
                    "INSERT INTO sluice.refresh_tokens VALUES (?, ?, now() + to_seconds(?), now())",
                    params![token_hash, user, seconds],
                )
                .map_err(db_error)?;
                Ok(())
            })
            .await
    }

    /// Use a refresh token up: it is removed, and its user returned if it was valid (stored
    /// and not expired). Expired tokens of anyone are cleared on the way.
    pub async fn take_refresh(&self, token_hash: String) -> Result<Option<String>> {
        self.db
            .run(move |c| {
                in_transaction(c, |c| {
                    let user = {
                        let mut stmt = c
                            .prepare(
                                "SELECT \"user\" FROM sluice.refresh_tokens WHERE token_hash = ? AND expires_at > now()",
                            )
                            .map_err(db_error)?;
                        let mut rows = stmt.query_map([&token_hash], |r| r.get::<_, String>(0)).map_err(db_error)?;
                        rows.next().transpose().map_err(db_error)?
                    };
                    c.execute("DELETE FROM sluice.refresh_tokens WHERE token_hash = ? OR expires_at <= now()", [
                        &token_hash,
                    ])
                    .map_err(db_error)?;
                    Ok(user)
                })
            })
            .await
    }
}

fn user_exists(c: &Connection, name: &str) -> Result<bool> {
    let n: i64 =
        c.query_row("SELECT count(*) FROM sluice.users WHERE name = ?", [name], |r| r.get(0)).map_err(db_error)?;
    Ok(n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workspace::Workspace;

    #[tokio::test]
    async fn users_tokens_and_refresh_tokens_round_trip() {
        let dir = std::env::temp_dir().join(format!("sluice-accounts-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let accounts = Workspace::open(&dir).unwrap().accounts().clone();
        assert!(accounts.add_user("ada".into(), "admin".into(), None).await.unwrap());
        assert!(!accounts.add_user("ada".into(), "viewer".into(), None).await.unwrap(), "names are unique");
        accounts.add_refresh("r1".into(), "ada".into(), 60).await.unwrap();
        accounts.add_refresh("old".into(), "ada".into(), -1).await.unwrap();
        assert_eq!(accounts.take_refresh("old".into()).await.unwrap(), None, "expired");
        assert_eq!(accounts.take_refresh("r1".into()).await.unwrap().as_deref(), Some("ada"));
        assert_eq!(accounts.take_refresh("r1".into()).await.unwrap(), None, "used up");

        accounts.add_refresh("r2".into(), "ada".into(), 60).await.unwrap();
        let change = UserChange { role: Some("editor".into()), password_hash: Some("h".into()) };
        assert!(accounts.change_user("ada".into(), change).await.unwrap());
        assert_eq!(accounts.take_refresh("r2".into()).await.unwrap(), None, "a new password ends sessions");
        let users = accounts.users().await.unwrap();
        assert_eq!((users[0].role.as_str(), users[0].password_hash.as_deref()), ("editor", Some("h")));

        let token = StoredToken {
            id: "t1".into(),
            name: "ci".into(),
            role: "viewer".into(),
            token_hash: "x".into(),
            created_by: "ada".into(),
            created_at: String::new(),
        };
        assert!(accounts.add_token(token).await.unwrap().ends_with('Z'));
        assert_eq!(accounts.tokens().await.unwrap().len(), 1);
        assert!(accounts.remove_token("t1".into()).await.unwrap());
        assert!(!accounts.remove_token("t1".into()).await.unwrap());
        assert!(accounts.remove_user("ada".into()).await.unwrap());
        assert!(accounts.users().await.unwrap().is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
