//! Writes into lakehouse tables (DuckLake, Iceberg) through DuckDB's extensions, on a DuckDB of
//! the destination's own (in memory; the lake's catalog and files are the durable part), with
//! the lake attached as `lake`. Each write creates or evolves its tables first, then is one
//! transaction: the rows of every table it touches and the stream's position
//! ([`Lakehouse::write_stamp`]) committed together (exactly once). Rows are appended to a temporary stage table first (DuckDB lets a transaction write
//! temporary tables beside one attached database), then inserted, merged by key or deleted.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use duckdb::Connection;
use sluice_core::schema::{Column, ColumnType, TableSchema};
use sluice_core::{Delivery, Destination, Error, ErrorKind, Result, Stamp, SyncMode};

use super::Lakehouse;
use super::tables::{apply, existing_columns, shape};

/// Delivers into the tables of a lake (`C`: a DuckLake or an Iceberg catalog).
pub struct LakeTarget<C: Lakehouse> {
    config: C,
    /// The attached lake, kept between writes; dropped after an error.
    lake: Lake,
    /// The last write failed: its commit may still have landed (a reply lost on the way back
    /// from a REST catalog), so the next write of the same position checks first.
    unsure: bool,
}

/// A lake's attachment: one per lake in this process, shared by its writers and its upkeep,
/// so that they take turns instead of meeting as two writers of one catalog (a SQLite catalog
/// takes one at a time). `None` until used, and again after an error.
pub(crate) type Lake = Arc<Mutex<Option<Connection>>>;

/// The attachment of the lake `config` names, as `config` attaches it, made on first use.
pub(crate) fn shared(config: &impl Lakehouse) -> Lake {
    type Attachments = Mutex<HashMap<String, Weak<Mutex<Option<Connection>>>>>;
    static LAKES: LazyLock<Attachments> = LazyLock::new(Mutex::default);
    // Everything the attachment is made of (extensions, S3 account, catalog and its password);
    // a catalog that cannot be served keys on its error, which `attach` then reports.
    let key = config.attach_sql().unwrap_or_else(|e| e.to_string());
    let mut lakes = LAKES.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    lakes.retain(|_, lake| lake.strong_count() > 0);
    if let Some(lake) = lakes.get(&key).and_then(Weak::upgrade) {
        return lake;
    }
    let lake: Lake = Arc::default();
    lakes.insert(key, Arc::downgrade(&lake));
    lake
}

/// Run `work` on the attached lake off the async threads; an error drops the attachment.
pub(crate) async fn on_lake<C, T, F>(lake: &Lake, config: &C, work: F) -> Result<T>
where
    C: Lakehouse,
    T: Send + 'static,
    F: FnOnce(&Connection, &C) -> Result<T> + Send + 'static,
{
    on_lake_detaching(lake, config, move |conn, config| work(conn, config).map(|t| (t, false))).await
}

/// [`on_lake`], for work that may commit past DuckDB (a compaction through the catalog's own
/// routes): when it says so, the attachment, which has not seen that commit, is dropped before
/// the lock is let go, so the next user attaches anew.
pub(crate) async fn on_lake_detaching<C, T, F>(lake: &Lake, config: &C, work: F) -> Result<T>
where
    C: Lakehouse,
    T: Send + 'static,
    F: FnOnce(&Connection, &C) -> Result<(T, bool)> + Send + 'static,
{
    let (lake, config) = (lake.clone(), config.clone());
    tokio::task::spawn_blocking(move || {
        // A panic in an earlier user poisons the lock: its connection may be mid-transaction,
        // so it is dropped and the lake attached anew, not left broken for every stream.
        let mut slot = lake.lock().unwrap_or_else(|poisoned| {
            let mut slot = poisoned.into_inner();
            *slot = None;
            lake.clear_poison();
            slot
        });
        if slot.is_none() {
            *slot = Some(attach(&config)?);
        }
        let result = work(slot.as_ref().expect("attached just now"), &config);
        if result.as_ref().map_or(true, |(_, detach)| *detach) {
            *slot = None;
        }
        result.map(|(t, _)| t).map_err(|e| Error::new(e.kind(), config.redact(e.message())))
    })
    .await
    .map_err(|e| Error::new(ErrorKind::Fatal, "lake: a write panicked").with_source(e))?
}

impl<C: Lakehouse> LakeTarget<C> {
    /// A destination for `config` (attaches on use).
    pub fn new(config: C) -> Self {
        let lake = shared(&config);
        Self { config, lake, unsure: false }
    }

    /// Whether the table holds `stamp`, read on a fresh attachment, trying for about 15 s
    /// while the catalog does not answer; `None`: not known.
    async fn landed(&self, stamp: &Stamp) -> Option<bool> {
        for wait in [0u64, 1, 2, 4, 8] {
            tokio::time::sleep(Duration::from_secs(wait)).await;
            let owner = stamp.owner.clone();
            if let Ok(held) = self.with_lake(move |conn, config| config.read_stamp(conn, &owner)).await {
                return Some(held.as_deref() == Some(stamp.checkpoint.as_str()));
            }
        }
        None
    }

