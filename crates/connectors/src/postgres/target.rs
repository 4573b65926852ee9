//! A Postgres table as a reverse ETL destination. Every run is one transaction: rows are loaded
//! with `COPY` (binary where the column types allow), into a staging table for upserts (one
//! `INSERT … ON CONFLICT` when a unique index covers the keys) and deletes, and replace
//! truncates and reloads inside the same transaction, so readers see the old rows or the new
//! ones, never a mix. A stream's writes share one session, kept until an error.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sluice_core::sink::Preceding;
use sluice_core::transform::CustomSql;
use sluice_core::{Delivery, Destination, Error, ErrorKind, Result, Secret, Stamp};

use super::apply::apply;
use super::config::{Endpoint, SslMode, cause, connect, validate_tls};
use crate::sql_table::Dialect;

/// A table in a Postgres database.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PostgresTableConfig {
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
    /// `disable`, `prefer`, `require`, `verify-ca` or `verify-full` (libpq's meanings).
    #[serde(default)]
    pub sslmode: SslMode,
    /// The CA certificate (PEM) for `verify-ca` and `verify-full`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sslrootcert: Option<std::path::PathBuf>,
    /// Schema of the table. A stream's may be a template of `[db]`, `[schema]`, `[table]` and
    /// `*` (the topic), as its `table` may: each source schema then lands in a schema of its
    /// own, created when missing.
    #[serde(default = "default_schema")]
    pub schema: String,
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
    5432
}

fn default_schema() -> String {
    "public".into()
}

