//! Staged loads into a SQL destination: each unit is first written to a local stage (Arrow IPC
//! files and a manifest per unit, fsynced; the manifest's rename is the commit), so a stream
//! moves as fast as the disk takes it; every `every_ms` the pending units are loaded in one
//! transaction of the destination, merged (`coalesce.rs`: one COPY per table, the last change
//! per key), with the stamp of the last unit, and then removed from the stage. The stamp also
//! names that unit's number, so units a crash left in the stage after they were loaded are
//! dropped on resume instead of loaded twice. A stop loads what is pending.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sluice_core::{CopyPhase, Delivery, Destination, Error, ErrorKind, Result, Stamp, SyncMode};

use super::coalesce::coalesce;
use crate::local_files::{io_error, read_ipc, remove, write_ipc, write_json};
use crate::stream::StageConfig;

/// A unit in the stage, as its manifest records it.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Manifest {
    seq: u64,
    /// The unit's stamp text (its checkpoint and push keys).
    stamp: String,
    /// When it was staged (microseconds since the epoch).
    staged_us: i64,
    deliveries: Vec<Staged>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Staged {
    sync: String,
    table: Option<String>,
    mode: SyncMode,
    keys: Vec<String>,
    rows: String,
    row_count: u64,
    deletes: Option<String>,
    #[serde(default)]
    copy: Option<CopyPhase>,
    #[serde(default)]
    keep: Vec<String>,
    #[serde(default)]
    multiset: bool,
}

/// What the destination keeps as the stamp of a staged stream.
#[derive(Serialize, Deserialize)]
struct Loaded {
    /// The last unit loaded.
    staged_seq: u64,
    /// Its stamp.
    stamp: String,
}

/// A SQL destination behind a local stage. Writes only touch the stage; a loader task owns
/// the loads, so staging and loading run side by side.
pub struct StagedDestination {
    shared: Arc<Shared>,
}

struct Shared {
    /// The destination; held for a whole load, so loads never overlap.
    inner: tokio::sync::Mutex<Box<dyn Destination>>,
    owner: String,
    dir: PathBuf,
    config: StageConfig,
    state: std::sync::Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Pending units, in order; `None` until the destination was asked what it loaded.
    pending: Option<Vec<Manifest>>,
    next_seq: u64,
    last_load_ms: f64,
}

impl StagedDestination {
    /// `inner`, the destination of stream `owner`, behind the stage in `dir` (a folder of its
    /// own). Must run inside the runtime: the loader task starts here and ends with the value.
    pub fn new(inner: Box<dyn Destination>, owner: &str, dir: &Path, config: StageConfig) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| io_error("create", dir, e))?;
        let shared = Arc::new(Shared {
            inner: tokio::sync::Mutex::new(inner),
            owner: owner.to_string(),
            dir: dir.to_path_buf(),
            config,
            state: std::sync::Mutex::new(State::default()),
        });
        tokio::spawn(loader(Arc::downgrade(&shared)));
        Ok(Self { shared })
    }
}

/// Every `every_ms`, load what is pending, until the destination is dropped.
async fn loader(shared: Weak<Shared>) {
    let every = shared.upgrade().map_or(1000, |s| s.config.every_ms);
    let mut interval = tokio::time::interval(Duration::from_millis(every));
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        let Some(shared) = shared.upgrade() else { return };
        if shared.known_pending().is_some_and(|p| p.is_empty()) {
            continue;
        }
        if let Err(e) = shared.load().await {
            tracing::warn!(stream = %shared.owner, error = %e, "Staged load failed; the rows stay staged and load later.");
        }
    }
}

impl Shared {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The pending units, if they were read yet.
    fn known_pending(&self) -> Option<Vec<Manifest>> {
        self.state().pending.clone()
    }

