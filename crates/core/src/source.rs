//! The Source trait: where records come from.

use async_trait::async_trait;

use crate::batch::{Chunk, Position};

/// What one chunk's events came to once durable.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChunkReport {
    /// The chunk's position.
    pub position: Position,
    /// Events the chunk held.
    pub events: u64,
    /// Events refused whole (in the ledger, no row).
    pub refused: u64,
    /// The chunk's ledger rows, by event (0-based within the chunk), in order; at most
    /// [`REPORTED_REJECTS`] of them.
    pub rejects: Vec<RejectedEvent>,
    /// Events with at least one ledger row.
    pub rejected: u64,
    /// Events the stream's filter (or script) skipped: no row, no ledger row.
    pub filtered: u64,
}

impl ChunkReport {
    /// What a push's 202 says of its events: `accepted` (stored as rows), `rejected` (with a
    /// ledger row), `filtered` when the stream's filter skipped some, and with `details` the
    /// ledger rows. The same answer is kept with the push's Idempotency-Key.
    pub fn answer(&self, details: bool) -> serde_json::Value {
        let stored = self.events.saturating_sub(self.refused + self.filtered);
        let mut answer = serde_json::json!({ "accepted": stored, "rejected": self.rejected });
        if self.filtered > 0 {
            answer["filtered"] = serde_json::json!(self.filtered);
        }
        if details {
            answer["rejects"] = serde_json::json!(self.rejects);
        }
        answer
    }
}

/// Most ledger rows a chunk's report lists.
pub const REPORTED_REJECTS: usize = 100;

/// A ledger row of a chunk's event.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RejectedEvent {
    /// The event, 0-based within its chunk.
    pub event: u64,
    /// The column, or none when the whole event was refused.
    pub column: Option<String>,
    /// Why.
    pub reason: String,
}
use crate::error::{Error, Result};

/// A source of records. Sources only move bytes (or, for HTTP push, JSON the edge parsed); the
/// run loop decodes, writes and then calls [`Source::commit`].
#[async_trait]
pub trait Source: Send {
    /// The next chunk, waiting until one is ready; `None` once the source has ended.
    ///
    /// Must be cancel-safe: the run loop drops this future when a flush is due, and a dropped
    /// call must not lose records.
    async fn next(&mut self) -> Result<Option<Chunk>>;

    /// Everything up to `position` is durable in the destination: acknowledge upstream.
    async fn commit(&mut self, position: &Position) -> Result<()>;

    /// [`Source::commit`], with what each chunk of the write came to: sources that answer their
    /// producers (HTTP push) tell each which of its events went to the ledger.
    async fn commit_reports(&mut self, position: &Position, reports: Vec<ChunkReport>) -> Result<()> {
        let _ = reports;
        self.commit(position).await
    }

    /// The records handed out since the last commit will not be written (the stream stops).
    async fn abort(&mut self, _error: &Error) {}

    /// The stream restarts from `position`, its last durable checkpoint: deliver again what
    /// came after it. Sources that cannot replay (HTTP push answered those requests with an
    /// error in `abort`) do nothing.
    async fn rewind(&mut self, _position: &Position) -> Result<()> {
        Ok(())
    }

    /// The stream stops: release the source cleanly (for Kafka, leave the consumer group so its
    /// partitions move to another member at once).
    async fn close(&mut self) {}
}
