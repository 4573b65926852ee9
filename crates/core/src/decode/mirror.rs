//! Mirror mode in the decoder: each event becomes a keyed change row, with its op, order,
//! change time and source position beside the row image. A change comes typed from its source
//! (Postgres CDC), or is read from a Debezium event or a plain JSON one.

use std::borrow::Cow;
use std::collections::HashMap;

use serde_json::{Map, Value};

use super::change::{Format, render};
use super::{Ctx, Decoded, Decoder, MAX_COLUMNS, MetadataConfig, TableBuilder};
use crate::batch::{ChangeOp, MirrorWrite, Payload, RecordMeta};
use crate::error::{Error, ErrorKind, Result};
use crate::format::change::{Change, EventKey, Unconverted};
use crate::format::debezium;
use crate::rejects::Rejects;
use crate::schema::{ColumnType, Fit, fit};

impl Decoder {
    /// Decode one event of a mirror stream into its table's builder, or the ledger.
    pub(super) fn change_event(
        &self,
        meta: &RecordMeta,
        payload: Payload,
        seq: i64,
        builders: &mut HashMap<String, TableBuilder>,
        order: &mut Vec<String>,
        out: &mut Decoded,
    ) -> Result<()> {
        let fallback = self.table_for(meta);
        let reject = |raw: String, reason: String| Ctx { table: &fallback, meta, seq }.reject(None, None, raw, reason);
        // With masks or drops, an event the rules could not act on keeps no raw text.
        let hides = self.transform.as_ref().is_some_and(|t| t.mapping.hides());
        let raw_of = |raw: String| if hides { super::transformed::WITHHELD.to_string() } else { raw };
        // A Debezium event is kept as sent, and turned into text only for a ledger row.
        let (change, event) = match payload {
            Payload::Change(change) => (*change, None),
            Payload::Json(Value::Object(image)) if self.changes.format == Format::Json => (Change::upsert(image), None),
            Payload::Json(event) if self.changes.format == Format::Json => {
                out.rejects.push(reject(raw_of(event.to_string()), "expected a JSON object".into()));
                return Ok(());
            }
            Payload::Json(event) => {
                // Keys the stream configures win over the event's: a keyless message is then not
                // a whole-row identity.
                let key = match EventKey::of(meta) {
                    EventKey::Absent if !self.changes.keys.is_empty() => EventKey::Unknown,
                    key => key,
                };
                match debezium::change(&event, key) {
                    Ok(Some(change)) => (change, Some(event)),
                    Ok(None) => return Ok(()),
                    Err(reason) => {
                        out.rejects.push(reject(raw_of(event.to_string()), reason));
                        return Ok(());
                    }
                }
            }
            // A Kafka tombstone (no value, or JSON null) follows a Debezium delete: nothing to do.
            Payload::Invalid { raw, .. } if self.changes.format == Format::Debezium && is_tombstone(&raw) => {
                return Ok(());
            }
            Payload::Invalid { raw, reason } => {
                out.rejects.push(reject(raw_of(raw), reason));
                return Ok(());
            }
            Payload::Bytes(_) | Payload::Body(_) | Payload::Events(_) | Payload::Copy(_) | Payload::Decoded(_) => {
                return Err(Error::new(ErrorKind::Fatal, "nested raw payload"));
            }
        };
        // The stream's field rules apply to the change; with masks or drops, its raw event is
        // not kept.
        let (change, event) = match &self.transform {
            Some(t) if !t.mapping.is_empty() => (t.mapping.change(change), if hides { None } else { event }),
            _ => (change, event),
        };
        let keys = if self.changes.keys.is_empty() { &change.keys } else { &self.changes.keys };
        let truncate = change.op == ChangeOp::Truncate;
        let problem = if truncate {
            // A truncate names no key: it is about the whole table.
            None
        } else if keys.is_empty() {
            Some("no key columns: set `keys` on the stream, or send the Debezium key as the message key".to_string())
        } else {
            // Keys the event names itself may hold NULL: a primary key cannot, so such a key is a
            // whole row (a table without one, REPLICA IDENTITY FULL), matched NULL-safe. Keys the
            // stream configures must have a value.
            let null_ok = self.changes.keys.is_empty();
            keys.iter()
                .find(|k| change.image.get(k.as_str()).is_none_or(|v| v.is_null() && !null_ok))
                .map(|k| format!("key column `{k}` is missing or null"))
        };
        let table = match (problem, render(&self.table, meta.route.as_deref(), &change.route)) {
            (None, Ok(table)) => table,
            (Some(reason), _) | (None, Err(reason)) => {
                let raw = match (event, &self.transform) {
                    (Some(event), _) => event.to_string(),
                    (None, Some(t)) => t.mapping.hidden_change(&change).to_string(),
                    (None, None) => change.to_json().to_string(),
                };
                out.rejects.push(reject(raw, reason));
                return Ok(());
            }
        };
        let builder = self.builder(&table, builders, order);
        if truncate && builder.schema.columns().is_empty() {
            // A table with no columns has no rows to remove.
            return Ok(());
        }
        // Keys the event names that cover its whole image: a table without a primary key.
        let whole_row = self.changes.keys.is_empty()
            && !truncate
            && !change.image.is_empty()
            && change.image.keys().all(|c| keys.contains(c));
        let mirror = builder.mirror.get_or_insert_with(|| MirrorWrite {
            keys: keys.clone(),
            whole_row,
            history: self.changes.history,
            ..MirrorWrite::default()
        });
        if mirror.keys.is_empty() {
            // A batch that began with a truncate learns its keys from the first keyed change.
            mirror.keys = keys.clone();
            mirror.whole_row = whole_row;
        }
        let counted = mirror.whole_row;
        // Snapshot rows earlier in this batch become `snapshot` changes of the merge.
        builder.pad_mirror();
        let ctx = Ctx { table: &table, meta, seq };
        let Change { op, image, before, types, unconverted, change_us, source, source_order, unavailable, .. } = change;
        // A table without a key counts copies: an update moves one from its old image to its
        // new one, also when the two are equal (an UPDATE that changed nothing).
        let moved_from = before.filter(|b| {
            (counted && op == ChangeOp::Update) || keys.iter().any(|k| b.get(k.as_str()) != image.get(k.as_str()))
        });
        let source = (source.map(|s| s.to_string()), source_order);
        let declared = |in_before| Declared { types: &types, unconverted: &unconverted, in_before };
        if let Some(old) = moved_from {
            // The key changed: the old key's row goes, as part of this one change.
            let info = (ChangeOp::Delete, false, change_us, &source);
            builder.push_change(&ctx, &self.metadata, &old, declared(true), info, out);
        }
        builder.push_change(&ctx, &self.metadata, &image, declared(false), (op, true, change_us, &source), out);
        if let Some(m) = builder.mirror.as_mut() {
            *m.unavailable.last_mut().expect("pushed above") = unavailable;
        }
        Ok(())
    }
}