    /// The pending units: read from the stage once, after asking the destination which unit
    /// it loaded last (those up to it are removed), dropping the files of a unit cut short.
    async fn pending(&self, inner: &mut Box<dyn Destination>) -> Result<Vec<Manifest>> {
        if let Some(pending) = self.known_pending() {
            return Ok(pending);
        }
        let loaded = match inner.stamp(&self.owner).await? {
            Some(text) => serde_json::from_str::<Loaded>(&text).map_or(0, |l| l.staged_seq),
            None => 0,
        };
        let mut manifests = Vec::new();
        let mut named = std::collections::HashSet::new();
        let mut files = Vec::new();
        for entry in std::fs::read_dir(&self.dir).map_err(|e| io_error("list", &self.dir, e))? {
            let path = entry.map_err(|e| io_error("list", &self.dir, e))?.path();
            if path.extension().is_some_and(|e| e == "json") {
                let bytes = std::fs::read(&path).map_err(|e| io_error("read", &path, e))?;
                let manifest: Manifest = serde_json::from_slice(&bytes).map_err(|e| {
                    Error::new(ErrorKind::Fatal, format!("stage: {} is unreadable", path.display())).with_source(e)
                })?;
                if manifest.seq <= loaded {
                    self.remove(&manifest)?;
                    continue;
                }
                for d in &manifest.deliveries {
                    named.insert(d.rows.clone());
                    named.extend(d.deletes.clone());
                }
                manifests.push(manifest);
            } else {
                files.push(path);
            }
        }
        for path in files {
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            // A part no manifest names: a unit cut short (or one just removed as loaded).
            if !named.contains(&name) {
                remove(&path)?;
            }
        }
        manifests.sort_by_key(|m| m.seq);
        let mut state = self.state();
        state.next_seq = manifests.last().map_or(loaded, |m| m.seq) + 1;
        state.pending = Some(manifests.clone());
        Ok(manifests)
    }

    fn remove(&self, manifest: &Manifest) -> Result<()> {
        let mut paths: Vec<PathBuf> = vec![self.dir.join(format!("{:012}.json", manifest.seq))];
        for d in &manifest.deliveries {
            paths.push(self.dir.join(&d.rows));
            paths.extend(d.deletes.as_ref().map(|n| self.dir.join(n)));
        }
        paths.iter().try_for_each(|path| remove(path))
    }

    /// Write one unit to the stage: its batches, then its manifest (renamed into place).
    fn stage(&self, seq: u64, deliveries: &[Delivery], stamp: &Stamp) -> Result<Manifest> {
        let mut staged = Vec::with_capacity(deliveries.len());
        for (i, d) in deliveries.iter().enumerate() {
            let rows = format!("{seq:012}-{i}-rows.arrow");
            write_ipc(&self.dir.join(&rows), &d.schema, &d.rows)?;
            let deletes = match d.deletes.first() {
                Some(first) => {
                    let name = format!("{seq:012}-{i}-deletes.arrow");
                    write_ipc(&self.dir.join(&name), &first.schema(), &d.deletes)?;
                    Some(name)
                }
                None => None,
            };
            staged.push(Staged {
                sync: d.sync.clone(),
                table: d.table.clone(),
                mode: d.mode,
                keys: d.keys.clone(),
                rows,
                row_count: (d.row_count() + d.delete_count()) as u64,
                deletes,
                copy: d.copy,
                keep: d.keep.clone(),
                multiset: d.multiset,
            });
        }
        let manifest = Manifest {
            seq,
            stamp: stamp.checkpoint.clone(),
            staged_us: chrono::Utc::now().timestamp_micros(),
            deliveries: staged,
        };
        write_json(&self.dir, &format!("{seq:012}.json"), &manifest)?;
        Ok(manifest)
    }

    fn deliveries_of(&self, manifest: &Manifest) -> Result<Vec<Delivery>> {
        manifest
            .deliveries
            .iter()
            .map(|d| {
                let (schema, rows) = read_ipc(&self.dir.join(&d.rows))?;
                let deletes = match &d.deletes {
                    Some(name) => read_ipc(&self.dir.join(name))?.1,
                    None => Vec::new(),
                };
                Ok(Delivery {
                    sync: d.sync.clone(),
                    run_id: String::new(),
                    mode: d.mode,
                    keys: d.keys.clone(),
                    schema,
                    rows,
                    deletes,
                    table: d.table.clone(),
                    copy: d.copy,
                    keep: d.keep.clone(),
                    multiset: d.multiset,
                })
            })
            .collect()
    }

