//! A Postgres table as a reverse ETL destination. Every run is one transaction: rows are loaded
//! with `COPY`, into a staging table for upserts and deletes, and replace truncates and reloads
//! inside the same transaction, so readers see the old rows or the new ones, never a mix.

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::SinkExt;
use serde::{Deserialize, Serialize};
use sluice_core::{Delivery, Destination, Error, ErrorKind, Result, Secret, Stamp, SyncMode};
use tokio_postgres::Transaction;

use super::config::{Endpoint, SslMode, cause, connect, validate_tls};
use crate::sql_table::{Dialect, Literals, column_names};

/// A table in a Postgres database.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PostgresTableConfig {
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
    /// `disable`, `prefer`, `require`, `verify-ca` or `verify-full` (libpq's meanings).
    #[serde(default)]
    pub sslmode: SslMode,
    /// The CA certificate (PEM) for `verify-ca` and `verify-full`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sslrootcert: Option<std::path::PathBuf>,
    /// Schema of the table.
    #[serde(default = "default_schema")]
    pub schema: String,
    /// The table; created when missing. A stream leaves it out: its `table` names the table.
    #[serde(default)]
    pub table: String,
    /// A read-only connection cannot be a destination; turn this off to let syncs write.
    #[serde(default)]
    pub read_only: bool,
}

fn default_port() -> u16 {
    5432
}

fn default_schema() -> String {
    "public".into()
}

impl PostgresTableConfig {
    /// Check the fields; pure.
    pub fn validate(&self) -> Result<()> {
        if self.table.trim().is_empty() {
            return Err(Error::config("destination.table", "must not be empty"));
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
        if self.schema.trim().is_empty() {
            return Err(Error::config("destination.schema", "must not be empty"));
        }
        validate_tls("destination", self.sslmode, self.sslrootcert.as_deref())?;
        if self.read_only {
            return Err(Error::config(
                "destination.read_only",
                "the connection is read-only; set read_only: false to let a sync write to it",
            ));
        }
        Ok(())
    }

    async fn client(&self) -> Result<tokio_postgres::Client> {
        let password = self.password.as_ref().map(Secret::expose).unwrap_or_default();
        connect(Endpoint {
            host: &self.host,
            port: self.port,
            database: &self.database,
            user: &self.user,
            password,
            sslmode: self.sslmode,
            sslrootcert: self.sslrootcert.as_deref(),
        })
        .await
    }
}

/// Delivers into a Postgres table.
pub struct PostgresTarget {
    config: PostgresTableConfig,
}

impl PostgresTarget {
    /// A destination for `config` (connects on use).
    pub fn new(config: PostgresTableConfig) -> Self {
        Self { config }
    }
}

#[async_trait]
impl Destination for PostgresTarget {
    async fn check(&mut self) -> Result<()> {
        let client = self.config.client().await?;
        let row = client.query_one("SHOW transaction_read_only", &[]).await.map_err(sql_error)?;
        if row.get::<_, String>(0) == "on" {
            return Err(Error::new(
                ErrorKind::Config,
                "destination: the Postgres session is read-only (default_transaction_read_only is on, or the \
                 server is a standby); a sync needs a writable connection",
            ));
        }
        Ok(())
    }

    async fn deliver(&mut self, delivery: &Delivery) -> Result<()> {
        self.write(std::slice::from_ref(delivery), None).await
    }

    async fn write(&mut self, deliveries: &[Delivery], stamp: Option<&Stamp>) -> Result<()> {
        let mut client = self.config.client().await?;
        let tx = client.transaction().await.map_err(sql_error)?;
        for delivery in deliveries {
            apply(&tx, &self.config.schema, delivery.table.as_deref().unwrap_or(&self.config.table), delivery).await?;
        }
        if let Some(stamp) = stamp {
            let positions = self.positions();
            tx.batch_execute(&format!(
                "CREATE TABLE IF NOT EXISTS {positions} (owner text PRIMARY KEY, checkpoint text NOT NULL, \
                 written_at timestamptz NOT NULL DEFAULT now())"
            ))
            .await
            .map_err(sql_error)?;
            tx.execute(
                &format!(
                    "INSERT INTO {positions} (owner, checkpoint) VALUES ($1, $2) ON CONFLICT (owner) \
                     DO UPDATE SET checkpoint = excluded.checkpoint, written_at = now()"
                ),
                &[&stamp.owner, &stamp.checkpoint],
            )
            .await
            .map_err(sql_error)?;
        }
        tx.commit().await.map_err(sql_error)
    }