    async fn with_lake<T, F>(&self, work: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection, &C) -> Result<T> + Send + 'static,
    {
        on_lake(&self.lake, &self.config, work).await
    }
}

/// A DuckDB of its own (in memory) with the lake attached as `lake`.
pub(crate) fn attach(config: &impl Lakehouse) -> Result<Connection> {
    let conn = Connection::open_in_memory().map_err(lake_error)?;
    conn.execute_batch("SET memory_limit = '256MB'; SET threads = 2").map_err(lake_error)?;
    let sql = config.attach_sql().map_err(|e| Error::new(e.kind(), config.redact(e.message())))?;
    conn.execute_batch(&sql).map_err(|e| {
        let e = attach_error(config, &e);
        Error::new(e.kind(), config.redact(e.message()))
    })?;
    Ok(conn)
}

#[async_trait]
impl<C: Lakehouse> Destination for LakeTarget<C> {
    async fn check(&mut self) -> Result<()> {
        self.with_lake(|conn, _| conn.execute_batch("SELECT 1").map_err(lake_error)).await
    }

    async fn deliver(&mut self, delivery: &Delivery) -> Result<()> {
        // A run with nothing to change commits nothing (no snapshot, no stamp).
        if delivery.row_count() == 0 && delivery.delete_count() == 0 && delivery.mode != SyncMode::Replace {
            return self.write(std::slice::from_ref(delivery), None).await;
        }
        // The run's id goes into its commit, so a commit whose answer was lost is read back
        // from the table, not guessed; its time orders it after the stamps of earlier runs
        // (a table the sync wrote before keeps the stamp it had then).
        let now = chrono::Utc::now().timestamp_micros();
        let checkpoint = serde_json::json!({"run": delivery.run_id, "checkpoint": {"sequence": now}}).to_string();
        let stamp = Stamp { owner: format!("sync.{}", delivery.sync), checkpoint };
        self.write(std::slice::from_ref(delivery), Some(&stamp)).await
    }

    async fn write(&mut self, deliveries: &[Delivery], stamp: Option<&Stamp>) -> Result<()> {
        let (deliveries, stamp) = (deliveries.to_vec(), stamp.cloned());
        if self.unsure
            && let Some(stamp) = &stamp
        {
            let owner = stamp.owner.clone();
            let held = self.with_lake(move |conn, config| config.read_stamp(conn, &owner)).await?;
            self.unsure = false;
            if held.as_deref() == Some(stamp.checkpoint.as_str()) {
                // The failed try committed after all: writing again would add its rows twice.
                return Ok(());
            }
        }
        let written = stamp.clone();
        let outcome = on_lake_detaching(&self.lake, &self.config, move |conn, config| {
            let result = write(conn, config, &deliveries, written.as_ref(), true);
            let failed = result.is_err(); // the attachment is dropped after a failure
            Ok((result, failed))
        })
        .await?;
        let redact = |e: Error| Error::new(e.kind(), self.config.redact(e.message()));
        match (outcome, stamp) {
            (Ok(()), _) => {
                self.unsure = false;
                Ok(())
            }
            (Err(Failed::Before(e)), _) => {
                self.unsure = false;
                Err(redact(e))
            }
            (Err(Failed::AtCommit(e)), None) => {
                self.unsure = true;
                Err(redact(e))
            }
            // The catalog may have committed (its answer lost on the way back): learn it from
            // the table, never guess.
            (Err(Failed::AtCommit(e)), Some(stamp)) => match self.landed(&stamp).await {
                Some(true) => {
                    tracing::warn!(error = %redact(e), "lake: a commit's answer was lost; the table holds it");
                    self.unsure = false;
                    Ok(())
                }
                // Not there yet: a commit still under way could land after this read, so the
                // next try checks again.
                Some(false) => {
                    self.unsure = true;
                    Err(redact(e))
                }
                None => {
                    self.unsure = true;
                    let e = redact(e);
                    Err(Error::new(
                        ErrorKind::Connect,
                        format!("{} (whether it was committed is not known yet)", e.message()),
                    ))
                }
            },
        }
    }

    async fn probe(&mut self, deliveries: &[Delivery]) -> Option<Result<()>> {
        let deliveries = deliveries.to_vec();
        Some(
            self.with_lake(move |conn, config| {
                write(conn, config, &deliveries, None, false).map_err(Failed::into_error)
            })
            .await,
        )
    }

    async fn keys(&mut self, _table: &str) -> Result<Option<Vec<String>>> {
        // A lake table has no primary key or unique index to read keys from.
        Ok(None)
    }

    async fn table_schema(&mut self, table: &str) -> Result<Option<TableSchema>> {
        let table = table.to_string();
        self.with_lake(move |conn, config| {
            let columns = existing_columns(conn, config.schema(), &table)?;
            Ok((!columns.is_empty()).then(|| {
                TableSchema::existing(
                    columns
                        .into_iter()
                        .map(|(name, ty)| Column { name, ty: ColumnType::from_sql(&ty).unwrap_or(ColumnType::Varchar) })
                        .collect(),
                )
            }))
        })
        .await
    }

