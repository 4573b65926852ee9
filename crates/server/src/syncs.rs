//! Reverse ETL syncs: the registry, runs (by hand, from the API, on a schedule), and preview.
//!
//! A run is `sluice_core::sync_run::run` with the workspace's `SyncPlanner` as its `Planner`:
//! compute the plan (the read-only SELECT and change detection), hand it to the destination, and
//! only when the destination reports success replace the row hashes; then the run is recorded as
//! succeeded.
//! A run that fails leaves the hashes alone, so the next run sends the same rows again.

use crate::connections::Connections;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Value;
use sluice_connectors::workspace::{Registry, RunRecord, StoredSync, SyncPlanner};
use sluice_connectors::{SyncConfig, build_destination};
use sluice_core::{Error, ErrorKind, Planner, Result, RunCounts, SyncSpec, sync_run};
use tokio::sync::{Mutex, RwLock};
use tokio_util::sync::CancellationToken;

/// One registered sync.
pub struct SyncEntry {
    /// Its config, secrets included (never serialized).
    pub config: SyncConfig,
    /// Held by a run, and by a change of the config (which waits for the run to end).
    running: Arc<Mutex<()>>,
    schedule: CancellationToken,
}

/// All syncs of this server.
#[derive(Clone)]
pub struct Syncs {
    registry: Registry,
    planner: SyncPlanner,
    connections: Connections,
    entries: Arc<RwLock<HashMap<String, Arc<SyncEntry>>>>,
    /// Where runs starting and ending are told (the page's activity feed).
    activity: crate::feed::Activity,
}

/// What a preview shows: counts, and a sample of each kind of change.
#[derive(Debug, Serialize)]
pub struct Preview {
    /// Rows in the result.
    pub total: u64,
    /// Rows that would be inserted.
    pub inserted: u64,
    /// Rows that would be updated.
    pub updated: u64,
    /// Keys that would be deleted.
    pub deleted: u64,
    /// Up to `sample` rows of each kind, each with `_op`.
    pub sample: Vec<serde_json::Map<String, Value>>,
    /// Milliseconds of change detection.
    pub detect_ms: u64,
}

impl Syncs {
    /// The syncs of a workspace's `registry`, planned by its `planner` (none loaded yet).
    pub fn new(registry: Registry, planner: SyncPlanner, connections: Connections) -> Self {
        Self { registry, planner, connections, entries: Arc::default(), activity: crate::feed::Activity::default() }
    }

    /// The named connections syncs' destinations may use.
    pub fn connections(&self) -> &Connections {
        &self.connections
    }

    /// Tell runs starting and ending to `activity`.
    pub fn with_activity(mut self, activity: crate::feed::Activity) -> Self {
        self.activity = activity;
        self
    }

    /// Load the stored syncs and start their schedules. Runs left `running` by a process that
    /// died are marked failed: their hashes were never replaced, so the next run resends.
    pub async fn load_stored(&self) -> Result<()> {
        self.registry.runs_interrupted().await?;
        for mut stored in self.registry.syncs().await? {
            // A connection that is gone keeps its sync from loading, not the server.
            if let Err(e) = self.connections.fill(&mut stored.config) {
                tracing::error!(sync = %stored.name, error = %e, "Stored sync did not load.");
                continue;
            }
            let mut config: SyncConfig = match serde_json::from_value(stored.config) {
                Ok(config) => config,
                Err(e) => {
                    tracing::error!(sync = %stored.name, error = %e, "Stored sync is unreadable; it did not load.");
                    continue;
                }
            };
            config.restore_secrets(&stored.secrets);
            self.install(config, Arc::default()).await;
        }
        Ok(())
    }

    /// Store a sync (created or replaced) after checking its query and destination.
    pub async fn save(&self, config: SyncConfig) -> Result<()> {
        self.save_checked(config, false).await
    }

    /// Store a sync declared in the config file. A destination that cannot be reached yet
    /// does not stop the server from starting: it is logged, and each run reports it.
    pub async fn save_declared(&self, config: SyncConfig) -> Result<()> {
        self.save_checked(config, true).await
    }

    async fn save_checked(&self, config: SyncConfig, unreachable_ok: bool) -> Result<()> {
        config.validate()?;
        self.planner.check_query(&config.query).await?;
        match build_destination(&config.destination)?.check().await {
            Err(e) if unreachable_ok && e.is_retryable() => {
                tracing::warn!(sync = %config.name, error = %e, "The sync's destination cannot be reached yet.");
            }
            other => other?,
        }
        let mut stored = serde_json::to_value(&config)
            .map_err(|e| Error::new(ErrorKind::Fatal, "cannot store the sync").with_source(e))?;
        // What a named connection gave is filled in again at each load, not stored.
        let mut secrets = config.secrets();
        self.connections.strip(&mut stored, &mut secrets);
        let previous = self.get(&config.name).await;
        // A run in progress ends before its config (and its hashes) change; the next run
        // takes the same lock.
        let running = previous.as_ref().map(|p| p.running.clone()).unwrap_or_default();
        let _no_run = running.clone().lock_owned().await;
        self.registry.save_sync(StoredSync { name: config.name.clone(), config: stored, secrets }).await?;
        // A different query, keys or destination makes the old hashes meaningless; a changed
        // password (compared without secrets) does not, or an append sync would send its
        // rows again.
        let visible = |d: &sluice_connectors::DestinationConfig| serde_json::to_value(d).ok();
        if let Some(previous) = previous
            && (previous.config.query != config.query
                || previous.config.keys != config.keys
                || visible(&previous.config.destination) != visible(&config.destination))
        {
            self.planner.reset(&config.name).await?;
        }
        self.install(config, running).await;
        Ok(())
    }

