//! Runs that wait for approval: an agent's run request is recorded in `sluice.sync_runs` with
//! status `awaiting_approval` and sends nothing until an editor approves it (it becomes
//! `running`, from then on an ordinary run) or rejects it (`rejected`, ended). The status moves
//! with a conditional update, so of two approvals at once only one starts the run.

use duckdb::params;
use sluice_core::Result;

use super::db::db_error;
use super::registry::Registry;
use super::runs::RunRecord;

/// The status of a run waiting for approval.
pub const AWAITING_APPROVAL: &str = "awaiting_approval";

impl Registry {
    /// Record a run that waits for approval.
    pub async fn run_requested(&self, run: RunRecord) -> Result<()> {
        self.db
            .run(move |c| {
                c.execute(
                    "INSERT INTO sluice.sync_runs (id, sync, \"trigger\", status, started_at) \
                     VALUES (?, ?, ?, ?, ?::TIMESTAMPTZ)",
                    params![run.id, run.sync, run.trigger, AWAITING_APPROVAL, run.started_at],
                )
                .map_err(db_error)?;
                Ok(())
            })
            .await
    }

    /// Move a waiting run to `running` (its start time is now); `false` when it was not waiting.
    pub async fn run_approved(&self, id: String) -> Result<bool> {
        self.db
            .run(move |c| {
                let changed = c
                    .execute(
                        "UPDATE sluice.sync_runs SET status = 'running', started_at = now() WHERE id = ? AND status = ?",
                        params![id, AWAITING_APPROVAL],
                    )
                    .map_err(db_error)?;
                Ok(changed > 0)
            })
            .await
    }

    /// End a waiting run as `rejected`, with `reason`; `false` when it was not waiting.
    pub async fn run_rejected(&self, id: String, reason: String) -> Result<bool> {
        self.db
            .run(move |c| {
                let changed = c
                    .execute(
                        "UPDATE sluice.sync_runs SET status = 'rejected', finished_at = now(), duration_ms = 0, \
                         error = ? WHERE id = ? AND status = ?",
                        params![reason, id, AWAITING_APPROVAL],
                    )
                    .map_err(db_error)?;
                Ok(changed > 0)
            })
            .await
    }
}
