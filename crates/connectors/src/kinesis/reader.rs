//! One shard's reader: GetShardIterator, then GetRecords until the shard ends. It renews an
//! expired iterator from the last record read, and backs off when throttled.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::error::{DisplayErrorContext, ProvideErrorMetadata};
use aws_sdk_kinesis::types::ShardIteratorType;
use bytes::Bytes;
use sluice_core::{Lag, Payload, Record, RecordMeta, StreamMetrics};
use tokio::sync::mpsc;

use super::kpl::deaggregate;
use super::shards::{ShardState, StartAt};

/// What a reader hands on: records of one GetRecords call, or the end of the shard.
#[derive(Debug)]
pub(crate) struct ShardBatch {
    pub shard: String,
    pub records: Vec<Record>,
    pub bytes: usize,
    pub last_seq: Option<String>,
    pub state: ShardState,
    pub arrived: Instant,
}

/// Payload bytes per batch handed on, at most (give or take one Kinesis record): a GetRecords
/// answer of up to 10 MB goes on in parts, so what waits in the stream's channel is bounded by
/// bytes, not by answers.
const PART_BYTES: usize = 1 << 20;

/// `batch` in parts of about `max_bytes` of payload, cut only between Kinesis records (the user
/// records of one aggregated record share its sequence number, which is the position): each
/// part ends at its last record's sequence, and only the last part carries the batch's state.
fn split(batch: ShardBatch, max_bytes: usize) -> Vec<ShardBatch> {
    if batch.bytes <= max_bytes {
        return vec![batch];
    }
    let ShardBatch { shard, records, last_seq, state, arrived, .. } = batch;
    let mut parts = Vec::new();
    let mut part: Vec<Record> = Vec::new();
    let mut part_bytes = 0;
    let mut records = records.into_iter().peekable();
    while let Some(record) = records.next() {
        part_bytes += match &record.payload {
            Payload::Bytes(b) => b.len(),
            _ => 0,
        };
        let seq = record.meta.sequence.clone();
        part.push(record);
        // A cut needs another Kinesis record after this one.
        let boundary = records.peek().is_some_and(|next| next.meta.sequence != seq);
        if part_bytes >= max_bytes && boundary {
            parts.push(ShardBatch {
                shard: shard.clone(),
                records: std::mem::take(&mut part),
                bytes: std::mem::take(&mut part_bytes),
                last_seq: seq,
                state: ShardState::Reading,
                arrived,
            });
        }
    }
    parts.push(ShardBatch { shard, records: part, bytes: part_bytes, last_seq, state, arrived });
    parts
}

/// Counters and lag shared by a stream's readers.
#[derive(Default)]
pub(crate) struct Health {
    pub throttled: AtomicU64,
    pub expired_iterators: AtomicU64,
    pub lag: Mutex<BTreeMap<String, Lag>>,
}

impl Health {
    pub fn set_lag(&self, metrics: &StreamMetrics, shard: &str, millis: Option<i64>) {
        let Ok(mut lag) = self.lag.lock() else { return };
        match millis {
            Some(ms) => {
                lag.insert(shard.to_string(), Lag { messages: None, age_seconds: ms.max(0) as f64 / 1000.0 });
            }
            None => {
                lag.remove(shard);
            }
        }
        metrics.set_lag(lag.clone());
    }
}

/// Everything one reader needs.
pub(crate) struct Reader {
    pub client: Client,
    pub stream_name: String,
    pub stream_arn: Option<String>,
    pub shard: String,
    pub start: StartAt,
    pub poll: Duration,
    pub max_records: i32,
    pub tx: mpsc::Sender<ShardBatch>,
    pub ended: mpsc::UnboundedSender<String>,
    pub health: Arc<Health>,
    pub metrics: Arc<StreamMetrics>,
}

const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// Why a call failed, as far as the reader's next step is concerned.
enum Failure {
    Expired,
    Throttled,
    Other(String),
}

