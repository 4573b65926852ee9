//! Small-file upkeep of a DuckLake schema's tables ([`compact`]) and their file figures
//! ([`files`]), on the lake's one attachment in this process, in steps: each step is a DuckLake
//! commit of its own, and the stream's writes take their turns between steps.

use std::sync::Arc;
use std::time::{Duration, Instant};

use duckdb::Connection;
use serde::Serialize;
use sluice_core::{ErrorKind, Result, StreamMetrics};

use super::config::DuckLakeConfig;
use crate::lakehouse::{Lake, lake_error, literal, on_lake, shared};

/// The data and delete files of a schema's tables.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct FileFigures {
    /// Tables.
    pub tables: u64,
    /// Parquet data files.
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Delete files (a mirror's deletes).
    pub delete_files: u64,
}

/// What a compaction did.
#[derive(Debug, Clone, Serialize)]
pub struct CompactionReport {
    /// Files before.
    pub before: FileFigures,
    /// Files after.
    pub after: FileFigures,
    /// Snapshots expired.
    pub expired_snapshots: u64,
    /// Files removed from the store (no snapshot kept reads them).
    pub removed_files: u64,
    /// How long it took, ms.
    pub ms: u64,
}

/// Write inlined rows out, rewrite much-deleted files, merge adjacent small ones, expire snapshots older than
/// `compaction.keep_snapshots_s` and remove the files only they read. Each step takes the
/// lake's attachment in turn with the stream's writes, so a write waits one step at most.
pub async fn compact(config: &DuckLakeConfig) -> Result<CompactionReport> {
    let started = Instant::now();
    let lake = shared(config);
    let before = step(&lake, config, |c, cfg| figures(c, &cfg.schema)).await?;
    let schema = literal(&config.schema);
    for table in step(&lake, config, |c, cfg| tables(c, &cfg.schema)).await? {
        let table = literal(&table);
        // Small inserts DuckLake kept in its catalog (inlined data) go to a Parquet file first.
        let flush =
            format!("CALL ducklake_flush_inlined_data('lake', table_name => '{table}', schema_name => '{schema}')");
        step(&lake, config, move |c, _| rows(c, &flush)).await?;
        let threshold = config.compaction.delete_threshold;
        let rewrite = format!(
            "CALL ducklake_rewrite_data_files('lake', '{table}', schema => '{schema}', delete_threshold => {threshold})"
        );
        step(&lake, config, move |c, _| rows(c, &rewrite)).await?;
        let merge = format!("CALL ducklake_merge_adjacent_files('lake', '{table}', schema => '{schema}')");
        step(&lake, config, move |c, _| rows(c, &merge)).await?;
    }
    let keep = config.compaction.keep_snapshots_s;
    let expired = step(&lake, config, move |c, _| expire_older(c, keep)).await?;
    let removed =
        step(&lake, config, |c, _| rows(c, "CALL ducklake_cleanup_old_files('lake', cleanup_all => true)")).await?;
    let after = step(&lake, config, |c, cfg| figures(c, &cfg.schema)).await?;
    Ok(CompactionReport {
        before,
        after,
        expired_snapshots: expired,
        removed_files: removed,
        ms: started.elapsed().as_millis() as u64,
    })
}

/// The data and delete files of the schema's tables now.
pub async fn files(config: &DuckLakeConfig) -> Result<FileFigures> {
    step(&shared(config), config, |c, cfg| figures(c, &cfg.schema)).await
}

/// One step on the lake, again while it meets another writer of the catalog (another process:
/// a SQLite catalog has one writer at a time, a commit can lose to another), for up to half a
/// minute.
async fn step<T, F>(lake: &Lake, config: &DuckLakeConfig, work: F) -> Result<T>
where
    T: Send + 'static,
    F: Fn(&Connection, &DuckLakeConfig) -> Result<T> + Send + Sync + 'static,
{
    let work = Arc::new(work);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut wait = Duration::from_millis(50);
    loop {
        let attempt = work.clone();
        match on_lake(lake, config, move |c, cfg| attempt(c, cfg)).await {
            Err(e) if e.kind() == ErrorKind::Transient && Instant::now() < deadline => {
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(1));
            }
            other => return other,
        }
    }
}

/// Compact every `compaction.every_s` and put the schema's file figures in `metrics` at least
/// every minute, while `alive` says the stream runs. Failures are logged and tried again.
pub async fn upkeep(stream: String, config: DuckLakeConfig, metrics: Arc<StreamMetrics>, alive: impl Fn() -> bool) {
    let every = Duration::from_secs(config.compaction.every_s);
    let mut last = Instant::now();
    let period = if every.is_zero() { 60 } else { config.compaction.every_s.clamp(1, 60) };
    // The first figures a period after the start, not beside the writer's first attach (two
    // first attaches of a new SQLite catalog collide).
    let first = tokio::time::Instant::now() + Duration::from_secs(period);
    let mut tick = tokio::time::interval_at(first, Duration::from_secs(period));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if !alive() {
            return;
        }
        if !every.is_zero() && last.elapsed() >= every {
            last = Instant::now();
            match compact(&config).await {
                Ok(report) => {
                    record(&metrics, &report);
                    continue;
                }
                Err(e) => {
                    tracing::warn!(stream = %stream, error = %e, "DuckLake compaction failed; it runs again later.")
                }
            }
        }
        match files(&config).await {
            Ok(f) => set_files(&metrics, f),
            Err(e) => tracing::debug!(stream = %stream, error = %e, "DuckLake file figures not read."),
        }
    }
}

