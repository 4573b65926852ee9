//! The one decoder: records in, typed Arrow batches per table out, with schema changes and
//! rejects. Every source's payloads pass through here.
//!
//! Flattening convention: a nested object's fields become columns named `parent__child`
//! (two underscores), down to [`MAX_DEPTH`] levels; arrays, and objects below that depth, are
//! kept as JSON text in a `JSON` column.

mod body;
pub mod change;
mod column;
mod copy;
mod copy_binary;
mod copy_numeric;
mod edge;
mod metadata;
mod mirror;
mod names;
mod script;
mod spread;
mod transformed;

use std::collections::HashMap;

use serde_json::{Map, Value};

pub use change::{ChangeConfig, Format, Mode};
pub use copy::unescape as unescape_copy_field;
pub use copy_binary::{BinaryCopyReader, Wire, fields as binary_fields, text_of as binary_text};
pub use edge::{Edge, Predecoded};
pub use metadata::MetadataConfig;
use metadata::source_coordinates;
pub use names::MAX_NAME_BYTES;
use names::{bad_name, truncated};
pub use spread::SPREAD_MIN_RUN_BYTES;

use crate::batch::{MirrorWrite, Payload, Record, RecordMeta, Reject, SnapshotWrite, TableWrite};
use crate::error::{Error, ErrorKind, Result};
use crate::format::json::{Event, body_events, message_events};
use crate::rejects::Rejects;
use crate::schema::{Column, ColumnType, Fit, SchemaChange, TableSchema, fit, kind_of};
use crate::transform::Transform;
use column::ColumnBuilder;
use mirror::Declared;

/// Object nesting flattened into columns; deeper objects are kept as JSON.
pub const MAX_DEPTH: usize = 4;
/// Most columns a table gets; fields beyond it go to the ledger instead of widening the table
/// without bound.
pub const MAX_COLUMNS: usize = 2000;
/// Separator between a parent and a child field in a flattened column name.
pub const SEPARATOR: &str = "__";
/// The ledger's reason for a field an object names twice.
const DUPLICATE_NAME: &str = "duplicate field name in one object: the later value was kept";
/// The ledger's reason for a field with an empty name.
const EMPTY_NAME: &str = "field name is empty; SQL has no empty column name";

/// The ledger's reason for a field that would be a column past [`MAX_COLUMNS`].
fn table_full() -> String {
    format!("the table already has the maximum of {MAX_COLUMNS} columns")
}

/// What one decode produced.
#[derive(Debug, Default)]
pub struct Decoded {
    /// Rows per table.
    pub tables: Vec<TableWrite>,
    /// Ledger rows.
    pub rejects: Rejects,
    /// Events seen (rows plus whole-event rejects).
    pub events: u64,
    /// Rows produced.
    pub rows: u64,
    /// The sequence of the last event.
    pub last_sequence: i64,
    /// The sequence of each record's last event, in record order.
    pub record_ends: Vec<i64>,
    /// The sequences of the events the transform's filter or script skipped (their count is
    /// the stream's `filtered`; a script's are its last events that came out as no row and no
    /// error: see `script::apply`).
    pub filtered_at: Vec<i64>,
}

impl Decoded {
    /// A table's finished rows, and the ledger rows its builder left (events with no columns).
    fn add(&mut self, write: Option<TableWrite>, empty: Vec<Reject>) {
        for reject in empty {
            self.rejects.push(reject);
        }
        if let Some(write) = write {
            self.rows += write.data.num_rows() as u64;
            self.tables.push(write);
        }
    }
}

/// Turns records into batches, holding each destination table's schema between calls.
#[derive(Debug)]
pub struct Decoder {
    table: String,
    metadata: MetadataConfig,
    changes: ChangeConfig,
    schemas: HashMap<String, TableSchema>,
    transform: Option<std::sync::Arc<Transform>>,
    /// The push edge this decoder shares its schemas with, and the version it last published.
    edge: Option<(std::sync::Arc<Edge>, u64)>,
}

impl Decoder {
    /// A decoder for `table` (a name, or a template where `*` is the record's route), starting
    /// from the schemas the destination already has.
    pub fn new(table: String, metadata: MetadataConfig, schemas: HashMap<String, TableSchema>) -> Self {
        Self { table, metadata, changes: ChangeConfig::default(), schemas, transform: None, edge: None }
    }

