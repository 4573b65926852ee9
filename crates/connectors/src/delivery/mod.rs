//! A stream whose rows land in a destination (a database of the user's) instead of the
//! workspace, through the same `Destination` contract that syncs use: each technology is
//! written once. The destination keeps the stream's checkpoint in the transaction of the rows
//! (`Destination::write` with a `Stamp`), and a restart resumes from what it holds, so every
//! row lands once. The workspace stays the control plane: the rejects ledger, push
//! idempotency keys and the stream's totals are written there, after the destination. The
//! stamp also carries the unit's push keys, so a crash between the two commits loses no key:
//! on resume, a stamp the workspace has not seen gives its keys back to the workspace and to
//! the push route, and a client's retry of that push is answered, not stored twice.

mod coalesce;
mod staged;

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use sluice_core::{
    Checkpoint, CopyPhase, Delivery, Destination, Error, ErrorKind, IdempotencyKey, Result, Sink, Stamp, StreamMetrics,
    SyncMode, WriteUnit, rejects::RejectBatch, sink::Preceding,
};
use tokio::sync::Mutex;

use serde::{Deserialize, Serialize};

use self::staged::StagedDestination;
use crate::files::FilesStream;
use crate::http_push::KeyMemory;
use crate::stream::{StageConfig, StreamConfig};
use crate::sync::{DestinationConfig, build_destination};
use crate::workspace::Workspace;

type Shared = Arc<Mutex<Box<dyn Destination>>>;

/// The sink of a stream with a `destination`.
pub struct DeliverySink {
    stream: String,
    destination: Shared,
    /// Whether the destination keeps the stream's position with the rows (databases and
    /// files); an HTTP API does not, so the workspace keeps it and delivery is at least once.
    stamps: bool,
    /// What the destination can do. When it cannot keep columns a delivery lists in `keep`,
    /// they are written as NULL, said in the log and counted (`unavailable_not_kept`).
    capabilities: sluice_core::Capabilities,
    workspace: Workspace,
    /// A push stream's idempotency keys, to give back those a crash kept from the workspace.
    push_keys: Option<KeyMemory>,
    metrics: Arc<StreamMetrics>,
    /// The destination runs custom SQL: it gets every change, with its op.
    changes: bool,
    /// The destination's table for the stream's ledger rows, written with the unit.
    dead_letters: Option<String>,
    /// The unit whose ledger rows are in the workspace already, and how many: a write tried
    /// again (after a failure, or without the rows the destination refused) adds only the rest.
    ledgered: std::sync::Mutex<Option<(Checkpoint, usize)>>,
    /// A second session of the destination, for a snapshot's chunk loaded while the one before
    /// it commits (`Sink::write_after`): Postgres, not staged, without custom SQL.
    second: Option<Shared>,
}

use sluice_core::mirror;
pub(crate) use sluice_core::mirror::OP_COLUMN;

/// What a destination keeps as a stream's stamp: the checkpoint, and the push keys of the
/// unit it came with.
#[derive(Serialize, Deserialize)]
struct Envelope {
    checkpoint: Checkpoint,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    push_keys: Vec<(String, String)>,
}

