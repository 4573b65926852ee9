//! One Delta table and how a write becomes one commit: columns added (and widened, by
//! rewriting the files), rows appended, the table replaced, or rows merged by key by rewriting
//! the files that hold the keys (copy-on-write: every Delta reader reads the result, with no
//! deletion vectors to support), and a stream's position in the same commit.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use arrow::array::{BooleanArray, RecordBatch};
use arrow::compute::filter_record_batch;
use arrow::datatypes::{DataType, Schema, SchemaRef};
use serde_json::json;
use sluice_core::{Delivery, Error, ErrorKind, Result, Stamp, SyncMode};

use super::files::{self, KeyCodec, KeyIndex};
use super::log::{Action, Add, Commit, Format, Log, Metadata, Protocol, Remove, Snapshot, Txn, now_ms};
use super::schema::{conform, evolve, parse_schema, schema_string};

/// The table configuration key that holds `owner`'s position.
const POSITION: &str = "sluice.position.";

/// A table's log, its state as this process last read it, and its key index.
pub(crate) struct Table {
    pub name: String,
    pub log: Log,
    /// `None` until read, and again after a failed commit.
    pub snapshot: Option<Snapshot>,
    pub index: Option<KeyIndex>,
}

/// What one commit changes, built up delivery by delivery.
struct Work {
    schema: SchemaRef,
    /// Committed files still live in this commit.
    live: BTreeMap<String, Add>,
    /// Files this commit adds.
    adds: BTreeMap<String, Add>,
    removes: Vec<Remove>,
    /// Files written by this commit and then rewritten by it: never in the log, deleted after.
    dropped: Vec<String>,
    metadata: Option<Metadata>,
    new_table: bool,
    index: Option<KeyIndex>,
}

impl Work {
    /// Nothing changed yet: the table as `snapshot` has it.
    fn new(snapshot: &Snapshot, index: Option<KeyIndex>) -> Result<Self> {
        let existing = Table::columns(snapshot)?;
        Ok(Self {
            schema: existing.clone().unwrap_or_else(|| Arc::new(Schema::empty())),
            live: snapshot.files.clone(),
            adds: BTreeMap::new(),
            removes: Vec::new(),
            dropped: Vec::new(),
            metadata: snapshot.metadata.clone(),
            new_table: existing.is_none(),
            index,
        })
    }

    fn remove(&mut self, path: &str) {
        if self.adds.remove(path).is_some() {
            self.dropped.push(path.to_string());
        } else if let Some(add) = self.live.remove(path) {
            self.removes.push(Remove {
                path: add.path,
                deletion_timestamp: Some(now_ms()),
                data_change: true,
                extended_file_metadata: None,
                size: Some(add.size),
            });
        }
    }

    fn paths(&self) -> Vec<String> {
        self.live.keys().chain(self.adds.keys()).cloned().collect()
    }
}

impl Table {
    pub(crate) fn new(name: String, log: Log) -> Self {
        Self { name, log, snapshot: None, index: None }
    }

    /// The table as the log has it now; a commit by another writer drops the key index.
    pub(crate) async fn current(&mut self) -> Result<&Snapshot> {
        match &mut self.snapshot {
            None => {
                self.snapshot = Some(self.log.load().await?);
                self.index = None;
            }
            Some(snapshot) => {
                if self.log.refresh(snapshot).await? > 0 {
                    self.index = None;
                }
            }
        }
        Ok(self.snapshot.as_ref().expect("loaded just now"))
    }

    /// The position `owner` committed last.
    pub(crate) fn position(snapshot: &Snapshot, owner: &str) -> Option<String> {
        snapshot.metadata.as_ref().and_then(|m| m.configuration.get(&format!("{POSITION}{owner}")).cloned())
    }

    /// The table's columns; `None` before its first commit.
    pub(crate) fn columns(snapshot: &Snapshot) -> Result<Option<SchemaRef>> {
        snapshot.metadata.as_ref().map(|m| parse_schema(&m.schema_string)).transpose()
    }