    /// The same decoder sharing its schemas with a push edge, which then decodes bodies on the
    /// requests' tasks (see [`Edge`]). Call it last, once the decoder is configured.
    pub fn with_edge(mut self, edge: Option<std::sync::Arc<Edge>>) -> Self {
        self.edge = edge.map(|edge| {
            let version = edge.publish(&self);
            (edge, version)
        });
        self
    }

    /// Whether a copy of this decoder gives the same result on another task: no transform,
    /// append mode on JSON, no `_position` (the sequence is known only here), one table.
    fn runs_at_edge(&self) -> bool {
        self.decodes_bytes() && !self.metadata.position && !self.table.contains('*')
    }

    /// The same decoder with a transform between the events and the tables.
    pub fn with_transform(mut self, transform: Option<std::sync::Arc<Transform>>) -> Self {
        self.transform = transform;
        self
    }

    /// The same decoder in another mode (mirror) or format (Debezium).
    pub fn with_changes(mut self, changes: ChangeConfig) -> Self {
        self.changes = changes;
        self
    }

    /// The table a record goes to.
    pub fn table_for(&self, meta: &RecordMeta) -> String {
        match &meta.route {
            Some(route) if self.table.contains('*') => self.table.replace('*', route),
            _ => self.table.clone(),
        }
    }