    async fn keys(&mut self, table: &str) -> Result<Option<Vec<String>>> {
        let client = self.config.client().await?;
        let name = format!("{}.{}", Dialect::Postgres.quote(&self.config.schema), Dialect::Postgres.quote(table));
        let exists: bool =
            client.query_one("SELECT to_regclass($1) IS NOT NULL", &[&name]).await.map_err(sql_error)?.get(0);
        if !exists {
            return Ok(None);
        }
        let row = client
            .query_opt(
                "SELECT array_agg(a.attname::text ORDER BY k.ord) FROM pg_index i \
                 CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) \
                 JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum \
                 WHERE i.indrelid = to_regclass($1) \
                   AND (i.indisprimary OR (i.indisunique AND i.indpred IS NULL AND i.indexprs IS NULL)) \
                 GROUP BY i.indexrelid, i.indisprimary ORDER BY i.indisprimary DESC, count(*), i.indexrelid LIMIT 1",
                &[&name],
            )
            .await
            .map_err(sql_error)?;
        Ok(Some(row.map(|r| r.get::<_, Vec<String>>(0)).unwrap_or_default()))
    }

    async fn stamp(&mut self, owner: &str) -> Result<Option<String>> {
        let client = self.config.client().await?;
        let exists: bool = client
            .query_one("SELECT to_regclass($1) IS NOT NULL", &[&self.positions()])
            .await
            .map_err(sql_error)?
            .get(0);
        if !exists {
            return Ok(None);
        }
        let row = client
            .query_opt(&format!("SELECT checkpoint FROM {} WHERE owner = $1", self.positions()), &[&owner])
            .await
            .map_err(sql_error)?;
        Ok(row.map(|r| r.get(0)))
    }
}

/// The table in the destination's schema where streams keep their positions.
const POSITIONS: &str = "sluice_positions";

impl PostgresTarget {
    fn positions(&self) -> String {
        format!("{}.{}", Dialect::Postgres.quote(&self.config.schema), Dialect::Postgres.quote(POSITIONS))
    }
}

/// Apply one delivery to `schema.name` inside `tx`: the table is created, or given the columns
/// it lacks, first.
async fn apply(tx: &Transaction<'_>, schema: &str, name: &str, delivery: &Delivery) -> Result<()> {
    let table = format!("{}.{}", Dialect::Postgres.quote(schema), Dialect::Postgres.quote(name));
    let keys: &[String] = if delivery.mode.keyed() { &delivery.keys } else { &[] };
    let existing = existing_columns(tx, schema, name).await?;
    let created = existing.is_empty();
    if created {
        tx.batch_execute(&Dialect::Postgres.create_table(&table, &delivery.schema, keys, false))
            .await
            .map_err(sql_error)?;
    } else {
        for field in delivery.schema.fields().iter().filter(|f| !existing.contains(f.name())) {
            tx.batch_execute(&Dialect::Postgres.add_column(&table, field)).await.map_err(sql_error)?;
        }
    }
    let columns = column_names(&delivery.schema);
    match delivery.mode {
        SyncMode::Replace => {
            if !created {
                tx.batch_execute(&format!("TRUNCATE {table}")).await.map_err(sql_error)?;
            }
            copy(tx, &table, &columns, &delivery.rows).await?;
        }
        SyncMode::Append => copy(tx, &table, &columns, &delivery.rows).await?,
        SyncMode::Upsert | SyncMode::Mirror => {
            if created {
                // A table made by this run is empty: every row is an insert.
                copy(tx, &table, &columns, &delivery.rows).await?;
            } else if delivery.row_count() > 0 {
                let list = Dialect::Postgres.list(&columns);
                tx.batch_execute(&format!(
                    "CREATE TEMP TABLE sluice_stage ON COMMIT DROP AS SELECT {list} FROM {table} WITH NO DATA"
                ))
                .await
                .map_err(sql_error)?;
                copy(tx, "sluice_stage", &columns, &delivery.rows).await?;
                if let Some(update) = Dialect::Postgres.update_from(&table, "sluice_stage", &columns, keys) {
                    tx.batch_execute(&update).await.map_err(sql_error)?;
                }
                let insert = Dialect::Postgres.insert_missing(&table, "sluice_stage", &columns, keys);
                tx.batch_execute(&insert).await.map_err(sql_error)?;
            }
            if delivery.delete_count() > 0 && !created {
                let list = Dialect::Postgres.list(keys);
                tx.batch_execute(&format!(
                    "CREATE TEMP TABLE sluice_gone ON COMMIT DROP AS SELECT {list} FROM {table} WITH NO DATA"
                ))
                .await
                .map_err(sql_error)?;
                copy(tx, "sluice_gone", keys, &delivery.deletes).await?;
                tx.batch_execute(&Dialect::Postgres.delete_matching(&table, "sluice_gone", keys))
                    .await
                    .map_err(sql_error)?;
            }
        }
    }
    Ok(())
}

/// The table's columns; empty when it does not exist.
async fn existing_columns(tx: &Transaction<'_>, schema: &str, table: &str) -> Result<Vec<String>> {
    let rows = tx
        .query(
            "SELECT column_name::text FROM information_schema.columns WHERE table_schema = $1 AND table_name = $2",
            &[&schema, &table],
        )
        .await
        .map_err(sql_error)?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// `COPY` batches into `table`, a few megabytes per message. A blocking thread renders the
/// text while the previous chunk travels, so rendering and Postgres's own parsing overlap.
async fn copy(
    tx: &Transaction<'_>,
    table: &str,
    columns: &[String],
    batches: &[arrow::record_batch::RecordBatch],
) -> Result<()> {
    const CHUNK: usize = 4 << 20;
    let statement = format!("COPY {table} ({}) FROM STDIN", Dialect::Postgres.list(columns));
    let sink = tx.copy_in::<_, Bytes>(&statement).await.map_err(sql_error)?;
    futures_util::pin_mut!(sink);
    let (chunks, mut rendered) = tokio::sync::mpsc::channel::<Result<Bytes>>(2);
    let batches = batches.to_vec();
    let renderer = tokio::task::spawn_blocking(move || {
        let mut text = String::with_capacity(CHUNK + (CHUNK >> 2));
        for batch in &batches {
            // Slices keep one chunk near CHUNK bytes whatever the batch size.
            let mut start = 0;
            while start < batch.num_rows() {
                let len = (batch.num_rows() - start).min(8_192);
                if let Err(e) =
                    Literals::new(&batch.slice(start, len), Dialect::Postgres).and_then(|l| l.write_copy(&mut text))
                {
                    let _ = chunks.blocking_send(Err(e));
                    return;
                }
                start += len;
                if text.len() >= CHUNK && chunks.blocking_send(Ok(Bytes::from(std::mem::take(&mut text)))).is_err() {
                    return;
                }
            }
        }
        if !text.is_empty() {
            let _ = chunks.blocking_send(Ok(Bytes::from(text)));
        }
    });
    while let Some(chunk) = rendered.recv().await {
        sink.send(chunk?).await.map_err(sql_error)?;
    }
    renderer.await.map_err(|e| Error::new(ErrorKind::Fatal, "COPY rendering panicked").with_source(e))?;
    sink.finish().await.map_err(sql_error)?;
    Ok(())
}

fn sql_error(e: tokio_postgres::Error) -> Error {
    let kind = if e.is_closed() || e.as_db_error().is_none() { ErrorKind::Connect } else { ErrorKind::Fatal };
    Error::new(kind, format!("Postgres: {}", cause(&e)))
}