    /// Apply `deliveries` and `stamp` as one commit.
    pub(crate) async fn write(&mut self, deliveries: &[&Delivery], stamp: Option<&Stamp>) -> Result<()> {
        let snapshot = self.current().await?.clone();
        if let Some(stamp) = stamp
            && Self::position(&snapshot, &stamp.owner).as_deref() == Some(stamp.checkpoint.as_str())
        {
            // This unit's commit landed before (its answer was lost): writing it again would
            // add its rows twice.
            return Ok(());
        }
        snapshot.check_writable(&self.name)?;
        if snapshot.metadata.is_none() && deliveries.is_empty() {
            return Ok(());
        }
        let mut work = Work::new(&snapshot, self.index.take())?;
        let result = self.build(&mut work, deliveries, &snapshot, stamp).await;
        let actions = match result {
            Ok(actions) => actions,
            Err(e) => {
                self.discard(&work).await;
                return Err(e);
            }
        };
        match self.log.commit(snapshot.version + 1, &actions).await {
            Ok(Commit::Done) => {}
            Ok(Commit::Taken) => {
                self.discard(&work).await;
                self.snapshot = None;
                return Err(Error::new(
                    ErrorKind::Transient,
                    format!(
                        "delta: another writer committed version {} of '{}' first",
                        snapshot.version + 1,
                        self.name
                    ),
                ));
            }
            Err(e) => {
                // The commit may have landed: read the log again before the next write.
                self.snapshot = None;
                return Err(e);
            }
        }
        for path in &work.dropped {
            let _ = self.log.delete(path).await;
        }
        let snapshot = self.snapshot.as_mut().expect("read above");
        snapshot.apply(&actions);
        snapshot.version += 1;
        self.index = work.index;
        Ok(())
    }

    /// Build the commit of `deliveries` and throw it away: whether it would be made. The key
    /// index it changed is dropped (rebuilt on the next merge).
    pub(crate) async fn probe(&mut self, deliveries: &[&Delivery]) -> Result<()> {
        let snapshot = self.current().await?.clone();
        snapshot.check_writable(&self.name)?;
        let mut work = Work::new(&snapshot, self.index.take())?;
        let result = self.build(&mut work, deliveries, &snapshot, None).await.map(drop);
        self.discard(&work).await;
        result
    }

    /// The commit's actions: every delivery applied to `work`, then the stamp.
    async fn build(
        &mut self,
        work: &mut Work,
        deliveries: &[&Delivery],
        snapshot: &Snapshot,
        stamp: Option<&Stamp>,
    ) -> Result<Vec<Action>> {
        let mut operation = "WRITE";
        for delivery in deliveries {
            self.apply(work, delivery).await?;
            if delivery.mode.keyed() {
                operation = "MERGE";
            }
        }
        let mut actions = vec![Action::CommitInfo(json!({
            "timestamp": now_ms(), "operation": operation, "engineInfo": concat!("sluice/", env!("CARGO_PKG_VERSION")),
            "txnId": super::log::random_id(),
        }))];
        let protocol = protocol_for(&work.schema, snapshot.protocol.as_ref());
        if snapshot.protocol.as_ref() != Some(&protocol) {
            actions.push(Action::Protocol(protocol));
        }
        let mut metadata = work.metadata.clone().unwrap_or_else(|| Metadata {
            id: super::log::random_id(),
            name: None,
            description: None,
            format: Format { provider: "parquet".into(), options: BTreeMap::new() },
            schema_string: String::new(),
            partition_columns: Vec::new(),
            configuration: BTreeMap::new(),
            created_time: Some(now_ms()),
        });
        let schema_text = schema_string(&work.schema, work.metadata.as_ref().map(|m| m.schema_string.as_str()))?;
        let mut changed = work.new_table || metadata.schema_string != schema_text;
        metadata.schema_string = schema_text;
        if let Some(stamp) = stamp {
            metadata.configuration.insert(format!("{POSITION}{}", stamp.owner), stamp.checkpoint.clone());
            let app_id = format!("sluice-{}", stamp.owner);
            let version = snapshot.txns.get(&app_id).map_or(0, |v| v + 1);
            actions.push(Action::Txn(Txn { app_id, version, last_updated: Some(now_ms()) }));
            changed = true;
        }
        if changed {
            actions.push(Action::MetaData(metadata));
        }
        actions.extend(work.removes.iter().cloned().map(Action::Remove));
        actions.extend(work.adds.values().cloned().map(Action::Add));
        Ok(actions)
    }

