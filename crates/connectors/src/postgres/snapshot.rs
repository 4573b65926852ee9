//! The initial copy: every table in key order, in chunks, inside the slot's exported snapshot
//! when there is one. Progress (tables done, last key copied) is stored with each chunk, so a
//! restart resumes the copy; the stream from the slot's start then brings the rows up to date.

use futures_util::StreamExt;
use std::sync::Arc;

use sluice_core::decode::{Wire, binary_copy_rows, binary_fields, binary_text};
use sluice_core::{CopyRows, Error, ErrorKind, Payload, Record, RecordMeta, Result};

use super::cdc::{Cdc, Progress, RelationInfo};
use super::config::sql_error;
use super::types::Types;

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
    Ok(RelationInfo::new(schema.into(), table.into(), columns, key))
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
        // The text forms the decoder reads: instants in UTC, ISO dates, bytea as hex.
        client
            .batch_execute(
                "SET LOCAL TimeZone = 'UTC'; SET LOCAL DateStyle = 'ISO, YMD'; SET LOCAL bytea_output = 'hex'",
            )
            .await
            .map_err(|e| sql_error("setting up the snapshot session", &e))?;
        let total = estimate_rows(&client, tables).await;
        let mut types = Types::default();
        let mut copied_rows = 0u64;
        let started = std::time::Instant::now();
        for table in tables {
            if progress.copied.contains(table) {
                continue;
            }
            let (schema, name) = table.split_once('.').ok_or_else(|| Error::new(ErrorKind::Config, "bad table"))?;
            let relation = relation(&client, &mut types, schema, name).await?;
            // A table whose key is its whole row (no primary key: REPLICA IDENTITY FULL) is paged
            // by ranges of its pages inside this snapshot (a TID range scan, no sort), not by a
            // row comparison, which NULLs, duplicates and some types defeat. A page means nothing
            // in another snapshot, so after a restart such a table is copied again from its
            // start, its earlier rows cleared.
            let whole_row = relation.key.len() == relation.columns.len();
            let mut after: Option<Vec<String>> =
                progress.copying.as_ref().filter(|(t, _)| t == table && !whole_row).map(|(_, k)| k.clone());
            let (pages, rows_per_page) = if whole_row { pages(&client, schema, name).await? } else { (0, 0.0) };
            let mut page = 0i64;
            tracing::info!(table = %table, after = ?after, "Copying.");
            let (exprs, wires) = copy_exprs(&relation);
            let wires = Arc::new(wires);
            let columns = relation.types.clone();
            let key_fields: Vec<usize> =
                relation.key.iter().filter_map(|k| relation.columns.iter().position(|c| &c.0 == k)).collect();
            // Qualified, so that ordering uses the columns and not the select list's texts.
            let keys: Vec<String> = relation.key.iter().map(|k| format!("t.{}", quote_ident(k))).collect();
            let mut limit = self.config.snapshot_chunk_rows.min(2_000);
            loop {
                // Pages in this chunk of a keyless table, for about `limit` rows.
                let span = if whole_row { ((f64::from(limit) / rows_per_page).ceil() as i64).max(1) } else { 0 };
                let filter = match &after {
                    _ if whole_row => {
                        format!(
                            "WHERE t.ctid >= '({page},0)'::tid AND t.ctid < '({},0)'::tid",
                            page.saturating_add(span)
                        )
                    }
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
                let paging =
                    if whole_row { String::new() } else { format!("ORDER BY {} LIMIT {limit}", keys.join(", ")) };
                let sql = format!(
                    "COPY (SELECT {} FROM {}.{} AS t {filter} {paging}) TO STDOUT (FORMAT binary)",
                    exprs.join(", "),
                    quote_ident(schema),
                    quote_ident(name),
                );
                let stream = client.copy_out(&sql).await.map_err(|e| sql_error(&format!("copying {table}"), &e))?;
                futures_util::pin_mut!(stream);
                // Each data message is one row: kept as received, with no copy into one buffer.
                let mut messages: Vec<bytes::Bytes> = Vec::with_capacity(limit as usize + 1);
                while let Some(part) = stream.next().await {
                    messages.push(part.map_err(|e| sql_error(&format!("copying {table}"), &e))?);
                }
                let lines = binary_copy_rows(messages)
                    .map_err(|e| Error::new(ErrorKind::Fatal, format!("copying {table}: {e}")))?;
                let count = lines.len();
                let done = if whole_row { page.saturating_add(span) >= pages } else { count < limit as usize };
                tracing::debug!(table = %table, rows = count, "Copied a chunk.");
                let last = lines.last().and_then(|line| last_key(line, &key_fields, &wires));
                if !done && !whole_row && last.is_none() {
                    // Never page from the start again: that would copy the table forever.
                    return Err(Error::new(ErrorKind::Fatal, format!("copying {table}: a row without its key")));
                }
                let clear = if whole_row { page == 0 } else { after.is_none() };
                let records = vec![Record {
                    payload: Payload::Copy(CopyRows {
                        columns: columns.clone(),
                        keys: relation.key.clone(),
                        db: self.config.database.clone(),
                        schema: schema.to_string(),
                        table: name.to_string(),
                        clear,
                        last: done,
                        rows: lines,
                        binary: Some(wires.clone()),
                    }),
                    meta: RecordMeta {
                        received_us: sluice_core::batch::now_us(),
                        route: Some(relation.name.clone()),
                        ..RecordMeta::default()
                    },
                }];
                let rows = count;
                // Small first chunks fill the pipeline (read, decode, write) sooner.
                limit = (limit * 4).min(self.config.snapshot_chunk_rows);
                copied_rows += rows as u64;
                if done {
                    progress.copied.push(table.clone());
                    progress.copying = None;
                } else if whole_row {
                    // Marks the table as begun: a restart copies it again from its start.
                    progress.copying = Some((table.clone(), Vec::new()));
                } else {
                    progress.copying = last.clone().map(|k| (table.clone(), k));
                }
                self.metrics.set_state("snapshotting", None);
                self.metrics.set_source("snapshot_rows", copied_rows as f64);
                // Never 100 before the end: an estimate below the rows copied so far says 99.
                if total > 0.0 {
                    self.metrics.set_source("snapshot_percent", (copied_rows as f64 / total * 100.0).min(99.0));
                }
                if !self.send(records, progress).await {
                    return Ok(());
                }
                if done {
                    break;
                }
                after = last;
                page = page.saturating_add(span);
            }
        }
        self.metrics.set_source("snapshot_percent", 100.0);
        tracing::info!(rows = copied_rows, ms = started.elapsed().as_millis() as u64, "Snapshot read.");
        let _ = client.batch_execute("COMMIT").await;
        Ok(())
    }
}

