//! A SQLite table as a reverse ETL or stream destination. Every write is one transaction, replace
//! included (delete and reload), so a reader sees the old rows or the new ones; a stream's
//! position is upserted into `sluice_positions` in that same transaction.

use std::path::PathBuf;

use arrow::array::{Array, AsArray};
use arrow::datatypes::{DataType, Int64Type};
use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use rusqlite::types::Value;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior};
use serde::{Deserialize, Serialize};
use sluice_core::transform::CustomSql;
use sluice_core::{Delivery, Destination, Error, ErrorKind, Result, Stamp, SyncMode};

use crate::sql_table::{Dialect, Literals, binary, column_names};

const D: Dialect = Dialect::Sqlite;

/// A table in a SQLite database file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SqliteTableConfig {
    /// The database file; created when missing.
    pub path: PathBuf,
    /// The table; created when missing. A stream leaves it out: its `table` names the table.
    #[serde(default)]
    pub table: String,
    /// A read-only connection cannot be a destination; turn this off to let syncs write.
    #[serde(default)]
    pub read_only: bool,
    /// A stream's own SQL in place of Sluice's insert or merge: blocks of
    /// `-- @sql key=<source table> [dependsOn=<key>,…]` … `-- @end`, run for each event of their
    /// table in the unit's transaction, parents first; `{column}` is a bind variable and
    /// `{debezium_cdc_op}` the change's op (`c`, `u`, `d`, `r`). Tables are not created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub custom_sql: Option<String>,
}

impl SqliteTableConfig {
    /// Stamps and several tables at once, unless custom SQL writes instead.
    pub fn capabilities(&self) -> sluice_core::Capabilities {
        let plain = self.custom_sql.is_none();
        sluice_core::Capabilities {
            multi_table: plain,
            custom_sql: !plain,
            stage: plain,
            multiset: plain,
            ..Default::default()
        }
    }

    /// Check the fields; pure.
    pub fn validate(&self) -> Result<()> {
        if self.table.trim().is_empty() {
            return Err(Error::config("destination.table", "must not be empty"));
        }
        if self.custom_sql.is_some() {
            return Err(Error::config("destination.custom_sql", "custom SQL is for streams"));
        }
        self.validate_connection()
    }

    /// Check every field but the table (a stream's destination takes the stream's); pure.
    pub fn validate_connection(&self) -> Result<()> {
        if self.path.as_os_str().is_empty() {
            return Err(Error::config("destination.path", "must not be empty"));
        }
        if let Some(sql) = &self.custom_sql {
            CustomSql::parse(sql).map_err(|e| Error::config("destination.custom_sql", e))?;
        }
        if self.read_only {
            return Err(Error::config(
                "destination.read_only",
                "the connection is read-only; set read_only: false to let a sync write to it",
            ));
        }
        Ok(())
    }

    fn open(&self) -> Result<Connection> {
        let conn = Connection::open(&self.path)
            .map_err(|e| Error::new(ErrorKind::Config, format!("SQLite: cannot open {}: {e}", self.path.display())))?;
        conn.busy_timeout(std::time::Duration::from_secs(10)).map_err(sql_error)?;
        Ok(conn)
    }
}

/// Delivers into a SQLite table.
pub struct SqliteTarget {
    config: SqliteTableConfig,
}

impl SqliteTarget {
    /// A destination for `config`.
    pub fn new(config: SqliteTableConfig) -> Self {
        Self { config }
    }
}

#[async_trait]
impl Destination for SqliteTarget {
    async fn check(&mut self) -> Result<()> {
        let config = self.config.clone();
        blocking(move || {
            let conn = config.open()?;
            // BEGIN IMMEDIATE takes the write lock: it fails on a read-only file or directory.
            conn.execute_batch("BEGIN IMMEDIATE; ROLLBACK;").map_err(|e| {
                Error::new(ErrorKind::Config, format!("destination: {} cannot be written: {e}", config.path.display()))
            })
        })
        .await
    }

    async fn deliver(&mut self, delivery: &Delivery) -> Result<()> {
        self.write(std::slice::from_ref(delivery), None).await
    }

    async fn write(&mut self, deliveries: &[Delivery], stamp: Option<&Stamp>) -> Result<()> {
        write(&self.config, deliveries, stamp, true).await
    }

