//! The embedded DuckDB workspace, in one database file: the default sink, the state store, the
//! rejects ledger, the registry of streams and syncs, the syncs' planner and read-only SQL.
//!
//! [`Workspace`] opens the file and hands out one value per role, each over the same shared
//! handle (`db::Db`) and each with its own small API: [`WorkspaceSink`] (`sink.rs`,
//! `mirror.rs`), [`WorkspaceState`] (`state.rs`, `replay.rs`), [`Registry`] (`registry.rs`,
//! `runs.rs`, `approvals.rs`, with `secrets.rs`), [`Accounts`] (`accounts.rs`: users and
//! tokens), [`SyncPlanner`] (`sync_plan.rs`) and [`Query`] (`query.rs`,
//! `access.rs`, `control.rs`).

mod access;
mod accounts;
mod approvals;
mod control;
mod db;
mod mirror;
mod mirror_last;
mod mirror_positions;
mod query;
mod registry;
mod replay;
mod runs;
mod schema_history;
mod secrets;
mod sink;
mod state;
mod sync_plan;

use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use duckdb::{AccessMode, Config, Connection};
use sluice_core::{Checkpoint, Error, ErrorKind, Result, Sink, StateStore, TableSchema, WriteUnit};

pub use accounts::{Accounts, StoredToken, StoredUser, UserChange};
pub use approvals::AWAITING_APPROVAL;
pub use db::quote;
pub use query::{Query, QueryError, QueryErrorKind, QueryLimits, QueryResult, query_connection};
pub use registry::{Registry, StoredConnection, StoredStream, StoredSync};
pub use replay::{LedgerEvent, ReplayRequest};
pub use runs::{RunRecord, RunSummary};
pub use schema_history::{SchemaEvent, SchemaHistory, changes_of as schema_changes_of};
pub use secrets::keyed_hash;
pub use sink::WorkspaceSink;
pub use state::{Resume, WorkspaceState};
pub use sync_plan::SyncPlanner;

use db::{Db, attach, clone_connection, db_error, open_error};

/// WAL size at which DuckDB checkpoints (see `Workspace::open`).
pub const WAL_CHECKPOINT: &str = "16MB";

/// Internal tables live in this schema; user tables in `main`.
pub const SCHEMA: &str = "sluice";

const BOOTSTRAP: &str = r#"
CREATE SCHEMA IF NOT EXISTS sluice;
CREATE TABLE IF NOT EXISTS sluice.streams (
    name VARCHAR NOT NULL, config JSON NOT NULL, key_hash VARCHAR NOT NULL,
    created_at TIMESTAMPTZ NOT NULL, updated_at TIMESTAMPTZ NOT NULL);
CREATE TABLE IF NOT EXISTS sluice.checkpoints (
    stream VARCHAR NOT NULL, position JSON, sequence BIGINT NOT NULL, totals JSON NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL);
CREATE TABLE IF NOT EXISTS sluice.rejects (
    stream VARCHAR NOT NULL, "table" VARCHAR NOT NULL, "column" VARCHAR, expected_type VARCHAR,
    value VARCHAR, position BIGINT, reason VARCHAR NOT NULL, source JSON,
    received_at TIMESTAMPTZ, recorded_at TIMESTAMPTZ NOT NULL);
ALTER TABLE sluice.rejects ADD COLUMN IF NOT EXISTS replayed_at TIMESTAMPTZ;
CREATE TABLE IF NOT EXISTS sluice.push_keys (
    stream VARCHAR NOT NULL, key VARCHAR NOT NULL, answer VARCHAR NOT NULL, stored_at TIMESTAMPTZ NOT NULL);
CREATE TABLE IF NOT EXISTS sluice.syncs (
    name VARCHAR NOT NULL, config JSON NOT NULL, created_at TIMESTAMPTZ NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL);
CREATE TABLE IF NOT EXISTS sluice.connections (
    name VARCHAR NOT NULL, config JSON NOT NULL, updated_at TIMESTAMPTZ NOT NULL);
CREATE TABLE IF NOT EXISTS sluice.sync_runs (
    id VARCHAR NOT NULL, sync VARCHAR NOT NULL, "trigger" VARCHAR NOT NULL, status VARCHAR NOT NULL,
    started_at TIMESTAMPTZ NOT NULL, finished_at TIMESTAMPTZ, duration_ms BIGINT,
    rows_sent BIGINT, inserted BIGINT, updated BIGINT, deleted BIGINT, detect_ms BIGINT, error VARCHAR);
"#;

/// DuckDB's memory limit unless `SLUICE_DUCKDB_MEMORY` says otherwise: the least that takes a
/// row of a 2,000-column table (the decoder's limit; 104MB does not), which keeps a server that
/// took 1M pushed events and then 50k events/s for 60 s under 250 MiB RSS (BENCHMARKS.md).
pub const DUCKDB_MEMORY: &str = "112MB";