/// What the binary `COPY` selects for each column, and the form it comes in. Booleans,
/// integers, floats, dates, timestamps, bytea and text come in their binary form, which neither
/// side prints or parses; arrays as JSON text (so a list column reads them as a change's
/// value), every other type as its text (`::text`, as a change's value). The column's type
/// comes from `types.rs`, as a change's does.
fn copy_exprs(relation: &RelationInfo) -> (Vec<String>, Vec<Wire>) {
    relation
        .columns
        .iter()
        .map(|(name, info, _)| {
            let column = format!("t.{}", quote_ident(name));
            if info.category == 'A' {
                return (format!("to_json({column})::text"), Wire::Text);
            }
            let wire = match info.name.as_str() {
                "bool" => Wire::Bool,
                "int2" => Wire::Int2,
                "int4" => Wire::Int4,
                "int8" => Wire::Int8,
                "float4" => Wire::Float4,
                "float8" => Wire::Float8,
                "date" => Wire::Date,
                "timestamp" => Wire::Timestamp,
                "timestamptz" => Wire::Timestamptz,
                "bytea" => Wire::Bytea,
                "text" | "varchar" | "bpchar" => Wire::Text,
                _ => return (format!("{column}::text"), Wire::Text),
            };
            (column, wire)
        })
        .unzip()
}

/// The key fields of a chunk's last row as text, for the next keyset filter.
fn last_key(row: &[u8], key_fields: &[usize], wires: &[Wire]) -> Option<Vec<String>> {
    let mut ranges = Vec::new();
    if !binary_fields(row, &mut ranges) {
        return None;
    }
    key_fields
        .iter()
        .map(|&i| {
            let range = ranges.get(i)?.clone()?;
            binary_text(*wires.get(i)?, &row[range]).map(std::borrow::Cow::into_owned)
        })
        .collect()
}

/// The SQL type of key column `k`, for the typed literal of a keyset filter.
fn type_of(relation: &RelationInfo, k: &str) -> String {
    relation.columns.iter().find(|c| c.0 == k).map_or_else(|| "text".into(), |c| c.1.name.clone())
}

/// The pages of `schema.table` now (at least those the snapshot sees: pages added since hold no
/// row it sees) and the rows a page holds by the planner's statistics (50 without them).
async fn pages(client: &tokio_postgres::Client, schema: &str, table: &str) -> Result<(i64, f64)> {
    let qualified = format!("{}.{}", quote_ident(schema), quote_ident(table));
    let row = client
        .query_one(
            "SELECT (pg_relation_size(c.oid) / current_setting('block_size')::int8)::int8, \
             CASE WHEN c.relpages > 0 AND c.reltuples > 0 THEN c.reltuples / c.relpages ELSE 50 END::float8 \
             FROM pg_class c WHERE c.oid = $1::text::regclass",
            &[&qualified],
        )
        .await
        .map_err(|e| sql_error(&format!("reading the size of {schema}.{table}"), &e))?;
    Ok((row.get(0), row.get::<_, f64>(1).max(1.0)))
}

/// Rows the snapshot will copy: the planner's estimate for tables that have statistics, and a
/// count for tables that were never analyzed (`reltuples` is -1 right after a bulk load, which
/// made the progress say 100% after the first chunk).
async fn estimate_rows(client: &tokio_postgres::Client, tables: &[String]) -> f64 {
    let rows = client
        .query(
            "SELECT quote_ident(n.nspname) || '.' || quote_ident(c.relname), c.reltuples::float8 FROM pg_class c \
             JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname || '.' || c.relname = ANY($1)",
            &[&tables.to_vec()],
        )
        .await
        .unwrap_or_default();
    let mut total = 0.0;
    for row in rows {
        let (name, estimate): (String, f64) = (row.get(0), row.get(1));
        if estimate >= 0.0 {
            total += estimate;
            continue;
        }
        let counted = client.query_one(&format!("SELECT count(*)::float8 FROM {name}"), &[]).await;
        total += counted.map(|r| r.get::<_, f64>(0)).unwrap_or(0.0);
    }
    total
}
