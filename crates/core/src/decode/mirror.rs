//! Mirror mode in the decoder: each event becomes a keyed change row, with its op, order,
//! change time and source position beside the row image.

use std::collections::HashMap;

use serde_json::{Map, Value};

use super::change::{Change, EventKey, Format, extract, render};
use super::{Ctx, Decoded, Decoder, MetadataConfig, TableBuilder};
use crate::batch::{ChangeOp, MirrorWrite, Payload, RecordMeta};
use crate::error::{Error, ErrorKind, Result};
use crate::format::logical::{REASON, TYPED_MARK};
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
        let event = match payload {
            Payload::Json(v) => v,
            // A Kafka tombstone (no value, or JSON null) follows a Debezium delete: nothing to do.
            Payload::Invalid { raw, .. } if self.changes.format == Format::Debezium && is_tombstone(&raw) => {
                return Ok(());
            }
            Payload::Invalid { raw, reason } => {
                out.rejects.push(reject(raw, reason));
                return Ok(());
            }
            Payload::Bytes(_) | Payload::Body(_) | Payload::Events(_) | Payload::Copy(_) => {
                return Err(Error::new(ErrorKind::Fatal, "nested raw payload"));
            }
        };
        let raw = || serde_json::to_string(&event).unwrap_or_default();
        let raw_text = if self.changes.format == Format::Debezium { Some(raw()) } else { None };
        // Keys the stream configures win over the event's: a keyless message is then not a
        // whole-row identity.
        let key = match EventKey::of(meta) {
            EventKey::Absent if !self.changes.keys.is_empty() => EventKey::Unknown,
            key => key,
        };
        let change = match extract(self.changes.format, event, key) {
            Ok(Some(c)) => c,
            Ok(None) => return Ok(()),
            Err(reason) => {
                out.rejects.push(reject(raw_text.unwrap_or_default(), reason));
                return Ok(());
            }
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
                let raw = raw_text.unwrap_or_else(|| Value::Object(change.image.clone()).to_string());
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
        // Snapshot rows earlier in this batch become `snapshot` changes of the merge.
        builder.pad_mirror();
        let ctx = Ctx { table: &table, meta, seq };
        let Change { op, image, before, change_us, source, source_order, unavailable, .. } = change;
        let moved_from = before.filter(|b| keys.iter().any(|k| b.get(k.as_str()) != image.get(k.as_str())));
        let source = (source.map(|s| s.to_string()), source_order);
        if let Some(old) = moved_from {
            // The key changed: the old key's row goes, as part of this one change.
            builder.push_change(&ctx, &self.metadata, &old, (ChangeOp::Delete, false, change_us, &source), out);
        }
        builder.push_change(&ctx, &self.metadata, &image, (op, true, change_us, &source), out);
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
        (op, recorded, change_us, source): ChangeInfo<'_>,
        out: &mut Decoded,
    ) {
        self.push_event(ctx, metadata, image, &mut out.rejects);
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

    /// A value the Debezium decoder marked with its column type (JSON, DECIMAL, TIME, …).
    pub(super) fn put_marked(&mut self, ctx: &Ctx, path: &str, inner: &Map<String, Value>, rejects: &mut Rejects) {
        let (Some(v), Some(ty)) =
            (inner.get(TYPED_MARK), inner.get("type").and_then(Value::as_str).and_then(ColumnType::from_sql))
        else {
            return;
        };
        let i = self.column(path, ty);
        if let Some(reason) = inner.get(REASON).and_then(Value::as_str) {
            // The decoder could not convert it: NULL here, the original value in the ledger.
            self.store(ctx, i, Fit::Null, None, rejects);
            let column = &self.schema.columns()[i];
            rejects.push(ctx.reject(Some(&column.name), Some(column.ty), v.to_string(), reason.to_string()));
            return;
        }
        // A typed value is there because the source had one: a JSON `null` in a json/jsonb
        // column is the JSON value null, not a missing value, as in a snapshot's rows.
        let f = match (self.schema.columns()[i].ty, v) {
            (ColumnType::Json, Value::Null) => Fit::Text("null".into()),
            (column, v) => fit(column, v),
        };
        self.store(ctx, i, f, Some(v), rejects);
    }
}

/// Whether an object is a typed value from [`crate::format::logical`].
pub(super) fn is_marked(inner: &Map<String, Value>) -> bool {
    inner.contains_key(TYPED_MARK) && (inner.len() == 2 || (inner.len() == 3 && inner.contains_key(REASON)))
}
