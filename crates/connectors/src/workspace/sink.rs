//! The workspace sink: one writer thread applies each write unit in one DuckDB transaction:
//! schema changes, rows (through the Arrow appender), rejects and the stream's checkpoint.

use std::sync::Arc;

use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use duckdb::Connection;
use sluice_core::schema::SchemaChange;
use sluice_core::{Error, ErrorKind, Result, Sink, WriteUnit};
use tokio::sync::{mpsc, oneshot};

use super::db::{Db, db_error, in_transaction, quote};

/// What the writer thread does: a unit, whether to roll it back once applied (a probe), and
/// where to answer; or reopen the workspace after its disk was full.
enum Job {
    Write(Arc<WriteUnit>, bool, oneshot::Sender<Result<()>>),
    Reopen(oneshot::Sender<Result<()>>),
}

/// The workspace as a sink: a mailbox to the one writer thread. Cheap to clone.
#[derive(Clone)]
pub struct WorkspaceSink {
    tx: mpsc::Sender<Job>,
}

impl WorkspaceSink {
    /// Start the writer thread on `conn`, a connection to `db`.
    pub(crate) fn start(conn: Connection, db: Db) -> Result<Self> {
        let (tx, mut rx) = mpsc::channel::<Job>(64);
        std::thread::Builder::new()
            .name("workspace-writer".into())
            .spawn(move || {
                let mut layouts = Layouts::default();
                while let Some(job) = rx.blocking_recv() {
                    let (unit, probe, reply) = match job {
                        Job::Write(unit, probe, reply) => (unit, probe, reply),
                        Job::Reopen(reply) => {
                            layouts.clear();
                            let _ = reply.send(db.reopen());
                            continue;
                        }
                    };
                    // While the disk is full, a write is answered at once, without DuckDB.
                    if let Some(fault) = db.fault() {
                        let _ = reply.send(Err(Error::new(ErrorKind::Storage, fault)));
                        continue;
                    }
                    let result =
                        if probe { try_apply(&conn, &unit, &mut layouts) } else { apply(&conn, &unit, &mut layouts) };
                    if let Err(e) = &result {
                        db.note(e);
                    }
                    if result.is_err() || probe {
                        // The transaction rolled back, its DDL with it.
                        layouts.clear();
                    }
                    let _ = reply.send(result);
                }
            })
            .map_err(|e| Error::new(ErrorKind::Fatal, "cannot start the workspace writer").with_source(e))?;
        Ok(Self { tx })
    }

    /// Reopen the workspace after its disk was full ([`Db::reopen`]), between writes.
    pub(crate) async fn reopen(&self) -> Result<()> {
        let (reply, done) = oneshot::channel();
        self.tx.send(Job::Reopen(reply)).await.map_err(|_| Error::new(ErrorKind::Fatal, "workspace writer stopped"))?;
        done.await.map_err(|_| Error::new(ErrorKind::Fatal, "workspace writer stopped"))?
    }
}

#[async_trait]
impl Sink for WorkspaceSink {
    async fn write(&self, unit: Arc<WriteUnit>) -> Result<()> {
        let (reply, done) = oneshot::channel();
        self.tx
            .send(Job::Write(unit, false, reply))
            .await
            .map_err(|_| Error::new(ErrorKind::Fatal, "workspace writer stopped"))?;
        done.await.map_err(|_| Error::new(ErrorKind::Fatal, "workspace writer stopped"))?
    }

    async fn probe(&self, unit: Arc<WriteUnit>) -> Option<Result<()>> {
        let (reply, done) = oneshot::channel();
        self.tx.send(Job::Write(unit, true, reply)).await.ok()?;
        done.await.ok()
    }
}

/// Keep `<table>__changes` in step with its table: the table's columns plus the history columns.
fn history_ddl(conn: &Connection, table: &str, change: &SchemaChange) -> Result<()> {
    let history = quote(&super::mirror::history_table(table));
    let sql = match change {
        SchemaChange::Create(_) => {
            let extra: Vec<String> =
                super::mirror::HISTORY_COLUMNS.iter().map(|(n, ty)| format!("NULL::{ty} AS {n}")).collect();
            format!(
                "CREATE TABLE IF NOT EXISTS main.{history} AS SELECT *, {} FROM main.{} LIMIT 0",
                extra.join(", "),
                quote(table)
            )
        }
        SchemaChange::Add(c) => {
            format!("ALTER TABLE main.{history} ADD COLUMN IF NOT EXISTS {} {}", quote(&c.name), c.ty.sql())
        }
        SchemaChange::Widen(c) => {
            format!("ALTER TABLE main.{history} ALTER COLUMN {} SET DATA TYPE {}", quote(&c.name), c.ty.sql())
        }
    };
    conn.execute_batch(&sql).map_err(db_error)
}

