//! A Postgres table as a reverse ETL destination. Every run is one transaction: rows are loaded
//! with `COPY` (binary where the column types allow), into a staging table for upserts (one
//! `INSERT … ON CONFLICT` when a unique index covers the keys) and deletes, and replace
//! truncates and reloads inside the same transaction, so readers see the old rows or the new
//! ones, never a mix. A stream's writes share one session, kept until an error.

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::SinkExt;
use serde::{Deserialize, Serialize};
use sluice_core::{CopyPhase, Delivery, Destination, Error, ErrorKind, Result, Secret, Stamp, SyncMode};
use tokio_postgres::Transaction;

use super::config::{Endpoint, SslMode, cause, connect, validate_tls};
use crate::sql_table::copy_binary::{self, BinaryRows};
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
    /// The session, kept from one write to the next (a stream writes every batch through one
    /// target); dropped after any error, so the next use starts on a new one.
    session: Option<tokio_postgres::Client>,
}

impl PostgresTarget {
    /// A destination for `config` (connects on use).
    pub fn new(config: PostgresTableConfig) -> Self {
        Self { config, session: None }
    }
}

/// The kept session, or a new one when there is none or the server closed it.
async fn open<'a>(
    config: &PostgresTableConfig,
    slot: &'a mut Option<tokio_postgres::Client>,
) -> Result<&'a mut tokio_postgres::Client> {
    if slot.as_ref().is_some_and(tokio_postgres::Client::is_closed) {
        *slot = None;
    }
    if slot.is_none() {
        *slot = Some(config.client().await?);
    }
    Ok(slot.as_mut().expect("a session was just opened"))
}

#[async_trait]
impl Destination for PostgresTarget {
    async fn check(&mut self) -> Result<()> {
        let result = self.check_session().await;
        self.forget_on_error(result)
    }

    async fn deliver(&mut self, delivery: &Delivery) -> Result<()> {
        self.write(std::slice::from_ref(delivery), None).await
    }

    async fn write(&mut self, deliveries: &[Delivery], stamp: Option<&Stamp>) -> Result<()> {
        let result = self.write_in_one(deliveries, stamp).await;
        self.forget_on_error(result)
    }

    async fn keys(&mut self, table: &str) -> Result<Option<Vec<String>>> {
        let result = self.key_columns(table).await;
        self.forget_on_error(result)
    }

    async fn stamp(&mut self, owner: &str) -> Result<Option<String>> {
        let result = self.read_stamp(owner).await;
        self.forget_on_error(result)
    }

    async fn table_schema(&mut self, table: &str) -> Result<Option<sluice_core::schema::TableSchema>> {
        let schema = self.config.schema.clone();
        let result = match open(&self.config, &mut self.session).await {
            Ok(client) => super::types::table_columns(client, &schema, table).await.map_err(sql_error),
            Err(e) => Err(e),
        };
        Ok(self.forget_on_error(result)?.map(sluice_core::schema::TableSchema::existing))
    }
}

/// The table in the destination's schema where streams keep their positions.
const POSITIONS: &str = "sluice_positions";

impl PostgresTarget {
    fn positions(&self) -> String {
        format!("{}.{}", Dialect::Postgres.quote(&self.config.schema), Dialect::Postgres.quote(POSITIONS))
    }

    /// After an error the session may be in any state: the next use opens a new one.
    fn forget_on_error<T>(&mut self, result: Result<T>) -> Result<T> {
        if result.is_err() {
            self.session = None;
        }
        result
    }