    /// One delivery into `work`.
    async fn apply(&mut self, work: &mut Work, delivery: &Delivery) -> Result<()> {
        let evolution = evolve(&work.schema, &delivery.schema)?;
        work.schema = evolution.schema;
        if evolution.widened {
            self.rewrite_all(work).await?;
        }
        let rows = delivery.rows.iter().map(|b| conform(b, &work.schema)).collect::<Result<Vec<_>>>()?;
        let count: usize = rows.iter().map(RecordBatch::num_rows).sum();
        match delivery.mode {
            SyncMode::Append => {
                let keep =
                    work.index.as_ref().is_some_and(|i| !delivery.keys.is_empty() && i.codec.columns == delivery.keys);
                if !keep {
                    work.index = None;
                }
                self.add(work, &rows, count).await?;
            }
            SyncMode::Replace => {
                for path in work.paths() {
                    work.remove(&path);
                }
                work.index = None;
                self.add(work, &rows, count).await?;
            }
            SyncMode::Upsert | SyncMode::Mirror if delivery.multiset => {
                self.merge_counted(work, delivery, &rows, count).await?;
            }
            SyncMode::Upsert | SyncMode::Mirror => self.merge(work, delivery, &rows, count).await?,
        }
        Ok(())
    }

    /// Add `rows` as a file (none for no rows), its keys pointed at it in the index.
    async fn add(&mut self, work: &mut Work, rows: &[RecordBatch], count: usize) -> Result<()> {
        if count == 0 {
            return Ok(());
        }
        let add = files::write(&self.log, &work.schema, rows).await?;
        if let Some(index) = &mut work.index {
            index.point(rows, &add.path)?;
        }
        work.adds.insert(add.path.clone(), add);
        Ok(())
    }

    /// Upsert `rows` and delete `delivery.deletes` by key: the files holding any of those keys
    /// are rewritten without them, and the rows (the last of each key) are added as a new file.
    async fn merge(&mut self, work: &mut Work, delivery: &Delivery, rows: &[RecordBatch], count: usize) -> Result<()> {
        if delivery.keys.is_empty() {
            return Err(Error::new(ErrorKind::Config, format!("delta: mode '{}' needs key columns", delivery.mode)));
        }
        if work.index.as_ref().is_none_or(|i| i.codec.columns != delivery.keys) {
            work.index = Some(self.build_index(work, &delivery.keys).await?);
        }
        let fault = |e: arrow::error::ArrowError| Error::new(ErrorKind::Fatal, format!("delta: {e}"));
        let key_schema = key_schema(&work.schema, &delivery.keys)?;
        let index = work.index.as_mut().expect("built above");
        // The last row of each key: a unit's changes come in order.
        let mut last: HashMap<Vec<u8>, (usize, usize)> = HashMap::new();
        for (b, batch) in rows.iter().enumerate() {
            for (r, key) in index.codec.keys(batch)?.into_iter().enumerate() {
                last.insert(key, (b, r));
            }
        }
        let mut changed: HashSet<Vec<u8>> = HashSet::new();
        let mut rows = rows.to_vec();
        let mut count = count;
        if last.len() < count {
            let mut keep: Vec<Vec<bool>> = rows.iter().map(|b| vec![false; b.num_rows()]).collect();
            for (b, r) in last.values() {
                keep[*b][*r] = true;
            }
            rows = rows
                .iter()
                .zip(keep)
                .map(|(batch, keep)| filter_record_batch(batch, &BooleanArray::from(keep)).map_err(fault))
                .collect::<Result<_>>()?;
            count = last.len();
        }
        changed.extend(last.into_keys());
        for batch in &delivery.deletes {
            if let Some(missing) = delivery.keys.iter().find(|k| batch.column_by_name(k).is_none()) {
                return Err(Error::new(ErrorKind::Fatal, format!("delta: deletes lack the key column '{missing}'")));
            }
            changed.extend(index.codec.keys(&conform(batch, &key_schema)?)?);
        }
        let touched: BTreeSet<Arc<str>> =
            changed.iter().filter_map(|k| index.files.get(k)).flatten().cloned().collect();
        // Rows that lack columns (`keep`) take them from their keys' rows in the files
        // rewritten here (a delivery with `keep` deletes nothing: its changed keys are its rows').
        let (mut old_rows, mut old_of) = (Vec::<RecordBatch>::new(), HashMap::<Vec<u8>, (usize, usize)>::new());
        for path in touched {
            self.rewrite(work, &path, |batch, keys| {
                if !delivery.keep.is_empty() {
                    for (r, key) in keys.iter().enumerate().filter(|(_, k)| changed.contains(*k)) {
                        old_of.insert(key.clone(), (old_rows.len(), r));
                    }
                    old_rows.push(batch.clone());
                }
                keys.iter().map(|k| Some(!changed.contains(k))).collect()
            })
            .await?;
        }
        if !old_of.is_empty() {
            let codec = &work.index.as_ref().expect("built above").codec;
            rows =
                rows.iter().map(|b| with_kept(b, codec, &delivery.keep, &old_rows, &old_of)).collect::<Result<_>>()?;
        }
        self.add(work, &rows, count).await
    }

