//! The handle every role of the workspace shares: the database file, a base connection to
//! clone per job, running a job off the async threads, one transaction, and identifier quoting.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use duckdb::Connection;
use sluice_core::{Error, ErrorKind, Result};

/// One open workspace database. Cheap to clone; all clones share one database.
#[derive(Clone)]
pub(crate) struct Db {
    path: PathBuf,
    // DuckDB connections are Send but not Sync: this one is only cloned from, under the lock.
    base: Arc<Mutex<Connection>>,
}

impl Db {
    pub(crate) fn new(path: PathBuf, conn: Connection) -> Self {
        Self { path, base: Arc::new(Mutex::new(conn)) }
    }

    /// The database file.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// A new connection to the same database, for one blocking job.
    pub(crate) fn connection(&self) -> Result<Connection> {
        let base = self.base.lock().map_err(|_| Error::new(ErrorKind::Fatal, "workspace lock poisoned"))?;
        base.try_clone().map_err(db_error)
    }

    /// Run a blocking job on its own connection, off the async threads.
    pub(crate) async fn run<T, F>(&self, job: F) -> Result<T>
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

/// Map a DuckDB error to a kind: write conflicts may pass on retry, the rest stops.
pub(crate) fn db_error(e: duckdb::Error) -> Error {
    let text = e.to_string();
    let kind =
        if text.contains("Conflict") || text.contains("conflict") { ErrorKind::Transient } else { ErrorKind::Fatal };
    Error::new(kind, "workspace error").with_source(e)
}

/// Stored JSON that no longer parses.
pub(crate) fn json_error(e: serde_json::Error) -> Error {
    Error::new(ErrorKind::Fatal, "stored JSON is unreadable").with_source(e)
}