    async fn install(&self, config: SyncConfig, running: Arc<Mutex<()>>) {
        let entry = Arc::new(SyncEntry { config, running, schedule: CancellationToken::new() });
        if entry.config.schedule.is_some() {
            tokio::spawn(schedule_loop(self.clone(), entry.clone()));
        }
        if let Some(old) = self.entries.write().await.insert(entry.config.name.clone(), entry) {
            old.schedule.cancel();
        }
    }

    /// Remove a sync, its hashes and runs. `false` when there was none.
    pub async fn remove(&self, name: &str) -> Result<bool> {
        let Some(entry) = self.entries.write().await.remove(name) else { return Ok(false) };
        entry.schedule.cancel();
        // Wait for a run in progress to end before its records go.
        let _running = entry.running.lock().await;
        self.registry.delete_sync(name).await?;
        Ok(true)
    }

    /// A sync by name.
    pub async fn get(&self, name: &str) -> Option<Arc<SyncEntry>> {
        self.entries.read().await.get(name).cloned()
    }

    /// Every sync, by name.
    pub async fn list(&self) -> Vec<Arc<SyncEntry>> {
        let mut all: Vec<_> = self.entries.read().await.values().cloned().collect();
        all.sort_by(|a, b| a.config.name.cmp(&b.config.name));
        all
    }

    /// The registry: the syncs' run records.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The planner: the syncs' row hashes.
    pub fn planner(&self) -> &SyncPlanner {
        &self.planner
    }

    /// Start a run in the background and return its id at once. Runs of one sync never
    /// overlap: a second one waits for the first.
    pub async fn start(&self, name: &str, trigger: &str) -> Result<String> {
        let entry = self.get(name).await.ok_or_else(|| Error::new(ErrorKind::Config, format!("no sync '{name}'")))?;
        let record = new_run(name, trigger);
        let id = record.id.clone();
        self.registry.run_started(record.clone()).await?;
        self.launch(entry, record);
        Ok(id)
    }

    /// Start a run already recorded as `running` (one an editor approved), in the background.
    pub async fn start_recorded(&self, record: RunRecord) -> Result<()> {
        let name = &record.sync;
        let entry = self.get(name).await.ok_or_else(|| Error::new(ErrorKind::Config, format!("no sync '{name}'")))?;
        self.launch(entry, record);
        Ok(())
    }

    fn launch(&self, entry: Arc<SyncEntry>, record: RunRecord) {
        let this = self.clone();
        tokio::spawn(async move {
            let _running = entry.running.lock().await;
            this.execute(&entry.config, record).await;
        });
    }

    /// Wait until a run has ended, or `timeout` passes; the record as it then stands.
    pub async fn wait(&self, id: &str, timeout: Duration) -> Result<Option<RunRecord>> {
        let deadline = Instant::now() + timeout;
        loop {
            let record = self.registry.run(id.to_string()).await?;
            match &record {
                Some(r) if !r.finished() && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                _ => return Ok(record),
            }
        }
    }

    async fn execute(&self, config: &SyncConfig, mut record: RunRecord) {
        let run = serde_json::json!({ "run_id": record.id, "trigger": record.trigger });
        self.activity.record(
            "run_started",
            &config.name,
            format!("run {} started ({})", record.id, record.trigger),
            run,
        );
        let started = Instant::now();
        let outcome = self.deliver(config, &record.id).await;
        record.duration_ms = Some(started.elapsed().as_millis() as i64);
        match outcome {
            Ok(counts) => {
                record.status = "succeeded".into();
                record.rows_sent = Some(counts.sent() as i64);
                record.inserted = Some(counts.inserted as i64);
                record.updated = Some(counts.updated as i64);
                record.deleted = Some(counts.deleted as i64);
                record.detect_ms = Some(counts.detect_ms as i64);
                tracing::info!(sync = %config.name, run = %record.id, sent = record.rows_sent, "Sync run succeeded.");
            }
            Err(e) => {
                record.status = "failed".into();
                record.error = Some(e.to_string());
                tracing::warn!(sync = %config.name, run = %record.id, error = %e, "Sync run failed.");
            }
        }
        let message = match &record.error {
            Some(error) => format!("run {} failed: {error}", record.id),
            None => format!("run {} succeeded: {} rows sent", record.id, record.rows_sent.unwrap_or(0)),
        };
        let details =
            serde_json::json!({ "run_id": record.id, "status": record.status, "rows_sent": record.rows_sent });
        self.activity.record("run_finished", &config.name, message, details);
        if let Err(e) = self.registry.run_finished(record).await {
            tracing::error!(sync = %config.name, error = %e, "Cannot record the run's end.");
        }
    }

