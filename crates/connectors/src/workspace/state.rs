//! The state store: checkpoints, table schemas and the stream registry.

use std::collections::BTreeMap;

use async_trait::async_trait;
use duckdb::{Connection, OptionalExt, params};
use sluice_core::schema::Column;
use sluice_core::{Checkpoint, ColumnType, Error, ErrorKind, Position, Result, StateStore, TableSchema, Totals};

use super::{Workspace, db_error, in_transaction, quote};

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

pub(crate) fn save_checkpoint(conn: &Connection, stream: &str, cp: &Checkpoint) -> Result<()> {
    let position = cp.position.0.to_string();
    let totals = serde_json::to_string(&cp.totals).map_err(json_error)?;
    let updated = conn
        .execute(
            "UPDATE sluice.checkpoints SET position = ?, sequence = ?, totals = ?, updated_at = now() WHERE stream = ?",
            params![position, cp.sequence, totals, stream],
        )
        .map_err(db_error)?;
    if updated == 0 {
        conn.execute(
            "INSERT INTO sluice.checkpoints VALUES (?, ?, ?, ?, now())",
            params![stream, position, cp.sequence, totals],
        )
        .map_err(db_error)?;
    }
    Ok(())
}

fn load_checkpoint(conn: &Connection, stream: &str) -> Result<Option<Checkpoint>> {
    let row: Option<(Option<String>, i64, String)> = conn
        .query_row(
            "SELECT position::VARCHAR, sequence, totals::VARCHAR FROM sluice.checkpoints WHERE stream = ?",
            params![stream],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .optional()
        .map_err(db_error)?;
    let Some((position, sequence, totals)) = row else { return Ok(None) };
    let position = match position {
        Some(p) => serde_json::from_str(&p).map_err(json_error)?,
        None => serde_json::Value::Null,
    };
    let totals: Totals = serde_json::from_str(&totals).map_err(json_error)?;
    Ok(Some(Checkpoint { position: Position(position), sequence, totals }))
}

fn load_table_schema(conn: &Connection, table: &str) -> Result<Option<TableSchema>> {
    let mut stmt = conn
        .prepare(
            "SELECT column_name, data_type FROM information_schema.columns \
             WHERE table_schema = 'main' AND table_name = ? ORDER BY ordinal_position",
        )
        .map_err(db_error)?;
    let columns: Vec<Column> = stmt
        .query_map(params![table], |r| {
            let name: String = r.get(0)?;
            let ty: String = r.get(1)?;
            Ok(Column { name, ty: ColumnType::from_sql(&ty).unwrap_or(ColumnType::Varchar) })
        })
        .map_err(db_error)?
        .collect::<Result<_, _>>()
        .map_err(db_error)?;
    Ok((!columns.is_empty()).then(|| TableSchema::existing(columns)))
}

#[async_trait]
impl StateStore for Workspace {
    async fn checkpoint(&self, stream: &str) -> Result<Option<Checkpoint>> {
        let stream = stream.to_string();
        self.with_connection(move |c| load_checkpoint(c, &stream)).await
    }

    async fn table_schema(&self, table: &str) -> Result<Option<TableSchema>> {
        let table = table.to_string();
        self.with_connection(move |c| load_table_schema(c, &table)).await
    }
}

impl Workspace {
    /// The existing tables a destination template (`*`, `[db]`, `[schema]`, `[table]`) can
    /// name, so a restarted stream knows their columns.
    pub async fn tables_matching(&self, template: &str) -> Result<Vec<String>> {
        let mut glob = String::new();
        let mut rest = template;
        while let Some(c) = rest.chars().next() {
            let token = ["[db]", "[schema]", "[table]"].into_iter().find(|t| rest.starts_with(t));
            if let Some(t) = token {
                glob.push('*');
                rest = &rest[t.len()..];
                continue;
            }
            match c {
                '*' => glob.push('*'),
                '?' | '[' | ']' => glob.push_str(&format!("[{c}]")),
                other => glob.push(other),
            }
            rest = &rest[c.len_utf8()..];
        }
        self.with_connection(move |c| {
            let mut stmt = c
                .prepare(
                    "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main' \
                     AND table_name GLOB ? ORDER BY table_name",
                )
                .map_err(db_error)?;
            let rows = stmt.query_map([glob], |r| r.get::<_, String>(0)).map_err(db_error)?;
            rows.collect::<std::result::Result<Vec<_>, _>>().map_err(db_error)
        })
        .await
    }

    /// Forget where `stream` stands at its source (totals and sequence stay), so it starts
    /// over: a re-snapshot.
    pub async fn reset_position(&self, stream: &str) -> Result<()> {
        let stream = stream.to_string();
        self.with_connection(move |c| {
            c.execute("UPDATE sluice.checkpoints SET position = 'null' WHERE stream = ?", params![stream])
                .map(|_| ())
                .map_err(db_error)
        })
        .await
    }

    /// Every stored stream, by name.
    pub async fn streams(&self) -> Result<Vec<StoredStream>> {
        let mut secrets = self.secrets.load()?;
        let mut streams = self
            .with_connection(|c| {
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
            s.secrets = secrets.remove(&s.name).unwrap_or_default();
        }
        Ok(streams)
    }

    /// Insert or replace a stream's stored config, key hash and secrets.
    pub async fn save_stream(&self, stream: StoredStream) -> Result<()> {
        self.secrets.set(&stream.name, stream.secrets.clone())?;
        self.with_connection(move |c| in_transaction(c, |c| save_stream(c, &stream))).await
    }
    /// The idempotency keys `stream`'s pushes stored in the last `window_s` seconds, oldest
    /// first, at most `limit` of the newest; older ones are removed.
    pub async fn push_keys(&self, stream: &str, window_s: u64, limit: usize) -> Result<Vec<(String, String)>> {
        let stream = stream.to_string();
        self.with_connection(move |c| {
            let cutoff = format!("now() - INTERVAL {window_s} SECOND");
            c.execute(
                &format!("DELETE FROM sluice.push_keys WHERE stream = ? AND stored_at < {cutoff}"),
                params![stream],
            )
            .map_err(db_error)?;
            let mut stmt = c
                .prepare(&format!(
                    "SELECT key, answer FROM (SELECT key, answer, stored_at FROM sluice.push_keys \
                     WHERE stream = ? ORDER BY stored_at DESC LIMIT {limit}) ORDER BY stored_at"
                ))
                .map_err(db_error)?;
            let rows = stmt
                .query_map(params![stream], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))
                .map_err(db_error)?;
            rows.collect::<std::result::Result<Vec<_>, _>>().map_err(db_error)
        })
        .await
    }

    /// Remove a stream, its checkpoint, its secrets, and (when asked) its table.
    pub async fn delete_stream(&self, name: &str, drop_table: Option<String>) -> Result<()> {
        self.secrets.set(name, BTreeMap::new())?;
        let name = name.to_string();
        self.with_connection(move |c| {
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

fn json_error(e: serde_json::Error) -> Error {
    Error::new(ErrorKind::Fatal, "stored JSON is unreadable").with_source(e)
}
