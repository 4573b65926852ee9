//! The push source: a bounded channel of parsed bodies, each answered after its commit.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sluice_core::{Chunk, ChunkReport, ErrorKind, Position, Record, Result, Source, error::Error};
use tokio::sync::{mpsc, oneshot};

use super::KeyMemory;

/// HTTP push settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct HttpPushConfig {
    /// Largest body accepted, after gzip decoding, in bytes; larger bodies get 413.
    pub max_body_bytes: usize,
    /// Bodies waiting to be written before pushes wait their turn.
    pub queue: usize,
    /// Events of one body that are not JSON objects (each a ledger row); a body with more is
    /// refused whole with 422, so one request cannot flood the ledger.
    pub max_invalid_events: usize,
    /// How long a push's `Idempotency-Key` is honoured, in seconds.
    pub idempotency_window_s: u64,
    /// Most idempotency keys remembered; past it the oldest are forgotten first.
    pub idempotency_keys: usize,
}

impl Default for HttpPushConfig {
    fn default() -> Self {
        Self {
            max_body_bytes: 16 << 20,
            queue: 1024,
            max_invalid_events: 1000,
            idempotency_window_s: 3600,
            idempotency_keys: 100_000,
        }
    }
}

impl HttpPushConfig {
    /// Check the values; pure.
    pub fn validate(&self) -> Result<()> {
        if self.max_body_bytes == 0 || self.max_body_bytes > 1 << 30 {
            return Err(Error::config("source.max_body_bytes", "must be between 1 and 1073741824"));
        }
        if self.queue == 0 {
            return Err(Error::config("source.queue", "must be at least 1"));
        }
        if self.idempotency_window_s == 0 || self.idempotency_window_s > 7 * 86_400 {
            return Err(Error::config("source.idempotency_window_s", "must be between 1 and 604800 (a week)"));
        }
        if self.idempotency_keys == 0 || self.idempotency_keys > 10_000_000 {
            return Err(Error::config("source.idempotency_keys", "must be between 1 and 10000000"));
        }
        Ok(())
    }
}

/// Why a push was not stored.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PushError {
    /// The stream is stopping or restarting; nothing of this push was committed.
    #[error("the stream is not running; nothing was stored, retry the push")]
    Unavailable,
    /// The write failed; nothing of this push was committed.
    #[error("the write failed and nothing was stored: {0}")]
    WriteFailed(String),
    /// The disk of the data folder is full; nothing of this push was committed.
    #[error("{0}")]
    NoSpace(String),
}

struct Push {
    records: Vec<Record>,
    bytes: usize,
    arrived: Instant,
    done: oneshot::Sender<Result<ChunkReport, PushError>>,
}

/// The server's side: hands bodies to the stream and waits for them to be durable.
#[derive(Debug, Clone)]
pub struct PushHandle {
    tx: mpsc::Sender<Push>,
    /// The body limit for this stream.
    pub max_body_bytes: usize,
    /// Most events of one body that may be refused before the whole body is.
    pub max_invalid_events: usize,
    /// The stream's idempotency keys.
    pub keys: KeyMemory,
    /// Where bodies are decoded on the requests' tasks, with the stream decoder's schemas.
    pub edge: std::sync::Arc<sluice_core::decode::Edge>,
}

impl PushHandle {
    /// Queue `records` and wait until they are committed; what they came to (which events went
    /// to the ledger).
    pub async fn push(&self, records: Vec<Record>, bytes: usize, arrived: Instant) -> Result<ChunkReport, PushError> {
        let (done, wait) = oneshot::channel();
        self.tx.send(Push { records, bytes, arrived, done }).await.map_err(|_| PushError::Unavailable)?;
        wait.await.map_err(|_| PushError::Unavailable)?
    }
}

/// The stream's side of the channel.
pub struct HttpPushSource {
    rx: mpsc::Receiver<Push>,
    next_id: u64,
    pending: VecDeque<(u64, oneshot::Sender<Result<ChunkReport, PushError>>)>,
}

/// A connected source and handle.
pub fn channel(config: &HttpPushConfig) -> (HttpPushSource, PushHandle) {
    let (tx, rx) = mpsc::channel(config.queue);
    (
        HttpPushSource { rx, next_id: 0, pending: VecDeque::new() },
        PushHandle {
            tx,
            max_body_bytes: config.max_body_bytes,
            max_invalid_events: config.max_invalid_events,
            keys: KeyMemory::new(Duration::from_secs(config.idempotency_window_s), config.idempotency_keys),
            edge: sluice_core::decode::Edge::new(),
        },
    )
}

#[async_trait]
impl Source for HttpPushSource {
    async fn next(&mut self) -> Result<Option<Chunk>> {
        // mpsc::Receiver::recv is cancel-safe: a dropped call loses nothing.
        let Some(push) = self.rx.recv().await else { return Ok(None) };
        self.next_id += 1;
        self.pending.push_back((self.next_id, push.done));
        Ok(Some(Chunk {
            records: push.records,
            bytes: push.bytes,
            // A push's position only orders its answer; the stream's sequence is what is stored.
            position: Position(self.next_id.into()),
            arrived: push.arrived,
            flush: false,
        }))
    }

    async fn commit(&mut self, position: &Position) -> Result<()> {
        self.commit_reports(position, Vec::new()).await
    }

    async fn commit_reports(&mut self, position: &Position, reports: Vec<ChunkReport>) -> Result<()> {
        let upto = position.0.as_u64().unwrap_or(0);
        let mut reports: std::collections::HashMap<u64, ChunkReport> =
            reports.into_iter().filter_map(|r| Some((r.position.0.as_u64()?, r))).collect();
        while self.pending.front().is_some_and(|(id, _)| *id <= upto) {
            if let Some((id, done)) = self.pending.pop_front() {
                // The client may have gone; its events are stored all the same.
                let _ = done.send(Ok(reports.remove(&id).unwrap_or_default()));
            }
        }
        Ok(())
    }

    async fn abort(&mut self, error: &Error) {
        let failed = || match error.kind() {
            ErrorKind::Storage => PushError::NoSpace(error.message().to_string()),
            _ => PushError::WriteFailed(error.to_string()),
        };
        for (_, done) in self.pending.drain(..) {
            let _ = done.send(Err(failed()));
        }
        // A full disk: the pushes still queued would only fail the same way once read, so
        // they are answered now instead of waiting for room.
        if error.kind() == ErrorKind::Storage {
            while let Ok(push) = self.rx.try_recv() {
                let _ = push.done.send(Err(failed()));
            }
        }
    }
}
