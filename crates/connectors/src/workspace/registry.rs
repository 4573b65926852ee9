//! The registry: what streams and syncs exist, each stored the same way: its config (JSON,
//! without secrets) in the database and its secrets in `secrets.json` (see `secrets`). Saving,
//! listing and deleting take and give both at once. Sync run records are in `runs.rs`.

use std::collections::BTreeMap;
use std::sync::Arc;

use duckdb::{Connection, params};
use sluice_core::{Error, ErrorKind, Result};

use super::db::{Db, db_error, in_transaction, json_error, quote};
use super::secrets::SecretFile;
use super::sync_plan;

/// A stream as stored: its config (JSON, without secrets) and the hash of its push key.
#[derive(Debug, Clone)]
pub struct StoredStream {
    /// Name.
    pub name: String,
    /// The config, serialized (secrets are never serialized).
    pub config: serde_json::Value,
    /// The push key's stored hash (`hmac-sha256:…`, or plain SHA-256 hex from older versions).
    pub key_hash: String,
    /// Secrets of the config (passwords), by field path; kept out of `config`.
    pub secrets: BTreeMap<String, String>,
}

/// A sync as stored: its config (JSON, without secrets).
#[derive(Debug, Clone)]
pub struct StoredSync {
    /// Name.
    pub name: String,
    /// The config, serialized (secrets are never serialized).
    pub config: serde_json::Value,
    /// Secrets of the config (passwords, header values), by field path; kept out of `config`.
    pub secrets: BTreeMap<String, String>,
}

/// The stream and sync registry, with the syncs' run records. Cheap to clone.
#[derive(Clone)]
pub struct Registry {
    pub(super) db: Db,
    secrets: Arc<SecretFile>,
}

impl Registry {
    pub(crate) fn new(db: Db, secrets: Arc<SecretFile>) -> Self {
        Self { db, secrets }
    }

