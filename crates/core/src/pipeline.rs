//! The run loop: read → decode → write → commit. The only place a position is committed.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::batch::{Checkpoint, Chunk, Record, WriteUnit};
use crate::decode::Decoder;
use crate::error::{Error, Result};
use crate::metrics::StreamMetrics;
use crate::sink::Sink;
use crate::source::Source;

/// When a micro-batch is written: on rows, bytes or time, whichever comes first, or as soon as
/// the source has nothing more ready for `linger_ms`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FlushConfig {
    /// Write once this many events are buffered.
    pub max_rows: usize,
    /// Write once this many payload bytes are buffered.
    pub max_bytes: usize,
    /// Write at the latest this long after the first buffered event arrived.
    pub max_wait_ms: u64,
    /// Write when no further data arrives for this long (keeps latency low at low rates).
    pub linger_ms: u64,
}

impl Default for FlushConfig {
    fn default() -> Self {
        Self { max_rows: 100_000, max_bytes: 32 << 20, max_wait_ms: 250, linger_ms: 5 }
    }
}

impl FlushConfig {
    /// Check the values; pure.
    pub fn validate(&self) -> Result<()> {
        if self.max_rows == 0 {
            return Err(Error::config("flush.max_rows", "must be at least 1"));
        }
        if self.max_bytes == 0 {
            return Err(Error::config("flush.max_bytes", "must be at least 1"));
        }
        if self.max_wait_ms == 0 || self.max_wait_ms > 60_000 {
            return Err(Error::config("flush.max_wait_ms", "must be between 1 and 60000"));
        }
        if self.linger_ms > self.max_wait_ms {
            return Err(Error::config("flush.linger_ms", "must not exceed flush.max_wait_ms"));
        }
        Ok(())
    }
}

/// Everything one stream's loop needs.
pub struct Stream<'a> {
    /// The stream's name.
    pub name: &'a str,
    /// Where records come from.
    pub source: &'a mut dyn Source,
    /// Turns records into batches.
    pub decoder: &'a mut Decoder,
    /// Where batches go.
    pub sink: &'a dyn Sink,
    /// Micro-batch rules.
    pub flush: &'a FlushConfig,
    /// Live metrics.
    pub metrics: &'a StreamMetrics,
    /// Stops the loop between batches.
    pub cancel: &'a CancellationToken,
}

/// Run a stream from `checkpoint` until the source ends or `cancel` fires. Returns the last
/// durable checkpoint. An error that is not retryable stops the loop; retryable write errors
/// are retried with backoff, the batch held unchanged.
pub async fn run(mut s: Stream<'_>, mut checkpoint: Checkpoint) -> Result<Checkpoint> {
    s.metrics.set_state("running", None);
    loop {
        let first = tokio::select! {
            _ = s.cancel.cancelled() => return Ok(checkpoint),
            chunk = s.source.next() => chunk?,
        };
        let Some(first) = first else { return Ok(checkpoint) };
        let (chunks, ended) = gather(&mut s, first).await?;
        checkpoint = write(&mut s, chunks, checkpoint).await?;
        if ended {
            return Ok(checkpoint);
        }
    }
}

/// Collect chunks until a flush rule fires. Returns them and whether the source ended.
async fn gather(s: &mut Stream<'_>, first: Chunk) -> Result<(Vec<Chunk>, bool)> {
    let deadline = tokio::time::Instant::from_std(first.arrived + Duration::from_millis(s.flush.max_wait_ms));
    let linger = Duration::from_millis(s.flush.linger_ms);
    let mut rows = first.records.len();
    let mut bytes = first.bytes;
    let mut chunks = vec![first];
    while rows < s.flush.max_rows && bytes < s.flush.max_bytes {
        let wake = deadline.min(tokio::time::Instant::now() + linger);
        match tokio::time::timeout_at(wake, s.source.next()).await {
            Ok(Ok(Some(chunk))) => {
                rows += chunk.records.len();
                bytes += chunk.bytes;
                chunks.push(chunk);
            }
            Ok(Ok(None)) => return Ok((chunks, true)),
            Ok(Err(e)) => return Err(e),
            Err(_) => break,
        }
    }
    Ok((chunks, false))
}

/// Decode, write durably (retrying what may succeed), then commit the position upstream.
async fn write(s: &mut Stream<'_>, chunks: Vec<Chunk>, checkpoint: Checkpoint) -> Result<Checkpoint> {
    let Some(position) = chunks.last().map(|c| c.position.clone()) else { return Ok(checkpoint) };
    let arrived: Vec<Instant> = chunks.iter().map(|c| c.arrived).collect();
    let bytes: usize = chunks.iter().map(|c| c.bytes).sum();
    let records: Vec<Record> = chunks.into_iter().flat_map(|c| c.records).collect();
    let newest = records.iter().map(|r| r.meta.received_us).max();

    let (decoded, pending) = s.decoder.decode(records, checkpoint.sequence + 1)?;
    let mut totals = checkpoint.totals.clone();
    totals.events_in += decoded.events;
    totals.rows_written += decoded.rows;
    totals.rejects += decoded.rejects.len() as u64;
    totals.bytes_in += bytes as u64;
    totals.batches += 1;
    totals.last_event_us = newest.max(totals.last_event_us);
    let unit = WriteUnit {
        stream: s.name.to_string(),
        tables: decoded.tables,
        rejects: decoded.rejects,
        checkpoint: Checkpoint { position: position.clone(), sequence: decoded.last_sequence, totals },
    };

    let mut backoff = Duration::from_millis(100);
    loop {
        match s.sink.write(&unit).await {
            Ok(()) => break,
            Err(e) if e.is_retryable() && !s.cancel.is_cancelled() => {
                tracing::warn!(stream = s.name, error = %e, "Write failed; retrying.");
                s.metrics.set_state("retrying", Some(e.to_string()));
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(10));
            }
            Err(e) => {
                s.source.abort(&e).await;
                return Err(e);
            }
        }
    }
    s.decoder.commit(pending);
    let now = Instant::now();
    let latencies: Vec<Duration> = arrived.iter().map(|a| now.duration_since(*a)).collect();
    s.metrics.committed(&unit.checkpoint.totals, &latencies);
    s.source.commit(&position).await?;
    Ok(unit.checkpoint)
}