fn is_tombstone(raw: &str) -> bool {
    let raw = raw.trim();
    raw.is_empty() || raw == "null"
}

/// What a mirror row carries besides its image: op, whether it is recorded in the history,
/// change time and source position.
type ChangeInfo<'a> = (ChangeOp, bool, Option<i64>, &'a (Option<String>, Option<String>));

impl TableBuilder {
    fn push_change(
        &mut self,
        ctx: &Ctx,
        metadata: &MetadataConfig,
        image: &Map<String, Value>,
        declared: Declared<'_>,
        (op, recorded, change_us, source): ChangeInfo<'_>,
        out: &mut Decoded,
    ) {
        self.push_event(ctx, metadata, image, declared, &mut out.rejects);
        if let Some(m) = self.mirror.as_mut() {
            m.ops.push(op);
            m.orders.push(ctx.seq);
            m.recorded.push(recorded);
            m.change_us.push(change_us);
            m.sources.push(source.0.clone());
            m.source_orders.push(source.1.clone());
            m.unavailable.push(Vec::new());
        }
    }

    /// A value whose column type the change declares: a new column gets that type, and the
    /// value is fitted to the column's type.
    fn put_declared(&mut self, ctx: &Ctx, name: &str, ty: ColumnType, value: &Value, rejects: &mut Rejects) {
        let i = match self.schema.find(name) {
            Some(i) => i,
            // A column appears with its first value, as any field's does.
            None if value.is_null() => return,
            None if self.schema.columns().len() >= MAX_COLUMNS => {
                rejects.push(ctx.reject(Some(name), None, value.to_string(), super::table_full()));
                return;
            }
            None => self.column(name, ty),
        };
        let column = self.schema.columns()[i].ty;
        match (ty, value) {
            // A JSON document's text: stored as it is.
            (ColumnType::Json, Value::String(text)) if column == ColumnType::Json => {
                self.store(ctx, i, Fit::Text(Cow::Borrowed(text)), Some(value), rejects);
            }
            // A JSON document in a column of another type (the source column's type changed).
            (ColumnType::Json, Value::String(text)) => {
                let document = serde_json::from_str(text).unwrap_or_else(|_| value.clone());
                self.store(ctx, i, fit(column, &document), Some(&document), rejects);
            }
            _ => self.store(ctx, i, fit(column, value), Some(value), rejects),
        }
    }

    /// A value the format could not convert to its declared type: NULL in its column, and the
    /// value as sent in the ledger with the reason.
    fn put_unconverted(
        &mut self,
        ctx: &Ctx,
        name: &str,
        ty: ColumnType,
        value: &Value,
        reason: &str,
        rejects: &mut Rejects,
    ) {
        let i = self.column(name, ty);
        self.store(ctx, i, Fit::Null, None, rejects);
        let column = &self.schema.columns()[i];
        rejects.push(ctx.reject(Some(&column.name), Some(column.ty), value.to_string(), reason.to_string()));
    }

    /// A top-level column of a change's image, with the type the change declares for it.
    pub(super) fn put_change_value(
        &mut self,
        ctx: &Ctx,
        name: &str,
        (ty, reason): (ColumnType, Option<&str>),
        value: &Value,
        rejects: &mut Rejects,
    ) {
        match reason {
            Some(reason) => self.put_unconverted(ctx, name, ty, value, reason, rejects),
            None => self.put_declared(ctx, name, ty, value, rejects),
        }
    }
}

/// What a change declares about the top-level columns of one of its images. Empty for a plain
/// JSON event, whose column types are inferred.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Declared<'a> {
    types: &'a [(String, ColumnType)],
    unconverted: &'a [Unconverted],
    /// The image is the change's `before`.
    in_before: bool,
}

impl<'a> Declared<'a> {
    /// What the change declares about its main image.
    pub(super) fn of(change: &'a Change) -> Self {
        Self { types: &change.types, unconverted: &change.unconverted, in_before: false }
    }

    /// The declared type of column `name`, and why its value could not be converted, if it
    /// could not. Images list their columns in the order of `types`, so the search starts
    /// after the column found last (`next`).
    pub(super) fn of_column(&self, name: &str, next: &mut usize) -> Option<(ColumnType, Option<&'a str>)> {
        let n = self.types.len();
        let i = (0..n).map(|step| (*next + step) % n).find(|&i| self.types[i].0 == name)?;
        *next = i + 1;
        let reason = self.unconverted.iter().find(|u| u.in_before == self.in_before && u.column == name);
        Some((self.types[i].1, reason.map(|u| u.reason.as_str())))
    }
}
