//! Sync run records: one row per run in `sluice.sync_runs`, written when a run starts and when
//! it ends, read for the API and metrics. Part of the [`Registry`].

use duckdb::params;
use serde::{Deserialize, Serialize};
use sluice_core::Result;

use super::db::db_error;
use super::registry::Registry;

/// One run of a sync, as recorded.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RunRecord {
    /// The run's id.
    pub id: String,
    /// The sync's name.
    pub sync: String,
    /// `manual`, `api` or `schedule`.
    pub trigger: String,
    /// `running`, `succeeded` or `failed`.
    pub status: String,
    /// When it started (RFC 3339).
    pub started_at: String,
    /// When it ended.
    pub finished_at: Option<String>,
    /// How long it took.
    pub duration_ms: Option<i64>,
    /// Rows and deletes sent.
    pub rows_sent: Option<i64>,
    /// Rows inserted (new keys; every row for replace and append).
    pub inserted: Option<i64>,
    /// Rows updated.
    pub updated: Option<i64>,
    /// Keys deleted.
    pub deleted: Option<i64>,
    /// Milliseconds of change detection.
    pub detect_ms: Option<i64>,
    /// Why it failed.
    pub error: Option<String>,
}

impl RunRecord {
    /// Whether the run has ended.
    pub fn finished(&self) -> bool {
        self.status != "running"
    }
}

const RUN_COLUMNS: &str = "id, sync, \"trigger\", status, strftime(started_at AT TIME ZONE 'UTC', '%Y-%m-%dT%H:%M:%S.%gZ'), \
    strftime(finished_at AT TIME ZONE 'UTC', '%Y-%m-%dT%H:%M:%S.%gZ'), duration_ms, rows_sent, inserted, updated, \
    deleted, detect_ms, error";

fn read_run(r: &duckdb::Row<'_>) -> duckdb::Result<RunRecord> {
    Ok(RunRecord {
        id: r.get(0)?,
        sync: r.get(1)?,
        trigger: r.get(2)?,
        status: r.get(3)?,
        started_at: r.get(4)?,
        finished_at: r.get(5)?,
        duration_ms: r.get(6)?,
        rows_sent: r.get(7)?,
        inserted: r.get(8)?,
        updated: r.get(9)?,
        deleted: r.get(10)?,
        detect_ms: r.get(11)?,
        error: r.get(12)?,
    })
}

/// Run counts and the last finished run of one sync, for metrics.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RunSummary {
    /// Runs that succeeded.
    pub succeeded: i64,
    /// Runs that failed.
    pub failed: i64,
    /// Whether the last finished run succeeded.
    pub last_ok: Option<bool>,
    /// Its duration.
    pub last_duration_ms: Option<i64>,
    /// Its rows sent.
    pub last_rows_sent: Option<i64>,
    /// When the last successful run finished (seconds since the epoch).
    pub last_success_epoch: Option<f64>,
}

impl Registry {
    /// Run counts and last runs, by sync.
    pub async fn run_summaries(&self) -> Result<std::collections::HashMap<String, RunSummary>> {
        self.db.run(|c| {
            let mut stmt = c
                .prepare(
                    "SELECT sync, count(*) FILTER (WHERE status = 'succeeded'), count(*) FILTER (WHERE status = 'failed'), \
                     arg_max(status = 'succeeded', finished_at) FILTER (WHERE finished_at IS NOT NULL), \
                     arg_max(duration_ms, finished_at) FILTER (WHERE finished_at IS NOT NULL), \
                     arg_max(rows_sent, finished_at) FILTER (WHERE finished_at IS NOT NULL), \
                     epoch(max(finished_at) FILTER (WHERE status = 'succeeded'))::DOUBLE \
                     FROM sluice.sync_runs GROUP BY sync",
                )
                .map_err(db_error)?;
            let rows = stmt
                .query_map([], |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        RunSummary {
                            succeeded: r.get(1)?,
                            failed: r.get(2)?,
                            last_ok: r.get(3)?,
                            last_duration_ms: r.get(4)?,
                            last_rows_sent: r.get(5)?,
                            last_success_epoch: r.get(6)?,
                        },
                    ))
                })
                .map_err(db_error)?;
            rows.map(|r| r.map_err(db_error)).collect()
        })
        .await
    }

    /// Record that a run started.
    pub async fn run_started(&self, run: RunRecord) -> Result<()> {
        self.db.run(move |c| {
            c.execute(
                "INSERT INTO sluice.sync_runs (id, sync, \"trigger\", status, started_at) VALUES (?, ?, ?, 'running', ?::TIMESTAMPTZ)",
                params![run.id, run.sync, run.trigger, run.started_at],
            )
            .map_err(db_error)?;
            Ok(())
        })
        .await
    }

    /// Record how a run ended.
    pub async fn run_finished(&self, run: RunRecord) -> Result<()> {
        self.db
            .run(move |c| {
                c.execute(
                    "UPDATE sluice.sync_runs SET status = ?, finished_at = now(), duration_ms = ?, rows_sent = ?, \
                 inserted = ?, updated = ?, deleted = ?, detect_ms = ?, error = ? WHERE id = ?",
                    params![
                        run.status,
                        run.duration_ms,
                        run.rows_sent,
                        run.inserted,
                        run.updated,
                        run.deleted,
                        run.detect_ms,
                        run.error,
                        run.id
                    ],
                )
                .map_err(db_error)?;
                Ok(())
            })
            .await
    }

    /// The newest runs of a sync, newest first.
    pub async fn runs(&self, sync: String, limit: usize) -> Result<Vec<RunRecord>> {
        self.db
            .run(move |c| {
                let mut stmt = c
                    .prepare(&format!(
                        "SELECT {RUN_COLUMNS} FROM sluice.sync_runs WHERE sync = ? ORDER BY started_at DESC LIMIT ?"
                    ))
                    .map_err(db_error)?;
                let rows = stmt.query_map(params![sync, limit as i64], read_run).map_err(db_error)?;
                rows.map(|r| r.map_err(db_error)).collect()
            })
            .await
    }

    /// One run by id.
    pub async fn run(&self, id: String) -> Result<Option<RunRecord>> {
        self.db
            .run(move |c| {
                let mut stmt =
                    c.prepare(&format!("SELECT {RUN_COLUMNS} FROM sluice.sync_runs WHERE id = ?")).map_err(db_error)?;
                let mut rows = stmt.query_map([id], read_run).map_err(db_error)?;
                rows.next().transpose().map_err(db_error)
            })
            .await
    }

    /// Mark runs left `running` by a process that died as failed (called at start).
    pub async fn runs_interrupted(&self) -> Result<()> {
        self.db
            .run(|c| {
                c.execute_batch(
                    "UPDATE sluice.sync_runs SET status = 'failed', finished_at = now(), \
                 error = 'interrupted: the server stopped during the run; the next run resends it' \
                 WHERE status = 'running'",
                )
                .map_err(db_error)
            })
            .await
    }
}