    /// Decode `records`; the first event gets sequence `next_sequence`.
    ///
    /// The schemas held here move forward only with [`Decoder::commit`]. The run loop commits
    /// right after decoding, so the next batch can be decoded while this one is written; if the
    /// write then fails for good, the decoder is rebuilt from the destination.
    pub fn decode(&self, records: Vec<Record>, next_sequence: i64) -> Result<(Decoded, Pending)> {
        let mut out = Decoded { last_sequence: next_sequence - 1, ..Decoded::default() };
        let mut builders: HashMap<String, TableBuilder> = HashMap::new();
        let mut order: Vec<String> = Vec::new();
        let mut early: HashMap<String, Vec<arrow::record_batch::RecordBatch>> = HashMap::new();
        for mut record in records {
            let table = self.table_for(&record.meta);
            if let Payload::Decoded(pre) = record.payload {
                // Taken as the edge decoded it only if the serial decode would give the same.
                let version = self.edge.as_ref().map(|(_, v)| *v);
                let fresh = builders.get(&table).is_none_or(|b| b.rows == 0 && b.changes.is_empty());
                if Some(pre.version) == version && pre.table == table && fresh {
                    self.builder(&table, &mut builders, &mut order);
                    pre.rejects_into(&mut out.rejects, out.last_sequence);
                    out.events += pre.events;
                    out.last_sequence += pre.events as i64;
                    out.record_ends.push(out.last_sequence);
                    if pre.batch.num_rows() > 0 {
                        early.entry(table).or_default().push(pre.batch);
                    }
                    continue;
                }
                record.payload = pre.into_body();
            }
            // Raw payloads are parsed one event at a time: a body of millions of events is
            // never held as values all at once; with nothing between the parser and the
            // columns, straight from the bytes.
            let direct = match record.payload {
                Payload::Bytes(raw) if self.decodes_bytes() => Ok(message_events(raw)),
                Payload::Body(raw) if self.decodes_bytes() => Ok(body_events(raw)),
                other => Err(other),
            };
            let payload = match direct {
                Ok(events) => {
                    let at = Ctx { table: &table, meta: &record.meta, seq: 0 };
                    let builder = self.builder(&table, &mut builders, &mut order);
                    body::raw_events(events, &at, &self.metadata, builder, &mut out);
                    out.record_ends.push(out.last_sequence);
                    continue;
                }
                Err(other) => other,
            };
            let events: Box<dyn Iterator<Item = Event>> = match payload {
                Payload::Bytes(raw) => Box::new(message_events(raw)),
                Payload::Body(raw) => Box::new(body_events(raw)),
                Payload::Events(events) => Box::new(events.into_iter()),
                Payload::Copy(rows) => {
                    self.copy_rows(&record.meta, rows, &mut builders, &mut order, &mut out)?;
                    out.record_ends.push(out.last_sequence);
                    continue;
                }
                other => Box::new(std::iter::once(Event { payload: other, duplicates: Vec::new() })),
            };
            for Event { payload, duplicates } in events {
                out.events += 1;
                out.last_sequence += 1;
                let seq = out.last_sequence;
                let ctx = Ctx { table: &table, meta: &record.meta, seq };
                for (field, earlier) in duplicates {
                    let reason = DUPLICATE_NAME;
                    let value = match &self.transform {
                        // A dropped field leaves no ledger row; a masked one its mask.
                        Some(t) => match t.mapping.ledger_value(&field, &earlier) {
                            Some(value) => value,
                            None => continue,
                        },
                        None => earlier.to_string(),
                    };
                    out.rejects.push(ctx.reject(Some(&field), None, value, reason));
                }
                let (payload, routed) = match &self.transform {
                    Some(t) => match self.transform_event(t, payload, &record.meta) {
                        Ok(done) => done,
                        Err((raw, reason)) => {
                            out.rejects.push(ctx.reject(None, None, raw, reason));
                            continue;
                        }
                    },
                    None => (payload, None),
                };
                let table = routed.as_deref().unwrap_or(&table);
                let ctx = Ctx { table, meta: &record.meta, seq };
                if self.changes.mode == Mode::Mirror {
                    match change::keyed_pair(self.changes.format, payload) {
                        (Some(key), value) => {
                            let meta = RecordMeta { no_key: key.is_none(), key, ..record.meta.clone() };
                            self.change_event(&meta, value, seq, &mut builders, &mut order, &mut out)?;
                        }
                        (None, payload) => {
                            self.change_event(&record.meta, payload, seq, &mut builders, &mut order, &mut out)?
                        }
                    }
                    continue;
                }
                let builder = self.builder(table, &mut builders, &mut order);
                match payload {
                    Payload::Json(Value::Object(map)) => {
                        builder.push_event(&ctx, &self.metadata, &map, Declared::default(), &mut out.rejects);
                    }
                    // In append mode a change is its row image.
                    Payload::Change(change) => {
                        let declared = Declared::of(&change);
                        builder.push_event(&ctx, &self.metadata, &change.image, declared, &mut out.rejects);
                    }
                    Payload::Invalid { raw, reason } => {
                        out.rejects.push(ctx.reject(None, None, raw, reason));
                    }
                    Payload::Json(other) => {
                        out.rejects.push(ctx.reject(None, None, other.to_string(), "expected a JSON object"));
                    }
                    Payload::Bytes(_)
                    | Payload::Body(_)
                    | Payload::Events(_)
                    | Payload::Copy(_)
                    | Payload::Decoded(_) => {
                        return Err(Error::new(ErrorKind::Fatal, "nested raw payload"));
                    }
                }
            }
            out.record_ends.push(out.last_sequence);
        }
        let mut pending = Pending::default();
        for table in order {
            let Some(builder) = builders.remove(&table) else { continue };
            let (write, schema, empty) = builder.finish_transformed(&table, &mut out)?;
            let write = match early.remove(&table) {
                Some(batches) => Some(edge::joined(&table, batches, write, &schema)?),
                None => write,
            };
            pending.schemas.push((table, schema));
            out.add(write, empty);
        }
        Ok((out, pending))
    }

    /// The builder of `table` within one decode, started from the table's known schema.
    fn builder<'b>(
        &self,
        table: &str,
        builders: &'b mut HashMap<String, TableBuilder>,
        order: &mut Vec<String>,
    ) -> &'b mut TableBuilder {
        if !builders.contains_key(table) {
            order.push(table.to_string());
            let schema = self.schemas.get(table).cloned().unwrap_or_default();
            builders.insert(table.to_string(), TableBuilder::new(schema).with_transform(self.transform.clone()));
        }
        builders.get_mut(table).expect("inserted above")
    }

    /// The write that produced `pending` is durable: its schemas are now the tables' schemas.
    pub fn commit(&mut self, pending: Pending) {
        let mut moved = false;
        for (table, schema) in pending.schemas {
            moved |= self.schemas.get(&table).is_none_or(|known| !known.same_as(&schema));
            self.schemas.insert(table, schema);
        }
        if moved && let Some((edge, _)) = &self.edge {
            let version = edge.publish(self);
            self.edge = self.edge.take().map(|(edge, _)| (edge, version));
        }
    }
}