    /// Load every pending unit in one transaction of the destination, then clear them.
    async fn load(&self) -> Result<()> {
        let mut inner = self.inner.lock().await;
        let pending = self.pending(&mut inner).await?;
        let Some(last) = pending.last() else { return Ok(()) };
        let started = Instant::now();
        let mut deliveries = Vec::new();
        for manifest in &pending {
            deliveries.extend(self.deliveries_of(manifest)?);
        }
        let deliveries = coalesce(deliveries)?;
        let loaded = Loaded { staged_seq: last.seq, stamp: last.stamp.clone() };
        let text = serde_json::to_string(&loaded)
            .map_err(|e| Error::new(ErrorKind::Fatal, "stage: cannot encode a stamp").with_source(e))?;
        inner.write(&deliveries, Some(&Stamp { owner: self.owner.clone(), checkpoint: text })).await?;
        {
            let mut state = self.state();
            if let Some(p) = state.pending.as_mut() {
                p.retain(|m| m.seq > last.seq);
            }
            state.last_load_ms = started.elapsed().as_secs_f64() * 1000.0;
        }
        for manifest in &pending {
            self.remove(manifest)?;
        }
        Ok(())
    }
}

fn pending_rows(pending: &[Manifest]) -> u64 {
    pending.iter().flat_map(|m| &m.deliveries).map(|d| d.row_count).sum()
}

#[async_trait]
impl Destination for StagedDestination {
    async fn check(&mut self) -> Result<()> {
        self.shared.inner.lock().await.check().await
    }

    async fn deliver(&mut self, delivery: &Delivery) -> Result<()> {
        self.shared.inner.lock().await.deliver(delivery).await
    }

    async fn write(&mut self, deliveries: &[Delivery], stamp: Option<&Stamp>) -> Result<()> {
        let stamp = stamp.ok_or_else(|| Error::new(ErrorKind::Fatal, "stage: a unit without a stamp"))?;
        if self.shared.known_pending().is_none() {
            let mut inner = self.shared.inner.lock().await;
            self.shared.pending(&mut inner).await?;
        }
        let seq = self.shared.state().next_seq;
        let manifest = self.shared.stage(seq, deliveries, stamp)?;
        let rows = {
            let mut state = self.shared.state();
            state.next_seq = seq + 1;
            let pending = state.pending.get_or_insert_with(Vec::new);
            pending.push(manifest);
            pending_rows(pending)
        };
        // A stage that grew past its bound loads now: the stream slows to the destination's pace.
        if rows >= self.shared.config.max_pending_rows {
            self.shared.load().await?;
        }
        Ok(())
    }

    async fn keys(&mut self, table: &str) -> Result<Option<Vec<String>>> {
        self.shared.inner.lock().await.keys(table).await
    }

    async fn table_schema(&mut self, table: &str) -> Result<Option<sluice_core::schema::TableSchema>> {
        self.shared.inner.lock().await.table_schema(table).await
    }

    async fn stamp(&mut self, _owner: &str) -> Result<Option<String>> {
        let mut inner = self.shared.inner.lock().await;
        if let Some(last) = self.shared.pending(&mut inner).await?.last() {
            return Ok(Some(last.stamp.clone()));
        }
        let stamp = inner.stamp(&self.shared.owner).await?;
        Ok(stamp.map(|text| serde_json::from_str::<Loaded>(&text).map_or(text, |l| l.stamp)))
    }

    fn gauges(&self) -> Vec<(&'static str, f64)> {
        let state = self.shared.state();
        let pending = state.pending.as_deref().unwrap_or_default();
        let now = chrono::Utc::now().timestamp_micros();
        let oldest = pending.iter().map(|m| m.staged_us).min();
        vec![
            ("pending_rows", pending_rows(pending) as f64),
            ("pending_seconds", oldest.map_or(0.0, |us| (now - us).max(0) as f64 / 1e6)),
            ("last_load_ms", state.last_load_ms),
        ]
    }

