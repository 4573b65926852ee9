//! Reverse ETL on the workspace side: run a sync's read-only SELECT, compare every row's hash
//! with the hashes of the last successful delivery, and, only after a delivery succeeded,
//! replace those hashes.
//!
//! The SELECT is checked by DuckDB's parser (one SELECT or WITH statement) and runs inside a
//! transaction that is always rolled back, so nothing it does can persist. Row hashes are kept
//! per sync in `sluice."hashes__<sync>"` as (key JSON, md5 of the row's JSON).

use std::sync::Arc;
use std::time::Instant;

use arrow::array::{AsArray, BooleanArray};
use arrow::datatypes::{Schema, SchemaRef};
use arrow::record_batch::RecordBatch;
use duckdb::Connection;
use sluice_core::{Error, ErrorKind, Result, SyncMode};

use super::{SCHEMA, check_read_only, db_error, in_transaction, quote};

/// What a run would send, computed without sending anything.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The result's columns, as the destination receives them.
    pub schema: SchemaRef,
    /// Replace and append: every row. Upsert and mirror: rows new or changed.
    pub rows: Vec<RecordBatch>,
    /// Upsert and mirror: for each batch of `rows`, whether each row's key is new.
    pub is_new: Vec<BooleanArray>,
    /// Mirror: the key columns of rows gone since the last successful run.
    pub deletes: Vec<RecordBatch>,
    /// Rows in the result.
    pub total: u64,
    /// Rows whose key was not delivered before (every row for replace and append).
    pub inserted: u64,
    /// Rows whose key was delivered with other values.
    pub updated: u64,
    /// Keys to delete (mirror).
    pub deleted: u64,
    /// Milliseconds spent on change detection (hashing and comparing).
    pub detect_ms: u64,
    /// (key, hash) of rows in `rows`, and the keys of `deletes`: what a successful delivery
    /// records.
    changed_hashes: Vec<RecordBatch>,
    gone_keys: Vec<RecordBatch>,
}

/// The table of a sync's row hashes.
pub(crate) fn hash_table(sync: &str) -> String {
    format!("{SCHEMA}.{}", quote(&format!("hashes__{sync}")))
}

/// Compute a sync's plan. `keys` are required for the keyed modes.
pub fn plan(conn: &Connection, sync: &str, sql: &str, mode: SyncMode, keys: &[String]) -> Result<Plan> {
    check_read_only(conn, sql)?;
    let hashes = hash_table(sync);
    conn.execute_batch(&format!("CREATE TABLE IF NOT EXISTS {hashes} (key VARCHAR NOT NULL, hash UBIGINT NOT NULL)"))
        .map_err(db_error)?;
    conn.execute_batch("BEGIN TRANSACTION").map_err(db_error)?;
    let result = plan_in(conn, &hashes, sql, mode, keys);
    // Always rolled back: the user's SELECT may not leave anything behind.
    let _ = conn.execute_batch("ROLLBACK");
    result
}

fn plan_in(conn: &Connection, hashes: &str, sql: &str, mode: SyncMode, keys: &[String]) -> Result<Plan> {
    // The text is inside parentheses on its own lines, so a trailing comment or semicolon
    // cannot escape them.
    let body = sql.trim().trim_end_matches(';');
    let columns = describe(conn, &format!("SELECT * FROM (\n{body}\n)"))?;
    let projection = columns.iter().map(|(name, ty)| project(name, ty)).collect::<Vec<_>>().join(", ");
    conn.execute_batch(&format!("CREATE TEMP TABLE __sluice_out AS SELECT {projection} FROM (\n{body}\n) r"))
        .map_err(|e| Error::new(ErrorKind::Data, format!("the query failed: {e}")))?;
    let total: i64 = conn.query_row("SELECT count(*) FROM __sluice_out", [], |r| r.get(0)).map_err(db_error)?;
    let total = total as u64;
    if !mode.keyed() {
        let rows = arrow_rows(conn, "SELECT * FROM __sluice_out")?;
        let schema = schema_of(conn, "SELECT * FROM __sluice_out", &rows)?;
        return Ok(Plan {
            schema,
            rows,
            is_new: Vec::new(),
            deletes: Vec::new(),
            total,
            inserted: total,
            updated: 0,
            deleted: 0,
            detect_ms: 0,
            changed_hashes: Vec::new(),
            gone_keys: Vec::new(),
        });
    }
    let started = Instant::now();
    check_keys(conn, &columns, keys)?;
    let key_json = keys.iter().map(|k| format!("'{}', o.{}", k.replace('\'', "''"), quote(k))).collect::<Vec<_>>();
    // The hash is of the row's JSON text: stable across DuckDB versions, unlike hash().
    conn.execute_batch(&format!(
        "CREATE TEMP TABLE __sluice_keyed AS SELECT o.*, json_object({})::VARCHAR AS __sluice_key, \
         md5_number_lower(to_json(o)::VARCHAR) AS __sluice_hash FROM __sluice_out o",
        key_json.join(", ")
    ))
    .map_err(db_error)?;
    let n = columns.len();
    let changed = arrow_rows(
        conn,
        &format!(
            "SELECT k.*, h.hash IS NULL AS __sluice_new FROM __sluice_keyed k LEFT JOIN {hashes} h \
             ON h.key = k.__sluice_key WHERE h.hash IS DISTINCT FROM k.__sluice_hash"
        ),
    )?;
    let (mut rows, mut changed_hashes, mut is_new, mut inserted) = (Vec::new(), Vec::new(), Vec::new(), 0u64);
    for batch in &changed {
        rows.push(batch.project(&(0..n).collect::<Vec<_>>()).map_err(arrow_error)?);
        changed_hashes.push(batch.project(&[n, n + 1]).map_err(arrow_error)?);
        let new: &BooleanArray = batch.column(n + 2).as_boolean();
        inserted += new.true_count() as u64;
        is_new.push(new.clone());
    }
    let changed_count: u64 = rows.iter().map(|b| b.num_rows() as u64).sum();
    let (deletes, gone_keys) =
        if mode == SyncMode::Mirror { gone(conn, hashes, &columns, keys)? } else { Default::default() };
    let deleted = deletes.iter().map(|b| b.num_rows() as u64).sum();
    let schema = schema_of(conn, "SELECT * FROM __sluice_out", &rows)?;
    Ok(Plan {
        schema,
        rows,
        is_new,
        deletes,
        total,
        inserted,
        updated: changed_count - inserted,
        deleted,
        detect_ms: started.elapsed().as_millis() as u64,
        changed_hashes,
        gone_keys,
    })
}

