//! Sluice's core: batches, schema inference and evolution, formats, the Source / Sink /
//! StateStore traits and the run loop. No network clients live here.
#![warn(missing_docs)]

pub mod batch;
pub mod crash;
pub mod decode;
pub mod error;
pub mod format;
pub mod metrics;
pub mod mirror;
pub mod pipeline;
pub mod quarantine;
pub mod rejects;
pub mod schema;
pub mod secret;
pub mod sink;
pub mod source;
pub mod sync;
pub mod sync_run;
pub mod transform;

pub use batch::{
    ChangeOp, Checkpoint, Chunk, CopyRows, IdempotencyKey, MirrorWrite, Payload, Position, Record, RecordMeta, Reject,
    SnapshotWrite, TableWrite, Totals, WriteUnit,
};
pub use decode::{ChangeConfig, Decoder, Format, MetadataConfig, Mode};
pub use error::{Error, ErrorKind, Result};
pub use format::change::Change;
pub use metrics::{Lag, MetricsSnapshot, StreamMetrics};
pub use pipeline::{FlushConfig, Stream};
pub use rejects::{RejectBatch, Rejects};
pub use schema::{ColumnType, TableSchema};
pub use secret::Secret;
pub use sink::{Sink, StateStore};
pub use source::{ChunkReport, RejectedEvent, Source};
pub use sync::{Capabilities, CopyPhase, Delivery, Destination, Stamp, SyncMode};
pub use sync_run::{Planner, RunCounts, SyncPlan, SyncSpec};