    async fn finish(&mut self) -> Result<()> {
        self.shared.load().await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use arrow::array::Int64Array;

    use super::*;
    use crate::test_rows::unit;

    /// What the in-memory destination holds: ids written, its stamp, writes.
    type Held = (Vec<i64>, Option<String>, usize);

    /// A destination that keeps what it was written in memory, shared across openings.
    #[derive(Clone, Default)]
    struct Memory(Arc<Mutex<Held>>);

    #[async_trait]
    impl Destination for Memory {
        async fn check(&mut self) -> Result<()> {
            Ok(())
        }

        async fn deliver(&mut self, _: &Delivery) -> Result<()> {
            Ok(())
        }

        async fn write(&mut self, deliveries: &[Delivery], stamp: Option<&Stamp>) -> Result<()> {
            let mut db = self.0.lock().unwrap();
            for d in deliveries {
                for b in &d.rows {
                    db.0.extend(b.column(0).as_any().downcast_ref::<Int64Array>().unwrap().values().iter());
                }
            }
            db.1 = stamp.map(|s| s.checkpoint.clone());
            db.2 += 1;
            Ok(())
        }

        async fn stamp(&mut self, _: &str) -> Result<Option<String>> {
            Ok(self.0.lock().unwrap().1.clone())
        }
    }

    fn stamp(n: u64) -> Stamp {
        Stamp { owner: "s".into(), checkpoint: format!("cp{n}") }
    }

    fn config() -> StageConfig {
        // Loads only when asked: the loader's interval is far away.
        StageConfig { every_ms: 3_600_000, max_pending_rows: 1_000_000 }
    }

    #[tokio::test]
    async fn units_load_in_one_write_and_the_stamp_follows_the_stage() {
        let dir = std::env::temp_dir().join(format!("sluice-stage-{}", rand::random::<u64>()));
        let db = Memory::default();
        let mut staged = StagedDestination::new(Box::new(db.clone()), "s", &dir, config()).unwrap();
        for n in 1..=3 {
            staged.write(&unit(&[n as i64 * 10, n as i64 * 10 + 1]), Some(&stamp(n))).await.unwrap();
        }
        assert_eq!(staged.stamp("s").await.unwrap().as_deref(), Some("cp3"), "the stage's last unit");
        assert!(db.0.lock().unwrap().0.is_empty(), "nothing loaded yet");
        staged.finish().await.unwrap();
        let (rows, _, writes) = db.0.lock().unwrap().clone();
        assert_eq!((rows, writes), (vec![10, 11, 20, 21, 30, 31], 1), "one write, one batch per table");
        assert_eq!(staged.stamp("s").await.unwrap().as_deref(), Some("cp3"), "now the destination's");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[tokio::test]
    async fn units_a_crash_left_in_the_stage_after_their_load_are_not_loaded_again() {
        let dir = std::env::temp_dir().join(format!("sluice-stage-{}", rand::random::<u64>()));
        let db = Memory::default();
        {
            let mut staged = StagedDestination::new(Box::new(db.clone()), "s", &dir, config()).unwrap();
            for n in 1..=3 {
                staged.write(&unit(&[n as i64]), Some(&stamp(n))).await.unwrap();
            }
        }
        // A load of units 1 and 2 committed, and the process died before the stage was cleared.
        {
            let mut state = db.0.lock().unwrap();
            state.0 = vec![1, 2];
            state.1 = Some(serde_json::to_string(&Loaded { staged_seq: 2, stamp: "cp2".into() }).unwrap());
        }
        // And a unit cut short: a part without its manifest.
        std::fs::write(dir.join("000000000004-0-rows.arrow"), b"torn").unwrap();
        let mut staged = StagedDestination::new(Box::new(db.clone()), "s", &dir, config()).unwrap();
        assert_eq!(staged.stamp("s").await.unwrap().as_deref(), Some("cp3"));
        assert!(!dir.join("000000000004-0-rows.arrow").exists(), "the torn part is gone");
        staged.write(&unit(&[4]), Some(&stamp(4))).await.unwrap();
        staged.finish().await.unwrap();
        assert_eq!(db.0.lock().unwrap().0, vec![1, 2, 3, 4], "each unit once");
        std::fs::remove_dir_all(dir).unwrap();
    }
}