    async fn stamp(&mut self, owner: &str) -> Result<Option<String>> {
        let owner = owner.to_string();
        self.with_lake(move |conn, config| config.read_stamp(conn, &owner)).await
    }
}

/// How a write failed: before its commit (nothing was committed), or at it (a REST catalog may
/// have committed it and lost the answer).
enum Failed {
    Before(Error),
    AtCommit(Error),
}

impl Failed {
    fn into_error(self) -> Error {
        match self {
            Failed::Before(e) | Failed::AtCommit(e) => e,
        }
    }
}

/// Tables shaped, then the rows and `stamp` in one transaction, committed or (`commit` false: a
/// probe) rolled back.
fn write(
    conn: &Connection,
    config: &impl Lakehouse,
    deliveries: &[Delivery],
    stamp: Option<&Stamp>,
    commit: bool,
) -> std::result::Result<(), Failed> {
    // Tables and columns first, each change a commit of its own: an Iceberg catalog does not
    // show a table to the transaction that created it. A table or column without rows is
    // harmless; the rows and the position then come in one commit.
    for delivery in deliveries {
        shape(conn, config, delivery).map_err(Failed::Before)?;
    }
    conn.execute_batch("BEGIN TRANSACTION").map_err(|e| Failed::Before(lake_error(e)))?;
    let result = (|| {
        let mut tables = Vec::new();
        for delivery in deliveries {
            tables.push(apply(conn, config, delivery).map_err(Failed::Before)?);
        }
        if let Some(stamp) = stamp {
            config.write_stamp(conn, &tables, stamp).map_err(Failed::Before)?;
        }
        if commit {
            conn.execute_batch("COMMIT").map_err(|e| Failed::AtCommit(lake_error(e)))
        } else {
            conn.execute_batch("ROLLBACK").map_err(|e| Failed::Before(lake_error(e)))
        }
    })();
    if result.is_err() {
        let _ = conn.execute_batch("ROLLBACK");
    }
    let _ = conn.execute_batch(
        "DROP TABLE IF EXISTS temp.main.sluice_stage; DROP TABLE IF EXISTS temp.main.sluice_gone; \
         DROP TABLE IF EXISTS temp.main.sluice_counts; DROP TABLE IF EXISTS temp.main.sluice_matched",
    );
    result
}

pub(crate) fn lake_error(e: duckdb::Error) -> Error {
    let text = e.to_string();
    // A catalog or store that cannot be reached is worth retrying, and so is a commit another
    // writer of the lake won (two streams creating or updating `sluice_positions` at once, a
    // compaction) or a SQLite catalog another writer holds; anything else is not.
    // A REST catalog's refusal says its HTTP status: a refused login is the config's to fix, a
    // request it does not take (a type promotion Iceberg lacks, a namespace it forbids) will
    // not pass by retrying; the rest (5xx, 409, 429, no answer) may.
    let http = |codes: &[&str]| text.contains("HTTP") && codes.iter().any(|c| text.contains(c));
    let kind = if http(&["401", "403", "Unauthorized", "Forbidden"]) {
        ErrorKind::Config
    } else if http(&["400", "404", "422", "Bad Request", "Not Found", "Unprocessable"]) {
        ErrorKind::Fatal
    } else if text.contains("IO Error") || text.contains("HTTP") || text.contains("Connection") {
        ErrorKind::Connect
    } else if text.contains("onflict")
        || text.contains("TransactionContext Error")
        || text.contains("database is locked")
    {
        ErrorKind::Transient
    } else {
        ErrorKind::Fatal
    };
    Error::new(kind, format!("lake: {text}"))
}

/// Why the lake could not be attached: a missing extension is a setup to fix (named, with
/// where it was looked for), anything else a catalog or store to retry.
fn attach_error(config: &impl Lakehouse, e: &duckdb::Error) -> Error {
    let text = e.to_string();
    if text.contains("Extension") && (text.contains("not found") || text.contains("could not be loaded")) {
        let dir = config.extensions().map_or("DuckDB's default folder".to_string(), |d| d.display().to_string());
        return Error::new(
            ErrorKind::Config,
            format!(
                "{} needs DuckDB's {} for DuckDB 1.5.5 in {dir}: run scripts/services/duckdb_extensions.sh, \
                 or set SLUICE_DUCKDB_EXTENSIONS or destination.extension_directory ({text})",
                config.label(),
                config.needs()
            ),
        );
    }
    // A new SQLite catalog that another connection is creating at this moment is busy; a
    // refused login is the config's to fix, not a server to wait for.
    let kind = if text.contains("database is locked") {
        ErrorKind::Transient
    } else if text.contains("password authentication failed") || text.contains("no password supplied") {
        ErrorKind::Config
    } else {
        ErrorKind::Connect
    };
    Error::new(kind, format!("{}: cannot attach {}: {text}", config.label(), config.catalog_name()))
}

pub(super) fn arrow_error(e: &arrow::error::ArrowError) -> Error {
    Error::new(ErrorKind::Fatal, format!("lake: {e}"))
}
