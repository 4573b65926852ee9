//! The Kinesis source. A coordinator task lists the shards and starts one reader per shard
//! that may be read now; the source turns reader batches into chunks whose position is every
//! shard's progress. Checkpoints are stored by the run loop with the rows.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::error::{DisplayErrorContext, ProvideErrorMetadata};
use sluice_core::{Chunk, Error, ErrorKind, Position, Result, Source, StreamMetrics};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::KinesisConfig;
use super::reader::{Health, Reader, ShardBatch};
use super::shards::{Plan, Progress, ShardInfo, ShardProgress, ShardState, plan, position, progress_of};

/// How often the shard list is read again when no shard ended.
const SHARD_REFRESH: Duration = Duration::from_secs(5);

enum Message {
    Batch(ShardBatch),
    Failed(Error),
}

/// Reads every shard of a Kinesis data stream into the run loop.
pub struct KinesisSource {
    config: KinesisConfig,
    metrics: Arc<StreamMetrics>,
    health: Arc<Health>,
    /// Progress as of the chunks handed out so far.
    progress: Progress,
    rx: mpsc::Receiver<Message>,
    coordinator: tokio::task::JoinHandle<()>,
}

impl KinesisSource {
    /// Start reading `config`'s stream from `position` (the durable checkpoint).
    pub fn build(config: &KinesisConfig, position: &Position, metrics: Arc<StreamMetrics>) -> Result<Self> {
        let progress = progress_of(position);
        let health = Arc::new(Health::default());
        let (rx, coordinator) = spawn(config.clone(), progress.clone(), metrics.clone(), health.clone());
        Ok(Self { config: config.clone(), metrics, health, progress, rx, coordinator })
    }
}

fn spawn(
    config: KinesisConfig,
    progress: Progress,
    metrics: Arc<StreamMetrics>,
    health: Arc<Health>,
) -> (mpsc::Receiver<Message>, tokio::task::JoinHandle<()>) {
    let (tx, rx) = mpsc::channel(64);
    let task = tokio::spawn(async move {
        let failed = tx.clone();
        if let Err(e) = coordinate(config, progress, metrics, health, tx).await {
            let _ = failed.send(Message::Failed(e)).await;
        }
    });
    (rx, task)
}

