//! A push body decoded straight from its bytes, with no `serde_json::Value` per event: the
//! edge's path ([`super::Edge`]). It gives what [`Decoder::decode`] gives for the same body
//! (rows, schema changes, ledger rows), for a decoder without a transform, in append mode. The
//! stream's own decoder takes the same path for raw messages (Kafka, Kinesis) and bodies.

use std::borrow::Cow;

use super::MetadataConfig;
use super::table_full;
use super::{Ctx, DUPLICATE_NAME, Decoded, Decoder, EMPTY_NAME, MAX_COLUMNS, MAX_DEPTH, Pending, TableBuilder};
use crate::batch::RecordMeta;
use crate::format::json::raw::{self, Raw};
use crate::format::json::{BodyError, BodyEvents, BodySummary, Span, body_events, check_body, not_an_object, not_json};
use crate::rejects::Rejects;

impl Decoder {
    /// Decode `body` (an object, an array of objects or NDJSON), its first event numbered
    /// `next_sequence`, and count its events as the HTTP edge answers them. A body that is not
    /// JSON at all is a located [`BodyError`], as [`crate::format::json::parse_body`] says.
    pub fn decode_body(
        &self,
        body: &bytes::Bytes,
        meta: &RecordMeta,
        next_sequence: i64,
    ) -> Result<(crate::error::Result<(Decoded, Pending)>, BodySummary), BodyError> {
        let events = body_events(body.clone());
        if events.is_array() {
            // An array that does not parse to its end is refused whole.
            check_body(body)?;
        }
        let table = self.table_for(meta);
        let mut out = Decoded { last_sequence: next_sequence - 1, ..Decoded::default() };
        let schema = self.schemas.get(&table).cloned().unwrap_or_default();
        let mut builder = TableBuilder::new(schema);
        let summary = raw_events(events, &Ctx { table: &table, meta, seq: 0 }, &self.metadata, &mut builder, &mut out);
        out.record_ends.push(out.last_sequence);
        if summary.invalid == summary.events && summary.invalid > 0 {
            // Nothing parsed as an object: the body may not be JSON at all, which check_body tells.
            check_body(body)?;
        }
        let finished = builder.finish(&table).map(|(write, schema, empty)| {
            out.add(write, empty);
            (out, Pending { schemas: vec![(table.clone(), schema)] })
        });
        Ok((finished, summary))
    }

    /// Whether events are decoded from their bytes, with no `Value` each: nothing acts on them
    /// between the parser and the columns (no transform, append mode, plain JSON).
    pub(super) fn decodes_bytes(&self) -> bool {
        self.transform.is_none() && self.changes == super::ChangeConfig::default()
    }
}

/// Decode each event of `events` into `builder`, for `at`'s table and record, numbering them
/// on from `out.last_sequence`; what they were, as the HTTP edge counts them.
pub(super) fn raw_events(
    mut events: BodyEvents,
    at: &Ctx,
    metadata: &MetadataConfig,
    builder: &mut TableBuilder,
    out: &mut Decoded,
) -> BodySummary {
    let mut summary = BodySummary::default();
    while let Some(span) = events.next_span() {
        out.events += 1;
        out.last_sequence += 1;
        summary.events += 1;
        let ctx = Ctx { table: at.table, meta: at.meta, seq: out.last_sequence };
        let (range, line) = match span {
            Span::Text(range, line) => (range, line),
            Span::Broken(event) => {
                summary.invalid += 1;
                if let crate::batch::Payload::Invalid { raw, reason } = event.payload {
                    out.rejects.push(ctx.reject(None, None, raw, reason));
                }
                continue;
            }
        };
        let text = &events.body()[range];
        match raw::parse(text) {
            Ok(event) => {
                for (field, earlier) in event.duplicates {
                    out.rejects.push(ctx.reject(Some(&field), None, earlier.to_string(), DUPLICATE_NAME));
                }
                match &event.value {
                    Raw::Object(fields) => builder.push_raw_event(&ctx, metadata, fields, &mut out.rejects),
                    other => {
                        summary.invalid += 1;
                        let reason = not_an_object(&other.to_value());
                        out.rejects.push(ctx.reject(None, None, other.to_json(), reason));
                    }
                }
            }
            Err(e) => {
                summary.invalid += 1;
                let text = String::from_utf8_lossy(text).into_owned();
                out.rejects.push(ctx.reject(None, None, text, not_json(line, &e)));
            }
        }
    }
    summary
}

impl TableBuilder {
    fn push_raw_event(
        &mut self,
        ctx: &Ctx,
        metadata: &MetadataConfig,
        fields: &[(Cow<'_, str>, Raw<'_>)],
        rejects: &mut Rejects,
    ) {
        self.at = ctx.seq;
        self.keep_row(ctx);
        self.push_metadata(ctx, metadata, rejects);
        self.path.clear();
        self.visit = 0;
        self.walk_raw(ctx, fields, 0, rejects);
        // Still no column at all: this event had nothing to store (and no metadata is on).
        if self.schema.columns().is_empty() {
            self.empty_rows.push((ctx.seq, ctx.meta.clone()));
        }
        self.rows += 1;
    }

    /// [`TableBuilder::walk`] over a raw object (no declared types, no masks: no transform).
    fn walk_raw(&mut self, ctx: &Ctx, fields: &[(Cow<'_, str>, Raw<'_>)], depth: usize, rejects: &mut Rejects) {
        for (key, value) in fields {
            let Some(mark) = self.enter(ctx, key, depth, || value.to_json(), rejects) else { continue };
            match value {
                Raw::Object(inner) if depth + 1 < MAX_DEPTH && !inner.is_empty() => {
                    self.walk_raw(ctx, inner, depth + 1, rejects);
                }
                _ if self.path.is_empty() => {
                    rejects.push(ctx.reject(None, None, value.to_json(), EMPTY_NAME));
                }
                _ => {
                    let path = std::mem::take(&mut self.path);
                    self.put_raw(ctx, &path, value, rejects);
                    self.path = path;
                }
            }
            self.path.truncate(mark);
        }
    }

    /// [`TableBuilder::put`] of a raw value.
    fn put_raw(&mut self, ctx: &Ctx, name: &str, value: &Raw<'_>, rejects: &mut Rejects) {
        let i = match self.find_column(name) {
            Some(i) => i,
            None => match value.kind().column_type() {
                Some(_) if self.schema.columns().len() >= MAX_COLUMNS => {
                    rejects.push(ctx.reject(Some(name), None, value.to_json(), table_full()));
                    return;
                }
                Some(ty) => self.column(name, ty),
                // A field seen only as null gets its column once a typed value arrives.
                None => return,
            },
        };
        let ty = self.schema.columns()[i].ty;
        let fitted = value.fit(ty);
        self.store_with(ctx, i, fitted, || value.to_json(), rejects);
    }
}