/// Each table's columns in order, as the catalog has them, learnt once and forgotten on DDL.
///
/// An appender given a column list costs DuckDB time in the square of the table's width (it
/// rebuilds its chunk per column added: 1 s per push to a 1,000-column table); a batch that has
/// every column in table order takes the plain appender instead.
///
/// It also holds what the writer knows of mirrored tables' positions; both are forgotten when
/// a write rolls back.
#[derive(Default)]
struct Layouts {
    columns: std::collections::HashMap<String, Vec<String>>,
    positions: super::mirror_positions::KnownPositions,
}

impl Layouts {
    fn clear(&mut self) {
        *self = Self::default();
    }

    fn is_whole_table(&mut self, conn: &Connection, table: &str, names: &[&str]) -> Result<bool> {
        if !self.columns.contains_key(table) {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT column_name FROM duckdb_columns() WHERE schema_name = 'main' AND table_name = ? \
                     ORDER BY column_index",
                )
                .map_err(db_error)?;
            let columns = stmt
                .query_map([table], |r| r.get::<_, String>(0))
                .map_err(db_error)?
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(db_error)?;
            self.columns.insert(table.to_string(), columns);
        }
        Ok(self.columns[table].iter().map(String::as_str).eq(names.iter().copied()))
    }
}

fn apply(conn: &Connection, unit: &WriteUnit, layouts: &mut Layouts) -> Result<()> {
    let started = std::time::Instant::now();
    let mut applied = started;
    let result = in_transaction(conn, |c| {
        let result = apply_in_transaction(c, unit, layouts);
        applied = std::time::Instant::now();
        result
    });
    // Where a unit's write goes: its statements, then the COMMIT (the WAL written and
    // fsynced, and a checkpoint when the WAL has grown past its threshold).
    tracing::debug!(
        stream = %unit.stream,
        rows = unit.tables.iter().map(|t| t.data.num_rows()).sum::<usize>(),
        apply_ms = (applied - started).as_secs_f64() * 1e3,
        commit_ms = applied.elapsed().as_secs_f64() * 1e3,
        "Unit applied."
    );
    result
}

/// Apply `unit` in a transaction that is always rolled back.
fn try_apply(conn: &Connection, unit: &WriteUnit, layouts: &mut Layouts) -> Result<()> {
    conn.execute_batch("BEGIN TRANSACTION").map_err(db_error)?;
    let result = apply_in_transaction(conn, unit, layouts);
    conn.execute_batch("ROLLBACK").map_err(db_error)?;
    result
}