    /// A multiset's changes (a table without a key): each delete removes one matching row from
    /// the files that hold its key (rewritten without it), then the rows are appended.
    async fn merge_counted(
        &mut self,
        work: &mut Work,
        delivery: &Delivery,
        rows: &[RecordBatch],
        count: usize,
    ) -> Result<()> {
        if work.index.as_ref().is_none_or(|i| i.codec.columns != delivery.keys) {
            work.index = Some(self.build_index(work, &delivery.keys).await?);
        }
        let key_schema = key_schema(&work.schema, &delivery.keys)?;
        let index = work.index.as_mut().expect("built above");
        let mut remaining: HashMap<Vec<u8>, usize> = HashMap::new();
        for batch in &delivery.deletes {
            for key in index.codec.keys(&conform(batch, &key_schema)?)? {
                *remaining.entry(key).or_default() += 1;
            }
        }
        let touched: BTreeSet<Arc<str>> =
            remaining.keys().filter_map(|k| index.files.get(k)).flatten().cloned().collect();
        for path in touched {
            if remaining.values().all(|n| *n == 0) {
                break;
            }
            self.rewrite(work, &path, |_, keys| {
                keys.iter()
                    .map(|k| match remaining.get_mut(k) {
                        Some(n) if *n > 0 => {
                            *n -= 1;
                            Some(false)
                        }
                        _ => Some(true),
                    })
                    .collect()
            })
            .await?;
        }
        self.add(work, rows, count).await
    }

    /// The data file `path` rewritten with the rows `keep` says to keep (given each batch and
    /// its rows' keys), its keys pointed at the new file.
    async fn rewrite(
        &mut self,
        work: &mut Work,
        path: &Arc<str>,
        mut keep: impl FnMut(&RecordBatch, &[Vec<u8>]) -> BooleanArray,
    ) -> Result<()> {
        let batches = files::read(&self.log, path, &work.schema, None).await?;
        let index = work.index.as_mut().expect("a merge builds the index first");
        let mut kept = Vec::new();
        for batch in batches {
            let keys = index.codec.keys(&batch)?;
            let mask = keep(&batch, &keys);
            index.forget(&keys, path);
            let batch =
                filter_record_batch(&batch, &mask).map_err(|e| Error::new(ErrorKind::Fatal, format!("delta: {e}")))?;
            if batch.num_rows() > 0 {
                kept.push(batch);
            }
        }
        work.remove(path);
        let kept_rows = kept.iter().map(RecordBatch::num_rows).sum();
        self.add(work, &kept, kept_rows).await
    }

    /// Which files hold each key: every file's key columns read once.
    async fn build_index(&self, work: &Work, keys: &[String]) -> Result<KeyIndex> {
        let mut index = KeyIndex { codec: KeyCodec::new(&work.schema, keys)?, files: HashMap::new() };
        for path in work.paths() {
            let batches = files::read(&self.log, &path, &work.schema, Some(keys)).await?;
            index.point(&batches, &path)?;
        }
        Ok(index)
    }
    /// Every file rewritten as the widened columns (Delta readers take a file's columns as the
    /// table's types, so a file of integers under a double column must be rewritten).
    async fn rewrite_all(&mut self, work: &mut Work) -> Result<()> {
        work.index = None;
        for path in work.paths() {
            let batches = files::read(&self.log, &path, &work.schema, None).await?;
            work.remove(&path);
            let count = batches.iter().map(RecordBatch::num_rows).sum();
            self.add(work, &batches, count).await?;
        }
        Ok(())
    }