/// Schemas a decode moved to, applied by [`Decoder::commit`] once the write is durable.
#[derive(Debug, Default)]
pub struct Pending {
    schemas: Vec<(String, TableSchema)>,
}

impl Pending {
    /// Each table's schema as it will be once committed.
    pub fn schemas(&self) -> impl Iterator<Item = (&str, &TableSchema)> {
        self.schemas.iter().map(|(table, schema)| (table.as_str(), schema))
    }
}

/// Rows for one table within one decode.
struct TableBuilder {
    schema: TableSchema,
    columns: Vec<ColumnBuilder>,
    /// Index into `changes` of the Create or Add that introduced a column in this batch.
    introduced: foldhash::HashMap<usize, usize>,
    changes: Vec<SchemaChange>,
    /// The event that brought each column `changes` names, by its sequence.
    brought_by: Vec<(String, i64)>,
    /// The sequence of the event being decoded.
    at: i64,
    rows: usize,
    path: String,
    /// The column each leaf field of the last event went to, by its place in the event: the
    /// next event of a feed mostly has the same shape, so a name compare finds its column.
    hints: Vec<usize>,
    /// The place of the next leaf field in the current event.
    visit: usize,
    empty_rows: Vec<(i64, RecordMeta)>,
    /// For a mirrored table: the change each row carries.
    mirror: Option<MirrorWrite>,
    /// Snapshot rows (from a `COPY`) are in this batch.
    snapshot: Option<SnapshotWrite>,
    /// The stream's transform, and what it needs kept per batch.
    transform: Option<transformed::Kept>,
}

impl TableBuilder {
    fn new(schema: TableSchema) -> Self {
        let columns = schema.columns().iter().map(|c| ColumnBuilder::new(c.ty)).collect();
        Self {
            schema,
            columns,
            introduced: foldhash::HashMap::default(),
            changes: Vec::new(),
            brought_by: Vec::new(),
            at: 0,
            rows: 0,
            path: String::new(),
            hints: Vec::new(),
            visit: 0,
            empty_rows: Vec::new(),
            mirror: None,
            snapshot: None,
            transform: None,
        }
    }

    fn push_event(
        &mut self,
        ctx: &Ctx,
        metadata: &MetadataConfig,
        map: &Map<String, Value>,
        declared: Declared<'_>,
        rejects: &mut Rejects,
    ) {
        self.at = ctx.seq;
        self.keep_row(ctx);
        self.push_metadata(ctx, metadata, rejects);
        self.path.clear();
        self.visit = 0;
        self.walk(ctx, map, 0, declared, rejects);
        // Still no column at all: this event had nothing to store (and no metadata is on).
        if self.schema.columns().is_empty() {
            self.empty_rows.push((ctx.seq, ctx.meta.clone()));
        }
        self.rows += 1;
    }

    /// Store an object's fields, flattened; `declared` types the top-level columns of a change.
    fn walk(
        &mut self,
        ctx: &Ctx,
        map: &Map<String, Value>,
        depth: usize,
        declared: Declared<'_>,
        rejects: &mut Rejects,
    ) {
        let mut next = 0;
        for (key, value) in map {
            let Some(mark) = self.enter(ctx, key, depth, || value.to_string(), rejects) else { continue };
            if let Some((mask, keep)) = self.mask_of(&self.path) {
                // A masked column gets only the masked value, whatever spelling brought it.
                let hidden = crate::transform::masked(value, mask, keep);
                let path = std::mem::take(&mut self.path);
                self.put(ctx, &path, &hidden, rejects);
                self.path = path;
                self.path.truncate(mark);
                continue;
            }
            let typed = if depth == 0 { declared.of_column(key, &mut next) } else { None };
            match (typed, value) {
                (Some(typed), _) if !self.path.is_empty() => {
                    let path = std::mem::take(&mut self.path);
                    self.put_change_value(ctx, &path, typed, value, rejects);
                    self.path = path;
                }
                (_, Value::Object(inner)) if depth + 1 < MAX_DEPTH && !inner.is_empty() => {
                    self.walk(ctx, inner, depth + 1, Declared::default(), rejects);
                }
                _ if self.path.is_empty() => {
                    rejects.push(ctx.reject(None, None, value.to_string(), EMPTY_NAME));
                }
                _ => {
                    let path = std::mem::take(&mut self.path);
                    self.put(ctx, &path, value, rejects);
                    self.path = path;
                }
            }
            self.path.truncate(mark);
        }
    }