fn apply_in_transaction(conn: &Connection, unit: &WriteUnit, layouts: &mut Layouts) -> Result<()> {
    // Per table, the sequences of mirror changes a replay skipped: their ledger rows are there.
    let mut replayed: Vec<(&str, Vec<i64>)> = Vec::new();
    for write in &unit.tables {
        if !write.changes.is_empty() || write.mirror.is_some() {
            layouts.columns.remove(&write.table);
        }
        let table = quote(&write.table);
        for change in &write.changes {
            let sql = match change {
                SchemaChange::Create(columns) => {
                    let cols: Vec<String> =
                        columns.iter().map(|c| format!("{} {}", quote(&c.name), c.ty.sql())).collect();
                    format!("CREATE TABLE IF NOT EXISTS main.{table} ({})", cols.join(", "))
                }
                SchemaChange::Add(c) => {
                    format!("ALTER TABLE main.{table} ADD COLUMN IF NOT EXISTS {} {}", quote(&c.name), c.ty.sql())
                }
                SchemaChange::Widen(c) => {
                    format!("ALTER TABLE main.{table} ALTER COLUMN {} SET DATA TYPE {}", quote(&c.name), c.ty.sql())
                }
            };
            conn.execute_batch(&sql).map_err(db_error)?;
            if write.mirror.as_ref().is_some_and(|m| m.history) {
                history_ddl(conn, &write.table, change)?;
            }
        }
        if write.snapshot.as_ref().is_some_and(|s| s.clear) {
            // A new copy of the table begins: what an earlier copy left goes.
            conn.execute_batch(&format!("DELETE FROM main.{table}")).map_err(db_error)?;
        }
        if let Some(mirror) = &write.mirror {
            if mirror.history {
                // A stream that turns history on for an existing table.
                history_ddl(conn, &write.table, &SchemaChange::Create(Vec::new()))?;
            }
            let skipped = super::mirror::apply(conn, write, mirror, &mut layouts.positions)?;
            if !skipped.is_empty() {
                replayed.push((&write.table, skipped));
            }
            continue;
        }
        let schema = write.data.schema();
        let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        let mut appender = if layouts.is_whole_table(conn, &write.table, &names)? {
            conn.appender_to_db(&write.table, "main").map_err(db_error)?
        } else {
            conn.appender_with_columns_to_db(&write.table, "main", &names).map_err(db_error)?
        };
        appender.append_record_batch(write.data.clone()).map_err(db_error)?;
        appender.flush().map_err(db_error)?;
    }
    let now = chrono::Utc::now().timestamp_micros();
    let ledger = (!unit.rejects.is_empty())
        .then(|| without_replayed(unit.rejects.to_ledger(&unit.stream, now), &replayed))
        .transpose()?;
    if let Some(batch) = ledger.filter(|b| b.num_rows() > 0) {
        // Every column of the ledger, in its order, so the plain appender takes it (one given a
        // column list cost 0.4 ms per unit, a tenth of a push's write).
        let mut appender = conn.appender_to_db("rejects", super::SCHEMA).map_err(db_error)?;
        appender.append_record_batch(with_replayed_at(batch)?).map_err(db_error)?;
        appender.flush().map_err(db_error)?;
    }
    if !unit.idempotency.is_empty() {
        let mut appender = conn.appender_to_db("push_keys", super::SCHEMA).map_err(db_error)?;
        let now = duckdb::types::Value::Timestamp(
            duckdb::types::TimeUnit::Microsecond,
            chrono::Utc::now().timestamp_micros(),
        );
        for k in &unit.idempotency {
            appender.append_row(duckdb::params![unit.stream, k.key, k.answer, now.clone()]).map_err(db_error)?;
        }
        appender.flush().map_err(db_error)?;
    }
    for positions in unit.replayed.chunks(1000) {
        let list: Vec<String> = positions.iter().map(i64::to_string).collect();
        let sql = format!(
            "UPDATE sluice.rejects SET replayed_at = now() WHERE stream = ? AND \"column\" IS NULL \
             AND replayed_at IS NULL AND position IN ({})",
            list.join(",")
        );
        conn.execute(&sql, duckdb::params![unit.stream]).map_err(db_error)?;
    }
    // The schema history commits with the DDL it records.
    super::schema_history::record(conn, unit)?;
    super::state::save_checkpoint(conn, &unit.stream, &unit.checkpoint)
}

/// Ledger rows with the ledger's last column, `replayed_at`, empty.
fn with_replayed_at(batch: RecordBatch) -> Result<RecordBatch> {
    use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
    let ty = DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
    let mut fields: Vec<Field> = batch.schema().fields().iter().map(|f| f.as_ref().clone()).collect();
    fields.push(Field::new("replayed_at", ty.clone(), true));
    let mut columns = batch.columns().to_vec();
    columns.push(arrow::array::new_null_array(&ty, batch.num_rows()));
    RecordBatch::try_new(std::sync::Arc::new(Schema::new(fields)), columns)
        .map_err(|e| Error::new(ErrorKind::Fatal, "could not complete the ledger rows").with_source(e))
}

/// The ledger rows of `batch` less those of changes a replay skipped (same table and sequence).
fn without_replayed(batch: RecordBatch, replayed: &[(&str, Vec<i64>)]) -> Result<RecordBatch> {
    use arrow::array::{Array, AsArray};
    if replayed.is_empty() {
        return Ok(batch);
    }
    let tables = batch.column_by_name("table").map(|c| c.as_string::<i32>().clone());
    let positions = batch.column_by_name("position").map(|c| c.as_primitive::<arrow::datatypes::Int64Type>().clone());
    let (Some(tables), Some(positions)) = (tables, positions) else {
        return Ok(batch);
    };
    let keep: arrow::array::BooleanArray = (0..batch.num_rows())
        .map(|i| {
            let skipped = !positions.is_null(i)
                && replayed
                    .iter()
                    .any(|(t, seqs)| *t == tables.value(i) && seqs.binary_search(&positions.value(i)).is_ok());
            Some(!skipped)
        })
        .collect();
    arrow::compute::filter_record_batch(&batch, &keep)
        .map_err(|e| Error::new(ErrorKind::Fatal, "could not filter the ledger rows").with_source(e))
}
