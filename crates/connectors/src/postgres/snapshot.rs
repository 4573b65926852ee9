//! The initial copy: every table in key order, in chunks, inside the slot's exported snapshot
//! when there is one. Progress (tables done, last key copied) is stored with each chunk, so a
//! restart resumes the copy; the stream from the slot's start then brings the rows up to date.

use serde_json::json;
use sluice_core::{Error, ErrorKind, Result};

use super::cdc::{Cdc, Progress, RelationInfo, change};
use super::config::sql_error;
use super::pgoutput::Cell;
use super::values::Types;

fn quote_literal(v: &str) -> String {
    format!("'{}'", v.replace('\'', "''"))
}

fn quote_ident(v: &str) -> String {
    format!("\"{}\"", v.replace('"', "\"\""))
}

/// The columns of `schema.table` (name, type OID, modifier) and its key: the primary key, or
/// every column for a table with REPLICA IDENTITY FULL and no primary key.
pub(super) async fn relation(
    client: &tokio_postgres::Client,
    types: &mut Types,
    schema: &str,
    table: &str,
) -> Result<RelationInfo> {
    let qualified = format!("{}.{}", quote_ident(schema), quote_ident(table));
    let rows = client
        .query(
            "SELECT a.attname::text, a.atttypid, a.atttypmod, \
             coalesce(a.attnum = ANY(i.indkey), false) FROM pg_attribute a \
             LEFT JOIN pg_index i ON i.indrelid = a.attrelid AND i.indisprimary \
             WHERE a.attrelid = $1::text::regclass AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            &[&qualified],
        )
        .await
        .map_err(|e| sql_error(&format!("reading the columns of {schema}.{table}"), &e))?;
    let mut columns = Vec::new();
    let mut key = Vec::new();
    for row in rows {
        let (name, oid, typmod, is_key): (String, u32, i32, bool) = (row.get(0), row.get(1), row.get(2), row.get(3));
        let info = types.get(client, oid).await.map_err(|e| sql_error("reading a column type", &e))?;
        if is_key {
            key.push(name.clone());
        }
        columns.push((name, info, typmod));
    }
    if key.is_empty() {
        key = columns.iter().map(|c| c.0.clone()).collect();
    }
    Ok(RelationInfo { schema: schema.into(), name: table.into(), columns, key })
}

impl Cdc {
    /// Copy every table not yet copied, in chunks; `snapshot` is the slot's exported snapshot.
    pub(super) async fn copy(
        &self,
        tables: &[String],
        progress: &mut Progress,
        snapshot: Option<String>,
    ) -> Result<()> {
        let client = self.config.connect().await?;
        client
            .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            .await
            .map_err(|e| sql_error("starting the snapshot", &e))?;
        if let Some(s) = &snapshot {
            client
                .batch_execute(&format!("SET TRANSACTION SNAPSHOT {}", quote_literal(s)))
                .await
                .map_err(|e| sql_error("using the slot's snapshot", &e))?;
        }
        let total: f64 = client
            .query_one(
                "SELECT coalesce(sum(greatest(c.reltuples, 0)), 0)::float8 FROM pg_class c JOIN pg_namespace n \
                 ON n.oid = c.relnamespace WHERE n.nspname || '.' || c.relname = ANY($1)",
                &[&tables.to_vec()],
            )
            .await
            .map(|r| r.get(0))
            .unwrap_or(0.0);
        let mut types = Types::default();
        let mut copied_rows = 0u64;
        let start_lsn = progress.start_lsn.unwrap_or(0);
        for table in tables {
            if progress.copied.contains(table) {
                continue;
            }
            let (schema, name) = table.split_once('.').ok_or_else(|| Error::new(ErrorKind::Config, "bad table"))?;
            let relation = relation(&client, &mut types, schema, name).await?;
            let mut after: Option<Vec<String>> =
                progress.copying.as_ref().filter(|(t, _)| t == table).map(|(_, k)| k.clone());
            tracing::info!(table = %table, after = ?after, "Copying.");
            let cols: Vec<String> = relation.columns.iter().map(|c| format!("t.{}::text", quote_ident(&c.0))).collect();
            // Qualified: the text casts in the select list keep the column names, and ordering by
            // the text would break the keyset.
            let keys: Vec<String> = relation.key.iter().map(|k| format!("t.{}", quote_ident(k))).collect();
            loop {
                let filter = match &after {
                    Some(last) => {
                        let values: Vec<String> = last.iter().map(|v| quote_literal(v)).collect();
                        let casts: Vec<String> = relation
                            .key
                            .iter()
                            .zip(&values)
                            .map(|(k, v)| format!("{v}::{}", type_of(&relation, k)))
                            .collect();
                        format!("WHERE ({}) > ({})", keys.join(", "), casts.join(", "))
                    }
                    None => String::new(),
                };
                let sql = format!(
                    "SELECT {} FROM {}.{} AS t {filter} ORDER BY {} LIMIT {}",
                    cols.join(", "),
                    quote_ident(schema),
                    quote_ident(name),
                    keys.join(", "),
                    self.config.snapshot_chunk_rows
                );
                let rows = client.query(&sql, &[]).await.map_err(|e| sql_error(&format!("copying {table}"), &e))?;
                tracing::debug!(table = %table, rows = rows.len(), "Copied a chunk.");
                let mut records = Vec::with_capacity(rows.len());
                for row in &rows {
                    let cells: Vec<Cell> = (0..relation.columns.len())
                        .map(|i| row.get::<_, Option<String>>(i).map_or(Cell::Null, Cell::Text))
                        .collect();
                    let source = json!({"connector": "postgresql", "db": self.config.database, "schema": schema,
                                        "table": name, "lsn": start_lsn, "snapshot": "true"});
                    records.push(change("r", &relation, None, Some(relation.image(&cells)), source));
                }
                let last: Option<Vec<String>> = rows.last().map(|row| {
                    relation
                        .key
                        .iter()
                        .map(|k| {
                            let i = relation.columns.iter().position(|c| &c.0 == k).unwrap_or(0);
                            row.get::<_, Option<String>>(i).unwrap_or_default()
                        })
                        .collect()
                });
                let done = rows.len() < self.config.snapshot_chunk_rows as usize;
                copied_rows += rows.len() as u64;
                if done {
                    progress.copied.push(table.clone());
                    progress.copying = None;
                } else {
                    progress.copying = last.clone().map(|k| (table.clone(), k));
                }
                self.metrics.set_state("snapshotting", None);
                self.metrics.set_source("snapshot_rows", copied_rows as f64);
                let percent = if total > 0.0 { (copied_rows as f64 / total * 100.0).min(100.0) } else { 100.0 };
                self.metrics.set_source("snapshot_percent", percent);
                if !self.send(records, progress).await {
                    return Ok(());
                }
                if done {
                    break;
                }
                after = last;
            }
        }
        self.metrics.set_source("snapshot_percent", 100.0);
        let _ = client.batch_execute("COMMIT").await;
        Ok(())
    }
}

/// The SQL type of key column `k`, for the typed literal of a keyset filter.
fn type_of(relation: &RelationInfo, k: &str) -> String {
    relation.columns.iter().find(|c| c.0 == k).map_or_else(|| "text".into(), |c| c.1.name.clone())
}
