//! Decoding at the edge: a push body becomes Arrow columns on the request's own task, so
//! decoding runs on every core while the stream's one loop only joins the batches and writes.
//!
//! It is optimistic. The edge decodes against the schemas the stream's decoder last committed,
//! tagged with a version. The stream takes such a batch only when nothing moved since: the same
//! version, no column added or widened by the batch itself, and nothing decoded before it in
//! the same unit for that table. Anything else is decoded again from the body, serially, as if
//! the edge had never seen it, so the result is always the serial decoder's.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use arrow::array::{ArrayRef, RecordBatch, new_null_array};
use arrow::datatypes::SchemaRef;

use super::{Decoder, Pending};
use crate::batch::{Payload, RecordMeta};
use crate::format::json::{BodyError, BodySummary};
use crate::rejects::Rejects;

/// A body decoded at the edge, and the body itself should the stream decode it again.
#[derive(Debug, Clone)]
pub struct Predecoded {
    /// The schema version it was decoded against.
    pub(super) version: u64,
    /// Its table.
    pub(super) table: String,
    /// Its rows, in the table's columns as of `version`.
    pub(super) batch: RecordBatch,
    /// Ledger rows, with sequences counted from 1 within the body, kept as columns while the
    /// body waits in the queue.
    pub(super) rejects: Arc<Rejects>,
    /// Events in the body.
    pub(super) events: u64,
    /// The body, for a serial decode.
    pub(super) raw: bytes::Bytes,
}

/// What the stream's decoder shares with its push edge: a decoder that can run anywhere, with
/// the schemas it last committed. Empty while the stream's decoder cannot be run at the edge (a
/// transform, mirror mode, Debezium events, a `_position` column, a routed table).
#[derive(Debug, Default)]
pub struct Edge {
    current: RwLock<Option<Arc<Shared>>>,
    versions: std::sync::atomic::AtomicU64,
}

#[derive(Debug)]
struct Shared {
    version: u64,
    decoder: Decoder,
}

impl Edge {
    /// A new, empty edge.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Publish what `decoder` knows now (or clear it); the version it gets.
    pub(super) fn publish(&self, decoder: &Decoder) -> u64 {
        let version = self.versions.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        let shared = decoder.runs_at_edge().then(|| {
            let schemas = decoder.schemas.get(&decoder.table).map(|s| (decoder.table.clone(), s.clone()));
            let schemas: HashMap<_, _> = schemas.into_iter().collect();
            Arc::new(Shared {
                version,
                decoder: Decoder::new(decoder.table.clone(), decoder.metadata.clone(), schemas),
            })
        });
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = shared;
        version
    }

    /// Decode a push body for the stream, and count its events as the edge answers them: the
    /// body as columns, or as it is when the edge cannot take it (the body changes the table's
    /// schema). `None` when nothing is published: the stream decodes every body itself.
    pub fn decode_body(
        &self,
        body: &bytes::Bytes,
        meta: &RecordMeta,
    ) -> Option<Result<(Payload, BodySummary), BodyError>> {
        let shared = self.current.read().unwrap_or_else(|e| e.into_inner()).clone()?;
        let table = shared.decoder.table_for(meta);
        let (decoded, summary) = match shared.decoder.decode_body(body, meta, 1) {
            Ok(done) => done,
            Err(e) => return Some(Err(e)),
        };
        // A table with no columns yet takes its first ones from the stream's decoder.
        let ready = shared.decoder.schemas.get(&table).is_some_and(|s| !s.columns().is_empty() && s.exists());
        let as_is = Some(Ok((Payload::Body(body.clone()), summary)));
        let Ok((mut decoded, Pending { .. })) = decoded else { return as_is };
        let unchanged = decoded.tables.iter().all(|t| t.changes.is_empty() && t.table == table);
        if !ready || !unchanged || decoded.tables.len() > 1 {
            return as_is;
        }
        let batch = match decoded.tables.pop() {
            Some(write) => write.data,
            None => RecordBatch::new_empty(Arc::new(arrow::datatypes::Schema::empty())),
        };
        let rejects = std::mem::take(&mut decoded.rejects);
        let predecoded = Predecoded {
            version: shared.version,
            table,
            batch,
            rejects: Arc::new(rejects),
            events: decoded.events,
            raw: body.clone(),
        };
        Some(Ok((Payload::Decoded(Box::new(predecoded)), summary)))
    }
}

impl Predecoded {
    /// The body, for a serial decode.
    pub(super) fn into_body(self) -> Payload {
        Payload::Body(self.raw)
    }

    /// Add this body's ledger rows to `rejects`, its sequences following `before`.
    pub(super) fn rejects_into(&self, rejects: &mut Rejects, before: i64) {
        rejects.extend_shifted(&self.rejects, before);
    }
}

/// `batch` in the columns of `schema` (found by name; columns it lacks are NULL, narrower
/// ones cast), for joining it with batches decoded later in the same unit.
pub(super) fn aligned(batch: &RecordBatch, schema: &SchemaRef) -> crate::error::Result<RecordBatch> {
    let rows = batch.num_rows();
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
    for field in schema.fields() {
        let column = match batch.column_by_name(field.name()) {
            Some(c) if c.data_type() == field.data_type() => c.clone(),
            Some(c) => arrow::compute::cast(c, field.data_type()).map_err(fatal)?,
            None => new_null_array(field.data_type(), rows),
        };
        columns.push(column);
    }
    let options = arrow::array::RecordBatchOptions::new().with_row_count(Some(rows));
    RecordBatch::try_new_with_options(schema.clone(), columns, &options).map_err(fatal)
}

fn fatal(e: arrow::error::ArrowError) -> crate::error::Error {
    crate::error::Error::new(crate::error::ErrorKind::Fatal, "could not join batches decoded at the edge")
        .with_source(e)
}

/// The unit's write for `table`: the batches taken from the edge, in arrival order, then the
/// rows decoded serially after them.
pub(super) fn joined(
    table: &str,
    early: Vec<RecordBatch>,
    later: Option<crate::batch::TableWrite>,
    schema: &crate::schema::TableSchema,
) -> crate::error::Result<crate::batch::TableWrite> {
    let mut write = later.unwrap_or_else(|| {
        let fields: Vec<_> = schema.columns().iter().map(|c| c.ty.field(&c.name)).collect();
        crate::batch::TableWrite {
            table: table.to_string(),
            changes: Vec::new(),
            brought_by: Vec::new(),
            data: RecordBatch::new_empty(Arc::new(arrow::datatypes::Schema::new(fields))),
            mirror: None,
            snapshot: None,
        }
    });
    let target = write.data.schema();
    let mut batches = Vec::with_capacity(early.len() + 1);
    for batch in &early {
        batches.push(aligned(batch, &target)?);
    }
    batches.push(write.data);
    write.data = arrow::compute::concat_batches(&target, &batches).map_err(fatal)?;
    Ok(write)
}