    /// Every stored stream, by name, with its secrets.
    pub async fn streams(&self) -> Result<Vec<StoredStream>> {
        let mut secrets = self.secrets.load()?;
        let mut streams = self
            .db
            .run(|c| {
                let mut stmt = c
                    .prepare("SELECT name, config::VARCHAR, key_hash FROM sluice.streams ORDER BY name")
                    .map_err(db_error)?;
                let rows = stmt
                    .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get::<_, String>(2)?)))
                    .map_err(db_error)?;
                let mut out = Vec::new();
                for row in rows {
                    let (name, config, key_hash) = row.map_err(db_error)?;
                    let config = serde_json::from_str(&config).map_err(json_error)?;
                    out.push(StoredStream { name, config, key_hash, secrets: BTreeMap::new() });
                }
                Ok(out)
            })
            .await?;
        for s in &mut streams {
            s.secrets = secrets.remove(&stream_owner(&s.name)).unwrap_or_default();
        }
        Ok(streams)
    }

    /// Insert or replace a stream's stored config, key hash and secrets.
    pub async fn save_stream(&self, stream: StoredStream) -> Result<()> {
        self.secrets.set(&stream_owner(&stream.name), stream.secrets.clone())?;
        self.db.run(move |c| in_transaction(c, |c| save_stream(c, &stream))).await
    }

    /// Remove a stream, its checkpoint, its push keys, its secrets, and (when asked) its table.
    pub async fn delete_stream(&self, name: &str, drop_table: Option<String>) -> Result<()> {
        self.secrets.set(&stream_owner(name), BTreeMap::new())?;
        let name = name.to_string();
        self.db
            .run(move |c| {
                in_transaction(c, |c| {
                    c.execute("DELETE FROM sluice.streams WHERE name = ?", params![name]).map_err(db_error)?;
                    c.execute("DELETE FROM sluice.checkpoints WHERE stream = ?", params![name]).map_err(db_error)?;
                    c.execute("DELETE FROM sluice.push_keys WHERE stream = ?", params![name]).map_err(db_error)?;
                    if let Some(table) = &drop_table {
                        c.execute_batch(&format!("DROP TABLE IF EXISTS main.{}", quote(table))).map_err(db_error)?;
                    }
                    Ok(())
                })
            })
            .await
    }

    /// Every stored sync, by name, with its secrets.
    pub async fn syncs(&self) -> Result<Vec<StoredSync>> {
        let mut secrets = self.secrets.load()?;
        let mut syncs = self
            .db
            .run(|c| {
                let mut stmt =
                    c.prepare("SELECT name, config::VARCHAR FROM sluice.syncs ORDER BY name").map_err(db_error)?;
                let rows =
                    stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))).map_err(db_error)?;
                let mut out = Vec::new();
                for row in rows {
                    let (name, config) = row.map_err(db_error)?;
                    let config = serde_json::from_str(&config).map_err(|e| {
                        Error::new(ErrorKind::Fatal, format!("sync '{name}' is unreadable")).with_source(e)
                    })?;
                    out.push(StoredSync { name, config, secrets: BTreeMap::new() });
                }
                Ok(out)
            })
            .await?;
        for s in &mut syncs {
            s.secrets = secrets.remove(&sync_owner(&s.name)).unwrap_or_default();
        }
        Ok(syncs)
    }

    /// Insert or replace a sync's stored config and secrets (its row hashes and runs stay).
    pub async fn save_sync(&self, sync: StoredSync) -> Result<()> {
        self.secrets.set(&sync_owner(&sync.name), sync.secrets.clone())?;
        self.db.run(move |c| in_transaction(c, |c| save_sync(c, &sync))).await
    }

    /// Remove a sync, its secrets, its row hashes and its runs.
    pub async fn delete_sync(&self, name: &str) -> Result<()> {
        self.secrets.set(&sync_owner(name), BTreeMap::new())?;
        let name = name.to_string();
        self.db
            .run(move |c| {
                in_transaction(c, |c| {
                    c.execute("DELETE FROM sluice.syncs WHERE name = ?", [&name]).map_err(db_error)?;
                    c.execute("DELETE FROM sluice.sync_runs WHERE sync = ?", [&name]).map_err(db_error)?;
                    sync_plan::reset(c, &name)
                })
            })
            .await
    }
}

/// A named connection as stored: its config (JSON, without secrets) and its secrets.
#[derive(Debug, Clone)]
pub struct StoredConnection {
    /// Name.
    pub name: String,
    /// The config, serialized (secrets are never serialized).
    pub config: serde_json::Value,
    /// Secrets of the config, by field path; kept out of `config`.
    pub secrets: BTreeMap<String, String>,
}

impl Registry {
    /// Every stored named connection, by name, with its secrets.
    pub async fn connections(&self) -> Result<Vec<StoredConnection>> {
        let mut secrets = self.secrets.load()?;
        let mut all = self
            .db
            .run(|c| {
                let mut stmt = c
                    .prepare("SELECT name, config::VARCHAR FROM sluice.connections ORDER BY name")
                    .map_err(db_error)?;
                let rows =
                    stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))).map_err(db_error)?;
                let mut out = Vec::new();
                for row in rows {
                    let (name, config) = row.map_err(db_error)?;
                    let config = serde_json::from_str(&config).map_err(json_error)?;
                    out.push(StoredConnection { name, config, secrets: BTreeMap::new() });
                }
                Ok(out)
            })
            .await?;
        for s in &mut all {
            s.secrets = secrets.remove(&connection_owner(&s.name)).unwrap_or_default();
        }
        Ok(all)
    }

    /// Insert or replace a named connection and its secrets.
    pub async fn save_connection(&self, connection: StoredConnection) -> Result<()> {
        self.secrets.set(&connection_owner(&connection.name), connection.secrets.clone())?;
        self.db
            .run(move |c| {
                in_transaction(c, |c| {
                    c.execute("DELETE FROM sluice.connections WHERE name = ?", [&connection.name]).map_err(db_error)?;
                    c.execute(
                        "INSERT INTO sluice.connections VALUES (?, ?::JSON, now())",
                        params![connection.name, connection.config.to_string()],
                    )
                    .map_err(db_error)?;
                    Ok(())
                })
            })
            .await
    }

    /// Remove a named connection and its secrets.
    pub async fn delete_connection(&self, name: &str) -> Result<()> {
        self.secrets.set(&connection_owner(name), BTreeMap::new())?;
        let name = name.to_string();
        self.db
            .run(move |c| {
                c.execute("DELETE FROM sluice.connections WHERE name = ?", [&name]).map_err(db_error)?;
                Ok(())
            })
            .await
    }
}