impl DeliverySink {
    /// A sink for `stream` into `config`; the ledger and totals go to `workspace`. Files spool
    /// in `<workspace folder>/spool/<stream>`. Must run inside the runtime: a task ticks the
    /// destination (files close by age) while the sink lives.
    pub fn new(
        stream: &StreamConfig,
        config: &DestinationConfig,
        workspace: Workspace,
        metrics: Arc<StreamMetrics>,
    ) -> Result<Self> {
        let stream_config = stream;
        let (stage, stream) = (stream.stage, stream.name.as_str());
        let capabilities = config.capabilities();
        let destination: Shared = Arc::new(Mutex::new(open(stream, config, stage, &workspace)?));
        tokio::spawn(tick(stream.to_string(), Arc::downgrade(&destination), metrics.clone()));
        if let DestinationConfig::Ducklake(lake) = config {
            // Small-file upkeep beside the writer, while the sink lives.
            let alive = Arc::downgrade(&destination);
            let upkeep = crate::ducklake::upkeep(stream.to_string(), lake.clone(), metrics.clone(), move || {
                alive.strong_count() > 0
            });
            tokio::spawn(upkeep);
        }
        if let DestinationConfig::Iceberg(ice) = config {
            let mut ice = ice.clone();
            ice.table.clone_from(&stream_config.table);
            let alive = Arc::downgrade(&destination);
            let upkeep =
                crate::iceberg::upkeep(stream.to_string(), ice, metrics.clone(), move || alive.strong_count() > 0);
            tokio::spawn(upkeep);
        }
        let (stamps, changes) = (capabilities.stamps, capabilities.custom_sql);
        let dead_letters = stream_config.dead_letter_table.clone();
        let second = match capabilities.lanes && stage.is_none() {
            true => Some(Arc::new(Mutex::new(build_destination(config)?))),
            false => None,
        };
        Ok(Self {
            stream: stream.to_string(),
            destination,
            stamps,
            capabilities,
            workspace,
            push_keys: None,
            metrics,
            changes,
            dead_letters,
            ledgered: std::sync::Mutex::default(),
            second,
        })
    }

    /// Make the destination forget where `stream` stands (it is removed, or starts over from
    /// its source): an empty write whose stamp is a fresh checkpoint. Rows already written stay;
    /// a file destination still writes out the files it has open.
    pub async fn forget(stream: &StreamConfig, config: &DestinationConfig, workspace: &Workspace) -> Result<()> {
        let (stage, stream) = (stream.stage, stream.name.as_str());
        if !config.capabilities().stamps {
            return Ok(());
        }
        let envelope = Envelope { checkpoint: Checkpoint::default(), push_keys: Vec::new() };
        let checkpoint = serde_json::to_string(&envelope)
            .map_err(|e| Error::new(ErrorKind::Fatal, "could not encode a checkpoint").with_source(e))?;
        let stamp = Stamp { owner: stream.to_string(), checkpoint };
        let mut destination = open(stream, config, stage, workspace)?;
        destination.write(&[], Some(&stamp)).await?;
        destination.finish().await
    }

    /// A push stream's key memory: keys a crash kept from the workspace are given back to it.
    pub fn with_push_keys(mut self, keys: KeyMemory) -> Self {
        self.push_keys = Some(keys);
        self
    }

    /// The stream stops: the destination writes out what it buffers.
    pub async fn finish(&self) {
        if let Err(e) = self.destination.lock().await.finish().await {
            tracing::warn!(stream = %self.stream, error = %e, "The destination could not write out its buffer; it will on the next start.");
        }
    }

    /// The checkpoint the destination holds for the stream: where it resumes. When the
    /// workspace missed the last unit's control write (a crash between the two commits), it
    /// is written now, with the unit's push keys.
    pub async fn checkpoint(&self) -> Result<Option<Checkpoint>> {
        if !self.stamps {
            return sluice_core::StateStore::checkpoint(&self.workspace, &self.stream).await;
        }
        let Some(text) = self.destination.lock().await.stamp(&self.stream).await? else { return Ok(None) };
        let envelope: Envelope = serde_json::from_str(&text).map_err(|e| {
            Error::new(
                ErrorKind::Fatal,
                format!("the destination's position of stream '{}' is unreadable", self.stream),
            )
            .with_source(e)
        })?;
        let seen = sluice_core::StateStore::checkpoint(&self.workspace, &self.stream).await?;
        if seen.as_ref() != Some(&envelope.checkpoint) {
            let unit = WriteUnit {
                stream: self.stream.clone(),
                tables: Vec::new(),
                rejects: RejectBatch::default(),
                idempotency: envelope
                    .push_keys
                    .iter()
                    .map(|(key, answer)| IdempotencyKey { key: key.clone(), answer: answer.clone() })
                    .collect(),
                replayed: Vec::new(),
                checkpoint: envelope.checkpoint.clone(),
            };
            self.workspace.write(Arc::new(unit)).await?;
            if let Some(memory) = &self.push_keys {
                memory.load(envelope.push_keys);
            }
        }
        Ok(Some(envelope.checkpoint))
    }