    /// Put field `key` on the path (after a separator below the top level) and return the mark
    /// to cut the path back to. A name no column can take sends the field (`text`, its JSON) to
    /// the ledger instead, leaves the path as it was and returns `None`.
    fn enter(
        &mut self,
        ctx: &Ctx,
        key: &str,
        depth: usize,
        text: impl FnOnce() -> String,
        rejects: &mut Rejects,
    ) -> Option<usize> {
        let mark = self.path.len();
        if depth > 0 {
            self.path.push_str(SEPARATOR);
        }
        self.path.push_str(key);
        if let Some(reason) = bad_name(key, &self.path) {
            rejects.push(ctx.reject(Some(truncated(&self.path)), None, text(), reason));
            self.path.truncate(mark);
            return None;
        }
        Some(mark)
    }

    /// The mask of column `name`, when the stream's transform has one.
    fn mask_of(&self, name: &str) -> Option<(crate::transform::Mask, usize)> {
        self.transform.as_ref()?.transform.mapping.mask_for(name)
    }

    /// Find or create the column for `name`, typed by `ty` when new.
    fn column(&mut self, name: &str, ty: ColumnType) -> usize {
        if let Some(i) = self.schema.find(name) {
            return i;
        }
        let column = Column { name: name.to_string(), ty };
        let i = self.schema.push(column.clone());
        let mut builder = ColumnBuilder::new(ty);
        builder.pad(self.rows);
        self.columns.push(builder);
        self.brought_by.push((name.to_string(), self.at));
        if self.schema.exists() {
            self.introduced.insert(i, self.changes.len());
            self.changes.push(SchemaChange::Add(column));
        } else {
            match self.changes.first_mut() {
                Some(SchemaChange::Create(cols)) => {
                    self.introduced.insert(i, 0);
                    cols.push(column);
                }
                _ => {
                    self.introduced.insert(i, 0);
                    self.changes.insert(0, SchemaChange::Create(vec![column]));
                }
            }
        }
        i
    }

    /// The column named `name`, as [`TableSchema::find`] finds it: where the field at the same
    /// place in the last event went, when that column has exactly this name, else by the index.
    fn find_column(&mut self, name: &str) -> Option<usize> {
        let at = self.visit;
        self.visit += 1;
        if let Some(&hint) = self.hints.get(at)
            && self.schema.columns().get(hint).is_some_and(|c| c.name == name)
        {
            return Some(hint);
        }
        let found = self.schema.find(name)?;
        if at < MAX_COLUMNS {
            if at >= self.hints.len() {
                self.hints.resize(at + 1, usize::MAX);
            }
            self.hints[at] = found;
        }
        Some(found)
    }

    fn put(&mut self, ctx: &Ctx, name: &str, value: &Value, rejects: &mut Rejects) {
        let i = match self.find_column(name) {
            Some(i) => i,
            None => match kind_of(value).column_type() {
                Some(_) if self.schema.columns().len() >= MAX_COLUMNS => {
                    rejects.push(ctx.reject(Some(name), None, value.to_string(), table_full()));
                    return;
                }
                Some(ty) => {
                    let declared = self.transform.as_ref().and_then(|t| t.transform.mapping.declared(name));
                    self.column(name, declared.unwrap_or(ty))
                }
                // A field seen only as null gets its column once a typed value arrives.
                None => return,
            },
        };
        let ty = self.schema.columns()[i].ty;
        let fitted = fit(ty, value);
        self.store(ctx, i, fitted, Some(value), rejects);
    }

    fn put_typed(&mut self, ctx: &Ctx, name: &str, ty: ColumnType, value: Fit<'_>, rejects: &mut Rejects) {
        let i = self.column(name, ty);
        self.store(ctx, i, value, None, rejects);
    }

    fn store(&mut self, ctx: &Ctx, i: usize, value: Fit<'_>, raw: Option<&Value>, rejects: &mut Rejects) {
        self.store_with(ctx, i, value, || raw.map_or_else(String::new, Value::to_string), rejects);
    }