/// The key of a connection's secrets in `secrets.json`.
fn connection_owner(name: &str) -> String {
    format!("connection:{name}")
}

/// The key of a stream's secrets in `secrets.json`.
fn stream_owner(name: &str) -> String {
    name.to_string()
}

/// The key of a sync's secrets in `secrets.json`.
fn sync_owner(name: &str) -> String {
    format!("sync:{name}")
}

fn save_stream(c: &Connection, stream: &StoredStream) -> Result<()> {
    let config = stream.config.to_string();
    let updated = c
        .execute(
            "UPDATE sluice.streams SET config = ?, key_hash = ?, updated_at = now() WHERE name = ?",
            params![config, stream.key_hash, stream.name],
        )
        .map_err(db_error)?;
    if updated == 0 {
        c.execute(
            "INSERT INTO sluice.streams VALUES (?, ?, ?, now(), now())",
            params![stream.name, config, stream.key_hash],
        )
        .map_err(db_error)?;
    }
    Ok(())
}

fn save_sync(c: &Connection, sync: &StoredSync) -> Result<()> {
    let created: Option<String> =
        c.query_row("SELECT created_at::VARCHAR FROM sluice.syncs WHERE name = ?", [&sync.name], |r| r.get(0)).ok();
    c.execute("DELETE FROM sluice.syncs WHERE name = ?", [&sync.name]).map_err(db_error)?;
    c.execute(
        "INSERT INTO sluice.syncs VALUES (?, ?::JSON, coalesce(?::TIMESTAMPTZ, now()), now())",
        params![sync.name, sync.config.to_string(), created],
    )
    .map_err(db_error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::workspace::Workspace;

    #[tokio::test]
    async fn streams_and_syncs_keep_their_secrets_apart_from_their_configs() {
        let dir = std::env::temp_dir().join(format!("sluice-registry-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let registry = Workspace::open(&dir).unwrap().registry().clone();
        let secrets: BTreeMap<String, String> = [("password".to_string(), "hunter2".to_string())].into();
        let stream = StoredStream {
            name: "s".into(),
            config: json!({"table": "t"}),
            key_hash: "h".into(),
            secrets: secrets.clone(),
        };
        registry.save_stream(stream).await.unwrap();
        let sync = StoredSync { name: "s".into(), config: json!({"query": "SELECT 1"}), secrets: secrets.clone() };
        registry.save_sync(sync).await.unwrap();

        let streams = registry.streams().await.unwrap();
        let syncs = registry.syncs().await.unwrap();
        assert_eq!((streams.len(), syncs.len()), (1, 1));
        assert_eq!((&streams[0].secrets, &syncs[0].secrets), (&secrets, &secrets));
        assert_eq!(syncs[0].config, json!({"query": "SELECT 1"}));

        // A stream and a sync of one name are apart: deleting one leaves the other's secrets.
        registry.delete_sync("s").await.unwrap();
        assert!(registry.syncs().await.unwrap().is_empty());
        assert_eq!(registry.streams().await.unwrap()[0].secrets, secrets);
        registry.delete_stream("s", None).await.unwrap();
        assert!(registry.streams().await.unwrap().is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
