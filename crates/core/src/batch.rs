//! What moves between the decoder and the sinks: Arrow micro-batches with a table name,
//! the schema changes they need, and the source position they bring the stream to.

use std::time::Instant;

use arrow::record_batch::RecordBatch;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::schema::{ColumnType, SchemaChange};

/// A resumable place in a source (Kafka offsets, shard sequence numbers, an LSN).
/// Opaque to the core; each source reads and writes its own shape.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Position(pub Value);

/// Where a stream stands, stored in the same transaction as its rows.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The source's own position.
    pub position: Position,
    /// The stream's own sequence: the `_position` of the last row written. Monotonic per stream.
    pub sequence: i64,
    /// Running totals, kept with the position so a restart keeps them.
    pub totals: Totals,
}

/// Counters that survive restarts.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Totals {
    /// Events received (accepted and rejected).
    pub events_in: u64,
    /// Rows written to tables.
    pub rows_written: u64,
    /// Rows added to the rejects ledger (whole events and misfit values).
    pub rejects: u64,
    /// Events a transform's filter skipped.
    #[serde(default)]
    pub filtered: u64,
    /// Payload bytes received.
    pub bytes_in: u64,
    /// Batches committed.
    pub batches: u64,
    /// Receive time of the newest committed event, as microseconds since the epoch.
    pub last_event_us: Option<i64>,
}

/// One table's share of a write: the DDL it needs first, then its rows.
#[derive(Debug, Clone)]
pub struct TableWrite {
    /// Destination table.
    pub table: String,
    /// Create, add or widen, applied in order before the rows.
    pub changes: Vec<SchemaChange>,
    /// The stream sequence of the event that brought each column `changes` names (created,
    /// added or widened it); a column not listed came with the unit's last event.
    pub brought_by: Vec<(String, i64)>,
    /// The rows; column names are table column names.
    pub data: RecordBatch,
    /// For a mirrored table: what each row is (upsert or delete, in which order).
    pub mirror: Option<MirrorWrite>,
    /// Rows of a snapshot copy, appended as they are (unless `mirror` is also set).
    pub snapshot: Option<SnapshotWrite>,
}

/// A write of snapshot rows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SnapshotWrite {
    /// Empty the table first: a new copy of it begins.
    pub clear: bool,
    /// The source table's key columns: a destination creates the table with them as its key.
    pub keys: Vec<String>,
    /// The last rows of the table's copy: a destination that loaded the copy without its key
    /// (see [`crate::CopyPhase`]) adds the key now.
    pub complete: bool,
}

/// What the rows of a mirrored table's write mean, one entry per row.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MirrorWrite {
    /// Key columns.
    pub keys: Vec<String>,
    /// The keys are the whole row (a source table without a primary key): rows are matched on
    /// every value, and identical rows are counted, so deleting one of two leaves the other.
    pub whole_row: bool,
    /// Also append every change to `<table>__changes`.
    pub history: bool,
    /// The change each row carries.
    pub ops: Vec<ChangeOp>,
    /// Source order: the stream sequence of the change. The last change per key wins.
    pub orders: Vec<i64>,
    /// Whether the row is a change of its own for the history (the delete half of a key move
    /// is not).
    pub recorded: Vec<bool>,
    /// When the change happened at the source, microseconds since the epoch.
    pub change_us: Vec<Option<i64>>,
    /// The source position of the change, as JSON.
    pub sources: Vec<Option<String>>,
    /// The source position as text that sorts in source order (an LSN, binlog file and
    /// offset, SCN, …), where the source has one. A change at or below the position already
    /// applied to its key is skipped, so replays change nothing.
    pub source_orders: Vec<Option<String>>,
    /// Per row, the columns the source did not send (Debezium's unavailable-value placeholder:
    /// an unchanged TOASTed value). The row keeps the value its key already has.
    pub unavailable: Vec<Vec<String>>,
}

