//! Small-file upkeep of a Delta table, run by its writer between writes (so it never meets the
//! stream as a second writer): small files merged into few (a commit that changes no data), a
//! log checkpoint every so often and after a merge, removed files and old commits deleted
//! once no version within the retention reads them.

use std::collections::HashSet;
use std::time::Instant;

use arrow::array::RecordBatch;
use serde::Serialize;
use serde_json::json;
use sluice_core::{Error, ErrorKind, Result};

use super::checkpoint;
use super::config::DeltaCompaction;
use super::files;
use super::log::{Action, Commit, Remove, Snapshot, now_ms};
use super::table::Table;

/// A merged file's target size.
const TARGET_BYTES: i64 = 128 << 20;
/// Commits between two checkpoints.
const CHECKPOINT_EVERY: i64 = 100;

/// A table's data files.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct FileFigures {
    /// Live data files.
    pub files: u64,
    /// Their bytes.
    pub bytes: u64,
}

impl FileFigures {
    pub(crate) fn of(snapshot: &Snapshot) -> Self {
        Self {
            files: snapshot.files.len() as u64,
            bytes: snapshot.files.values().map(|a| u64::try_from(a.size).unwrap_or(0)).sum(),
        }
    }
}

/// What one upkeep did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CompactionReport {
    /// Files before.
    pub before: FileFigures,
    /// Files after.
    pub after: FileFigures,
    /// Data files and old commits deleted from the store.
    pub removed_files: u64,
    /// The version a checkpoint was written at, if one was.
    pub checkpoint: Option<i64>,
    /// How long it took, ms.
    pub ms: u64,
}

impl Table {
    /// Merge small files when `settings.small_files` of them have gathered (or `force`), write
    /// a checkpoint when due, and delete what the retention no longer keeps.
    pub(crate) async fn upkeep(&mut self, settings: &DeltaCompaction, force: bool) -> Result<CompactionReport> {
        let started = Instant::now();
        // After this writer's own commit its snapshot is current; on demand, the log is read
        // again (another writer may have committed since).
        let snapshot = match &self.snapshot {
            Some(snapshot) if !force => snapshot.clone(),
            _ => self.current().await?.clone(),
        };
        // A table Sluice would write wrongly is not compacted or checkpointed either.
        snapshot.check_writable(&self.name)?;
        let before = FileFigures::of(&snapshot);
        let mut small: Vec<_> = snapshot
            .files
            .values()
            .filter(|a| u64::try_from(a.size).unwrap_or(0) < settings.small_file_bytes)
            .cloned()
            .collect();
        small.sort_by(|a, b| (a.modification_time, &a.path).cmp(&(b.modification_time, &b.path)));
        let due =
            if force { small.len() >= 2 } else { settings.small_files > 0 && small.len() >= settings.small_files };
        let merged = due && self.merge_small(&snapshot, &small).await?;
        let version = self.snapshot.as_ref().map_or(-1, |s| s.version);
        let mut report = CompactionReport { before, ..CompactionReport::default() };
        let last = self.snapshot.as_ref().map_or(-1, |s| s.checkpoint);
        if version >= 0 && (merged || force || version - last >= CHECKPOINT_EVERY) {
            self.checkpoint().await?;
            report.checkpoint = Some(version);
            report.removed_files += self.vacuum(settings.keep_versions_s).await?;
        }
        report.after = FileFigures::of(self.snapshot.as_ref().unwrap_or(&snapshot));
        report.ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        Ok(report)
    }

    /// Small files rewritten as files of up to [`TARGET_BYTES`], in one commit that changes no
    /// data; whether it committed.
    async fn merge_small(&mut self, snapshot: &Snapshot, small: &[super::log::Add]) -> Result<bool> {
        let Some(schema) = Table::columns(snapshot)? else { return Ok(false) };
        let mut actions = vec![Action::CommitInfo(json!({
            "timestamp": now_ms(), "operation": "OPTIMIZE", "engineInfo": concat!("sluice/", env!("CARGO_PKG_VERSION")),
            "txnId": super::log::random_id(),
        }))];
        let mut written = Vec::new();
        let mut moves = Vec::new();
        for bin in bins(small) {
            let mut batches: Vec<RecordBatch> = Vec::new();
            for add in bin {
                batches.extend(files::read(&self.log, &add.path, &schema, None).await?);
            }
            let mut add = files::write(&self.log, &schema, &batches).await?;
            add.data_change = false;
            written.push(add.path.clone());
            let old: HashSet<String> = bin.iter().map(|a| a.path.clone()).collect();
            for gone in bin {
                actions.push(Action::Remove(Remove {
                    path: gone.path.clone(),
                    deletion_timestamp: Some(now_ms()),
                    data_change: false,
                    extended_file_metadata: None,
                    size: Some(gone.size),
                }));
            }
            moves.push((old, add.path.clone()));
            actions.push(Action::Add(add));
        }
        if moves.is_empty() {
            return Ok(false);
        }
        match self.log.commit(snapshot.version + 1, &actions).await? {
            Commit::Done => {}
            Commit::Taken => {
                for path in &written {
                    let _ = self.log.delete(path).await;
                }
                self.snapshot = None;
                return Err(Error::new(
                    ErrorKind::Transient,
                    "delta: another writer committed first; compaction waits",
                ));
            }
        }
        let current = self.snapshot.as_mut().expect("read by the caller");
        current.apply(&actions);
        current.version += 1;
        if let Some(index) = &mut self.index {
            for (old, new) in &moves {
                index.move_files(old, new);
            }
        }
        Ok(true)
    }