/// Keys delivered before and absent now: their key columns (typed as in the result) and JSON.
fn gone(
    conn: &Connection,
    hashes: &str,
    columns: &[(String, String)],
    keys: &[String],
) -> Result<(Vec<RecordBatch>, Vec<RecordBatch>)> {
    let batches = arrow_rows(
        conn,
        &format!(
            "SELECT unnest(json_transform(g.key, {shape})), g.key FROM \
             (SELECT h.key FROM {hashes} h ANTI JOIN __sluice_keyed k ON k.__sluice_key = h.key) g",
            shape = quote_literal(&json_shape(keys, columns)),
        ),
    )?;
    let n = keys.len();
    let mut deletes = Vec::new();
    let mut gone_keys = Vec::new();
    for batch in &batches {
        deletes.push(batch.project(&(0..n).collect::<Vec<_>>()).map_err(arrow_error)?);
        gone_keys.push(batch.project(&[n]).map_err(arrow_error)?);
    }
    Ok((deletes, gone_keys))
}

/// The JSON structure `json_transform` expects for the key columns.
fn json_shape(keys: &[String], columns: &[(String, String)]) -> String {
    let mut shape = serde_json::Map::new();
    for k in keys {
        let ty = columns.iter().find(|(c, _)| c == k).map(|(_, t)| t.clone()).unwrap_or_else(|| "VARCHAR".into());
        shape.insert(k.clone(), serde_json::Value::String(ty));
    }
    serde_json::Value::Object(shape).to_string()
}

fn quote_literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// After a successful delivery: replace the hashes of the rows sent and forget the keys deleted.
pub fn commit(conn: &Connection, sync: &str, plan: &Plan) -> Result<()> {
    if plan.changed_hashes.is_empty() && plan.gone_keys.is_empty() {
        return Ok(());
    }
    let hashes = hash_table(sync);
    let stage = format!("{SCHEMA}.{}", quote(&format!("hash_stage__{sync}")));
    let stage_name = format!("hash_stage__{sync}");
    in_transaction(conn, |c| {
        c.execute_batch(&format!("CREATE OR REPLACE TABLE {stage} (key VARCHAR NOT NULL, hash UBIGINT)"))
            .map_err(db_error)?;
        {
            let mut appender =
                c.appender_with_columns_to_db(&stage_name, SCHEMA, &["key", "hash"]).map_err(db_error)?;
            for batch in &plan.changed_hashes {
                let renamed = rename(batch, &["key", "hash"])?;
                appender.append_record_batch(renamed).map_err(db_error)?;
            }
            appender.flush().map_err(db_error)?;
        }
        {
            let mut appender = c.appender_with_columns_to_db(&stage_name, SCHEMA, &["key"]).map_err(db_error)?;
            for batch in &plan.gone_keys {
                appender.append_record_batch(rename(batch, &["key"])?).map_err(db_error)?;
            }
            appender.flush().map_err(db_error)?;
        }
        c.execute_batch(&format!(
            "DELETE FROM {hashes} WHERE key IN (SELECT key FROM {stage});
             INSERT INTO {hashes} SELECT key, hash FROM {stage} WHERE hash IS NOT NULL;
             DROP TABLE {stage};"
        ))
        .map_err(db_error)
    })
}

/// Forget every hash of a sync (its next keyed run sends every row).
pub fn reset(conn: &Connection, sync: &str) -> Result<()> {
    conn.execute_batch(&format!("DROP TABLE IF EXISTS {}", hash_table(sync))).map_err(db_error)
}

