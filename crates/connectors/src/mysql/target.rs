//! A MySQL or MariaDB table as a reverse ETL destination. Rows go in as multi-row `INSERT`s of
//! a few megabytes. Every run is one InnoDB transaction: upserts and deletes go through a
//! temporary staging table, and replace deletes and reloads.

use async_trait::async_trait;
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, OptsBuilder};
use serde::{Deserialize, Serialize};
use sluice_core::transform::CustomSql;
use sluice_core::{Delivery, Destination, Error, ErrorKind, Result, Secret, Stamp, SyncMode};

use super::columns::Existing;
use crate::sql_table::{Dialect, Literals, column_names};

const D: Dialect = Dialect::MySql;
/// Bytes of SQL text per INSERT (MariaDB's default max_allowed_packet is 16 MB).
const STATEMENT_BYTES: usize = 4 << 20;

/// A table in a MySQL or MariaDB database.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MysqlTableConfig {
    /// A named connection (`/api/connections`) that gives the fields left out here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection: Option<String>,
    /// Host name or address.
    pub host: String,
    /// Port.
    #[serde(default = "default_port")]
    pub port: u16,
    /// Database.
    pub database: String,
    /// User.
    pub user: String,
    /// Password; never serialized back.
    #[serde(default, skip_serializing)]
    pub password: Option<Secret>,
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

fn default_port() -> u16 {
    3306
}

