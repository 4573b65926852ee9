//! Agents' run requests. A token with the `agent` role that asks for a sync run gets a run
//! recorded as `awaiting_approval`, which sends nothing. An editor's approval turns it into a
//! running run (the same id, so whoever polls `GET /api/runs/:id` follows it); a rejection ends
//! it as `rejected`. Waiting runs survive a restart.

use sluice_connectors::workspace::{AWAITING_APPROVAL, RunRecord};
use sluice_core::{Error, ErrorKind, Result};

use crate::syncs::{Syncs, new_run};

/// What became of an approval or a rejection.
pub enum Decision {
    /// Done; the run as it now stands.
    Done(Box<RunRecord>),
    /// No such run.
    Missing,
    /// The run is not waiting for approval (its status is given).
    NotWaiting(String),
}

/// Record a run of sync `name` requested by agent `agent`, waiting for approval.
pub async fn request(syncs: &Syncs, name: &str, agent: &str) -> Result<RunRecord> {
    let mut record = new_run(name, "agent");
    record.status = AWAITING_APPROVAL.to_string();
    syncs.registry().run_requested(record.clone()).await?;
    tracing::info!(sync = %name, run = %record.id, agent = %agent, "Run requested; it waits for approval.");
    Ok(record)
}

/// Approve a waiting run: it starts now.
pub async fn approve(syncs: &Syncs, id: &str, by: &str) -> Result<Decision> {
    let Some(record) = syncs.registry().run(id.to_string()).await? else { return Ok(Decision::Missing) };
    if syncs.get(&record.sync).await.is_none() {
        return Err(Error::new(
            ErrorKind::Config,
            format!("the sync '{}' of run '{id}' no longer exists", record.sync),
        ));
    }
    if !syncs.registry().run_approved(id.to_string()).await? {
        return Ok(Decision::NotWaiting(record.status));
    }
    let Some(record) = syncs.registry().run(id.to_string()).await? else { return Ok(Decision::Missing) };
    tracing::info!(sync = %record.sync, run = %id, by = %by, "Run approved.");
    syncs.start_recorded(record.clone()).await?;
    Ok(Decision::Done(Box::new(record)))
}

/// Reject a waiting run: it ends as `rejected` and never sends anything.
pub async fn reject(syncs: &Syncs, id: &str, by: &str) -> Result<Decision> {
    let Some(record) = syncs.registry().run(id.to_string()).await? else { return Ok(Decision::Missing) };
    if !syncs.registry().run_rejected(id.to_string(), format!("rejected by {by}")).await? {
        return Ok(Decision::NotWaiting(record.status));
    }
    tracing::info!(sync = %record.sync, run = %id, by = %by, "Run rejected.");
    let record = syncs.registry().run(id.to_string()).await?;
    Ok(record.map_or(Decision::Missing, |r| Decision::Done(Box::new(r))))
}