/// The kind of a change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangeOp {
    /// A row was inserted.
    Insert,
    /// A row was updated.
    Update,
    /// A row was deleted.
    Delete,
    /// A row read by a snapshot.
    Snapshot,
    /// The latest version of a keyed event (a plain JSON feed in mirror mode).
    Upsert,
    /// Every row of the table was removed (a Debezium `t` event); its row has no image.
    Truncate,
}

impl ChangeOp {
    /// The name stored in `_op`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Insert => "insert",
            Self::Update => "update",
            Self::Delete => "delete",
            Self::Snapshot => "snapshot",
            Self::Upsert => "upsert",
            Self::Truncate => "truncate",
        }
    }
}

/// A row of the rejects ledger: a value or an event that could not be stored as is.
#[derive(Debug, Clone, PartialEq)]
pub struct Reject {
    /// Destination table.
    pub table: String,
    /// The column, or `None` when the whole event was rejected.
    pub column: Option<String>,
    /// The column's type, when a value did not fit it.
    pub expected: Option<ColumnType>,
    /// The original value or raw event text.
    pub value: String,
    /// The stream sequence of the event.
    pub sequence: i64,
    /// Why (most reasons are fixed text, shared by every row that has them).
    pub reason: std::borrow::Cow<'static, str>,
    /// When it was received, microseconds since the epoch.
    pub received_us: i64,
    /// Source coordinates, e.g. `{"topic": "t", "partition": 0, "offset": 42}`.
    pub source: Option<Value>,
}

/// Everything one commit makes durable, atomically: rows, rejects, position and totals.
#[derive(Debug, Clone)]
pub struct WriteUnit {
    /// The stream that writes.
    pub stream: String,
    /// Rows per table.
    pub tables: Vec<TableWrite>,
    /// Ledger rows.
    pub rejects: crate::rejects::RejectBatch,
    /// Idempotency keys of the pushes in this unit.
    pub idempotency: Vec<IdempotencyKey>,
    /// Ledger rows (whole events, by their sequence) that this unit decodes again: marked
    /// replayed in the same transaction as the rows they become.
    pub replayed: Vec<i64>,
    /// The checkpoint reached once this unit is durable.
    pub checkpoint: Checkpoint,
}

/// A record as a source hands it over: a payload and what the source knows about it.
#[derive(Debug, Clone)]
pub struct Record {
    /// The payload.
    pub payload: Payload,
    /// Source metadata.
    pub meta: RecordMeta,
}

/// A payload: raw bytes to decode, or JSON that the edge already parsed (HTTP push parses to
/// answer 400 synchronously), a change a CDC source already typed, or an input the edge
/// already found bad.
#[derive(Debug, Clone)]
pub enum Payload {
    /// Raw bytes of one message (an object, or an array of objects); the decoder parses them.
    Bytes(bytes::Bytes),
    /// A push body the HTTP edge already checked (an object, an array of objects or NDJSON);
    /// the decoder parses it one event at a time, so it is never held as one tree.
    Body(bytes::Bytes),
    /// A small push body the HTTP edge already split into events (in parallel with other
    /// requests, off the stream's one decoding task).
    Events(Vec<crate::format::json::Event>),
    /// A small push body the HTTP edge already decoded into columns (see
    /// [`crate::decode::Edge`]), with the body kept for a serial decode.
    Decoded(Box<crate::decode::Predecoded>),
    /// A parsed JSON value.
    Json(Value),
    /// Rows of a table snapshot in PostgreSQL's `COPY` text format.
    Copy(CopyRows),
    /// A change to one keyed row, its column types declared by the source (Postgres CDC).
    Change(Box<crate::format::change::Change>),
    /// Input that is not a JSON object; it goes to the ledger with its reason.
    Invalid {
        /// The raw text.
        raw: String,
        /// Why it was refused.
        reason: String,
    },
}