    /// Delete the files an abandoned commit wrote.
    async fn discard(&self, work: &Work) {
        for path in work.adds.keys().chain(work.dropped.iter()) {
            let _ = self.log.delete(path).await;
        }
    }
}

/// The protocol a table of `schema` needs, given the one it has: `timestamp_ntz` columns need
/// reader 3 / writer 7 with the `timestampNtz` feature, and a table moved up to writer 7 keeps
/// the features its old writer version implied (the protocol says a writer must assume they
/// were used).
fn protocol_for(schema: &Schema, existing: Option<&Protocol>) -> Protocol {
    fn ntz(data_type: &DataType) -> bool {
        match data_type {
            DataType::Timestamp(_, None) => true,
            DataType::List(item) => ntz(item.data_type()),
            _ => false,
        }
    }
    let plain = Protocol { min_reader_version: 1, min_writer_version: 2, reader_features: None, writer_features: None };
    let has_ntz = |p: &Protocol| p.reader_features.iter().flatten().any(|f| f == "timestampNtz");
    if !schema.fields().iter().any(|f| ntz(f.data_type())) || existing.is_some_and(has_ntz) {
        return existing.cloned().unwrap_or(plain);
    }
    let mut writer: Vec<String> = match existing {
        Some(p) if p.min_writer_version >= 7 => p.writer_features.clone().unwrap_or_default(),
        Some(p) => {
            let implied: &[&str] = match p.min_writer_version {
                2 => &["appendOnly", "invariants"],
                3 => &["appendOnly", "invariants", "checkConstraints"],
                4.. => &["appendOnly", "invariants", "checkConstraints", "changeDataFeed", "generatedColumns"],
                _ => &[],
            };
            implied.iter().map(|f| (*f).to_string()).collect()
        }
        None => Vec::new(),
    };
    let mut reader = existing.and_then(|p| p.reader_features.clone()).unwrap_or_default();
    writer.push("timestampNtz".into());
    reader.push("timestampNtz".into());
    Protocol {
        min_reader_version: 3,
        min_writer_version: 7,
        reader_features: Some(reader),
        writer_features: Some(writer),
    }
}

/// `batch` with its columns `keep` taken from the old row of each key that has one.
fn with_kept(
    batch: &RecordBatch,
    codec: &KeyCodec,
    keep: &[String],
    old_rows: &[RecordBatch],
    old_of: &HashMap<Vec<u8>, (usize, usize)>,
) -> Result<RecordBatch> {
    let fault = |e: arrow::error::ArrowError| Error::new(ErrorKind::Fatal, format!("delta: {e}"));
    let picks: Vec<(usize, usize)> = codec
        .keys(batch)?
        .iter()
        .enumerate()
        .map(|(r, k)| old_of.get(k).map_or((0, r), |(b, row)| (b + 1, *row)))
        .collect();
    let mut columns = batch.columns().to_vec();
    for column in keep {
        // `conform` gave the rows the table's spelling of each name.
        let Some(i) = batch.schema().fields().iter().position(|f| f.name().eq_ignore_ascii_case(column)) else {
            continue;
        };
        let mut sources: Vec<&dyn arrow::array::Array> = vec![batch.column(i).as_ref()];
        sources.extend(old_rows.iter().map(|o| o.column(i).as_ref()));
        columns[i] = arrow::compute::interleave(&sources, &picks).map_err(fault)?;
    }
    RecordBatch::try_new(batch.schema(), columns).map_err(fault)
}

/// The table's types of `keys`.
fn key_schema(schema: &Schema, keys: &[String]) -> Result<SchemaRef> {
    let fields = keys.iter().map(|k| schema.field_with_name(k).cloned()).collect::<std::result::Result<Vec<_>, _>>();
    Ok(Arc::new(Schema::new(fields.map_err(|e| Error::new(ErrorKind::Fatal, format!("delta: {e}")))?)))
}
