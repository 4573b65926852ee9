//! The embedded DuckDB workspace: the default sink, the state store, the rejects ledger and the
//! stream registry, all in one database file.

mod access;
mod control;
mod mirror;
mod query;
mod replay;
mod secrets;
mod sink;
mod state;
mod sync_plan;
mod sync_state;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use duckdb::{AccessMode, Config, Connection};
use sluice_core::{Error, ErrorKind, Result};

pub use query::{QueryError, QueryErrorKind, QueryLimits, QueryResult, check_read_only, query_connection};
pub use replay::{LedgerEvent, ReplayRequest};
pub use secrets::keyed_hash;
pub use state::StoredStream;
pub use sync_state::{RunRecord, RunSummary};

/// WAL size at which DuckDB checkpoints (see `Workspace::open`).
pub const WAL_CHECKPOINT: &str = "64MB";

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
"#;

/// DuckDB's memory limit unless `SLUICE_DUCKDB_MEMORY` says otherwise.
pub const DUCKDB_MEMORY: &str = "256MB";

/// An open workspace. Cheap to clone; all clones share one database.
#[derive(Clone)]
pub struct Workspace {
    path: PathBuf,
    // DuckDB connections are Send but not Sync: this one is only cloned from, under the lock.
    base: Arc<Mutex<Connection>>,
    writer: sink::Writer,
    secrets: Arc<secrets::SecretFile>,
}

impl Workspace {
    /// Open (or create) the workspace in `dir`, as `dir/workspace.duckdb`.
    pub fn open(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| {
            Error::new(ErrorKind::Config, format!("cannot create data dir {}", dir.display())).with_source(e)
        })?;
        let path = dir.join("workspace.duckdb");
        let conn = Connection::open(&path).map_err(|e| open_error(&path, e))?;
        conn.execute_batch(BOOTSTRAP).map_err(db_error)?;
        sync_state::bootstrap(&conn)?;
        // DuckDB checkpoints the WAL into the database file when it reaches this size, and a
        // checkpoint holds up commits for as long as it runs. Measured with `sluice bench`:
        // 16 MB checkpoints so often that pushes queue (p99 760 ms at 50k events/s); 256 MB
        // stalls for seconds at a time (p99 3.5 s); 64 MB gave p99 435 ms and the best rate.
        conn.execute_batch(&format!("SET wal_autocheckpoint = '{WAL_CHECKPOINT}'")).map_err(db_error)?;
        // DuckDB keeps pages it has read or written cached up to its memory limit, 80% of the
        // machine's RAM by default: a server taking pushes would grow towards that. The limit
        // bounds the cache and query work (beyond it DuckDB spills to its temp folder or fails
        // the statement with an out-of-memory error); `SLUICE_DUCKDB_MEMORY` changes it.
        let memory = std::env::var("SLUICE_DUCKDB_MEMORY").unwrap_or_else(|_| DUCKDB_MEMORY.to_string());
        conn.execute_batch(&format!("SET memory_limit = '{}'", memory.replace('\'', "")))
            .map_err(|e| Error::new(ErrorKind::Config, format!("SLUICE_DUCKDB_MEMORY: {e}")))?;
        // User SQL must not read files or attach databases: the workspace needs neither.
        conn.execute_batch("SET enable_external_access = false").map_err(db_error)?;
        let writer = sink::Writer::start(conn.try_clone().map_err(db_error)?)?;
        let secrets = Arc::new(secrets::SecretFile::new(dir));
        Ok(Self { path, base: Arc::new(Mutex::new(conn)), writer, secrets })
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

    /// The key of push-key hashes: derived from the secrets key (`SLUICE_SECRET_KEY` or
    /// `secret.key`), so a copy of the database alone does not allow guessing keys offline.
    pub fn push_key_pepper(&self) -> Result<[u8; 32]> {
        self.secrets.derive("sluice push key hashes v1")
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A new connection to the same database, for one blocking job.
    pub fn connection(&self) -> Result<Connection> {
        let base = self.base.lock().map_err(|_| Error::new(ErrorKind::Fatal, "workspace lock poisoned"))?;
        base.try_clone().map_err(db_error)
    }

    /// Run a blocking job on its own connection, off the async threads.
    pub async fn with_connection<T, F>(&self, job: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T> + Send + 'static,
    {
        let conn = self.connection()?;
        tokio::task::spawn_blocking(move || job(&conn))
            .await
            .map_err(|e| Error::new(ErrorKind::Fatal, "workspace job panicked").with_source(e))?
    }
}

/// Run `job` in one transaction: committed when it succeeds, rolled back when it fails.
pub(crate) fn in_transaction<T>(conn: &Connection, job: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
    conn.execute_batch("BEGIN TRANSACTION").map_err(db_error)?;
    match job(conn) {
        Ok(value) => {
            conn.execute_batch("COMMIT").map_err(db_error)?;
            Ok(value)
        }
        Err(e) => {
            if let Err(rollback) = conn.execute_batch("ROLLBACK") {
                tracing::error!(error = %rollback, "Rollback failed.");
            }
            Err(e)
        }
    }
}

/// Quote an identifier for SQL: always, whatever its characters.
pub fn quote(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}

fn open_error(path: &Path, e: duckdb::Error) -> Error {
    let text = e.to_string();
    if text.contains("lock") {
        Error::new(
            ErrorKind::Config,
            format!("workspace {} is in use by another process (is `sluice serve` running?)", path.display()),
        )
        .with_source(e)
    } else {
        Error::new(ErrorKind::Config, format!("cannot open workspace {}", path.display())).with_source(e)
    }
}

/// Map a DuckDB error to a kind: write conflicts may pass on retry, the rest stops.
pub(crate) fn db_error(e: duckdb::Error) -> Error {
    let text = e.to_string();
    let kind =
        if text.contains("Conflict") || text.contains("conflict") { ErrorKind::Transient } else { ErrorKind::Fatal };
    Error::new(kind, "workspace error").with_source(e)
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
