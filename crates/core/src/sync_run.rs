//! Reverse ETL's run: plan, write to the destination, and only then move the row hashes. This is
//! the one place a sync's hashes are committed, as `pipeline` is the one place a stream's
//! position is.
//!
//! A run that fails anywhere before the commit leaves the hashes where they were, so the next
//! run finds the same rows changed and sends them again.

use std::time::Instant;

use arrow::array::BooleanArray;
use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use serde::Serialize;

use crate::error::Result;
use crate::sync::{Delivery, Destination, SyncMode};

/// A sync as a run sees it: what to read and how it reaches the destination.
#[derive(Debug, Clone, PartialEq)]
pub struct SyncSpec {
    /// The sync's name.
    pub name: String,
    /// Its read-only SELECT.
    pub query: String,
    /// How the result reaches the destination.
    pub mode: SyncMode,
    /// Key columns (upsert and mirror).
    pub keys: Vec<String>,
}

/// What a run's result came to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct RunCounts {
    /// Rows in the result.
    pub total: u64,
    /// Rows whose key was not delivered before (every row for replace and append).
    pub inserted: u64,
    /// Rows whose key was delivered with other values.
    pub updated: u64,
    /// Keys deleted (mirror).
    pub deleted: u64,
    /// Milliseconds spent on change detection (hashing and comparing).
    pub detect_ms: u64,
}

impl RunCounts {
    /// Rows and deletes sent.
    pub fn sent(&self) -> u64 {
        self.inserted + self.updated + self.deleted
    }
}

/// What one run sends, and what it records once the destination accepted all of it.
#[derive(Debug, Clone)]
pub struct SyncPlan {
    /// What the destination is handed.
    pub delivery: Delivery,
    /// What the result came to.
    pub counts: RunCounts,
    /// Upsert and mirror: for each batch of `delivery.rows`, whether each row's key is new.
    pub is_new: Vec<BooleanArray>,
    /// Upsert and mirror: the key columns and row hash of each row in `delivery.rows`, which
    /// `Planner::commit` records (and it forgets the keys in `delivery.deletes`). Empty for
    /// replace and append, which keep no hashes.
    pub hashes: Vec<RecordBatch>,
}

/// Where a sync's result and row hashes live (the workspace): it computes what a run sends
/// without changing anything, and records a plan's hashes once a destination accepted it.
#[async_trait]
pub trait Planner: Send + Sync {
    /// Run the sync's query and compare each row with the stored hashes. The query's own
    /// effects never persist; at most the planner prepares where hashes are kept (creating it,
    /// or starting it afresh when the key columns changed type, so that every row is sent again).
    async fn plan(&self, sync: &SyncSpec, run_id: &str) -> Result<SyncPlan>;

    /// Replace the hashes of the rows `plan` sent and forget the keys it deleted, all or
    /// nothing. Called only after the destination accepted the whole plan.
    async fn commit(&self, sync: &SyncSpec, plan: &SyncPlan) -> Result<()>;
}

