//! The Sink and StateStore traits: where batches go, and where a stream's progress is kept.

use std::sync::Arc;

use async_trait::async_trait;

use crate::batch::{Checkpoint, WriteUnit};
use crate::error::Result;
use crate::schema::TableSchema;

/// A destination. `write` returns once the unit is durable: its schema changes, rows, rejects
/// and checkpoint all together, or none of them. A transactional sink commits the checkpoint in
/// the same transaction as the rows; that is what makes a stream exactly once.
#[async_trait]
pub trait Sink: Send + Sync {
    /// Apply `unit` atomically and durably.
    async fn write(&self, unit: Arc<WriteUnit>) -> Result<()>;

    /// Apply `unit` and roll it back: whether it would commit. A sink that cannot try a write
    /// without keeping it answers `None`; a unit it refuses then stops the stream.
    async fn probe(&self, unit: Arc<WriteUnit>) -> Option<Result<()>> {
        let _ = unit;
        None
    }
}

/// Where streams' checkpoints and the destination's table schemas are read back from.
#[async_trait]
pub trait StateStore: Send + Sync {
    /// The last durable checkpoint of `stream`, if any.
    async fn checkpoint(&self, stream: &str) -> Result<Option<Checkpoint>>;

    /// The columns of `table`, if it exists.
    async fn table_schema(&self, table: &str) -> Result<Option<TableSchema>>;
}