    /// Store a fitted value; `original` gives its JSON text for a ledger row.
    fn store_with(
        &mut self,
        ctx: &Ctx,
        i: usize,
        value: Fit<'_>,
        original: impl Fn() -> String,
        rejects: &mut Rejects,
    ) {
        let column = &self.schema.columns()[i];
        if self.columns[i].len() > self.rows {
            rejects.push(self.value_reject(
                ctx,
                i,
                original(),
                "duplicate field: another field of this event maps to the same column (flattening or letter case)",
            ));
            return;
        }
        self.columns[i].pad(self.rows);
        match value {
            Fit::Widen(f) => {
                let widened = Column { name: column.name.clone(), ty: ColumnType::Double };
                self.schema.set_type(i, ColumnType::Double);
                self.columns[i].widen_to_double();
                match self.introduced.get(&i).copied() {
                    Some(at) => match &mut self.changes[at] {
                        SchemaChange::Create(cols) => {
                            if let Some(c) = cols.iter_mut().find(|c| c.name == widened.name) {
                                c.ty = ColumnType::Double;
                            }
                        }
                        SchemaChange::Add(c) | SchemaChange::Widen(c) => c.ty = ColumnType::Double,
                    },
                    None => {
                        self.introduced.insert(i, self.changes.len());
                        self.brought_by.push((widened.name.clone(), self.at));
                        self.changes.push(SchemaChange::Widen(widened));
                    }
                }
                self.columns[i].push(Fit::Float(f));
            }
            Fit::Misfit(reason) => {
                self.columns[i].push(Fit::Null);
                rejects.push(self.value_reject(ctx, i, original(), reason));
            }
            other => self.columns[i].push(other),
        }
    }

    fn value_reject(&self, ctx: &Ctx, i: usize, value: String, reason: &'static str) -> Reject {
        let column = &self.schema.columns()[i];
        ctx.reject(Some(&column.name), Some(column.ty), value, reason)
    }

    /// The batch (if the table has columns), the schema it moves the table to, and rejects for
    /// events that had nothing to store.
    fn finish(self, table: &str) -> Result<(Option<TableWrite>, TableSchema, Vec<Reject>)> {
        let mut rejects = Vec::new();
        if self.schema.columns().is_empty() {
            for (seq, meta) in &self.empty_rows {
                let ctx = Ctx { table, meta, seq: *seq };
                let reason = "event has no non-null fields and the table has no columns yet";
                rejects.push(ctx.reject(None, None, "{}".into(), reason));
            }
            return Ok((None, self.schema, rejects));
        }
        // A snapshot of an empty table still creates it (and clears an earlier copy).
        if self.rows == 0 && self.snapshot.is_none() {
            return Ok((None, self.schema, rejects));
        }
        let mut fields = Vec::with_capacity(self.columns.len());
        let mut arrays = Vec::with_capacity(self.columns.len());
        for (column, mut builder) in self.schema.columns().iter().zip(self.columns) {
            builder.pad(self.rows);
            fields.push(column.ty.field(&column.name));
            arrays.push(builder.finish());
        }
        let schema = std::sync::Arc::new(arrow::datatypes::Schema::new(fields));
        let data = arrow::record_batch::RecordBatch::try_new(schema, arrays)
            .map_err(|e| Error::new(ErrorKind::Fatal, "could not build a batch").with_source(e))?;
        let mut schema = self.schema;
        schema.set_exists();
        let write = TableWrite {
            table: table.to_string(),
            changes: self.changes,
            brought_by: self.brought_by,
            data,
            mirror: self.mirror,
            snapshot: self.snapshot,
        };
        Ok((Some(write), schema, rejects))
    }
}

/// Where a value comes from: its table, record and sequence.
struct Ctx<'a> {
    table: &'a str,
    meta: &'a RecordMeta,
    seq: i64,
}

impl Ctx<'_> {
    /// A ledger row for this event: the whole event when `column` is `None`.
    fn reject(
        &self,
        column: Option<&str>,
        expected: Option<ColumnType>,
        value: String,
        reason: impl Into<std::borrow::Cow<'static, str>>,
    ) -> Reject {
        Reject {
            table: self.table.to_string(),
            column: column.map(str::to_string),
            expected,
            value,
            sequence: self.seq,
            reason: reason.into(),
            received_us: self.meta.received_us,
            source: source_coordinates(self.meta),
        }
    }
}