    /// The columns the destination has for `table`, to start the decoder from.
    pub async fn table_schema(&self, table: &str) -> Result<Option<sluice_core::schema::TableSchema>> {
        self.destination.lock().await.table_schema(table).await
    }

    /// The unit's tables as deliveries: appended, or replacing the table for the first chunk
    /// of a snapshot copy.
    fn deliveries(&self, unit: &WriteUnit) -> Result<Vec<Delivery>> {
        let mut out = Vec::with_capacity(unit.tables.len());
        for table in &unit.tables {
            if self.changes {
                out.push(mirror::changes(&self.stream, table)?);
                continue;
            }
            if let Some(mirror) = &table.mirror {
                let mut planned = mirror::plan(&self.stream, table, mirror, self.capabilities.multiset)?;
                for d in planned.iter_mut().filter(|d| !self.capabilities.keeps_columns && !d.keep.is_empty()) {
                    tracing::warn!(stream = %self.stream, table = %table.table, columns = ?d.keep, rows = d.row_count(),
                        "the source did not send these columns (unavailable) and the destination cannot keep the \
                         values it has: they are written as NULL");
                    self.metrics.add_destination("unavailable_not_kept", d.row_count() as f64);
                    d.keep.clear();
                }
                out.extend(planned);
                continue;
            }
            let replace = table.snapshot.as_ref().is_some_and(|s| s.clear);
            out.push(Delivery {
                sync: self.stream.clone(),
                run_id: String::new(),
                mode: if replace { SyncMode::Replace } else { SyncMode::Append },
                // A snapshot's source key: the destination creates the table with it.
                keys: table.snapshot.as_ref().map(|s| s.keys.clone()).unwrap_or_default(),
                schema: table.data.schema(),
                rows: vec![table.data.clone()],
                deletes: Vec::new(),
                table: Some(table.table.clone()),
                copy: table
                    .snapshot
                    .as_ref()
                    .map(|s| if s.complete { CopyPhase::Complete } else { CopyPhase::Copying }),
                keep: Vec::new(),
                multiset: false,
            });
        }
        Ok(out)
    }

    /// The unit's deliveries, and its ledger rows for the dead-letter table when there is one.
    fn all_deliveries(&self, unit: &WriteUnit) -> Result<Vec<Delivery>> {
        let mut deliveries = self.deliveries(unit)?;
        if let Some(table) = self.dead_letters.as_ref().filter(|_| !unit.rejects.is_empty()) {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
            let rows = without_nul(unit.rejects.to_ledger(&self.stream, now))?;
            deliveries.push(Delivery {
                sync: self.stream.clone(),
                run_id: String::new(),
                mode: SyncMode::Append,
                keys: Vec::new(),
                schema: rows.schema(),
                rows: vec![rows],
                deletes: Vec::new(),
                table: Some(table.clone()),
                copy: None,
                keep: Vec::new(),
                multiset: false,
            });
        }
        Ok(deliveries)
    }

    /// A unit for the workspace with no rows: the ledger rows, or the push keys and marks of
    /// replayed ledger rows, with the checkpoint (the stream's totals).
    fn control(unit: &WriteUnit, ledger: bool) -> Arc<WriteUnit> {
        Arc::new(WriteUnit {
            stream: unit.stream.clone(),
            tables: Vec::new(),
            rejects: if ledger { unit.rejects.clone() } else { RejectBatch::default() },
            idempotency: if ledger { Vec::new() } else { unit.idempotency.clone() },
            replayed: if ledger { Vec::new() } else { unit.replayed.clone() },
            checkpoint: unit.checkpoint.clone(),
        })
    }
}

#[async_trait]
impl Sink for DeliverySink {
    /// A unit tried and rolled back by the destination, where it can: a unit it refuses for
    /// good then has its refused rows found and sent to the ledger (and the dead-letter table),
    /// and the rest written.
    async fn probe(&self, unit: Arc<WriteUnit>) -> Option<Result<()>> {
        self.probe_on(0, unit).await
    }

