//! The Delta destination: each write is one commit per table with the stream's position in it
//! (a stream writes one table, so its rows and position land together), tables shared by every
//! writer of them in this process so they take turns, and their upkeep between writes.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, LazyLock, Weak};

use async_trait::async_trait;
use object_store::PutPayload;
use object_store::path::Path as StorePath;
use sluice_core::schema::TableSchema;
use sluice_core::{Delivery, Destination, Error, ErrorKind, Result, Stamp};
use tokio::sync::Mutex;

use super::compact::{CompactionReport, FileFigures};
use super::config::{DeltaConfig, check_name};
use super::log::{Log, store_error};
use super::schema::table_schema;
use super::table::Table;

/// A table, shared by its writers in this process.
pub(crate) type Shared = Arc<Mutex<Table>>;

/// The table `name` under `config`'s location: one per process, made on first use.
pub(crate) fn shared(config: &DeltaConfig, name: &str) -> Result<Shared> {
    type Tables = std::sync::Mutex<HashMap<String, Weak<Mutex<Table>>>>;
    static TABLES: LazyLock<Tables> = LazyLock::new(Tables::default);
    check_name("table", name)?;
    let key = format!("{}\u{0}{name}", config.location.trim_end_matches('/'));
    let mut tables = TABLES.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    tables.retain(|_, t| t.strong_count() > 0);
    if let Some(table) = tables.get(&key).and_then(Weak::upgrade) {
        return Ok(table);
    }
    let (store, prefix) = config.store()?;
    let root = if prefix.is_empty() { name.to_string() } else { format!("{prefix}/{name}") };
    let table = Arc::new(Mutex::new(Table::new(name.to_string(), Log::new(store, root))));
    tables.insert(key, Arc::downgrade(&table));
    Ok(table)
}

/// Writes Delta tables.
pub struct DeltaTarget {
    config: DeltaConfig,
    tables: HashMap<String, Shared>,
    figures: HashMap<String, FileFigures>,
}

impl DeltaTarget {
    /// A destination for `config` (opens its store on use).
    pub fn new(config: DeltaConfig) -> Self {
        Self { config, tables: HashMap::new(), figures: HashMap::new() }
    }

    fn table(&mut self, name: &str) -> Result<Shared> {
        if let Some(table) = self.tables.get(name) {
            return Ok(table.clone());
        }
        let table = shared(&self.config, name)?;
        self.tables.insert(name.to_string(), table.clone());
        Ok(table)
    }

    /// `deliveries` by the table each writes (the config's, for a sync).
    fn by_table<'a>(&self, deliveries: &'a [Delivery]) -> BTreeMap<String, Vec<&'a Delivery>> {
        let mut by_table: BTreeMap<String, Vec<&Delivery>> = BTreeMap::new();
        for delivery in deliveries {
            let name = delivery.table.clone().unwrap_or_else(|| self.config.table.clone());
            by_table.entry(name).or_default().push(delivery);
        }
        by_table
    }

    /// The tables under the location (folders with a `_delta_log`).
    async fn existing(&self) -> Result<Vec<String>> {
        let (store, prefix) = self.config.store()?;
        let prefix = (!prefix.is_empty()).then(|| StorePath::from(prefix));
        let listed = store.list_with_delimiter(prefix.as_ref()).await.map_err(store_error)?;
        let mut tables = Vec::new();
        for folder in listed.common_prefixes {
            let Some(name) = folder.filename() else { continue };
            let log = StorePath::from(format!("{folder}/_delta_log"));
            let inside = store.list_with_delimiter(Some(&log)).await.map_err(store_error)?;
            if !inside.objects.is_empty() && check_name("table", name).is_ok() {
                tables.push(name.to_string());
            }
        }
        Ok(tables)
    }

    /// The positions `owner` holds in the location's tables.
    async fn positions(&mut self, owner: &str) -> Result<Vec<(String, String)>> {
        let mut out = Vec::new();
        for name in self.existing().await? {
            let table = self.table(&name)?;
            let mut table = table.lock().await;
            // Another engine's table Sluice cannot read holds no position of a stream's.
            match table.current().await {
                Ok(snapshot) => out.extend(Table::position(snapshot, owner).map(|p| (name, p))),
                Err(e) => {
                    tracing::warn!(table = %name, error = %e, "Delta table skipped while looking for a position.")
                }
            }
        }
        Ok(out)
    }

    /// Upkeep of `name` after a write; a failure is logged, the rows are committed already.
    async fn upkeep(&mut self, name: &str, table: &mut Table) {
        match table.upkeep(&self.config.compaction, false).await {
            Ok(report) => {
                self.figures.insert(name.to_string(), report.after);
            }
            Err(e) => {
                tracing::warn!(table = %name, error = %e, "Delta upkeep failed; it runs again after the next write.")
            }
        }
    }
}