    async fn probe(&mut self, deliveries: &[Delivery]) -> Option<Result<()>> {
        Some(write(&self.config, deliveries, None, false).await)
    }

    async fn keys(&mut self, table: &str) -> Result<Option<Vec<String>>> {
        let config = self.config.clone();
        let table = table.to_string();
        blocking(move || {
            if !config.path.exists() {
                return Ok(None);
            }
            table_keys(&config.open()?, &table)
        })
        .await
    }

    async fn stamp(&mut self, owner: &str) -> Result<Option<String>> {
        let config = self.config.clone();
        let owner = owner.to_string();
        blocking(move || {
            // A file that is not there yet holds no position (and is not created by looking).
            if !config.path.exists() {
                return Ok(None);
            }
            let conn = config.open()?;
            let exists: bool = conn
                .query_row(
                    "SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = ?1",
                    [POSITIONS],
                    |r| r.get(0),
                )
                .map_err(sql_error)?;
            if !exists {
                return Ok(None);
            }
            conn.query_row(&format!("SELECT checkpoint FROM {} WHERE owner = ?1", D.quote(POSITIONS)), [&owner], |r| {
                r.get(0)
            })
            .optional()
            .map_err(sql_error)
        })
        .await
    }
}

/// The table where streams keep their positions, next to their rows.
const POSITIONS: &str = "sluice_positions";

/// The current time as SQLite writes it: ISO 8601 UTC with milliseconds.
const NOW: &str = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')";

async fn blocking<T: Send + 'static>(job: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(job)
        .await
        .map_err(|e| Error::new(ErrorKind::Fatal, "SQLite job panicked").with_source(e))?
}

/// Apply `deliveries` and `stamp` in one transaction, committed or (`commit` false: a probe)
/// rolled back.
async fn write(config: &SqliteTableConfig, deliveries: &[Delivery], stamp: Option<&Stamp>, commit: bool) -> Result<()> {
    let config = config.clone();
    let deliveries = deliveries.to_vec();
    let stamp = stamp.cloned();
    blocking(move || {
        let mut conn = config.open()?;
        // IMMEDIATE: the write lock from the start, so a concurrent writer makes this wait
        // (busy_timeout) rather than fail on upgrading a read lock.
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate).map_err(sql_error)?;
        match config.custom_sql.as_deref().map(CustomSql::parse).transpose() {
            Ok(Some(custom)) => run_custom(&tx, &custom, &deliveries)?,
            Ok(None) => {
                for delivery in &deliveries {
                    apply(&tx, delivery.table.as_deref().unwrap_or(&config.table), delivery)?;
                }
            }
            Err(e) => return Err(Error::config("destination.custom_sql", e)),
        }
        if let Some(stamp) = stamp {
            let positions = D.quote(POSITIONS);
            tx.execute_batch(&format!(
                "CREATE TABLE IF NOT EXISTS {positions} (owner TEXT PRIMARY KEY, checkpoint TEXT NOT NULL, \
                 written_at TEXT NOT NULL DEFAULT ({NOW}))"
            ))
            .map_err(sql_error)?;
            tx.execute(
                &format!(
                    "INSERT INTO {positions} (owner, checkpoint) VALUES (?1, ?2) ON CONFLICT (owner) \
                     DO UPDATE SET checkpoint = excluded.checkpoint, written_at = {NOW}"
                ),
                [&stamp.owner, &stamp.checkpoint],
            )
            .map_err(sql_error)?;
        }
        if commit { tx.commit().map_err(sql_error) } else { tx.rollback().map_err(sql_error) }
    })
    .await
}

/// A stream's custom SQL blocks, run inside the open transaction.
fn run_custom(conn: &Connection, custom: &CustomSql, deliveries: &[Delivery]) -> Result<()> {
    for run in crate::sql_table::custom::plan(custom, deliveries, D)? {
        let failed = |e| {
            let e = sql_error(e);
            Error::new(e.kind(), format!("custom SQL block `{}`: {e}", run.block.key))
        };
        let mut statement = conn.prepare_cached(&run.sql).map_err(failed)?;
        for row in &run.rows {
            statement.execute(rusqlite::params_from_iter(row.iter())).map_err(failed)?;
        }
    }
    Ok(())
}