/// One run of `sync`: plan, hand the whole delivery to `destination`, and only when it
/// succeeded commit the plan's hashes. Returns what the run sent.
///
/// Any error ends the run with that error and the hashes unmoved:
/// * the plan fails: nothing was sent;
/// * the destination fails: it applied all of the delivery or none of it (database
///   destinations use one transaction), and the next run sends the same rows again;
/// * the commit fails after the destination accepted the delivery: the run is reported failed
///   with the commit's error, and the next run sends these rows again. That is safe because only
///   upsert and mirror keep hashes, and both are idempotent (an upsert of the same row leaves
///   it as it was, a delete of a gone key does nothing). Replace and append have no hashes to
///   commit; they send their whole result on every run anyway.
pub async fn run(
    planner: &dyn Planner,
    destination: &mut dyn Destination,
    sync: &SyncSpec,
    run_id: &str,
) -> Result<RunCounts> {
    let started = Instant::now();
    let plan = planner.plan(sync, run_id).await?;
    let planned = started.elapsed();
    destination.deliver(&plan.delivery).await?;
    let delivered = started.elapsed();
    // Only now, after the destination said yes, do the hashes move.
    if let Err(e) = planner.commit(sync, &plan).await {
        tracing::warn!(
            sync = %sync.name,
            run = run_id,
            error = %e,
            "The destination accepted the run but its row hashes were not recorded; the next run sends these rows again."
        );
        return Err(e);
    }
    tracing::info!(
        sync = %sync.name,
        run = run_id,
        plan_ms = planned.as_millis() as u64,
        detect_ms = plan.counts.detect_ms,
        deliver_ms = (delivered - planned).as_millis() as u64,
        commit_ms = (started.elapsed() - delivered).as_millis() as u64,
        "Sync run phases."
    );
    Ok(plan.counts)
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use arrow::array::{Int64Array, UInt64Array};
    use arrow::datatypes::{DataType, Field, Schema};

    use super::*;
    use crate::error::{Error, ErrorKind};

    /// What happened, in order, across the planner and the destination.
    type Log = Arc<Mutex<Vec<String>>>;

    struct FakePlanner {
        log: Log,
        fail_plan: bool,
        fail_commit: bool,
        /// The hashes handed to each commit.
        commits: Mutex<Vec<Vec<RecordBatch>>>,
    }

    impl FakePlanner {
        fn new(log: &Log) -> Self {
            Self { log: log.clone(), fail_plan: false, fail_commit: false, commits: Mutex::default() }
        }

        fn commits(&self) -> Vec<Vec<RecordBatch>> {
            self.commits.lock().unwrap().clone()
        }
    }

    #[async_trait]
    impl Planner for FakePlanner {
        async fn plan(&self, sync: &SyncSpec, run_id: &str) -> Result<SyncPlan> {
            self.log.lock().unwrap().push("plan".into());
            if self.fail_plan {
                return Err(Error::new(ErrorKind::Data, "the query failed"));
            }
            Ok(plan(sync, run_id))
        }

        async fn commit(&self, _sync: &SyncSpec, plan: &SyncPlan) -> Result<()> {
            self.log.lock().unwrap().push("commit".into());
            if self.fail_commit {
                return Err(Error::new(ErrorKind::Transient, "workspace write conflict"));
            }
            self.commits.lock().unwrap().push(plan.hashes.clone());
            Ok(())
        }
    }

    struct FakeDestination {
        log: Log,
        fail: bool,
        /// The deliveries it accepted.
        accepted: Vec<Delivery>,
    }

    impl FakeDestination {
        fn new(log: &Log) -> Self {
            Self { log: log.clone(), fail: false, accepted: Vec::new() }
        }
    }

    #[async_trait]
    impl Destination for FakeDestination {
        async fn check(&mut self) -> Result<()> {
            Ok(())
        }

        async fn deliver(&mut self, delivery: &Delivery) -> Result<()> {
            self.log.lock().unwrap().push("deliver".into());
            if self.fail {
                return Err(Error::new(ErrorKind::Connect, "destination unreachable"));
            }
            self.accepted.push(delivery.clone());
            Ok(())
        }
    }

    fn spec() -> SyncSpec {
        SyncSpec {
            name: "orders".into(),
            query: "SELECT id, total FROM orders".into(),
            mode: SyncMode::Mirror,
            keys: vec!["id".into()],
        }
    }

    /// Three changed rows (ids 1–3, id 1 new) and one deleted key (4).
    fn plan(sync: &SyncSpec, run_id: &str) -> SyncPlan {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("total", DataType::Int64, true),
        ]));
        let rows = RecordBatch::try_new(
            schema.clone(),
            vec![Arc::new(Int64Array::from(vec![1, 2, 3])), Arc::new(Int64Array::from(vec![10, 20, 30]))],
        )
        .unwrap();
        let key = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
        let deletes = RecordBatch::try_new(key, vec![Arc::new(Int64Array::from(vec![4]))]).unwrap();
        let hashed = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("__sluice_hash", DataType::UInt64, false),
        ]));
        let hashes = RecordBatch::try_new(
            hashed,
            vec![Arc::new(Int64Array::from(vec![1, 2, 3])), Arc::new(UInt64Array::from(vec![11, 22, 33]))],
        )
        .unwrap();
        SyncPlan {
            delivery: Delivery {
                sync: sync.name.clone(),
                run_id: run_id.into(),
                mode: sync.mode,
                keys: sync.keys.clone(),
                schema,
                rows: vec![rows],
                deletes: vec![deletes],
                table: None,
                copy: None,
                keep: Vec::new(),
                multiset: false,
            },
            counts: RunCounts { total: 5, inserted: 1, updated: 2, deleted: 1, detect_ms: 7 },
            is_new: vec![BooleanArray::from(vec![true, false, false])],
            hashes: vec![hashes],
        }
    }

    fn events(log: &Log) -> Vec<String> {
        log.lock().unwrap().clone()
    }

    #[tokio::test]
    async fn success_commits_once_after_the_write() {
        let log = Log::default();
        let (planner, mut destination) = (FakePlanner::new(&log), FakeDestination::new(&log));
        let counts = run(&planner, &mut destination, &spec(), "run_1").await.unwrap();

        assert_eq!(events(&log), ["plan", "deliver", "commit"]);
        assert_eq!(destination.accepted.len(), 1);
        let delivered = &destination.accepted[0];
        assert_eq!((delivered.sync.as_str(), delivered.run_id.as_str()), ("orders", "run_1"));
        assert_eq!((delivered.row_count(), delivered.delete_count()), (3, 1));
        // The hashes committed are those of the rows delivered.
        let commits = planner.commits();
        assert_eq!(commits.len(), 1);
        assert_eq!(commits[0], plan(&spec(), "run_1").hashes);
        assert_eq!(counts, RunCounts { total: 5, inserted: 1, updated: 2, deleted: 1, detect_ms: 7 });
        assert_eq!(counts.sent(), 4);
    }

    #[tokio::test]
    async fn a_failed_write_leaves_the_hashes_unmoved() {
        let log = Log::default();
        let planner = FakePlanner::new(&log);
        let mut destination = FakeDestination { fail: true, ..FakeDestination::new(&log) };
        let error = run(&planner, &mut destination, &spec(), "run_1").await.unwrap_err();

        assert_eq!(error.kind(), ErrorKind::Connect);
        assert_eq!(error.message(), "destination unreachable");
        assert_eq!(events(&log), ["plan", "deliver"]);
        assert!(planner.commits().is_empty());

        // The next run, with the destination back, sends the same rows and only then commits.
        destination.fail = false;
        let counts = run(&planner, &mut destination, &spec(), "run_2").await.unwrap();
        assert_eq!(counts.sent(), 4);
        assert_eq!(destination.accepted.len(), 1);
        assert_eq!(destination.accepted[0].row_count(), 3);
        assert_eq!(planner.commits().len(), 1);
    }

    #[tokio::test]
    async fn a_failed_plan_sends_nothing() {
        let log = Log::default();
        let planner = FakePlanner { fail_plan: true, ..FakePlanner::new(&log) };
        let mut destination = FakeDestination::new(&log);
        let error = run(&planner, &mut destination, &spec(), "run_1").await.unwrap_err();

        assert_eq!(error.kind(), ErrorKind::Data);
        assert_eq!(events(&log), ["plan"]);
        assert!(destination.accepted.is_empty());
        assert!(planner.commits().is_empty());
    }

    #[tokio::test]
    async fn a_failed_commit_after_the_write_is_reported() {
        let log = Log::default();
        let planner = FakePlanner { fail_commit: true, ..FakePlanner::new(&log) };
        let mut destination = FakeDestination::new(&log);
        let error = run(&planner, &mut destination, &spec(), "run_1").await.unwrap_err();

        // The run fails with the commit's error, though the destination holds the rows: the
        // hashes did not move, so the next run sends them again (idempotent for keyed modes).
        assert_eq!(error.kind(), ErrorKind::Transient);
        assert_eq!(error.message(), "workspace write conflict");
        assert_eq!(events(&log), ["plan", "deliver", "commit"]);
        assert_eq!(destination.accepted.len(), 1);
        assert!(planner.commits().is_empty());
    }
}