#[async_trait]
impl Destination for DeltaTarget {
    async fn check(&mut self) -> Result<()> {
        let (store, prefix) = self.config.store()?;
        let probe = format!("{prefix}/.sluice-check-{:08x}", rand::random::<u32>());
        let probe = StorePath::from(probe.trim_start_matches('/'));
        store.put(&probe, PutPayload::from_static(b"")).await.map_err(store_error)?;
        store.delete(&probe).await.map_err(store_error)
    }

    async fn deliver(&mut self, delivery: &Delivery) -> Result<()> {
        self.write(std::slice::from_ref(delivery), None).await
    }

    async fn write(&mut self, deliveries: &[Delivery], stamp: Option<&Stamp>) -> Result<()> {
        let mut by_table = self.by_table(deliveries);
        if by_table.len() > 1 && stamp.is_some() {
            return Err(Error::new(
                ErrorKind::Fatal,
                format!(
                    "delta: a commit holds one table, and this write has {}: a stream into Delta writes one table",
                    by_table.len()
                ),
            ));
        }
        if by_table.is_empty()
            && let Some(stamp) = stamp
        {
            // No rows (a stream told to forget where it stands): the new position goes to the
            // tables that hold one of the stream's.
            for (name, _) in self.positions(&stamp.owner).await? {
                by_table.insert(name, Vec::new());
            }
        }
        for (name, group) in by_table {
            let shared = self.table(&name)?;
            let mut table = shared.lock().await;
            table.write(&group, stamp).await?;
            self.upkeep(&name, &mut table).await;
        }
        Ok(())
    }

    async fn probe(&mut self, deliveries: &[Delivery]) -> Option<Result<()>> {
        let by_table = self.by_table(deliveries);
        for (name, group) in by_table {
            let shared = match self.table(&name) {
                Ok(shared) => shared,
                Err(e) => return Some(Err(e)),
            };
            if let Err(e) = shared.lock().await.probe(&group).await {
                return Some(Err(e));
            }
        }
        Some(Ok(()))
    }

    async fn table_schema(&mut self, name: &str) -> Result<Option<TableSchema>> {
        let shared = self.table(name)?;
        let mut table = shared.lock().await;
        let snapshot = table.current().await?;
        Ok(Table::columns(snapshot)?.map(|s| table_schema(&s)))
    }

    async fn stamp(&mut self, owner: &str) -> Result<Option<String>> {
        // The newest, should the stream once have written another table of the location.
        let sequence = |value: &str| {
            serde_json::from_str::<serde_json::Value>(value)
                .ok()
                .and_then(|v| v.pointer("/checkpoint/sequence").and_then(serde_json::Value::as_i64))
                .unwrap_or(i64::MIN)
        };
        Ok(self.positions(owner).await?.into_iter().map(|(_, p)| p).max_by_key(|p| sequence(p)))
    }

    fn gauges(&self) -> Vec<(&'static str, f64)> {
        let files: u64 = self.figures.values().map(|f| f.files).sum();
        let bytes: u64 = self.figures.values().map(|f| f.bytes).sum();
        vec![
            ("files", files as f64),
            ("file_bytes", bytes as f64),
            ("avg_file_bytes", if files == 0 { 0.0 } else { bytes as f64 / files as f64 }),
        ]
    }
}

/// Compact the location's tables now (`POST /api/streams/:id/compact`): each table's small
/// files merged, a checkpoint written, and what the retention no longer keeps deleted, taking
/// turns with the stream's writes.
pub async fn compact(config: &DeltaConfig, tables: &[String]) -> Result<CompactionReport> {
    let mut total = CompactionReport::default();
    let started = std::time::Instant::now();
    for name in tables {
        let shared = shared(config, name)?;
        let mut table = shared.lock().await;
        let report = table.upkeep(&config.compaction, true).await?;
        total.before.files += report.before.files;
        total.before.bytes += report.before.bytes;
        total.after.files += report.after.files;
        total.after.bytes += report.after.bytes;
        total.removed_files += report.removed_files;
        total.checkpoint = total.checkpoint.max(report.checkpoint);
    }
    total.ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    Ok(total)
}