fn rename(batch: &RecordBatch, names: &[&str]) -> Result<RecordBatch> {
    let fields: Vec<_> =
        batch.schema().fields().iter().zip(names).map(|(f, n)| f.as_ref().clone().with_name(*n)).collect();
    RecordBatch::try_new(Arc::new(Schema::new(fields)), batch.columns().to_vec()).map_err(arrow_error)
}

/// Column names and DuckDB types of a query, without running it.
fn describe(conn: &Connection, sql: &str) -> Result<Vec<(String, String)>> {
    let mut stmt = conn
        .prepare(&format!("DESCRIBE {sql}"))
        .map_err(|e| Error::new(ErrorKind::Data, format!("the query failed: {e}")))?;
    let rows = stmt
        .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))
        .map_err(|e| Error::new(ErrorKind::Data, format!("the query failed: {e}")))?;
    let mut columns = Vec::new();
    for row in rows {
        columns.push(row.map_err(db_error)?);
    }
    let mut seen = std::collections::HashSet::new();
    for (name, _) in &columns {
        if !seen.insert(name.as_str()) {
            return Err(Error::new(
                ErrorKind::Data,
                format!("the query returns the column '{name}' twice; give each column its own name"),
            ));
        }
    }
    Ok(columns)
}

/// How one result column is handed to destinations: nested values as JSON text, types that no
/// destination shares (UUID, ENUM, INTERVAL, ...) as text; the rest as they are.
fn project(name: &str, ty: &str) -> String {
    let col = format!("r.{}", quote(name));
    let upper = ty.to_ascii_uppercase();
    let nested = upper.ends_with(']') || ["STRUCT", "MAP", "UNION"].iter().any(|p| upper.starts_with(p));
    let plain = [
        "BOOLEAN",
        "TINYINT",
        "SMALLINT",
        "INTEGER",
        "BIGINT",
        "HUGEINT",
        "FLOAT",
        "DOUBLE",
        "VARCHAR",
        "DATE",
        "TIMESTAMP",
        "TIMESTAMP WITH TIME ZONE",
        "TIME",
        "BLOB",
        "UTINYINT",
        "USMALLINT",
        "UINTEGER",
        "UBIGINT",
    ];
    if nested {
        format!("to_json({col}) AS {}", quote(name))
    } else if plain.contains(&upper.as_str()) || upper.starts_with("DECIMAL") || upper == "JSON" {
        format!("{col} AS {}", quote(name))
    } else {
        format!("CAST({col} AS VARCHAR) AS {}", quote(name))
    }
}

fn check_keys(conn: &Connection, columns: &[(String, String)], keys: &[String]) -> Result<()> {
    if keys.is_empty() {
        return Err(Error::config("keys", "upsert and mirror need at least one key column"));
    }
    for key in keys {
        if !columns.iter().any(|(c, _)| c == key) {
            let names = columns.iter().map(|(c, _)| c.as_str()).collect::<Vec<_>>().join(", ");
            return Err(Error::new(
                ErrorKind::Data,
                format!("key column '{key}' is not in the query's result (columns: {names})"),
            ));
        }
    }
    let cols = keys.iter().map(|k| quote(k)).collect::<Vec<_>>().join(", ");
    let nulls = keys.iter().map(|k| format!("{} IS NULL", quote(k))).collect::<Vec<_>>().join(" OR ");
    let (null_rows, duplicates): (i64, i64) = conn
        .query_row(
            &format!(
                "SELECT count(*) FILTER (WHERE {nulls}), count(*) - (SELECT count(*) FROM (SELECT DISTINCT {cols} FROM __sluice_out)) FROM __sluice_out"
            ),
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .map_err(db_error)?;
    if null_rows > 0 {
        return Err(Error::new(ErrorKind::Data, format!("{null_rows} rows have a NULL key ({})", keys.join(", "))));
    }
    if duplicates > 0 {
        return Err(Error::new(
            ErrorKind::Data,
            format!("the key ({}) is not unique in the result: {duplicates} rows repeat a key", keys.join(", ")),
        ));
    }
    Ok(())
}

fn arrow_rows(conn: &Connection, sql: &str) -> Result<Vec<RecordBatch>> {
    let mut stmt = conn.prepare(sql).map_err(db_error)?;
    let batches: Vec<RecordBatch> = stmt.query_arrow([]).map_err(db_error)?.filter(|b| b.num_rows() > 0).collect();
    Ok(batches)
}

/// The schema of `sql`'s result, from its batches or, when there are none, from DuckDB.
fn schema_of(conn: &Connection, sql: &str, batches: &[RecordBatch]) -> Result<SchemaRef> {
    if let Some(b) = batches.first() {
        return Ok(b.schema());
    }
    let mut stmt = conn.prepare(&format!("{sql} LIMIT 0")).map_err(db_error)?;
    let arrow = stmt.query_arrow([]).map_err(db_error)?;
    Ok(arrow.get_schema())
}

fn arrow_error(e: arrow::error::ArrowError) -> Error {
    Error::new(ErrorKind::Fatal, "cannot reshape a result batch").with_source(e)
}
