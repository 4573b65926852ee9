//! The Sink and StateStore traits: where batches go, and where a stream's progress is kept.

use std::sync::Arc;

use async_trait::async_trait;

use crate::batch::{Checkpoint, WriteUnit};
use crate::error::{Error, ErrorKind, Result};
use crate::schema::TableSchema;

/// A destination. `write` returns once the unit is durable: its schema changes, rows, rejects
/// and checkpoint all together, or none of them. A transactional sink commits the checkpoint in
/// the same transaction as the rows; that is what makes a stream exactly once.
#[async_trait]
pub trait Sink: Send + Sync {
    /// Apply `unit` atomically and durably.
    async fn write(&self, unit: Arc<WriteUnit>) -> Result<()>;

    /// How many units the sink can write at once. With two, the run loop hands a snapshot's
    /// chunk to [`Sink::write_after`] while the chunk before it is still being written, so the
    /// destination loads both at once; they still commit in order.
    fn lanes(&self) -> usize {
        1
    }

    /// Apply `unit` on `lane` (0 or 1) while the unit before it may still be in flight on the
    /// other: `unit` may become durable only once `previous` says that one is, and never if it
    /// failed. Called only when [`Sink::lanes`] is two, for a unit of one table's snapshot rows
    /// with no schema change, rejects or push keys, following a unit of the same kind (or that
    /// unit tried again without rows the sink refused, once the one before is durable). A unit
    /// keeps its lane when it is tried again.
    async fn write_after(&self, unit: Arc<WriteUnit>, lane: usize, previous: Preceding) -> Result<()> {
        let _ = lane;
        previous.durable().await?;
        self.write(unit).await
    }

    /// [`Sink::probe`] on `lane`: the loop finds what a unit written beside another refuses
    /// on the unit's own lane, as the other lane may be held by a write waiting for it.
    async fn probe_on(&self, lane: usize, unit: Arc<WriteUnit>) -> Option<Result<()>> {
        let _ = lane;
        self.probe(unit).await
    }

    /// Apply `unit` and roll it back: whether it would commit. A sink that cannot try a write
    /// without keeping it answers `None`; a unit it refuses then stops the stream.
    async fn probe(&self, unit: Arc<WriteUnit>) -> Option<Result<()>> {
        let _ = unit;
        None
    }
}

/// Whether the write before a unit written beside it ([`Sink::write_after`]) is durable: the
/// run loop says so once that write has ended.
#[derive(Clone, Debug)]
pub struct Preceding(tokio::sync::watch::Receiver<Option<bool>>);

impl Preceding {
    /// A handle and the sender that ends it: `Some(true)` once the write is durable,
    /// `Some(false)` (or the sender dropped) when it failed or was stopped.
    pub fn new() -> (tokio::sync::watch::Sender<Option<bool>>, Self) {
        let (tx, rx) = tokio::sync::watch::channel(None);
        (tx, Self(rx))
    }

    /// Wait until the write before is durable; an error if it failed or was stopped (a
    /// write that follows it must then not commit).
    pub async fn durable(&self) -> Result<()> {
        let mut rx = self.0.clone();
        match rx.wait_for(Option::is_some).await.map(|v| *v) {
            Ok(Some(true)) => Ok(()),
            _ => Err(Error::new(ErrorKind::Transient, "the write before this one did not commit")),
        }
    }

    /// Whether the write before has failed or was stopped (so far).
    pub fn failed(&self) -> bool {
        match *self.0.borrow() {
            Some(durable) => !durable,
            None => self.0.has_changed().is_err(),
        }
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