    async fn probe_on(&self, lane: usize, unit: Arc<WriteUnit>) -> Option<Result<()>> {
        if !self.stamps {
            return None;
        }
        let deliveries = match self.all_deliveries(&unit) {
            Ok(deliveries) => deliveries,
            Err(e) => return Some(Err(e)),
        };
        self.lane(lane).lock().await.probe(&deliveries).await
    }

    async fn write(&self, unit: Arc<WriteUnit>) -> Result<()> {
        self.write_on(0, unit, None).await
    }

    fn lanes(&self) -> usize {
        if self.second.is_some() { 2 } else { 1 }
    }

    /// On lane 1, the destination's second session: the rows load while the unit before
    /// commits on the other, and commit after it.
    async fn write_after(&self, unit: Arc<WriteUnit>, lane: usize, previous: Preceding) -> Result<()> {
        self.write_on(lane, unit, Some(previous)).await
    }
}

impl DeliverySink {
    /// The destination's session for `lane`.
    fn lane(&self, lane: usize) -> &Shared {
        match &self.second {
            Some(second) if lane == 1 => second,
            _ => &self.destination,
        }
    }

    /// Write `unit` on `lane`, after `previous` when it is written beside the unit before.
    async fn write_on(&self, lane: usize, unit: Arc<WriteUnit>, previous: Option<Preceding>) -> Result<()> {
        // The ledger first: a crash after it replays the unit, and a ledger row twice is better
        // than none (the destination's position decides what is read again).
        let already = match &*self.ledgered.lock().unwrap_or_else(std::sync::PoisonError::into_inner) {
            Some((checkpoint, n)) if *checkpoint == unit.checkpoint => *n,
            _ => 0,
        };
        if unit.rejects.len() > already {
            let mut control = Self::control(&unit, true);
            Arc::make_mut(&mut control).rejects = unit.rejects.skip(already);
            self.workspace.write(control).await?;
            *self.ledgered.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
                Some((unit.checkpoint.clone(), unit.rejects.len()));
        }
        let mut deliveries = self.all_deliveries(&unit)?;
        let envelope = Envelope {
            checkpoint: unit.checkpoint.clone(),
            push_keys: unit.idempotency.iter().map(|k| (k.key.clone(), k.answer.clone())).collect(),
        };
        let checkpoint = serde_json::to_string(&envelope)
            .map_err(|e| Error::new(ErrorKind::Fatal, "could not encode a checkpoint").with_source(e))?;
        let started = Instant::now();
        let mut destination = self.lane(lane).lock().await;
        if self.stamps {
            let stamp = Stamp { owner: self.stream.clone(), checkpoint };
            let written = match previous.clone() {
                Some(previous) => destination.write_after(&deliveries, Some(&stamp), previous).await,
                None => destination.write(&deliveries, Some(&stamp)).await,
            };
            match written {
                Err(e) if self.dead_letters.is_some() && !unit.rejects.is_empty() && refusal(&e) => {
                    // The dead-letter table itself may be what the destination refuses (a table
                    // of the user's with other columns): the unit goes without its dead letters,
                    // which stay in the workspace ledger, rather than stopping the stream.
                    let rows = deliveries.len() - 1;
                    if !matches!(destination.probe(&deliveries[..rows]).await, Some(Ok(()))) {
                        return Err(e);
                    }
                    tracing::warn!(stream = %self.stream, error = %e, "The destination refused the dead-letter rows; they stay in the workspace ledger.");
                    self.metrics.add_destination("dead_letters_refused", unit.rejects.len() as f64);
                    deliveries.truncate(rows);
                    if let Some(previous) = &previous {
                        previous.durable().await?;
                    }
                    destination.write(&deliveries, Some(&stamp)).await?;
                }
                other => other?,
            }
        } else {
            // At least once: the run id comes from the unit's end position (and the
            // delivery's place in it), so a unit read again the same way carries the same
            // idempotency keys.
            let run = hex::encode(
                &sha2::Digest::finalize(sha2::Digest::chain_update(
                    <sha2::Sha256 as sha2::Digest>::new(),
                    checkpoint.as_bytes(),
                ))[..12],
            );
            deliveries.iter_mut().enumerate().for_each(|(i, d)| d.run_id = format!("{run}-{i}"));
            destination.write(&deliveries, None).await?;
        }
        record(&self.metrics, destination.as_ref());
        drop(destination);
        let ms = started.elapsed().as_secs_f64() * 1000.0;
        self.metrics.add_destination("rows", deliveries.iter().map(Delivery::row_count).sum::<usize>() as f64);
        self.metrics.add_destination("deletes", deliveries.iter().map(Delivery::delete_count).sum::<usize>() as f64);
        self.metrics.add_destination("writes", 1.0);
        if previous.is_some() {
            // A snapshot's chunk loaded while the one before it committed.
            self.metrics.add_destination("writes_beside", 1.0);
        }
        self.metrics.set_destination("load_ms", ms);
        self.metrics.max_destination("load_ms_max", ms);
        // Then the push keys and totals, once the rows are durable where they belong. The
        // destination holds the position: should the workspace's disk be full, the rows are
        // stored all the same, and the pushes must not be told otherwise (a retry would store
        // them twice); the keys stay known in memory, the totals wait for the next unit.
        match self.workspace.write(Self::control(&unit, false)).await {
            Err(e) if e.kind() == ErrorKind::Storage => {
                tracing::warn!(error = %e, "Stored in the destination; the workspace could not record the push keys.");
                Ok(())
            }
            written => written,
        }
    }
}