impl MysqlTableConfig {
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
        if self.table.len() > 64 {
            return Err(Error::config("destination.table", "at most 64 characters (MySQL's limit)"));
        }
        if self.custom_sql.is_some() {
            return Err(Error::config("destination.custom_sql", "custom SQL is for streams"));
        }
        self.validate_connection()
    }

    /// Check every field but the table (a stream's destination takes the stream's); pure.
    pub fn validate_connection(&self) -> Result<()> {
        for (field, value) in [("host", &self.host), ("database", &self.database), ("user", &self.user)] {
            if value.trim().is_empty() {
                return Err(Error::config(&format!("destination.{field}"), "must not be empty"));
            }
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

    async fn connect(&self) -> Result<Conn> {
        let opts = OptsBuilder::default()
            .ip_or_hostname(self.host.clone())
            .tcp_port(self.port)
            .user(Some(self.user.clone()))
            .pass(self.password.as_ref().map(|p| p.expose().to_string()))
            .db_name(Some(self.database.clone()));
        let mut conn = Conn::new(opts).await.map_err(|e| {
            Error::new(ErrorKind::Connect, format!("MySQL: cannot connect to {}:{}: {e}", self.host, self.port))
        })?;
        conn.query_drop("SET NAMES utf8mb4, time_zone = '+00:00', sql_mode = CONCAT(@@sql_mode, ',STRICT_ALL_TABLES')")
            .await
            .map_err(sql_error)?;
        Ok(conn)
    }
}

/// Delivers into a MySQL or MariaDB table.
pub struct MysqlTarget {
    config: MysqlTableConfig,
    /// The last write failed: its COMMIT may have landed with its answer lost, so the next
    /// write of a stamp first reads the position the table holds.
    unsure: bool,
}

impl MysqlTarget {
    /// A destination for `config` (connects on use).
    pub fn new(config: MysqlTableConfig) -> Self {
        Self { config, unsure: false }
    }
}

#[async_trait]
impl Destination for MysqlTarget {
    async fn check(&mut self) -> Result<()> {
        let mut conn = self.config.connect().await?;
        let read_only: Option<(i64, i64)> =
            conn.query_first("SELECT @@global.read_only, @@session.tx_read_only").await.map_err(sql_error)?;
        let _ = conn.disconnect().await;
        if let Some((global, session)) = read_only
            && (global != 0 || session != 0)
        {
            return Err(Error::new(
                ErrorKind::Config,
                "destination: the MySQL server or session is read-only; a sync needs a writable connection",
            ));
        }
        Ok(())
    }

    async fn deliver(&mut self, delivery: &Delivery) -> Result<()> {
        self.write(std::slice::from_ref(delivery), None).await
    }

    async fn write(&mut self, deliveries: &[Delivery], stamp: Option<&Stamp>) -> Result<()> {
        let custom = self.config.custom_sql.as_deref().map(CustomSql::parse).transpose();
        let custom = custom.map_err(|e| Error::config("destination.custom_sql", e))?;
        if let Some(stamp) = stamp.filter(|_| self.unsure)
            && self.stamp(&stamp.owner).await?.as_deref() == Some(stamp.checkpoint.as_str())
        {
            // The failed try committed after all: writing it again would repeat its rows.
            self.unsure = false;
            return Ok(());
        }
        let mut conn = self.config.connect().await?;
        let result = write(&mut conn, &self.config.table, custom.as_ref(), deliveries, stamp, true).await;
        let _ = conn.disconnect().await;
        self.unsure = result.is_err();
        result
    }

    async fn probe(&mut self, deliveries: &[Delivery]) -> Option<Result<()>> {
        let custom = self.config.custom_sql.as_deref().map(CustomSql::parse).transpose();
        let custom = match custom.map_err(|e| Error::config("destination.custom_sql", e)) {
            Ok(custom) => custom,
            Err(e) => return Some(Err(e)),
        };
        let mut conn = match self.config.connect().await {
            Ok(conn) => conn,
            Err(e) => return Some(Err(e)),
        };
        let result = write(&mut conn, &self.config.table, custom.as_ref(), deliveries, None, false).await;
        let _ = conn.disconnect().await;
        Some(result)
    }

    async fn keys(&mut self, table: &str) -> Result<Option<Vec<String>>> {
        let mut conn = self.config.connect().await?;
        let found = async {
            if super::columns::existing(&mut conn, table).await?.is_empty() {
                return Ok(None);
            }
            let rows: Vec<(String, String)> = conn
                .exec(
                    "SELECT index_name, column_name FROM information_schema.statistics WHERE table_schema = DATABASE() \
                     AND table_name = ? AND non_unique = 0 ORDER BY index_name = 'PRIMARY' DESC, index_name, seq_in_index",
                    (table,),
                )
                .await
                .map_err(sql_error)?;
            let first = rows.first().map(|(index, _)| index.clone());
            Ok(Some(rows.into_iter().filter(|(index, _)| Some(index) == first.as_ref()).map(|(_, c)| c).collect()))
        }
        .await;
        let _ = conn.disconnect().await;
        found
    }

    async fn table_schema(&mut self, table: &str) -> Result<Option<sluice_core::TableSchema>> {
        let mut conn = self.config.connect().await?;
        let found = super::columns::existing(&mut conn, table).await;
        let _ = conn.disconnect().await;
        Ok(super::columns::decoder_columns(&found?).map(sluice_core::TableSchema::existing))
    }

    async fn stamp(&mut self, owner: &str) -> Result<Option<String>> {
        let mut conn = self.config.connect().await?;
        let found = async {
            let exists: Option<i64> = conn
                .exec_first(
                    "SELECT 1 FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?",
                    (POSITIONS,),
                )
                .await
                .map_err(sql_error)?;
            if exists.is_none() {
                return Ok(None);
            }
            conn.exec_first(format!("SELECT checkpoint FROM {} WHERE owner = ?", D.quote(POSITIONS)), (owner,))
                .await
                .map_err(sql_error)
        }
        .await;
        let _ = conn.disconnect().await;
        found
    }
}

/// The table where streams keep their positions, beside their tables.
const POSITIONS: &str = "sluice_positions";

/// Apply `deliveries` and `stamp` in one transaction, committed or (`commit` false: a probe)
/// rolled back. Table DDL commits implicitly in MySQL, so tables are created and given their new
/// columns first, outside it (each step idempotent).
async fn write(
    conn: &mut Conn,
    configured: &str,
    custom: Option<&CustomSql>,
    deliveries: &[Delivery],
    stamp: Option<&Stamp>,
    commit: bool,
) -> Result<()> {
    // Custom SQL writes the user's own tables: none is created.
    for delivery in deliveries.iter().filter(|_| custom.is_none()) {
        let name = delivery.table.as_deref().unwrap_or(configured);
        let existing = super::columns::existing(conn, name).await?;
        if existing.is_empty() {
            // A stream's snapshot brings its source key in replace and append too.
            // A table without a key (a multiset) may hold identical rows: no primary key.
            let key: &[String] = if delivery.multiset { &[] } else { &delivery.keys };
            conn.query_drop(D.create_table(&D.quote(name), &delivery.schema, key, true)).await.map_err(sql_error)?;
        } else {
            add_missing(conn, &D.quote(name), delivery, &existing).await?;
        }
    }
    if stamp.is_some() {
        conn.query_drop(format!(
            "CREATE TABLE IF NOT EXISTS {} (owner VARCHAR(255) PRIMARY KEY, checkpoint LONGTEXT NOT NULL, \
             written_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6))",
            D.quote(POSITIONS)
        ))
        .await
        .map_err(sql_error)?;
    }
    conn.query_drop("START TRANSACTION").await.map_err(sql_error)?;
    let applied = async {
        if let Some(custom) = custom {
            run_custom(conn, custom, deliveries).await?;
        }
        for delivery in deliveries.iter().filter(|_| custom.is_none()) {
            let name = delivery.table.as_deref().unwrap_or(configured);
            let table = D.quote(name);
            let keys: &[String] = if delivery.mode.keyed() { &delivery.keys } else { &[] };
            if delivery.multiset && delivery.mode == SyncMode::Mirror {
                apply_multiset(conn, name, keys, delivery).await?;
                continue;
            }
            apply(conn, &table, &column_names(&delivery.schema), keys, delivery).await?;
        }
        if let Some(stamp) = stamp {
            conn.exec_drop(
                format!(
                    "INSERT INTO {} (owner, checkpoint) VALUES (?, ?) ON DUPLICATE KEY UPDATE \
                     checkpoint = VALUES(checkpoint), written_at = CURRENT_TIMESTAMP(6)",
                    D.quote(POSITIONS)
                ),
                (&stamp.owner, &stamp.checkpoint),
            )
            .await
            .map_err(sql_error)?;
        }
        Ok::<(), Error>(())
    }
    .await;
    match applied {
        Ok(()) => conn.query_drop(if commit { "COMMIT" } else { "ROLLBACK" }).await.map_err(sql_error),
        Err(e) => {
            let _ = conn.query_drop("ROLLBACK").await;
            Err(e)
        }
    }
}

/// A stream's custom SQL blocks, run inside the open transaction.
async fn run_custom(conn: &mut Conn, custom: &CustomSql, deliveries: &[Delivery]) -> Result<()> {
    for run in crate::sql_table::custom::plan(custom, deliveries, D)? {
        let params = run.rows.iter().map(|row| {
            let values: Vec<mysql_async::Value> = row
                .iter()
                .map(|v| {
                    v.as_ref().map_or(mysql_async::Value::NULL, |t| mysql_async::Value::Bytes(t.clone().into_bytes()))
                })
                .collect();
            mysql_async::Params::Positional(values)
        });
        conn.exec_batch(run.sql.as_str(), params).await.map_err(|e| {
            let e = sql_error(e);
            Error::new(e.kind(), format!("custom SQL block `{}`: {e}", run.block.key))
        })?;
    }
    Ok(())
}

async fn apply(conn: &mut Conn, table: &str, columns: &[String], keys: &[String], delivery: &Delivery) -> Result<()> {
    match delivery.mode {
        SyncMode::Append => return insert(conn, table, columns, &delivery.rows).await,
        SyncMode::Replace => {
            // DELETE, not TRUNCATE (which commits at once): readers keep the old rows until
            // the new ones commit, and the table's triggers, grants and indexes stay.
            conn.query_drop(format!("DELETE FROM {table}")).await.map_err(sql_error)?;
            return insert(conn, table, columns, &delivery.rows).await;
        }
        SyncMode::Upsert | SyncMode::Mirror => {}
    }
    if delivery.row_count() > 0 {
        conn.query_drop(format!(
            "CREATE TEMPORARY TABLE sluice_stage AS SELECT {} FROM {table} WHERE 1 = 0",
            D.list(columns)
        ))
        .await
        .map_err(sql_error)?;
        insert(conn, "sluice_stage", columns, &delivery.rows).await?;
        if let Some(update) = D.update_from(table, "sluice_stage", columns, keys, &delivery.keep) {
            conn.query_drop(update).await.map_err(sql_error)?;
        }
        conn.query_drop(D.insert_missing(table, "sluice_stage", columns, keys)).await.map_err(sql_error)?;
        conn.query_drop("DROP TEMPORARY TABLE sluice_stage").await.map_err(sql_error)?;
    }
    if delivery.delete_count() > 0 {
        stage_gone(conn, table, keys, delivery).await?;
        conn.query_drop(D.delete_matching(table, "sluice_gone", keys)).await.map_err(sql_error)?;
        conn.query_drop("DROP TEMPORARY TABLE sluice_gone").await.map_err(sql_error)?;
    }
    Ok(())
}

/// A multiset's changes (a table without a key): each delete removes one matching row, then
/// the rows are appended.
async fn apply_multiset(conn: &mut Conn, name: &str, keys: &[String], delivery: &Delivery) -> Result<()> {
    let table = D.quote(name);
    if delivery.delete_count() > 0 {
        conn.query_drop("DROP TEMPORARY TABLE IF EXISTS sluice_gone").await.map_err(sql_error)?;
        stage_gone(conn, &table, keys, delivery).await?;
        let all: Vec<String> = super::columns::existing(conn, name).await?.into_iter().map(|c| c.name).collect();
        for sql in D.delete_counted(&table, "sluice_gone", keys, &all) {
            conn.query_drop(sql).await.map_err(sql_error)?;
        }
        conn.query_drop("DROP TEMPORARY TABLE sluice_gone, sluice_counts, sluice_matched").await.map_err(sql_error)?;
    }
    insert(conn, &table, &column_names(&delivery.schema), &delivery.rows).await
}

/// The key columns of the delivery's deletes in the temporary table `sluice_gone`.
async fn stage_gone(conn: &mut Conn, table: &str, keys: &[String], delivery: &Delivery) -> Result<()> {
    let sql = format!("CREATE TEMPORARY TABLE sluice_gone AS SELECT {} FROM {table} WHERE 1 = 0", D.list(keys));
    conn.query_drop(sql).await.map_err(sql_error)?;
    insert(conn, "sluice_gone", keys, &delivery.deletes).await
}

/// Give `table` the columns the delivery brings and it lacks, and widen to DOUBLE a column of
/// integers that now gets fractions (the decoder widened it), as in the workspace.
async fn add_missing(conn: &mut Conn, table: &str, delivery: &Delivery, existing: &[Existing]) -> Result<()> {
    for field in delivery.schema.fields() {
        match existing.iter().find(|c| &c.name == field.name()) {
            None => conn.query_drop(D.add_column(table, field)).await.map_err(sql_error)?,
            // Only a plain column: MODIFY rewrites the whole definition, and would drop NOT NULL,
            // a default, a comment or break a key. Other integer columns stay as they are, and
            // MySQL rounds the fractions it is given (noted in the README).
            Some(column)
                if column.is_integer() && column.plain && field.data_type() == &arrow::datatypes::DataType::Float64 =>
            {
                let sql = format!("ALTER TABLE {table} MODIFY COLUMN {} DOUBLE", D.quote(field.name()));
                conn.query_drop(sql).await.map_err(sql_error)?;
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// Multi-row INSERTs of about `STATEMENT_BYTES` each.
async fn insert(
    conn: &mut Conn,
    table: &str,
    columns: &[String],
    batches: &[arrow::record_batch::RecordBatch],
) -> Result<()> {
    let head = format!("INSERT INTO {table} ({}) VALUES ", D.list(columns));
    for batch in batches {
        let mut start = 0;
        // Slices of 2,000 rows keep each statement near the size limit without measuring rows.
        while start < batch.num_rows() {
            let len = (batch.num_rows() - start).min(2_000);
            let mut sql = String::with_capacity(STATEMENT_BYTES);
            sql.push_str(&head);
            Literals::new(&batch.slice(start, len), D)?.write_mysql_rows(&mut sql, true)?;
            conn.query_drop(sql).await.map_err(sql_error)?;
            start += len;
        }
    }
    Ok(())
}

pub(super) fn sql_error(e: mysql_async::Error) -> Error {
    let kind = match &e {
        mysql_async::Error::Io(_) | mysql_async::Error::Driver(_) => ErrorKind::Connect,
        _ => ErrorKind::Fatal,
    };
    Error::new(kind, format!("MySQL: {e}"))
}
