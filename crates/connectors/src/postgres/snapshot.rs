//! The initial copy: every table by one `COPY` in key order, cut into chunks as it streams in,
//! inside the slot's exported snapshot when there is one. Progress (tables done, last key
//! copied) is stored with each chunk, so a restart resumes the copy; the stream from the slot's
//! start then brings the rows up to date.

use futures_util::StreamExt;
use std::sync::Arc;

use sluice_core::decode::{BinaryCopyReader, Wire, binary_fields, binary_text};
use sluice_core::{CopyRows, Error, ErrorKind, Payload, Record, RecordMeta, Result};

use super::cdc::{Cdc, Progress, RelationInfo};
use super::config::sql_error;
use super::types::Types;

/// A chunk ends at this many bytes of rows, whatever its row count: `snapshot_chunk_rows` rows
/// of a table with wide rows would not fit in memory (a chunk is read, decoded and written at
/// once, and the next is read meanwhile).
const CHUNK_BYTES: usize = 64 << 20;

fn quote_literal(v: &str) -> String {
    format!("'{}'", v.replace('\'', "''"))
}

fn quote_ident(v: &str) -> String {
    format!("\"{}\"", v.replace('"', "\"\""))
}

/// The columns of `schema.table` (name, type OID, modifier) and its key: the primary key, or
/// every column for a table with REPLICA IDENTITY FULL and no primary key (then `true`).
pub(super) async fn relation(
    client: &tokio_postgres::Client,
    types: &mut Types,
    schema: &str,
    table: &str,
) -> Result<(RelationInfo, bool)> {
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
    let keyless = key.is_empty();
    if keyless {
        key = columns.iter().map(|c| c.0.clone()).collect();
    }
    Ok((RelationInfo::new(schema.into(), table.into(), columns, key), keyless))
}

impl Cdc {
    /// Copy every table not yet copied, in chunks; `snapshot` is the slot's exported snapshot.
    pub(super) async fn copy(
        &self,
        tables: &[String],
        progress: &mut Progress,
        snapshot: Option<String>,
    ) -> Result<()> {
        // Dropped before its end (the stream stopped, an error), the session cuts its connection:
        // the server stops the table's `COPY` and ends the snapshot's transaction.
        let session = self.config.session().await?;
        let client = &session.client;
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
        // The text forms the decoder reads: instants in UTC, ISO dates, bytea as hex. A table's
        // rows come by one statement in key order: by the key's index rather than after a sort
        // of the whole table (the first rows come at once), and with no time limit.
        client
            .batch_execute(
                "SET LOCAL TimeZone = 'UTC'; SET LOCAL DateStyle = 'ISO, YMD'; SET LOCAL bytea_output = 'hex'; \
                 SET LOCAL enable_sort = off; SET LOCAL statement_timeout = 0",
            )
            .await
            .map_err(|e| sql_error("setting up the snapshot session", &e))?;
        let total = estimate_rows(client, tables).await;
        let mut types = Types::default();
        let mut copied_rows = 0u64;
        let started = std::time::Instant::now();
        for table in tables {
            if progress.copied.contains(table) {
                continue;
            }
            let (schema, name) = table.split_once('.').ok_or_else(|| Error::new(ErrorKind::Config, "bad table"))?;
            let (relation, keyless) = relation(client, &mut types, schema, name).await?;
            // The table is read by one `COPY` in key order (an index scan of the primary key),
            // cut into chunks here as its rows stream in; each chunk records the last key it
            // holds, so a restart reads on from there in a new snapshot. A table without a primary
            // key (REPLICA IDENTITY FULL) is read in heap order: a row has no place in another
            // snapshot, so after a restart such a table is copied again from its start, its earlier
            // rows cleared.
            let after: Option<Vec<String>> = progress
                .copying
                .as_ref()
                .filter(|(t, k)| t == table && !keyless && !k.is_empty())
                .map(|(_, k)| k.clone());
            tracing::info!(table = %table, after = ?after, "Copying.");
            let (exprs, wires) = copy_exprs(&relation);
            let wires = Arc::new(wires);
            let columns = relation.types.clone();
            let key_fields: Vec<usize> =
                relation.key.iter().filter_map(|k| relation.columns.iter().position(|c| &c.0 == k)).collect();
            // Qualified, so that ordering uses the columns and not the select list's texts.
            let keys: Vec<String> = relation.key.iter().map(|k| format!("t.{}", quote_ident(k))).collect();
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
            let order = if keyless { String::new() } else { format!("ORDER BY {}", keys.join(", ")) };
            let sql = format!(
                "COPY (SELECT {} FROM {}.{} AS t {filter} {order}) TO STDOUT (FORMAT binary)",
                exprs.join(", "),
                quote_ident(schema),
                quote_ident(name),
            );
            let stream = client.copy_out(&sql).await.map_err(|e| sql_error(&format!("copying {table}"), &e))?;
            futures_util::pin_mut!(stream);
            let mut reader = BinaryCopyReader::default();
            let mut first = true;
            let mut limit = self.config.snapshot_chunk_rows.min(2_000) as usize;
            loop {
                // Each data message is one row: kept as received, with no copy into one buffer.
                let mut lines: Vec<bytes::Bytes> = Vec::with_capacity(limit);
                let mut bytes = 0usize;
                let mut done = false;
                while lines.len() < limit && bytes < CHUNK_BYTES {
                    let Some(part) = stream.next().await else {
                        done = true;
                        break;
                    };
                    let message = part.map_err(|e| sql_error(&format!("copying {table}"), &e))?;
                    if let Some(row) = reader
                        .row(message)
                        .map_err(|e| Error::new(ErrorKind::Fatal, format!("copying {table}: {e}")))?
                    {
                        bytes += row.len();
                        lines.push(row);
                    }
                }
                let count = lines.len();
                tracing::debug!(table = %table, rows = count, "Copied a chunk.");
                let last =
                    if keyless { None } else { lines.last().and_then(|line| last_key(line, &key_fields, &wires)) };
                if !done && !keyless && last.is_none() {
                    // Never page from the start again: that would copy the table forever.
                    return Err(Error::new(ErrorKind::Fatal, format!("copying {table}: a row without its key")));
                }
                let clear = first && (keyless || after.is_none());
                first = false;
                let records = vec![Record {
                    payload: Payload::Copy(CopyRows {
                        columns: columns.clone(),
                        keys: relation.key.clone(),
                        whole_row: keyless,
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
                // Small first chunks fill the pipeline (read, decode, write) sooner.
                limit = (limit * 4).min(self.config.snapshot_chunk_rows as usize);
                copied_rows += count as u64;
                if done {
                    progress.copied.push(table.clone());
                    progress.copying = None;
                } else if keyless {
                    // Marks the table as begun: a restart copies it again from its start.
                    progress.copying = Some((table.clone(), Vec::new()));
                } else if let Some(k) = last {
                    progress.copying = Some((table.clone(), k));
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
            }
        }
        self.metrics.set_source("snapshot_percent", 100.0);
        tracing::info!(rows = copied_rows, ms = started.elapsed().as_millis() as u64, "Snapshot read.");
        let _ = client.batch_execute("COMMIT").await;
        session.detach();
        Ok(())
    }
}

/// What the binary `COPY` selects for each column, and the form it comes in. Booleans,
/// integers, floats, numerics, dates, timestamps, bytea and text come in their binary form, which neither
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
                "numeric" => Wire::Numeric,
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
