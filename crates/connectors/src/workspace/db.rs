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
    /// The row group size the file is attached with.
    rows: u64,
    // DuckDB connections are Send but not Sync: this one is only cloned from, under the lock.
    base: Arc<Mutex<Connection>>,
    /// Why the workspace cannot store now (its disk full), until it is reopened.
    fault: Arc<tokio::sync::watch::Sender<Option<String>>>,
}

impl Db {
    pub(crate) fn new(path: PathBuf, conn: Connection) -> Self {
        let rows = row_group().trim().parse().unwrap_or_else(|_| ROW_GROUP.parse().unwrap_or_default());
        let fault = Arc::new(tokio::sync::watch::channel(None).0);
        Self { path, rows, base: Arc::new(Mutex::new(conn)), fault }
    }

    /// Why the workspace cannot store now: its disk is full. `None` when it can.
    pub(crate) fn fault(&self) -> Option<String> {
        self.fault.borrow().clone()
    }

    /// Watch [`Db::fault`].
    pub(crate) fn watch_fault(&self) -> tokio::sync::watch::Receiver<Option<String>> {
        self.fault.subscribe()
    }

    /// Note an error: a full disk marks the workspace faulted until [`Db::reopen`].
    pub(crate) fn note(&self, e: &Error) {
        if e.kind() == ErrorKind::Storage {
            let message = e.message().to_string();
            self.fault.send_if_modified(|f| f.replace(message.clone()).is_none_or(|old| old != message));
        }
    }

    /// Make the workspace writable again after its disk was full, on the writer's thread (so
    /// no write is under way): a database DuckDB invalidated (a checkpoint that found no room)
    /// is detached and attached again, which replays its WAL to the last durable commit; then a
    /// checkpoint proves there is room. Every connection, the writer's included, works again
    /// once the file is attached under the same name. Fails, leaving the fault, while the disk
    /// is still full.
    pub(crate) fn reopen(&self) -> Result<()> {
        let control = {
            let base = self.base.lock().map_err(|_| Error::new(ErrorKind::Fatal, "workspace lock poisoned"))?;
            // A new connection uses DuckDB's default catalog, not the workspace: it can detach it.
            base.try_clone().map_err(db_error)?
        };
        let invalidated =
            |c: &Connection| c.execute_batch(&format!("SELECT 1 FROM {CATALOG}.sluice.checkpoints LIMIT 0")).is_err();
        if invalidated(&control) {
            match control.execute_batch(&format!("DETACH {CATALOG}")) {
                Ok(()) => {}
                // Detached although the checkpoint DETACH tried failed; or already gone.
                Err(e) if e.to_string().contains("Detached database") || e.to_string().contains("not found") => {}
                Err(e) => return Err(self.noted(db_error(e))),
            }
            control.execute_batch(&attach_sql(&self.path, self.rows)).map_err(|e| self.noted(db_error(e)))?;
        }
        control.execute_batch(&format!("CHECKPOINT {CATALOG}")).map_err(|e| self.noted(db_error(e)))?;
        self.fault.send_replace(None);
        Ok(())
    }

    fn noted(&self, e: Error) -> Error {
        self.note(&e);
        e
    }

    /// The database file.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// A new connection to the same database, for one blocking job.
    pub(crate) fn connection(&self) -> Result<Connection> {
        let base = self.base.lock().map_err(|_| Error::new(ErrorKind::Fatal, "workspace lock poisoned"))?;
        clone_connection(&base)
    }