/// An open workspace: the owner of the database that hands out its roles. Cheap to clone; all
/// clones share one database.
#[derive(Clone)]
pub struct Workspace {
    db: Db,
    sink: WorkspaceSink,
    state: WorkspaceState,
    registry: Registry,
    accounts: Accounts,
    planner: SyncPlanner,
    sql: Query,
    secrets: Arc<secrets::SecretFile>,
}

impl Workspace {
    /// Open (or create) the workspace in `dir`, as `dir/workspace.duckdb`.
    pub fn open(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| {
            Error::new(ErrorKind::Config, format!("cannot create data dir {}", dir.display())).with_source(e)
        })?;
        let path = dir.join("workspace.duckdb");
        let conn = attach(&path)?;
        conn.execute_batch(BOOTSTRAP).map_err(db_error)?;
        conn.execute_batch(accounts::BOOTSTRAP).map_err(db_error)?;
        conn.execute_batch(schema_history::BOOTSTRAP).map_err(db_error)?;
        // DuckDB checkpoints the WAL into the database file when it reaches this size, and a
        // checkpoint holds up commits for as long as it runs. Measured with `sluice bench`
        // (50k events/s for 60 s): with DuckDB's row groups, 64 MB stalled 280-460 ms (p99
        // 298 ms) and 16 MB no less (p99 430 ms); with row groups of 30,720 rows (`attach`),
        // 16 MB stalls 75-155 ms (p99 118 ms) and 8 MB checkpoints too often for the rate.
        let wal = std::env::var("SLUICE_WAL_CHECKPOINT").unwrap_or_else(|_| WAL_CHECKPOINT.to_string());
        conn.execute_batch(&format!("SET wal_autocheckpoint = '{}'", wal.replace('\'', "")))
            .map_err(|e| Error::new(ErrorKind::Config, format!("SLUICE_WAL_CHECKPOINT: {e}")))?;
        // DuckDB keeps pages it has read or written cached up to its memory limit, 80% of the
        // machine's RAM by default: a server taking pushes would grow towards that. The limit
        // bounds the cache and query work (beyond it DuckDB spills to its temp folder or fails
        // the statement with an out-of-memory error); `SLUICE_DUCKDB_MEMORY` changes it.
        let memory = std::env::var("SLUICE_DUCKDB_MEMORY").unwrap_or_else(|_| DUCKDB_MEMORY.to_string());
        conn.execute_batch(&format!("SET memory_limit = '{}'", memory.replace('\'', "")))
            .map_err(|e| Error::new(ErrorKind::Config, format!("SLUICE_DUCKDB_MEMORY: {e}")))?;
        // A checkpoint holds up commits while it compresses the new rows; `uncompressed` made
        // it about half as long (p99 push→queryable 141 ms at 50k events/s over 60 s, against
        // 348-437 ms), for tables about 8 times larger on disk. So it is a choice, not the default.
        if let Ok(compression) = std::env::var("SLUICE_DUCKDB_COMPRESSION") {
            conn.execute_batch(&format!("SET force_compression = '{}'", compression.replace('\'', "")))
                .map_err(|e| Error::new(ErrorKind::Config, format!("SLUICE_DUCKDB_COMPRESSION: {e}")))?;
        }
        // User SQL must not read files or attach databases: the workspace needs neither.
        conn.execute_batch("SET enable_external_access = false").map_err(db_error)?;
        let writer = clone_connection(&conn)?;
        let secrets = Arc::new(secrets::SecretFile::new(dir));
        let db = Db::new(path, conn);
        let sink = WorkspaceSink::start(writer, db.clone())?;
        Ok(Self {
            sink,
            state: WorkspaceState::new(db.clone()),
            registry: Registry::new(db.clone(), secrets.clone()),
            accounts: Accounts::new(db.clone()),
            planner: SyncPlanner::new(db.clone()),
            sql: Query::new(db.clone()),
            db,
            secrets,
        })
    }

    /// Open an existing workspace read-only (the CLI, when no server runs).
    pub fn open_read_only(dir: &Path) -> Result<Connection> {
        let path = dir.join("workspace.duckdb");
        if !path.exists() {
            return Err(Error::new(ErrorKind::Config, format!("no workspace at {}", path.display())));
        }
        let config = Config::default()
            .access_mode(AccessMode::ReadOnly)
            .and_then(|c| c.enable_external_access(false))
            .map_err(db_error)?;
        Connection::open_with_flags(&path, config).map_err(|e| open_error(&path, e))
    }

    /// Why the workspace cannot store now (the disk of the data folder is full), or `None`.
    pub fn storage_fault(&self) -> Option<String> {
        self.db.fault()
    }

    /// Watch [`Workspace::storage_fault`].
    pub fn watch_storage(&self) -> tokio::sync::watch::Receiver<Option<String>> {
        self.db.watch_fault()
    }

    /// While the disk is full, try every second or so (up to every 5 s) to reopen the
    /// workspace, through its writer, until it stores again; until `stop` completes.
    pub async fn recover_storage(self, stop: impl std::future::Future<Output = ()>) {
        let mut fault = self.db.watch_fault();
        tokio::pin!(stop);
        loop {
            tokio::select! {
                () = &mut stop => return,
                changed = fault.wait_for(Option::is_some) => if changed.is_err() { return },
            }
            let mut wait = std::time::Duration::from_secs(1);
            while self.db.fault().is_some() {
                tokio::select! {
                    () = &mut stop => return,
                    () = tokio::time::sleep(wait) => {}
                }
                match self.sink.reopen().await {
                    Ok(()) => tracing::info!("The workspace stores again; streams resume from their checkpoints."),
                    Err(e) => {
                        tracing::warn!(error = %e, "The workspace cannot be reopened yet.");
                        wait = (wait * 2).min(std::time::Duration::from_secs(5));
                    }
                }
            }
        }
    }

    /// The sink: writes units through the one writer thread.
    pub fn sink(&self) -> &WorkspaceSink {
        &self.sink
    }

    /// The state store: checkpoints, table columns, push keys; where a stream resumes.
    pub fn state(&self) -> &WorkspaceState {
        &self.state
    }

    /// The registry of streams and syncs, with their secrets, and the syncs' run records.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The users and API tokens (their hashes).
    pub fn accounts(&self) -> &Accounts {
        &self.accounts
    }

    /// The history of the streams' table schemas.
    pub fn schema_history(&self) -> SchemaHistory {
        SchemaHistory::new(self.db.clone())
    }

    /// The syncs' planner: their queries and row hashes.
    pub fn planner(&self) -> &SyncPlanner {
        &self.planner
    }

    /// Read-only SQL for users.
    pub fn sql(&self) -> &Query {
        &self.sql
    }

    /// Run one read-only user statement: [`Query::run`].
    pub async fn query<S>(
        &self,
        sql: String,
        limits: QueryLimits,
        timeout: std::time::Duration,
        shutdown: S,
    ) -> std::result::Result<QueryResult, QueryError>
    where
        S: std::future::Future<Output = ()> + Send + 'static,
    {
        self.sql.run(sql, limits, timeout, shutdown).await
    }

    /// The key of push-key hashes: derived from the secrets key (`SLUICE_SECRET_KEY` or
    /// `secret.key`), so a copy of the database alone does not allow guessing keys offline.
    pub fn push_key_pepper(&self) -> Result<[u8; 32]> {
        self.secrets.derive("sluice push key hashes v1")
    }

    /// A 32-byte key for `purpose` (a fixed label), derived from the secrets key like
    /// [`Self::push_key_pepper`]: for signing access tokens and keying token hashes.
    pub fn derived_key(&self, purpose: &str) -> Result<[u8; 32]> {
        self.secrets.derive(purpose)
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        self.db.path()
    }
}