/// Apply one delivery to table `name` inside the open transaction: the table is created, or given
/// the columns it lacks, first.
fn apply(conn: &Connection, name: &str, delivery: &Delivery) -> Result<()> {
    let table = D.quote(name);
    let keys: &[String] = if delivery.mode.keyed() { &delivery.keys } else { &[] };
    let columns = column_names(&delivery.schema);
    let existing = existing_columns(conn, name)?;
    let created = existing.is_empty();
    if created {
        // A stream's snapshot brings its source key in replace and append too.
        // A table without a key (a multiset) may hold identical rows: no primary key.
        let key: &[String] = if delivery.multiset { &[] } else { &delivery.keys };
        conn.execute_batch(&D.create_table(&table, &delivery.schema, key, false)).map_err(sql_error)?;
    } else {
        for field in delivery.schema.fields().iter().filter(|f| !existing.contains(f.name())) {
            conn.execute_batch(&D.add_column(&table, field)).map_err(sql_error)?;
        }
    }
    match delivery.mode {
        SyncMode::Replace => {
            conn.execute_batch(&format!("DELETE FROM {table}")).map_err(sql_error)?;
            insert(conn, &table, &columns, &delivery.rows)
        }
        SyncMode::Append => insert(conn, &table, &columns, &delivery.rows),
        SyncMode::Upsert | SyncMode::Mirror if delivery.multiset => {
            if delivery.delete_count() > 0 && !created {
                conn.execute_batch(&format!(
                    "DROP TABLE IF EXISTS temp.sluice_gone; CREATE TEMP TABLE sluice_gone AS SELECT {} FROM {table} WHERE 0",
                    D.list(keys)
                ))
                .map_err(sql_error)?;
                insert(conn, "sluice_gone", keys, &delivery.deletes)?;
                let mut all = existing.clone();
                all.extend(columns.iter().filter(|c| !existing.contains(c)).cloned());
                for sql in D.delete_counted(&table, "sluice_gone", keys, &all) {
                    conn.execute_batch(&sql).map_err(sql_error)?;
                }
                conn.execute_batch("DROP TABLE temp.sluice_gone").map_err(sql_error)?;
            }
            insert(conn, &table, &columns, &delivery.rows)
        }
        SyncMode::Upsert | SyncMode::Mirror => {
            if created {
                insert(conn, &table, &columns, &delivery.rows)?;
            } else if delivery.row_count() > 0 {
                conn.execute_batch(&format!(
                    "CREATE TEMP TABLE sluice_stage AS SELECT {} FROM {table} WHERE 0",
                    D.list(&columns)
                ))
                .map_err(sql_error)?;
                insert(conn, "sluice_stage", &columns, &delivery.rows)?;
                if let Some(update) = D.update_from(&table, "sluice_stage", &columns, keys, &delivery.keep) {
                    conn.execute_batch(&update).map_err(sql_error)?;
                }
                conn.execute_batch(&D.insert_missing(&table, "sluice_stage", &columns, keys)).map_err(sql_error)?;
                conn.execute_batch("DROP TABLE temp.sluice_stage").map_err(sql_error)?;
            }
            if delivery.delete_count() > 0 && !created {
                conn.execute_batch(&format!(
                    "CREATE TEMP TABLE sluice_gone AS SELECT {} FROM {table} WHERE 0",
                    D.list(keys)
                ))
                .map_err(sql_error)?;
                insert(conn, "sluice_gone", keys, &delivery.deletes)?;
                conn.execute_batch(&D.delete_matching(&table, "sluice_gone", keys)).map_err(sql_error)?;
                conn.execute_batch("DROP TABLE temp.sluice_gone").map_err(sql_error)?;
            }
            Ok(())
        }
    }
}