    /// Run a blocking job on its own connection, off the async threads.
    pub(crate) async fn run<T, F>(&self, job: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T> + Send + 'static,
    {
        let conn = self.connection().map_err(|e| self.noted(e))?;
        tokio::task::spawn_blocking(move || job(&conn))
            .await
            .map_err(|e| Error::new(ErrorKind::Fatal, "workspace job panicked").with_source(e))?
            .map_err(|e| self.noted(e))
    }
}

/// Rows per row group of the workspace's tables unless `SLUICE_DUCKDB_ROW_GROUP` says otherwise.
pub const ROW_GROUP: &str = "30720";

/// The workspace file attached as `workspace` on a new DuckDB, and used. Attached rather than
/// opened, because only ATTACH takes a row group size (DuckDB keeps it for the session, not in
/// the file). A checkpoint rewrites the row groups that took rows since the last one; at
/// DuckDB's 122,880 rows each, the smallest checkpoint held commits up for about 100 ms.
pub(crate) fn attach(path: &Path) -> Result<Connection> {
    attach_with(path, &row_group())
}

/// `SLUICE_DUCKDB_ROW_GROUP`'s text, or the default.
fn row_group() -> String {
    std::env::var("SLUICE_DUCKDB_ROW_GROUP").unwrap_or_else(|_| ROW_GROUP.to_string())
}

/// The statement that attaches the workspace file with `rows` rows per row group.
fn attach_sql(path: &Path, rows: u64) -> String {
    let file = path.display().to_string().replace('\'', "''");
    format!("ATTACH '{file}' AS {CATALOG} (ROW_GROUP_SIZE {rows})")
}

/// [`attach`] with `rows` as the row group size (`SLUICE_DUCKDB_ROW_GROUP`'s text).
fn attach_with(path: &Path, rows: &str) -> Result<Connection> {
    let bad_rows = |why: String| Error::new(ErrorKind::Config, format!("SLUICE_DUCKDB_ROW_GROUP: {why}"));
    let rows: u64 = rows.trim().parse().map_err(|_| bad_rows(format!("{rows:?} is not a number of rows")))?;
    let conn = Connection::open_in_memory().map_err(db_error)?;
    let file = path.display().to_string().replace('\'', "''");
    // Where DuckDB spills what does not fit its memory limit: beside the file, as it would for
    // a file it opened (an in-memory DuckDB would spill into the working directory). Set
    // before the ATTACH, whose WAL replay may already spill.
    conn.execute_batch(&format!("SET temp_directory = '{file}.tmp'")).map_err(db_error)?;
    conn.execute_batch(&format!("{}; USE {CATALOG}", attach_sql(path, rows))).map_err(|e| {
        let text = e.to_string();
        // DuckDB's own refusals of the size (not a divisor of its vector size, 0, too large
        // for the file's storage version), not any error that mentions row groups.
        if ["Invalid row group size", "Unsupported row group size"].iter().any(|m| text.contains(m)) {
            bad_rows(text)
        } else {
            open_error(path, e)
        }
    })?;
    Ok(conn)
}

/// The catalog the workspace file is attached as (what DuckDB would name it when opened).
pub(crate) const CATALOG: &str = "workspace";

/// Another connection to the workspace's DuckDB, using the workspace.
pub(crate) fn clone_connection(conn: &Connection) -> Result<Connection> {
    let clone = conn.try_clone().map_err(db_error)?;
    clone.execute_batch(&format!("USE {CATALOG}")).map_err(db_error)?;
    Ok(clone)
}

pub(crate) fn open_error(path: &Path, e: duckdb::Error) -> Error {
    let text = e.to_string();
    // DuckDB's "Could not set lock on file"; not "lock" alone, which "block" also holds.
    if text.contains("Could not set lock") {
        Error::new(
            ErrorKind::Config,
            format!("workspace {} is in use by another process (is `sluice serve` running?)", path.display()),
        )
        .with_source(e)
    } else {
        Error::new(ErrorKind::Config, format!("cannot open workspace {}", path.display())).with_source(e)
    }
}

/// Run `job` in one transaction: committed when it succeeds, rolled back when it fails.
pub(crate) fn in_transaction<T>(conn: &Connection, job: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
    conn.execute_batch("BEGIN TRANSACTION").map_err(db_error)?;
    match job(conn) {
        Ok(value) => match conn.execute_batch("COMMIT") {
            Ok(()) => Ok(value),
            // DuckDB says the commit is durable and only the checkpoint after it failed: the
            // unit is stored. The next statement finds the database invalidated.
            Err(e) if disk_fault(&e.to_string()) == Some(Disk::CommittedThenInvalidated) => {
                tracing::warn!(error = %e, "Committed; the checkpoint after it found the disk full.");
                Ok(value)
            }
            Err(e) => Err(db_error(e)),
        },
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

/// Map a DuckDB error to a kind: write conflicts may pass on retry, the rest stops. Running
/// out of DuckDB's memory is retried too: it says nothing of the rows (a unit refused for good
/// would have its rows sent to the ledger), and memory frees when queries end; a write that
/// needs more than the limit holds the stream, `retrying`, with this message, until the limit
/// is raised.
pub(crate) fn db_error(e: duckdb::Error) -> Error {
    let text = e.to_string();
    if let Some(disk) = disk_fault(&text) {
        let what = match disk {
            Disk::Full => "the disk of the data folder is full: nothing of this write was stored",
            Disk::Invalidated | Disk::CommittedThenInvalidated => {
                "the disk of the data folder was full when the workspace checkpointed; it is being reopened"
            }
        };
        let message = format!("{what}. Free space there: the workspace reopens by itself and streams resume; retry");
        return Error::new(ErrorKind::Storage, message).with_source(e);
    }
    if out_of_memory(&text) {
        let limit = std::env::var("SLUICE_DUCKDB_MEMORY").unwrap_or_else(|_| super::DUCKDB_MEMORY.to_string());
        let message = format!(
            "the workspace ran out of DuckDB's memory (SLUICE_DUCKDB_MEMORY, now {limit}): raise it, \
             or end the queries holding it"
        );
        return Error::new(ErrorKind::Transient, message).with_source(e);
    }
    let kind =
        if text.contains("Conflict") || text.contains("conflict") { ErrorKind::Transient } else { ErrorKind::Fatal };
    Error::new(kind, "workspace error").with_source(e)
}

/// How DuckDB says the disk was full, by how its messages begin (so a value in the data cannot
/// pass for one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Disk {
    /// A write found no room; the database is still usable (a WAL append failed).
    Full,
    /// A checkpoint found no room (or failed otherwise) and DuckDB invalidated the database:
    /// it must be detached and attached again.
    Invalidated,
    /// The commit is durable, the checkpoint after it failed: invalidated too.
    CommittedThenInvalidated,
}

pub(crate) fn disk_fault(text: &str) -> Option<Disk> {
    const NO_ROOM: [&str; 3] = ["No space left on device", "Disk quota exceeded", "File too large"];
    if text.starts_with("IO Error: Transaction COMMIT succeeded and is durable") {
        return Some(Disk::CommittedThenInvalidated);
    }
    if text.starts_with(&format!("IO Error: Database \"{CATALOG}\" has been invalidated because checkpointing failed"))
        || text.starts_with("TransactionContext Error: Failed to commit: Checkpoint failed for database")
    {
        return Some(Disk::Invalidated);
    }
    if text.starts_with("IO Error: Checkpoint failed for database") {
        return Some(Disk::Invalidated);
    }
    // A statement's, a commit's or the appender's failed write or fsync.
    let rest = ["TransactionContext Error: Failed to commit: ", "Failed to append: ", "IO Error: "]
        .iter()
        .find_map(|p| text.strip_prefix(p))
        .unwrap_or(text);
    let write = ["Could not write", "Could not fsync"].iter().any(|w| rest.starts_with(w));
    (write && NO_ROOM.iter().any(|m| text.contains(m))).then_some(Disk::Full)
}

/// DuckDB's own out-of-memory errors, by how they begin (a statement's, or the appender's), so
/// that a name in the data cannot pass for one. A database DuckDB invalidated after a fatal
/// error (its message quotes the original one) stays fatal: only a restart helps.
fn out_of_memory(text: &str) -> bool {
    let fatal = text.contains("invalidated") || text.starts_with("FATAL") || text.starts_with("INTERNAL");
    !fatal
        && (text.starts_with("Out of Memory Error")
            || text.starts_with("Failed to append: could not allocate block")
            || text.starts_with("could not allocate block"))
}

/// Stored JSON that no longer parses.
pub(crate) fn json_error(e: serde_json::Error) -> Error {
    Error::new(ErrorKind::Fatal, "stored JSON is unreadable").with_source(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("sluice-db-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir.join("workspace.duckdb")
    }

    fn one<T: duckdb::types::FromSql>(conn: &Connection, sql: &str) -> T {
        conn.query_row(sql, [], |r| r.get(0)).unwrap()
    }

    #[test]
    fn running_out_of_duckdbs_memory_may_pass_and_a_name_that_says_so_does_not() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch("SET memory_limit = '64MB'").unwrap();
        let columns: Vec<String> = (0..2000).map(|i| format!("c{i} BIGINT")).collect();
        conn.execute_batch(&format!("CREATE TABLE wide ({})", columns.join(", "))).unwrap();
        let full = conn.execute_batch("INSERT INTO wide (c1) VALUES (1)").unwrap_err();
        let error = db_error(full);
        assert_eq!(error.kind(), ErrorKind::Transient, "{error:?}");
        assert!(error.to_string().contains("SLUICE_DUCKDB_MEMORY"), "{error}");
        // A column named like the error is a binder's error about a name: not retried.
        let named = conn.execute_batch(r#"SELECT "could not allocate block" FROM wide"#).unwrap_err();
        assert_eq!(db_error(named).kind(), ErrorKind::Fatal);
    }

    #[test]
    fn a_full_disk_is_told_by_how_duckdbs_message_begins() {
        let checkpoint = "TransactionContext Error: Failed to commit: Checkpoint failed for database \"workspace\". \
                          The database has been invalidated. Original error: Could not write file \"/d/workspace.duckdb\": \
                          No space left on device";
        assert_eq!(disk_fault(checkpoint), Some(Disk::Invalidated));
        let after = "IO Error: Database \"workspace\" has been invalidated because checkpointing failed. Detach and \
                     reattach it before using it again. Original error: No space left on device";
        assert_eq!(disk_fault(after), Some(Disk::Invalidated));
        let wal = "TransactionContext Error: Failed to commit: Could not write file \"/d/workspace.duckdb.wal\": \
                   No space left on device";
        assert_eq!(disk_fault(wal), Some(Disk::Full));
        let durable = "IO Error: Transaction COMMIT succeeded and is durable, but the autocheckpoint failed.";
        assert_eq!(disk_fault(durable), Some(Disk::CommittedThenInvalidated));
        // The same words in a name or a value are a binder's error, not a full disk.
        let conn = Connection::open_in_memory().unwrap();
        let named = conn.execute_batch(r#"SELECT "No space left on device" FROM range(1)"#).unwrap_err();
        assert_eq!(disk_fault(&named.to_string()), None, "{named}");
        assert_eq!(db_error(named).kind(), ErrorKind::Fatal);
        let error = db_error(conn.execute_batch(&format!("SELECT error('{}')", wal.replace('\'', "''"))).unwrap_err());
        assert_ne!(error.kind(), ErrorKind::Storage, "{error}");
    }

    #[test]
    fn the_workspace_is_attached_with_small_row_groups_and_every_clone_uses_it() {
        let path = scratch("attach");
        let conn = attach(&path).unwrap();
        conn.execute_batch("CREATE TABLE t AS SELECT range AS i FROM range(100000); CHECKPOINT").unwrap();
        let rows: i64 = one(&conn, "SELECT max(count) FROM pragma_storage_info('t')");
        assert_eq!(rows, ROW_GROUP.parse::<i64>().unwrap(), "DuckDB's own row groups hold 122,880 rows");
        let clone = clone_connection(&conn).unwrap();
        assert_eq!(one::<String>(&clone, "SELECT current_database()"), CATALOG);
        assert_eq!(one::<i64>(&clone, "SELECT count(*) FROM t"), 100_000);
        let spill: String = one(&conn, "SELECT current_setting('temp_directory')");
        assert_eq!(spill, format!("{}.tmp", path.display()));
        drop((conn, clone));

        // The table is in the file, where a plain open finds it.
        let reopened = Connection::open(&path).unwrap();
        assert_eq!(one::<i64>(&reopened, "SELECT count(*) FROM t"), 100_000);
    }

    #[test]
    fn a_workspace_written_with_duckdbs_row_groups_takes_rows_in_smaller_ones() {
        // Workspaces made before the change have 122,880-row groups, the last one part full.
        let path = scratch("upgrade");
        let old = Connection::open(&path).unwrap();
        old.execute_batch("CREATE TABLE t AS SELECT range AS i FROM range(160000)").unwrap();
        drop(old);
        for round in 0..2 {
            let conn = attach(&path).unwrap();
            conn.execute_batch(&format!(
                "INSERT INTO t SELECT 1000000 * {} + range FROM range(50000); CHECKPOINT",
                round + 1
            ))
            .unwrap();
        }
        let conn = attach(&path).unwrap();
        let (rows, sum): (i64, i64) =
            conn.query_row("SELECT count(*), sum(i)::BIGINT FROM t", [], |r| Ok((r.get(0)?, r.get(1)?))).unwrap();
        let expected: i64 = (0..160_000).sum::<i64>()
            + (1..=2).map(|k| (0..50_000).map(|i| 1_000_000 * k + i).sum::<i64>()).sum::<i64>();
        assert_eq!((rows, sum), (260_000, expected));
    }

    #[test]
    fn a_row_group_size_duckdb_refuses_names_the_variable() {
        let path = scratch("rows");
        for (rows, why) in [("1000", "divisible by the vector size"), ("many", "not a number of rows")] {
            let Err(error) = attach_with(&path, rows) else { panic!("{rows} rows per group was taken") };
            assert_eq!(error.kind(), ErrorKind::Config);
            let text = error.to_string();
            assert!(text.contains("SLUICE_DUCKDB_ROW_GROUP") && text.contains(why), "{text}");
        }
        attach_with(&path, "4096").expect("a multiple of 2,048 rows is taken");
    }
}