fn classify<E, R>(e: &aws_sdk_kinesis::error::SdkError<E, R>) -> Failure
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug + 'static,
{
    match e.code() {
        Some("ExpiredIteratorException") => Failure::Expired,
        Some("ProvisionedThroughputExceededException" | "LimitExceededException" | "KMSThrottlingException") => {
            Failure::Throttled
        }
        _ => Failure::Other(DisplayErrorContext(e).to_string()),
    }
}

impl Reader {
    /// Read the shard to its end (or until the task is aborted).
    pub async fn run(mut self) {
        let mut backoff = Duration::from_millis(200);
        'open: loop {
            let mut iterator = match self.open().await {
                Ok(Some(it)) => it,
                Ok(None) => return self.finish().await,
                Err(failure) => {
                    self.failed(failure, &mut backoff).await;
                    continue 'open;
                }
            };
            loop {
                let called = Instant::now();
                let out = self.client.get_records().shard_iterator(&iterator).limit(self.max_records);
                let out = match self.stream_arn.as_deref() {
                    Some(arn) => out.stream_arn(arn),
                    None => out,
                };
                match out.send().await {
                    Ok(out) => {
                        backoff = Duration::from_millis(200);
                        let next = out.next_shard_iterator().map(str::to_string);
                        let batch = self.batch(out.records);
                        if let Some(seq) = &batch.last_seq {
                            self.start = StartAt::After(seq.clone());
                        }
                        self.health.set_lag(&self.metrics, &self.shard, out.millis_behind_latest);
                        let had_records = !batch.records.is_empty();
                        if had_records {
                            for part in split(batch, PART_BYTES) {
                                if self.tx.send(part).await.is_err() {
                                    return;
                                }
                            }
                        }
                        let Some(next) = next else { return self.finish().await };
                        iterator = next;
                        // Back to back while behind; at the per-shard call rate once caught up.
                        if !had_records || out.millis_behind_latest.unwrap_or(0) == 0 {
                            tokio::time::sleep_until((called + self.poll).into()).await;
                        }
                    }
                    Err(e) => {
                        let failure = classify(&e);
                        let expired = matches!(failure, Failure::Expired);
                        self.failed(failure, &mut backoff).await;
                        if expired {
                            continue 'open;
                        }
                    }
                }
            }
        }
    }

    /// An iterator at `self.start`; `None` when the shard has nothing more (closed and read).
    async fn open(&self) -> Result<Option<String>, Failure> {
        let mut call = self.client.get_shard_iterator().shard_id(&self.shard);
        call = match self.stream_arn.as_deref() {
            Some(arn) => call.stream_arn(arn),
            None => call.stream_name(&self.stream_name),
        };
        call = match &self.start {
            StartAt::After(seq) => {
                call.shard_iterator_type(ShardIteratorType::AfterSequenceNumber).starting_sequence_number(seq)
            }
            StartAt::TrimHorizon => call.shard_iterator_type(ShardIteratorType::TrimHorizon),
            StartAt::Latest => call.shard_iterator_type(ShardIteratorType::Latest),
            StartAt::AtTimestamp(t) => call
                .shard_iterator_type(ShardIteratorType::AtTimestamp)
                .timestamp(aws_sdk_kinesis::primitives::DateTime::from_millis(t.timestamp_millis())),
        };
        match call.send().await {
            Ok(out) => Ok(out.shard_iterator().map(str::to_string)),
            Err(e) => Err(classify(&e)),
        }
    }

    async fn failed(&self, failure: Failure, backoff: &mut Duration) {
        match failure {
            Failure::Expired => {
                self.health.expired_iterators.fetch_add(1, Ordering::Relaxed);
                tracing::info!(shard = %self.shard, "Shard iterator expired; renewing it from the last record read.");
                return;
            }
            Failure::Throttled => {
                self.health.throttled.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(shard = %self.shard, "Throttled; backing off.");
            }
            Failure::Other(text) => {
                tracing::warn!(shard = %self.shard, error = %text, "Kinesis call failed; retrying.");
                self.metrics.set_state("reconnecting", Some(format!("shard {}: {text}", self.shard)));
            }
        }
        let jitter = Duration::from_millis(rand::random::<u64>() % 100);
        tokio::time::sleep(*backoff + jitter).await;
        *backoff = (*backoff * 2).min(MAX_BACKOFF);
    }

    /// The shard is read to its end: say so in the data (so the checkpoint records it) and to
    /// the coordinator (so children may start).
    async fn finish(&self) {
        let end = ShardBatch {
            shard: self.shard.clone(),
            records: Vec::new(),
            bytes: 0,
            last_seq: None,
            state: ShardState::Ended,
            arrived: Instant::now(),
        };
        if self.tx.send(end).await.is_ok() {
            self.health.set_lag(&self.metrics, &self.shard, None);
            let _ = self.ended.send(self.shard.clone());
        }
    }

    fn batch(&self, records: Vec<aws_sdk_kinesis::types::Record>) -> ShardBatch {
        let received_us = sluice_core::batch::now_us();
        let mut out = Vec::with_capacity(records.len());
        let mut bytes = 0;
        let mut last_seq = None;
        for r in records {
            let arrival = r.approximate_arrival_timestamp().and_then(|t| t.to_millis().ok()).map(|ms| ms * 1000);
            let meta = |key: String| RecordMeta {
                received_us,
                key: Some(key),
                event_time_us: arrival,
                route: Some(self.stream_name.clone()),
                shard: Some(self.shard.clone()),
                sequence: Some(r.sequence_number.clone()),
                ..RecordMeta::default()
            };
            let data = r.data.as_ref();
            bytes += data.len();
            let own_key = r.partition_key.clone().unwrap_or_default();
            match deaggregate(data, &own_key) {
                Some(users) => {
                    for (key, payload) in users {
                        out.push(Record { payload: Payload::Bytes(payload), meta: meta(key) });
                    }
                }
                None => {
                    let payload = Bytes::copy_from_slice(data);
                    out.push(Record { payload: Payload::Bytes(payload), meta: meta(own_key.clone()) });
                }
            }
            last_seq = Some(r.sequence_number);
        }
        ShardBatch {
            shard: self.shard.clone(),
            records: out,
            bytes,
            last_seq,
            state: ShardState::Reading,
            arrived: Instant::now(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(seq: u32, len: usize) -> Record {
        let meta = RecordMeta { sequence: Some(format!("{seq:04}")), ..RecordMeta::default() };
        Record { payload: Payload::Bytes(Bytes::from(vec![b'x'; len])), meta }
    }

    #[test]
    fn a_large_answer_goes_on_in_parts_cut_between_kinesis_records() {
        // Records 2 and 3 share a sequence (user records of one aggregated record).
        let records = vec![record(1, 600), record(2, 300), record(2, 300), record(3, 600), record(4, 100)];
        let batch = ShardBatch {
            shard: "s".into(),
            bytes: 1_900,
            records,
            last_seq: Some("0004".into()),
            state: ShardState::Ended,
            arrived: Instant::now(),
        };
        let parts = split(batch, 1_000);
        let shape: Vec<_> = parts
            .iter()
            .map(|p| (p.records.len(), p.bytes, p.last_seq.clone().unwrap(), matches!(p.state, ShardState::Reading)))
            .collect();
        // Not after 1,200 bytes inside record 2, but at its end.
        assert_eq!(shape, vec![(3, 1_200, "0002".to_string(), true), (2, 700, "0004".to_string(), false)]);
        let small = ShardBatch {
            shard: "s".into(),
            bytes: 600,
            records: vec![record(9, 600)],
            last_seq: Some("0009".into()),
            state: ShardState::Reading,
            arrived: Instant::now(),
        };
        assert_eq!(split(small, 1_000).len(), 1);
    }
}
