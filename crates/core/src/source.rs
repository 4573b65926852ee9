//! The Source trait: where records come from.

use async_trait::async_trait;

use crate::batch::{Chunk, Position};
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