    /// The state at the current version as a checkpoint, and `_last_checkpoint` pointing at it.
    async fn checkpoint(&mut self) -> Result<()> {
        let snapshot = self.snapshot.as_ref().expect("read by the caller");
        let version = snapshot.version;
        let bytes = checkpoint::write(snapshot)?;
        let count = snapshot.files.len() + snapshot.removed.len() + snapshot.txns.len() + 2;
        self.log.put(&format!("_delta_log/{version:020}.checkpoint.parquet"), bytes).await?;
        let pointer = json!({"version": version, "size": count}).to_string();
        self.log.put("_delta_log/_last_checkpoint", pointer.into_bytes()).await?;
        self.snapshot.as_mut().expect("read by the caller").checkpoint = version;
        Ok(())
    }

    /// Delete what no version within `keep_s` reads: removed data files older than that, data
    /// files no commit lists (an abandoned write's) older than that, and the commits and
    /// checkpoints before the newest checkpoint that is older than that (the protocol's
    /// metadata cleanup: every version since that checkpoint can still be rebuilt). How many
    /// went.
    async fn vacuum(&mut self, keep_s: u64) -> Result<u64> {
        let cutoff = now_ms() - i64::try_from(keep_s.saturating_mul(1000)).unwrap_or(i64::MAX);
        let snapshot = self.snapshot.as_mut().expect("read by the caller");
        let expired: Vec<String> =
            snapshot.removed.iter().filter(|(_, at)| **at < cutoff).map(|(p, _)| p.clone()).collect();
        let mut removed = 0;
        for path in expired {
            self.log.delete(&path).await?;
            self.snapshot.as_mut().expect("read by the caller").removed.remove(&path);
            removed += 1;
        }
        let snapshot = self.snapshot.as_ref().expect("read by the caller");
        let root = self.log.path("");
        let listed = self.log.store().list_with_delimiter(Some(&root)).await.map_err(super::log::store_error)?;
        for meta in listed.objects {
            let Some(name) = meta.location.filename() else { continue };
            let orphan = name.starts_with("part-")
                && name.ends_with(".parquet")
                && !snapshot.files.contains_key(name)
                && !snapshot.removed.contains_key(name);
            if orphan && meta.last_modified.timestamp_millis() < cutoff {
                self.log.delete(name).await?;
                removed += 1;
            }
        }
        let logs = self.log.path("_delta_log");
        let listed = self.log.store().list_with_delimiter(Some(&logs)).await.map_err(super::log::store_error)?;
        // (version, is a checkpoint, name, modified)
        let entries: Vec<(i64, bool, String, i64)> = listed
            .objects
            .iter()
            .filter_map(|meta| {
                let name = meta.location.filename()?.to_string();
                let (digits, rest) = name.split_once('.')?;
                let version = digits.parse::<i64>().ok().filter(|_| digits.len() == 20)?;
                let checkpoint = rest == "checkpoint.parquet";
                (checkpoint || rest == "json")
                    .then(|| (version, checkpoint, name, meta.last_modified.timestamp_millis()))
            })
            .collect();
        let keep_from = entries.iter().filter(|e| e.1 && e.3 <= cutoff).map(|e| e.0).max();
        if let Some(keep_from) = keep_from {
            for (version, _, name, _) in entries.iter().filter(|e| e.0 < keep_from) {
                let _ = version;
                self.log.delete(&format!("_delta_log/{name}")).await?;
                removed += 1;
            }
        }
        Ok(removed)
    }
}

/// Consecutive small files in groups of up to [`TARGET_BYTES`]; a group of one is left alone.
fn bins(small: &[super::log::Add]) -> Vec<&[super::log::Add]> {
    let mut bins = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, add) in small.iter().enumerate() {
        if bytes + add.size > TARGET_BYTES && i > start {
            bins.push(&small[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += add.size;
    }
    bins.push(&small[start..]);
    bins.retain(|b| b.len() > 1);
    bins
}