impl PostgresTableConfig {
    /// Stamps, several tables at once and a second session for snapshot chunks, unless custom
    /// SQL writes instead (every change, one unit at a time).
    pub fn capabilities(&self) -> sluice_core::Capabilities {
        let plain = self.custom_sql.is_none();
        sluice_core::Capabilities {
            multi_table: plain,
            custom_sql: !plain,
            lanes: plain,
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
        if self.schema_is_template() {
            return Err(Error::config("destination.schema", "a template ([db], [schema], [table], *) is for streams"));
        }
        if self.custom_sql.is_some() {
            return Err(Error::config("destination.custom_sql", "custom SQL is for streams"));
        }
        self.validate_connection()
    }

    /// Whether `schema` is a template, rendered per record like a stream's `table`.
    pub fn schema_is_template(&self) -> bool {
        self.schema.contains(['[', '*'])
    }

    /// The table template a stream's decoder renders: with a templated schema, `schema.table`
    /// (split again at the first dot when written), else the stream's `table` as it is.
    pub fn table_template(&self, table: &str) -> String {
        if self.schema_is_template() { format!("{}.{table}", self.schema) } else { table.to_string() }
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
        if self.schema_is_template() && self.schema.contains('*') {
            return Err(Error::config(
                "destination.schema",
                "`*` (the topic) may hold dots, which end a rendered schema; use [db], [schema] or [table]",
            ));
        }
        validate_tls("destination", self.sslmode, self.sslrootcert.as_deref())?;
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
    /// Schemas this session made sure exist (a templated schema).
    schemas: std::collections::HashSet<String>,
    /// The last write failed: its COMMIT may have landed with its answer lost, so the next
    /// write of a stamp first reads the position the table holds.
    unsure: bool,
    /// A write is under way: if it is still set when the next begins, that write was stopped
    /// midway (its task aborted), and its session, in any state, is not used again.
    busy: bool,
}

impl PostgresTarget {
    /// A destination for `config` (connects on use).
    pub fn new(config: PostgresTableConfig) -> Self {
        Self { config, session: None, schemas: Default::default(), unsure: false, busy: false }
    }

    /// The schema and name of a delivery's table: split at the first dot when the schema is a
    /// template (the decoder rendered `schema.table`), else in the configured schema.
    fn locate(&self, table: &str) -> (String, String) {
        match table.split_once('.').filter(|_| self.config.schema_is_template()) {
            Some((schema, name)) => (schema.to_string(), name.to_string()),
            None => (self.config.schema.clone(), table.to_string()),
        }
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
        self.write_stamped(deliveries, stamp, None).await
    }

    /// The rows load on this session while the write before commits on another; the stamp is
    /// written, and the transaction committed, only once that one is durable. The commits stay
    /// in the stream's order, so a retry after a lost answer still finds its own stamp or the
    /// one before it.
    async fn write_after(&mut self, deliveries: &[Delivery], stamp: Option<&Stamp>, previous: Preceding) -> Result<()> {
        self.write_stamped(deliveries, stamp, Some(previous)).await
    }

    async fn probe(&mut self, deliveries: &[Delivery]) -> Option<Result<()>> {
        self.begin();
        let result = self.write_in_one(deliveries, None, false, None).await;
        self.busy = false;
        // Schemas it created are rolled back with it.
        self.schemas.clear();
        Some(self.forget_on_error(result))
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
        let (schema, table) = self.locate(table);
        let result = match open(&self.config, &mut self.session).await {
            Ok(client) => super::types::table_columns(client, &schema, &table).await.map_err(sql_error),
            Err(e) => Err(e),
        };
        Ok(self.forget_on_error(result)?.map(sluice_core::schema::TableSchema::existing))
    }
}

/// The table in the destination's schema where streams keep their positions.
const POSITIONS: &str = "sluice_positions";
/// The schema of the positions when the destination's schema is a template.
const POSITIONS_SCHEMA: &str = "sluice";

impl PostgresTarget {
    /// In the destination's schema, or in `sluice` (created when missing) when that is a
    /// template: since PostgreSQL 15 a role that is not the database's owner may not create
    /// tables in `public`.
    fn positions(&self) -> String {
        let schema = if self.config.schema_is_template() { POSITIONS_SCHEMA } else { &self.config.schema };
        format!("{}.{}", Dialect::Postgres.quote(schema), Dialect::Postgres.quote(POSITIONS))
    }

    /// A write begins: a session left by a write that was stopped midway is dropped.
    fn begin(&mut self) {
        if std::mem::replace(&mut self.busy, true) {
            self.session = None;
            self.schemas.clear();
            self.unsure = true;
        }
    }

    async fn write_stamped(
        &mut self,
        deliveries: &[Delivery],
        stamp: Option<&Stamp>,
        previous: Option<Preceding>,
    ) -> Result<()> {
        self.begin();
        if let Some(stamp) = stamp.filter(|_| self.unsure) {
            let held = self.read_stamp(&stamp.owner).await;
            if self.forget_on_error(held)?.as_deref() == Some(stamp.checkpoint.as_str()) {
                // The failed try committed after all: writing it again would repeat its rows.
                self.unsure = false;
                self.busy = false;
                return Ok(());
            }
        }
        let result = self.write_in_one(deliveries, stamp, true, previous.as_ref()).await;
        self.unsure = result.is_err();
        self.busy = false;
        self.forget_on_error(result)
    }

    /// After an error the session may be in any state: the next use opens a new one.
    fn forget_on_error<T>(&mut self, result: Result<T>) -> Result<T> {
        if result.is_err() {
            self.session = None;
            self.schemas.clear();
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

    /// Everything in one transaction, committed, or rolled back when `commit` is false (a probe).
    /// With `previous`, the stamp is written and the transaction committed only once it says
    /// the write before is durable.
    async fn write_in_one(
        &mut self,
        deliveries: &[Delivery],
        stamp: Option<&Stamp>,
        commit: bool,
        previous: Option<&Preceding>,
    ) -> Result<()> {
        let positions = self.positions();
        let places: Vec<(String, String)> =
            deliveries.iter().map(|d| self.locate(d.table.as_deref().unwrap_or(&self.config.table))).collect();
        let templated = self.config.schema_is_template();
        let custom = self
            .config
            .custom_sql
            .as_deref()
            .map(CustomSql::parse)
            .transpose()
            .map_err(|e| Error::config("destination.custom_sql", e))?;
        let client = open(&self.config, &mut self.session).await?;
        let tx = client.transaction().await.map_err(sql_error)?;
        if let Some(custom) = &custom {
            super::custom::run(&tx, custom, deliveries).await?;
        }
        for ((schema, name), delivery) in places.iter().zip(deliveries).filter(|_| custom.is_none()) {
            if templated && !self.schemas.contains(schema) {
                let sql = format!("CREATE SCHEMA IF NOT EXISTS {}", Dialect::Postgres.quote(schema));
                tx.batch_execute(&sql).await.map_err(sql_error)?;
                self.schemas.insert(schema.clone());
            }
            apply(&tx, schema, name, delivery).await?;
        }
        if let Some(previous) = previous {
            wait_for(&tx, previous).await?;
        }
        if let Some(stamp) = stamp {
            if templated {
                tx.batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS {POSITIONS_SCHEMA}"))
                    .await
                    .map_err(sql_error)?;
            }
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
        if commit { tx.commit().await.map_err(sql_error) } else { tx.rollback().await.map_err(sql_error) }
    }

    async fn key_columns(&mut self, table: &str) -> Result<Option<Vec<String>>> {
        let (schema, table) = self.locate(table);
        let name = format!("{}.{}", Dialect::Postgres.quote(&schema), Dialect::Postgres.quote(&table));
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

/// Wait, this transaction open, until the write before it is durable. That write may need a
/// lock this one holds (a table both create, a value of a unique index both insert), which
/// Postgres cannot see as a deadlock, as this session only waits in Sluice: so every half
/// second this one asks whether a session waits for it, and if one does it rolls back with a
/// retryable error, and is tried again, its rows loaded anew, behind that write.
async fn wait_for(tx: &tokio_postgres::Transaction<'_>, previous: &Preceding) -> Result<()> {
    // `pg_locks`, not `pg_stat_activity`, which a transaction reads once and keeps.
    const BLOCKING: &str =
        "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE NOT granted AND pg_backend_pid() = ANY(pg_blocking_pids(pid)))";
    loop {
        tokio::select! {
            durable = previous.durable() => return durable,
            () = tokio::time::sleep(std::time::Duration::from_millis(500)) => {
                if tx.query_one(BLOCKING, &[]).await.map_err(sql_error)?.get::<_, bool>(0) {
                    return Err(Error::new(
                        ErrorKind::Transient,
                        "Postgres: the write before this one waits for a lock this one holds; it is tried again after it",
                    ));
                }
            }
        }
    }
}

pub(super) fn sql_error(e: tokio_postgres::Error) -> Error {
    use tokio_postgres::error::SqlState;
    // A deadlock, a serialization failure or a lock not granted in time: the same write, tried
    // again, may well succeed (two lanes of a snapshot can meet so).
    let again = [SqlState::T_R_DEADLOCK_DETECTED, SqlState::T_R_SERIALIZATION_FAILURE, SqlState::LOCK_NOT_AVAILABLE];
    let kind = match e.code() {
        _ if e.is_closed() || e.as_db_error().is_none() => ErrorKind::Connect,
        Some(code) if again.contains(code) => ErrorKind::Transient,
        _ => ErrorKind::Fatal,
    };
    Error::new(kind, format!("Postgres: {}", cause(&e)))
}