/// List shards, start readers as lineage allows, and record skipped shards; until aborted.
async fn coordinate(
    config: KinesisConfig,
    mut progress: Progress,
    metrics: Arc<StreamMetrics>,
    health: Arc<Health>,
    tx: mpsc::Sender<Message>,
) -> Result<()> {
    let client = config.client().await?;
    let (data_tx, mut data_rx) = mpsc::channel::<ShardBatch>(64);
    let (ended_tx, mut ended_rx) = mpsc::unbounded_channel::<String>();
    let mut readers = JoinSet::new();
    let mut running: HashSet<String> = HashSet::new();
    let mut listed_ok = false;
    loop {
        match list_shards(&client, &config).await {
            Ok(shards) => {
                if !listed_ok {
                    metrics.set_state("running", None);
                    listed_ok = true;
                }
                let listed: HashSet<&str> = shards.iter().map(|s| s.id.as_str()).collect();
                for shard in &shards {
                    match plan(shard, &listed, &progress, &running, &config.start) {
                        Some(Plan::Read(start)) => {
                            tracing::info!(shard = %shard.id, ?start, "Reading shard.");
                            running.insert(shard.id.clone());
                            progress.entry(shard.id.clone()).or_default();
                            readers.spawn(
                                Reader {
                                    client: client.clone(),
                                    stream_name: config.stream_name().to_string(),
                                    stream_arn: config.stream_arn().map(str::to_string),
                                    shard: shard.id.clone(),
                                    start,
                                    poll: Duration::from_millis(config.poll_interval_ms),
                                    max_records: config.max_records,
                                    tx: data_tx.clone(),
                                    ended: ended_tx.clone(),
                                    health: health.clone(),
                                    metrics: metrics.clone(),
                                }
                                .run(),
                            );
                        }
                        Some(Plan::Skip) => {
                            progress.insert(shard.id.clone(), ShardProgress { seq: None, state: ShardState::Skipped });
                            let skip = ShardBatch {
                                shard: shard.id.clone(),
                                records: Vec::new(),
                                bytes: 0,
                                last_seq: None,
                                state: ShardState::Skipped,
                                arrived: std::time::Instant::now(),
                            };
                            if tx.send(Message::Batch(skip)).await.is_err() {
                                return Ok(());
                            }
                        }
                        None => {}
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "ListShards failed; retrying.");
                metrics.set_state("reconnecting", Some(e.to_string()));
                listed_ok = false;
            }
        }
        let closed = progress.values().filter(|p| p.state.done()).count();
        metrics.set_source("open_shards", running.len() as f64);
        metrics.set_source("closed_shards", closed as f64);
        metrics.set_source("throttled", health.throttled.load(Ordering::Relaxed) as f64);
        metrics.set_source("expired_iterators", health.expired_iterators.load(Ordering::Relaxed) as f64);
        // Forward data until a shard ends (its children may start) or the list is due again.
        let refresh = tokio::time::sleep(SHARD_REFRESH);
        tokio::pin!(refresh);
        loop {
            tokio::select! {
                Some(batch) = data_rx.recv() => {
                    if tx.send(Message::Batch(batch)).await.is_err() {
                        return Ok(());
                    }
                }
                Some(shard) = ended_rx.recv() => {
                    running.remove(&shard);
                    progress.entry(shard).or_default().state = ShardState::Ended;
                    break;
                }
                Some(_) = readers.join_next(), if !readers.is_empty() => {}
                () = &mut refresh => break,
            }
        }
    }
}

/// Every shard of the stream, following pages.
async fn list_shards(client: &Client, config: &KinesisConfig) -> Result<Vec<ShardInfo>> {
    let mut out = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let mut call = client.list_shards();
        call = match (&token, config.stream_arn()) {
            (Some(t), _) => call.next_token(t),
            (None, Some(arn)) => call.stream_arn(arn),
            (None, None) => call.stream_name(config.stream_name()),
        };
        let page = call.send().await.map_err(|e| {
            let kind =
                if e.code() == Some("ResourceNotFoundException") { ErrorKind::Connect } else { ErrorKind::Transient };
            let why = match e.code() {
                Some("ResourceNotFoundException") => format!("stream '{}' not found", config.stream),
                _ => DisplayErrorContext(&e).to_string(),
            };
            Error::new(kind, format!("ListShards: {why}"))
        })?;
        for s in page.shards() {
            let parents = [s.parent_shard_id(), s.adjacent_parent_shard_id()].into_iter().flatten().map(str::to_string);
            let closed = s.sequence_number_range().and_then(|r| r.ending_sequence_number()).is_some();
            out.push(ShardInfo { id: s.shard_id().to_string(), parents: parents.collect(), closed });
        }
        match page.next_token() {
            Some(t) => token = Some(t.to_string()),
            None => return Ok(out),
        }
    }
}

#[async_trait]
impl Source for KinesisSource {
    async fn next(&mut self) -> Result<Option<Chunk>> {
        // Cancel-safe: mpsc::Receiver::recv loses nothing when dropped.
        match self.rx.recv().await {
            None => Err(Error::new(ErrorKind::Transient, "the Kinesis readers stopped")),
            Some(Message::Failed(e)) => Err(e),
            Some(Message::Batch(batch)) => {
                let entry = self.progress.entry(batch.shard).or_default();
                if let Some(seq) = batch.last_seq {
                    entry.seq = Some(seq);
                }
                entry.state = batch.state;
                Ok(Some(Chunk {
                    records: batch.records,
                    bytes: batch.bytes,
                    position: position(&self.progress),
                    arrived: batch.arrived,
                    flush: false,
                }))
            }
        }
    }

    async fn commit(&mut self, _position: &Position) -> Result<()> {
        // The checkpoint is stored with the rows; Kinesis keeps no consumer state.
        Ok(())
    }

    async fn rewind(&mut self, position: &Position) -> Result<()> {
        self.coordinator.abort();
        self.progress = progress_of(position);
        let (rx, task) = spawn(self.config.clone(), self.progress.clone(), self.metrics.clone(), self.health.clone());
        self.rx = rx;
        self.coordinator = task;
        Ok(())
    }

    async fn close(&mut self) {
        self.coordinator.abort();
    }
}

impl Drop for KinesisSource {
    fn drop(&mut self) {
        self.coordinator.abort();
    }
}