/// An error that says the destination will not take the write as it is (not a connection or
/// a busy server to wait for, not the config).
fn refusal(e: &Error) -> bool {
    matches!(e.kind(), ErrorKind::Fatal | ErrorKind::Data)
}

/// Ledger rows with NUL characters replaced (U+FFFD): the raw text of an event that is not
/// JSON may hold one, and Postgres text refuses it, which would refuse the dead-letter row
/// itself.
fn without_nul(batch: arrow::record_batch::RecordBatch) -> Result<arrow::record_batch::RecordBatch> {
    use arrow::array::{Array, ArrayRef, StringArray};
    let columns = batch
        .columns()
        .iter()
        .map(|column| match column.as_any().downcast_ref::<StringArray>() {
            Some(text) if text.iter().flatten().any(|v| v.contains('\0')) => {
                let cleaned: StringArray = text.iter().map(|v| v.map(|v| v.replace('\0', "\u{FFFD}"))).collect();
                Arc::new(cleaned) as ArrayRef
            }
            _ => column.clone(),
        })
        .collect();
    arrow::record_batch::RecordBatch::try_new(batch.schema(), columns)
        .map_err(|e| Error::new(ErrorKind::Fatal, "ledger rows").with_source(e))
}

/// The destination of `stream`: files spool in `<workspace folder>/spool/<stream>`, and a
/// staged database destination stages in `<workspace folder>/stage/<stream>`.
fn open(
    stream: &str,
    config: &DestinationConfig,
    stage: Option<StageConfig>,
    workspace: &Workspace,
) -> Result<Box<dyn Destination>> {
    let root = workspace.path().parent().unwrap_or(std::path::Path::new("."));
    Ok(match (config, stage) {
        (DestinationConfig::Files(files), _) => {
            Box::new(FilesStream::open(stream, files, &root.join("spool").join(stream))?)
        }
        (other, Some(stage)) => Box::new(StagedDestination::new(
            build_destination(other)?,
            stream,
            &root.join("stage").join(stream),
            stage,
        )?),
        (other, None) => build_destination(other)?,
    })
}

/// The destination's own figures into the stream's metrics.
fn record(metrics: &StreamMetrics, destination: &dyn Destination) {
    for (name, value) in destination.gauges() {
        metrics.set_destination(name, value);
    }
}

/// Five times a second, the destination's periodic work and figures, until the sink is dropped.
async fn tick(stream: String, destination: Weak<Mutex<Box<dyn Destination>>>, metrics: Arc<StreamMetrics>) {
    let mut interval = tokio::time::interval(Duration::from_millis(200));
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        let Some(destination) = destination.upgrade() else { return };
        let mut destination = destination.lock().await;
        if let Err(e) = destination.tick().await {
            tracing::warn!(stream = %stream, error = %e, "Destination: periodic work failed; retrying.");
        }
        record(&metrics, destination.as_ref());
    }
}
