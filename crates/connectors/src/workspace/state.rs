//! A stream's durable progress in the workspace: its checkpoint, the columns of its tables as
//! they are, and the push keys it answered, read back as one [`Resume`] when it (re)starts; and
//! moving that progress back (a re-snapshot here, a replay in `replay.rs`).

use std::collections::HashMap;

use async_trait::async_trait;
use duckdb::{Connection, OptionalExt, params};
use sluice_core::schema::Column;
use sluice_core::{Checkpoint, ColumnType, Position, Result, StateStore, TableSchema, Totals};

use super::db::{Db, db_error, json_error};

/// The workspace as a state store. Cheap to clone.
#[derive(Clone)]
pub struct WorkspaceState {
    pub(super) db: Db,
}

/// Where a stream picks up: its durable checkpoint (the default when it never wrote) and the
/// columns of the existing tables its table template names.
#[derive(Debug, Clone, Default)]
pub struct Resume {
    /// The last durable checkpoint.
    pub checkpoint: Checkpoint,
    /// Each existing table's columns, by table name.
    pub schemas: HashMap<String, TableSchema>,
}

pub(crate) fn save_checkpoint(conn: &Connection, stream: &str, cp: &Checkpoint) -> Result<()> {
    let position = cp.position.0.to_string();
    let totals = serde_json::to_string(&cp.totals).map_err(json_error)?;
    let updated = conn
        .prepare_cached(
            "UPDATE sluice.checkpoints SET position = ?, sequence = ?, totals = ?, updated_at = now() WHERE stream = ?",
        )
        .and_then(|mut update| update.execute(params![position, cp.sequence, totals, stream]))
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
impl StateStore for WorkspaceState {
    async fn checkpoint(&self, stream: &str) -> Result<Option<Checkpoint>> {
        let stream = stream.to_string();
        self.db.run(move |c| load_checkpoint(c, &stream)).await
    }

    async fn table_schema(&self, table: &str) -> Result<Option<TableSchema>> {
        let table = table.to_string();
        self.db.run(move |c| load_table_schema(c, &table)).await
    }
}

impl WorkspaceState {
    pub(crate) fn new(db: Db) -> Self {
        Self { db }
    }

    /// Watch why the workspace cannot store now (its disk full), `None` once it can.
    pub fn watch_storage(&self) -> tokio::sync::watch::Receiver<Option<String>> {
        self.db.watch_fault()
    }

    /// What `stream`, writing the tables `template` names, resumes from, read on one connection.
    pub async fn resume(&self, stream: &str, template: &str) -> Result<Resume> {
        let (stream, glob) = (stream.to_string(), glob_of(template));
        self.db
            .run(move |c| {
                let checkpoint = load_checkpoint(c, &stream)?.unwrap_or_default();
                let mut schemas = HashMap::new();
                for table in tables_matching(c, &glob)? {
                    if let Some(schema) = load_table_schema(c, &table)? {
                        schemas.insert(table, schema);
                    }
                }
                Ok(Resume { checkpoint, schemas })
            })
            .await
    }

    /// The existing tables a destination template (`*`, `[db]`, `[schema]`, `[table]`) can
    /// name, so a restarted stream knows their columns.
    pub async fn tables_matching(&self, template: &str) -> Result<Vec<String>> {
        let glob = glob_of(template);
        self.db.run(move |c| tables_matching(c, &glob)).await
    }

    /// Forget where `stream` stands at its source (totals and sequence stay), so it starts
    /// over: a re-snapshot.
    pub async fn reset_position(&self, stream: &str) -> Result<()> {
        let stream = stream.to_string();
        self.db
            .run(move |c| {
                c.execute("UPDATE sluice.checkpoints SET position = 'null' WHERE stream = ?", params![stream])
                    .map(|_| ())
                    .map_err(db_error)
            })
            .await
    }

    /// The idempotency keys `stream`'s pushes stored in the last `window_s` seconds, oldest
    /// first, at most `limit` of the newest; older ones are removed.
    pub async fn push_keys(&self, stream: &str, window_s: u64, limit: usize) -> Result<Vec<(String, String)>> {
        let stream = stream.to_string();
        self.db
            .run(move |c| {
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
}

/// A table template as a GLOB pattern: each of `*`, `[db]`, `[schema]` and `[table]` stands for
/// any text, and GLOB's own special characters stand for themselves.
fn glob_of(template: &str) -> String {
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
    glob
}

fn tables_matching(conn: &Connection, glob: &str) -> Result<Vec<String>> {
    let mut stmt = conn
        .prepare(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main' \
             AND table_name GLOB ? ORDER BY table_name",
        )
        .map_err(db_error)?;
    let rows = stmt.query_map([glob], |r| r.get::<_, String>(0)).map_err(db_error)?;
    rows.collect::<std::result::Result<Vec<_>, _>>().map_err(db_error)
}

#[cfg(test)]
mod tests {
    #[test]
    fn table_templates_become_globs() {
        assert_eq!(super::glob_of("events"), "events");
        assert_eq!(super::glob_of("cdc_[schema]_[table]"), "cdc_*_*");
        assert_eq!(super::glob_of("t_*?[x]"), "t_*[?][[]x[]]");
    }
}