/// The workspace writes as its [`WorkspaceSink`] does, for holders of the whole workspace.
#[async_trait]
impl Sink for Workspace {
    async fn write(&self, unit: Arc<WriteUnit>) -> Result<()> {
        self.sink.write(unit).await
    }

    async fn probe(&self, unit: Arc<WriteUnit>) -> Option<Result<()>> {
        self.sink.probe(unit).await
    }
}

/// The workspace reads state as its [`WorkspaceState`] does, for holders of the whole workspace.
#[async_trait]
impl StateStore for Workspace {
    async fn checkpoint(&self, stream: &str) -> Result<Option<Checkpoint>> {
        self.state.checkpoint(stream).await
    }

    async fn table_schema(&self, table: &str) -> Result<Option<TableSchema>> {
        self.state.table_schema(table).await
    }
}

/// Load an NDJSON file with DuckDB's own `read_json_auto` into a fresh database in `dir`; the
/// limit `sluice bench` compares against. `options` is appended to the call, for example
/// `sample_size = -1` so that DuckDB scans the whole file for its schema. Returns the rows.
pub fn load_json_file(dir: &Path, json: &Path, options: &str) -> Result<u64> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::new(ErrorKind::Config, "cannot create bench dir").with_source(e))?;
    let conn = Connection::open(dir.join("baseline.duckdb")).map_err(db_error)?;
    let file = json.display().to_string().replace('\'', "''");
    let options = if options.is_empty() { String::new() } else { format!(", {options}") };
    conn.execute_batch(&format!("CREATE TABLE events AS SELECT * FROM read_json_auto('{file}'{options})"))
        .map_err(db_error)?;
    conn.query_row("SELECT count(*) FROM events", [], |r| r.get::<_, i64>(0)).map(|n| n as u64).map_err(db_error)
}