    async fn check_session(&mut self) -> Result<()> {
        let client = open(&self.config, &mut self.session).await?;
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

    async fn write_in_one(&mut self, deliveries: &[Delivery], stamp: Option<&Stamp>) -> Result<()> {
        let positions = self.positions();
        let client = open(&self.config, &mut self.session).await?;
        let tx = client.transaction().await.map_err(sql_error)?;
        for delivery in deliveries {
            apply(&tx, &self.config.schema, delivery.table.as_deref().unwrap_or(&self.config.table), delivery).await?;
        }
        if let Some(stamp) = stamp {
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

    async fn key_columns(&mut self, table: &str) -> Result<Option<Vec<String>>> {
        let name = format!("{}.{}", Dialect::Postgres.quote(&self.config.schema), Dialect::Postgres.quote(table));
        let client = open(&self.config, &mut self.session).await?;
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

    async fn read_stamp(&mut self, owner: &str) -> Result<Option<String>> {
        let positions = self.positions();
        let client = open(&self.config, &mut self.session).await?;
        let exists: bool =
            client.query_one("SELECT to_regclass($1) IS NOT NULL", &[&positions]).await.map_err(sql_error)?.get(0);
        if !exists {
            return Ok(None);
        }
        let row = client
            .query_opt(&format!("SELECT checkpoint FROM {positions} WHERE owner = $1"), &[&owner])
            .await
            .map_err(sql_error)?;
        Ok(row.map(|r| r.get(0)))
    }
}

/// Apply one delivery to `schema.name` inside `tx`: the table is created, or given the columns
/// it lacks, first.
async fn apply(tx: &Transaction<'_>, schema: &str, name: &str, delivery: &Delivery) -> Result<()> {
    let table = format!("{}.{}", Dialect::Postgres.quote(schema), Dialect::Postgres.quote(name));
    let keys: &[String] = if delivery.mode.keyed() { &delivery.keys } else { &[] };
    let mut existing = existing_columns(tx, schema, name).await?;
    let created = existing.is_empty();
    let mut altered = false;
    // A snapshot copy loads its rows before the table gets its key, as pg_dump does: one index
    // build at the end is cheaper than keeping the index up row by row. The table's comment
    // marks the key as owed, so a restart in the middle of the copy still adds it.
    let defer_key = created && delivery.copy.is_some() && !delivery.keys.is_empty();
    if created {
        // A stream's snapshot brings its source key in replace and append too.
        let key: &[String] = if defer_key { &[] } else { &delivery.keys };
        tx.batch_execute(&Dialect::Postgres.create_table(&table, &delivery.schema, key, false))
            .await
            .map_err(sql_error)?;
        if defer_key {
            tx.batch_execute(&format!("COMMENT ON TABLE {table} IS '{KEY_OWED}'")).await.map_err(sql_error)?;
        }
    } else {
        for field in delivery.schema.fields().iter().filter(|f| !existing.iter().any(|(c, _)| c == f.name())) {
            tx.batch_execute(&Dialect::Postgres.add_column(&table, field)).await.map_err(sql_error)?;
            altered = true;
        }
        // A column of integers that now gets fractions (the decoder widened it) becomes
        // double precision, as in the workspace.
        for field in delivery.schema.fields().iter().filter(|f| f.data_type() == &arrow::datatypes::DataType::Float64) {
            if existing.iter().any(|(c, oid)| c == field.name() && INTEGERS.contains(oid)) {
                let column = Dialect::Postgres.quote(field.name());
                tx.batch_execute(&format!(
                    "ALTER TABLE {table} ALTER COLUMN {column} TYPE double precision USING {column}::double precision"
                ))
                .await
                .map_err(sql_error)?;
                altered = true;
            }
        }
    }
    if created || altered {
        existing = existing_columns(tx, schema, name).await?;
    }
    let types = |names: &[String]| -> Vec<Option<u32>> {
        names.iter().map(|n| existing.iter().find(|(c, _)| c == n).map(|(_, oid)| *oid)).collect()
    };
    let columns = column_names(&delivery.schema);
    let column_types = types(&columns);
    match delivery.mode {
        SyncMode::Replace => {
            if !created {
                tx.batch_execute(&format!("TRUNCATE {table}")).await.map_err(sql_error)?;
            }
            copy(tx, &table, &columns, &column_types, &delivery.rows).await?;
        }
        SyncMode::Append => copy(tx, &table, &columns, &column_types, &delivery.rows).await?,
        SyncMode::Upsert | SyncMode::Mirror => {
            if created {
                // A table made by this run is empty: every row is an insert.
                copy(tx, &table, &columns, &column_types, &delivery.rows).await?;
            } else if delivery.row_count() > 0 {
                let list = Dialect::Postgres.list(&columns);
                // Dropped first: an earlier delivery of this transaction (another table) made one.
                tx.batch_execute(&format!(
                    "DROP TABLE IF EXISTS pg_temp.sluice_stage; \
                     CREATE TEMP TABLE sluice_stage ON COMMIT DROP AS SELECT {list} FROM {table} WITH NO DATA"
                ))
                .await
                .map_err(sql_error)?;
                copy(tx, "sluice_stage", &columns, &column_types, &delivery.rows).await?;
                if unique_on(tx, schema, name, keys).await? {
                    // One statement, an index probe per row, instead of a join for the updates
                    // and another for the inserts.
                    tx.batch_execute(&Dialect::Postgres.upsert_on_conflict(&table, "sluice_stage", &columns, keys))
                        .await
                        .map_err(sql_error)?;
                } else {
                    if let Some(update) = Dialect::Postgres.update_from(&table, "sluice_stage", &columns, keys) {
                        tx.batch_execute(&update).await.map_err(sql_error)?;
                    }
                    let insert = Dialect::Postgres.insert_missing(&table, "sluice_stage", &columns, keys);
                    tx.batch_execute(&insert).await.map_err(sql_error)?;
                }
            }
            if delivery.delete_count() > 0 && !created {
                let list = Dialect::Postgres.list(keys);
                tx.batch_execute(&format!(
                    "DROP TABLE IF EXISTS pg_temp.sluice_gone; \
                     CREATE TEMP TABLE sluice_gone ON COMMIT DROP AS SELECT {list} FROM {table} WITH NO DATA"
                ))
                .await
                .map_err(sql_error)?;
                copy(tx, "sluice_gone", keys, &types(keys), &delivery.deletes).await?;
                tx.batch_execute(&Dialect::Postgres.delete_matching(&table, "sluice_gone", keys))
                    .await
                    .map_err(sql_error)?;
            }
        }
    }
    if delivery.copy == Some(CopyPhase::Complete) && !delivery.keys.is_empty() {
        add_owed_key(tx, &table, &delivery.keys).await?;
    }
    Ok(())
}

/// The comment a table carries while its snapshot copy loads without the key.
const KEY_OWED: &str = "sluice: the primary key is added when the snapshot copy completes";

/// Give the table the key its copy was loaded without, when the comment says it is owed (a
/// table the user made keeps what it has).
async fn add_owed_key(tx: &Transaction<'_>, table: &str, keys: &[String]) -> Result<()> {
    let owed: bool = tx
        .query_one("SELECT obj_description(to_regclass($1), 'pg_class') IS NOT DISTINCT FROM $2", &[&table, &KEY_OWED])
        .await
        .map_err(sql_error)?
        .get(0);
    if !owed {
        return Ok(());
    }
    let list = Dialect::Postgres.list(keys);
    tx.batch_execute(&format!("ALTER TABLE {table} ADD PRIMARY KEY ({list}); COMMENT ON TABLE {table} IS NULL"))
        .await
        .map_err(sql_error)
}

/// The table's columns with their type OIDs; empty when it does not exist. The same columns
/// `information_schema.columns` lists (tables, views, foreign and partitioned tables, where
/// the user holds a privilege), read from the catalog directly, which is much cheaper.
/// `int2`, `int4` and `int8`.
const INTEGERS: [u32; 3] = [21, 23, 20];

async fn existing_columns(tx: &Transaction<'_>, schema: &str, table: &str) -> Result<Vec<(String, u32)>> {
    let rows = tx
        .query(
            "SELECT a.attname::text, a.atttypid FROM pg_catalog.pg_attribute a \
             JOIN pg_catalog.pg_class c ON c.oid = a.attrelid \
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relname = $2 AND c.relkind IN ('r', 'v', 'f', 'p') \
               AND a.attnum > 0 AND NOT a.attisdropped \
               AND (pg_catalog.pg_has_role(c.relowner, 'USAGE') \
                    OR pg_catalog.has_column_privilege(c.oid, a.attnum, 'SELECT, INSERT, UPDATE, REFERENCES'))",
            &[&schema, &table],
        )
        .await
        .map_err(sql_error)?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// Whether the table has a unique index whose columns are exactly `keys` (immediate, valid,
/// without predicate or expressions): then `INSERT … ON CONFLICT (keys)` can upsert.
async fn unique_on(tx: &Transaction<'_>, schema: &str, table: &str, keys: &[String]) -> Result<bool> {
    if keys.is_empty() {
        return Ok(false);
    }
    let mut sorted = keys.to_vec();
    sorted.sort();
    let row = tx
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_index i \
             JOIN pg_catalog.pg_class c ON c.oid = i.indrelid \
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relname = $2 AND i.indisunique AND i.indimmediate AND i.indisvalid \
               AND i.indpred IS NULL AND i.indexprs IS NULL AND i.indnatts = cardinality($3::text[]) \
               AND ARRAY(SELECT a.attname::text COLLATE \"C\" FROM pg_catalog.pg_attribute a \
                         WHERE a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey) ORDER BY 1) = $3::text[])",
            &[&schema, &table, &sorted],
        )
        .await
        .map_err(sql_error)?;
    Ok(row.get(0))
}

/// `COPY` batches into `table`, in messages of about half a megabyte. A blocking thread
/// renders the rows while the previous message travels, so rendering and Postgres's own work
/// overlap. Binary rows where every column's type (`types`, the OIDs of `columns`) takes the
/// Arrow values as they are, else text.
async fn copy(
    tx: &Transaction<'_>,
    table: &str,
    columns: &[String],
    types: &[Option<u32>],
    batches: &[arrow::record_batch::RecordBatch],
) -> Result<()> {
    const CHUNK: usize = 512 << 10;
    const SLICE: usize = 4_096;
    let binary = batches.first().and_then(|first| {
        let schema = first.schema();
        let same = batches.iter().all(|b| {
            b.schema().fields().iter().map(|f| f.data_type()).eq(schema.fields().iter().map(|f| f.data_type()))
        });
        if same { BinaryRows::new(&schema, types, batches) } else { None }
    });
    let list = Dialect::Postgres.list(columns);
    let statement = match binary {
        Some(_) => format!("COPY {table} ({list}) FROM STDIN (FORMAT binary)"),
        None => format!("COPY {table} ({list}) FROM STDIN"),
    };
    let sink = tx.copy_in::<_, Bytes>(&statement).await.map_err(sql_error)?;
    futures_util::pin_mut!(sink);
    let (chunks, mut rendered) = tokio::sync::mpsc::channel::<Result<Bytes>>(2);
    let batches = batches.to_vec();
    let renderer = tokio::task::spawn_blocking(move || {
        // Slices keep one message near CHUNK bytes whatever the batch size.
        let slices = batches.iter().flat_map(|batch| {
            (0..batch.num_rows()).step_by(SLICE).map(|start| batch.slice(start, SLICE.min(batch.num_rows() - start)))
        });
        match binary {
            Some(rows) => {
                let mut out = Vec::with_capacity(CHUNK + (CHUNK >> 2));
                out.extend_from_slice(copy_binary::HEADER);
                for slice in slices {
                    if let Err(e) = rows.write(&slice, &mut out) {
                        let _ = chunks.blocking_send(Err(e));
                        return;
                    }
                    if out.len() >= CHUNK {
                        let full = std::mem::replace(&mut out, Vec::with_capacity(CHUNK + (CHUNK >> 2)));
                        if chunks.blocking_send(Ok(Bytes::from(full))).is_err() {
                            return;
                        }
                    }
                }
                out.extend_from_slice(copy_binary::TRAILER);
                let _ = chunks.blocking_send(Ok(Bytes::from(out)));
            }
            None => {
                let mut text = String::with_capacity(CHUNK + (CHUNK >> 2));
                for slice in slices {
                    if let Err(e) = Literals::new(&slice, Dialect::Postgres).and_then(|l| l.write_copy(&mut text)) {
                        let _ = chunks.blocking_send(Err(e));
                        return;
                    }
                    if text.len() >= CHUNK {
                        let full = std::mem::replace(&mut text, String::with_capacity(CHUNK + (CHUNK >> 2)));
                        if chunks.blocking_send(Ok(Bytes::from(full))).is_err() {
                            return;
                        }
                    }
                }
                if !text.is_empty() {
                    let _ = chunks.blocking_send(Ok(Bytes::from(text)));
                }
            }
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