/// `table`'s primary key columns in key order, else those of its narrowest unique index
/// without a condition or expression; `None` when the table does not exist.
fn table_keys(conn: &Connection, table: &str) -> Result<Option<Vec<String>>> {
    let mut stmt = conn.prepare("SELECT name, pk FROM pragma_table_info(?1) ORDER BY pk").map_err(sql_error)?;
    let columns: Vec<(String, i64)> = stmt
        .query_map([table], |r| Ok((r.get(0)?, r.get(1)?)))
        .map_err(sql_error)?
        .collect::<Result<_, _>>()
        .map_err(sql_error)?;
    if columns.is_empty() {
        return Ok(None);
    }
    let primary: Vec<String> = columns.into_iter().filter(|(_, pk)| *pk > 0).map(|(name, _)| name).collect();
    if !primary.is_empty() {
        return Ok(Some(primary));
    }
    let mut stmt = conn
        .prepare("SELECT name FROM pragma_index_list(?1) WHERE \"unique\" = 1 AND partial = 0 ORDER BY name")
        .map_err(sql_error)?;
    let indexes: Vec<String> =
        stmt.query_map([table], |r| r.get(0)).map_err(sql_error)?.collect::<Result<_, _>>().map_err(sql_error)?;
    let mut best: Option<Vec<String>> = None;
    for index in indexes {
        let mut stmt = conn.prepare("SELECT cid, name FROM pragma_index_info(?1) ORDER BY seqno").map_err(sql_error)?;
        let parts: Vec<(i64, Option<String>)> = stmt
            .query_map([&index], |r| Ok((r.get(0)?, r.get(1)?)))
            .map_err(sql_error)?
            .collect::<Result<_, _>>()
            .map_err(sql_error)?;
        // An expression (cid -2) or the rowid (cid -1) is not a column rows can be matched on.
        let Some(names) = parts.into_iter().map(|(cid, name)| name.filter(|_| cid >= 0)).collect::<Option<Vec<_>>>()
        else {
            continue;
        };
        if best.as_ref().is_none_or(|b| names.len() < b.len()) {
            best = Some(names);
        }
    }
    Ok(Some(best.unwrap_or_default()))
}

fn existing_columns(conn: &Connection, table: &str) -> Result<Vec<String>> {
    let mut stmt = conn.prepare("SELECT name FROM pragma_table_info(?1)").map_err(sql_error)?;
    let rows = stmt.query_map([table], |r| r.get::<_, String>(0)).map_err(sql_error)?;
    rows.map(|r| r.map_err(sql_error)).collect()
}

fn insert(conn: &Connection, table: &str, columns: &[String], batches: &[RecordBatch]) -> Result<()> {
    let marks = vec!["?"; columns.len()].join(", ");
    let mut stmt = conn
        .prepare_cached(&format!("INSERT INTO {table} ({}) VALUES ({marks})", D.list(columns)))
        .map_err(sql_error)?;
    for batch in batches {
        Literals::new(batch, D)?.for_each_row(|row, cells| {
            let values: Vec<Value> = cells
                .iter()
                .map(|(array, format)| {
                    if array.is_null(row) {
                        return Value::Null;
                    }
                    match array.data_type() {
                        DataType::Boolean => Value::Integer(array.as_boolean().value(row) as i64),
                        DataType::Int8
                        | DataType::Int16
                        | DataType::Int32
                        | DataType::UInt8
                        | DataType::UInt16
                        | DataType::UInt32 => {
                            let wide = arrow::compute::cast(&array.slice(row, 1), &DataType::Int64);
                            wide.map(|w| Value::Integer(w.as_primitive::<Int64Type>().value(0))).unwrap_or(Value::Null)
                        }
                        DataType::Int64 => Value::Integer(array.as_primitive::<Int64Type>().value(row)),
                        DataType::Float16 | DataType::Float32 | DataType::Float64 => {
                            format.value(row).to_string().parse::<f64>().map(Value::Real).unwrap_or(Value::Null)
                        }
                        DataType::Binary
                        | DataType::LargeBinary
                        | DataType::BinaryView
                        | DataType::FixedSizeBinary(_) => Value::Blob(binary(array, row)),
                        _ => Value::Text(format.value(row).to_string()),
                    }
                })
                .collect();
            stmt.execute(rusqlite::params_from_iter(values)).map(|_| ()).map_err(sql_error)
        })?;
    }
    Ok(())
}

fn sql_error(e: rusqlite::Error) -> Error {
    let busy = matches!(&e, rusqlite::Error::SqliteFailure(f, _) if f.code == rusqlite::ErrorCode::DatabaseBusy);
    Error::new(if busy { ErrorKind::Transient } else { ErrorKind::Fatal }, format!("SQLite: {e}"))
}