/// Rows of one source table in PostgreSQL's `COPY … TO STDOUT` text format (tab-separated,
/// `\N` for NULL, backslash escapes), printed with `TimeZone` UTC and `DateStyle` ISO, or in
/// its binary format (one row a message, header and trailer taken off) when `binary` gives
/// each field's form. A
/// snapshot's rows are copies of a consistent state, so they are appended as they are instead
/// of being merged by key like changes.
#[derive(Debug, Clone)]
pub struct CopyRows {
    /// The columns, in field order, with the type each gets in a new table.
    pub columns: std::sync::Arc<Vec<(String, ColumnType)>>,
    /// The source table's key columns: every column when it has no key (`whole_row`).
    pub keys: Vec<String>,
    /// The source table has no primary key: its rows are identified by every value, which is
    /// no key for a destination's table (values may be NULL and rows may repeat).
    pub whole_row: bool,
    /// Source database, schema and table (for `[db]`, `[schema]` and `[table]`).
    pub db: String,
    /// Source schema.
    pub schema: String,
    /// Source table.
    pub table: String,
    /// The first rows of a new copy of the table: what the destination held is removed first.
    pub clear: bool,
    /// The last rows of the table's copy.
    pub last: bool,
    /// The rows, one `COPY` data message (one line, newline included) each, as received.
    pub rows: Vec<bytes::Bytes>,
    /// For binary rows, how each field is sent; `None` for text rows.
    pub binary: Option<std::sync::Arc<Vec<crate::decode::Wire>>>,
}

impl CopyRows {
    /// Bytes of row text.
    pub fn len_bytes(&self) -> usize {
        self.rows.iter().map(bytes::Bytes::len).sum()
    }
}

/// Metadata a source may know about a record.
#[derive(Debug, Clone, Default)]
pub struct RecordMeta {
    /// Wall-clock receive time, microseconds since the epoch.
    pub received_us: i64,
    /// Message key.
    pub key: Option<String>,
    /// The transport carries message keys and this record has none (a Kafka message without a
    /// key, a pushed `{"key": null, …}` pair): for Debezium, a row of a table without a primary
    /// key. Without it, a missing key is unknown.
    pub no_key: bool,
    /// Topic (or stream) the record came from.
    pub topic: Option<String>,
    /// Partition within the topic.
    pub partition: Option<i64>,
    /// Offset or sequence number within the partition.
    pub offset: Option<i64>,
    /// Event time set by the producer, microseconds since the epoch.
    pub event_time_us: Option<i64>,
    /// Message headers as a JSON object.
    pub headers: Option<Value>,
    /// Route key for destination templates (topic, source table).
    pub route: Option<String>,
    /// Shard, for sources whose partitions are named (Kinesis).
    pub shard: Option<String>,
    /// Sequence number as text, for sources whose positions do not fit 64 bits (Kinesis).
    pub sequence: Option<String>,
    /// A push's idempotency key, stored with its rows.
    pub idempotency: Option<IdempotencyKey>,
}

/// A client's idempotency key for one push, and the answer it got: committed in the same
/// transaction as the push's rows, so a retry after a timeout is answered, not stored again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyKey {
    /// The client's key.
    pub key: String,
    /// The answer's JSON body.
    pub answer: String,
}

/// What a source hands the run loop.
#[derive(Debug)]
pub struct Chunk {
    /// Records in source order.
    pub records: Vec<Record>,
    /// Payload bytes, for metrics and the flush-by-bytes rule.
    pub bytes: usize,
    /// The source position once these records are durable.
    pub position: Position,
    /// When the chunk arrived, for receive-to-commit latency.
    pub arrived: Instant,
    /// Write what is buffered now, this chunk included, instead of waiting for a flush rule
    /// (a Kafka consumer losing partitions asks for this).
    pub flush: bool,
}

/// Microseconds since the Unix epoch, now.
pub fn now_us() -> i64 {
    chrono::Utc::now().timestamp_micros()
}
