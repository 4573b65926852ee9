//! The history of each stream's tables: which column appeared when, and which widened. Each
//! schema change is recorded in `sluice.schema_changes` in the transaction that applies it
//! (the workspace sink), or just after a destination applied it.

use serde::Serialize;
use sluice_core::schema::SchemaChange;
use sluice_core::{Result, WriteUnit};

use super::db::{Db, db_error};

pub(crate) const BOOTSTRAP: &str = r#"
CREATE TABLE IF NOT EXISTS sluice.schema_changes (
    stream VARCHAR NOT NULL, "table" VARCHAR NOT NULL, change VARCHAR NOT NULL, "column" VARCHAR,
    type VARCHAR, sequence BIGINT, applied_at TIMESTAMPTZ NOT NULL);
"#;

/// One recorded change of one column.
#[derive(Debug, Clone, Serialize)]
pub struct SchemaEvent {
    /// The table.
    pub table: String,
    /// `create` (a column the table was created with), `add` or `widen`.
    pub change: String,
    /// The column.
    pub column: Option<String>,
    /// Its SQL type after the change.
    pub r#type: Option<String>,
    /// The stream sequence of the event that brought it.
    pub sequence: Option<i64>,
    /// When it was applied (RFC 3339).
    pub applied_at: String,
}

/// One column's change in a unit: table, change, column, type, and the sequence of the event
/// that brought it.
pub type ColumnChange = (String, &'static str, String, String, i64);

/// The rows a unit's schema changes come to.
pub fn changes_of(unit: &WriteUnit) -> Vec<ColumnChange> {
    let mut out = Vec::new();
    for write in &unit.tables {
        let by = |column: &str| {
            let brought = write.brought_by.iter().find(|(name, _)| name == column);
            brought.map_or(unit.checkpoint.sequence, |(_, at)| *at)
        };
        let mut row = |change: &'static str, c: &sluice_core::schema::Column| {
            out.push((write.table.clone(), change, c.name.clone(), c.ty.sql().into_owned(), by(&c.name)));
        };
        for change in &write.changes {
            match change {
                SchemaChange::Create(columns) => columns.iter().for_each(|c| row("create", c)),
                SchemaChange::Add(c) => row("add", c),
                SchemaChange::Widen(c) => row("widen", c),
            }
        }
    }
    out
}

/// Record `unit`'s schema changes on `conn` (inside the caller's transaction).
pub(crate) fn record(conn: &duckdb::Connection, unit: &WriteUnit) -> Result<()> {
    let changes = changes_of(unit);
    if changes.is_empty() {
        return Ok(());
    }
    let mut stmt =
        conn.prepare_cached("INSERT INTO sluice.schema_changes VALUES (?, ?, ?, ?, ?, ?, now())").map_err(db_error)?;
    for (table, change, column, ty, sequence) in changes {
        stmt.execute(duckdb::params![unit.stream, table, change, column, ty, sequence]).map_err(db_error)?;
    }
    Ok(())
}

/// The schema history of the streams.
#[derive(Clone)]
pub struct SchemaHistory {
    db: Db,
}

impl SchemaHistory {
    pub(crate) fn new(db: Db) -> Self {
        Self { db }
    }

    /// Record the schema changes of a unit a destination (not the workspace) applied.
    pub async fn record(&self, unit: std::sync::Arc<WriteUnit>) -> Result<()> {
        self.db.run(move |c| record(c, &unit)).await
    }

    /// Every recorded change of `stream`, oldest first (at most the newest 10,000).
    pub async fn of_stream(&self, stream: &str) -> Result<Vec<SchemaEvent>> {
        let stream = stream.to_string();
        self.db
            .run(move |c| {
                let mut stmt = c
                    .prepare(
                        "SELECT \"table\", change, \"column\", type, sequence, strftime(applied_at AT TIME ZONE 'UTC', \
                         '%Y-%m-%dT%H:%M:%S.%fZ') FROM (SELECT *, rowid AS r FROM sluice.schema_changes WHERE stream = ? \
                         ORDER BY r DESC LIMIT 10000) ORDER BY r",
                    )
                    .map_err(db_error)?;
                let rows = stmt
                    .query_map([stream], |r| {
                        Ok(SchemaEvent {
                            table: r.get(0)?,
                            change: r.get(1)?,
                            column: r.get(2)?,
                            r#type: r.get(3)?,
                            sequence: r.get(4)?,
                            applied_at: r.get(5)?,
                        })
                    })
                    .map_err(db_error)?;
                rows.collect::<std::result::Result<Vec<_>, _>>().map_err(db_error)
            })
            .await
    }

    /// Forget a removed stream's history.
    pub async fn forget(&self, stream: &str) -> Result<()> {
        let stream = stream.to_string();
        self.db
            .run(move |c| {
                c.execute("DELETE FROM sluice.schema_changes WHERE stream = ?", [stream]).map_err(db_error).map(|_| ())
            })
            .await
    }
}