    /// One run: the destination is written first, and the hashes move only after it accepted
    /// the whole run (`sync_run::run`).
    async fn deliver(&self, config: &SyncConfig, run_id: &str) -> Result<RunCounts> {
        let mut destination = build_destination(&config.destination)?;
        sync_run::run(&self.planner, destination.as_mut(), &spec(config), run_id).await
    }

    /// What the next run would send, without sending anything.
    pub async fn preview(&self, name: &str, sample: usize) -> Result<Preview> {
        let entry = self.get(name).await.ok_or_else(|| Error::new(ErrorKind::Config, format!("no sync '{name}'")))?;
        let plan = self.planner.plan(&spec(&entry.config), "preview").await?;
        let delivery = &plan.delivery;
        let mut rows = Vec::new();
        let (mut inserts, mut updates) = (0, 0);
        let flags: Vec<bool> = plan.is_new.iter().flat_map(|a| a.iter().map(|v| v.unwrap_or(true))).collect();
        for (i, mut row) in json_rows(&delivery.rows, 10_000)?.into_iter().enumerate() {
            let new = flags.get(i).copied().unwrap_or(true);
            let count = if new { &mut inserts } else { &mut updates };
            if *count >= sample {
                continue;
            }
            *count += 1;
            row.insert("_op".into(), Value::String(if new { "insert" } else { "update" }.into()));
            rows.push(row);
            if inserts >= sample && updates >= sample {
                break;
            }
        }
        for (n, row) in json_rows(&delivery.deletes, sample)?.into_iter().enumerate() {
            if n >= sample {
                break;
            }
            let mut row = row;
            row.insert("_op".into(), Value::String("delete".into()));
            rows.push(row);
        }
        let counts = plan.counts;
        Ok(Preview {
            total: counts.total,
            inserted: counts.inserted,
            updated: counts.updated,
            deleted: counts.deleted,
            sample: rows,
            detect_ms: counts.detect_ms,
        })
    }

    /// Stop every schedule.
    pub async fn stop_all(&self) {
        for entry in self.entries.read().await.values() {
            entry.schedule.cancel();
        }
    }
}

/// A new run's record: `running`, started now.
pub fn new_run(sync: &str, trigger: &str) -> RunRecord {
    RunRecord {
        id: format!("run_{:016x}", rand::random::<u64>()),
        sync: sync.to_string(),
        trigger: trigger.to_string(),
        status: "running".into(),
        started_at: chrono::Utc::now().to_rfc3339(),
        finished_at: None,
        duration_ms: None,
        rows_sent: None,
        inserted: None,
        updated: None,
        deleted: None,
        detect_ms: None,
        error: None,
    }
}

/// What a run of `config` reads and how it sends it.
fn spec(config: &SyncConfig) -> SyncSpec {
    SyncSpec { name: config.name.clone(), query: config.query.clone(), mode: config.mode, keys: config.keys.clone() }
}

/// The first `limit` rows as JSON objects.
fn json_rows(
    batches: &[arrow::record_batch::RecordBatch],
    limit: usize,
) -> Result<Vec<serde_json::Map<String, Value>>> {
    let mut out = Vec::new();
    for batch in batches {
        if out.len() >= limit {
            break;
        }
        let batch = &batch.slice(0, batch.num_rows().min(limit - out.len()));
        let mut writer = arrow::json::ArrayWriter::new(Vec::new());
        writer.write(batch).map_err(|e| Error::new(ErrorKind::Fatal, "JSON").with_source(e))?;
        writer.finish().map_err(|e| Error::new(ErrorKind::Fatal, "JSON").with_source(e))?;
        let bytes = writer.into_inner();
        if !bytes.is_empty() {
            let rows: Vec<serde_json::Map<String, Value>> =
                serde_json::from_slice(&bytes).map_err(|e| Error::new(ErrorKind::Fatal, "JSON").with_source(e))?;
            out.extend(rows);
        }
    }
    Ok(out)
}

/// Fire a sync's runs on its schedule until cancelled. A tick that finds the previous run
/// still going is skipped, not queued.
async fn schedule_loop(syncs: Syncs, entry: Arc<SyncEntry>) {
    let Some(schedule) = entry.config.schedule.clone() else { return };
    let name = entry.config.name.clone();
    loop {
        let now = chrono::Utc::now();
        let next = match schedule.next_after(now) {
            Ok(next) => next,
            Err(e) => {
                tracing::error!(sync = %name, error = %e, "Schedule has no next time; it stops.");
                return;
            }
        };
        let wait = (next - now).to_std().unwrap_or_default();
        tokio::select! {
            _ = entry.schedule.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
        if entry.running.try_lock().is_err() {
            tracing::warn!(sync = %name, "Scheduled run skipped: the previous run is still going.");
            continue;
        }
        if let Err(e) = syncs.start(&name, "schedule").await {
            tracing::error!(sync = %name, error = %e, "Scheduled run did not start.");
        }
    }
}