/// A compaction's figures into the stream's metrics.
pub fn record(metrics: &StreamMetrics, report: &CompactionReport) {
    set_files(metrics, report.after);
    metrics.add_destination("compactions", 1.0);
    metrics.set_destination("compaction_ms", report.ms as f64);
    metrics.add_destination("files_compacted", report.before.files.saturating_sub(report.after.files) as f64);
}

fn set_files(metrics: &StreamMetrics, f: FileFigures) {
    metrics.set_destination("files", f.files as f64);
    metrics.set_destination("file_bytes", f.bytes as f64);
    metrics.set_destination("delete_files", f.delete_files as f64);
    metrics.set_destination("avg_file_bytes", if f.files == 0 { 0.0 } else { f.bytes as f64 / f.files as f64 });
}

fn tables(conn: &Connection, schema: &str) -> Result<Vec<String>> {
    let mut statement = conn
        .prepare("SELECT table_name FROM duckdb_tables() WHERE database_name = 'lake' AND schema_name = ?")
        .map_err(lake_error)?;
    let rows = statement.query_map([schema], |row| row.get::<_, String>(0)).map_err(lake_error)?;
    rows.collect::<std::result::Result<_, _>>().map_err(lake_error)
}

fn figures(conn: &Connection, schema: &str) -> Result<FileFigures> {
    let sql = "SELECT count(*), coalesce(sum(i.file_count), 0), coalesce(sum(i.file_size_bytes), 0), \
               coalesce(sum(i.delete_file_count), 0) FROM ducklake_table_info('lake') i \
               JOIN duckdb_tables() t ON t.database_name = 'lake' AND t.schema_name = ? AND t.table_name = i.table_name";
    conn.query_row(sql, [schema], |row| {
        Ok(FileFigures {
            tables: row.get::<_, i64>(0)? as u64,
            files: row.get::<_, i64>(1)? as u64,
            bytes: row.get::<_, i64>(2)? as u64,
            delete_files: row.get::<_, i64>(3)? as u64,
        })
    })
    .map_err(lake_error)
}

/// Expire the snapshots older than `keep_s` seconds (DuckLake never expires the newest). The
/// ids are picked here, by DuckDB comparing timestamps: DuckLake 1.5's own `older_than` compares
/// a SQLite catalog's `snapshot_time` as text (`2026-12-07 18:53:09+00` sorts before
/// `2026-12-07T17:53:09+00`), and so expired every snapshot of the cutoff's day but the newest.
fn expire_older(conn: &Connection, keep_s: u64) -> Result<u64> {
    let old = format!(
        "SELECT snapshot_id FROM ducklake_snapshots('lake') \
         WHERE snapshot_time < now() - INTERVAL '{keep_s} seconds' \
         AND snapshot_id < (SELECT max(snapshot_id) FROM ducklake_snapshots('lake')) ORDER BY snapshot_id"
    );
    let ids: Vec<i64> = {
        let mut statement = conn.prepare(&old).map_err(lake_error)?;
        let ids = statement.query_map([], |r| r.get(0)).map_err(lake_error)?;
        ids.collect::<std::result::Result<_, _>>().map_err(lake_error)?
    };
    // `versions => []` is an SQL error in DuckLake 1.5.
    if ids.is_empty() {
        return Ok(0);
    }
    let list = ids.iter().map(i64::to_string).collect::<Vec<_>>().join(", ");
    rows(conn, &format!("CALL ducklake_expire_snapshots('lake', versions => [{list}])"))
}

/// Rows a `CALL` answers.
fn rows(conn: &Connection, sql: &str) -> Result<u64> {
    // In a transaction of its own, read to the end before it commits (DuckLake does not scan
    // after its transaction ended).
    conn.execute_batch("BEGIN TRANSACTION").map_err(lake_error)?;
    let counted = (|| {
        let mut statement = conn.prepare(sql).map_err(lake_error)?;
        let mut rows = statement.query([]).map_err(lake_error)?;
        let mut n = 0;
        while rows.next().map_err(lake_error)?.is_some() {
            n += 1;
        }
        Ok(n)
    })();
    match counted {
        Ok(n) => conn.execute_batch("COMMIT").map(|()| n).map_err(lake_error),
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}
