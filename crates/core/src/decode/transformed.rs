//! Where the decoder meets a stream's transform: field rules and routes per event, SQL
//! expressions per finished batch.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, BooleanArray};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::record_batch::RecordBatch;
use serde_json::Value;

use super::metadata::source_coordinates;
use super::{Ctx, Decoded, Decoder, Mode, TableBuilder};
use crate::batch::{Payload, RecordMeta, Reject, TableWrite};
use crate::error::{Error, ErrorKind, Result};
use crate::schema::{Column, ColumnType, SchemaChange, TableSchema};
use crate::transform::{Transform, cast_to, column_type_of};

/// What one table's builder keeps for its transform within a batch.
#[derive(Debug)]
pub(super) struct Kept {
    pub(super) transform: Arc<Transform>,
    /// The table's schema before this batch: a batch whose rows are all skipped leaves it.
    pub(super) original: TableSchema,
    /// Per row: its sequence, receive time and source coordinates, for ledger rows.
    pub(super) rows: Vec<(i64, i64, Option<Value>)>,
}

/// What the ledger keeps of an event it may not see whole.
pub(super) const WITHHELD: &str =
    "(withheld: the stream masks or drops fields, and this event could not be read to apply them)";

impl Decoder {
    /// Apply the field rules to one event and find its table (`None`: the stream's). A refused
    /// event comes back as its ledger text and reason.
    pub(super) fn transform_event(
        &self,
        t: &Transform,
        payload: Payload,
        meta: &RecordMeta,
    ) -> Result<(Payload, Option<String>), (String, String)> {
        let payload = match payload {
            // In mirror mode events become changes first, and the rules apply to the change.
            Payload::Json(Value::Object(mut map)) if self.changes.mode == Mode::Append => {
                t.mapping.apply(&mut map);
                Payload::Json(Value::Object(map))
            }
            Payload::Change(change) if self.changes.mode == Mode::Append => {
                Payload::Change(Box::new(t.mapping.change(*change)))
            }
            Payload::Invalid { reason, .. } if t.mapping.hides() => {
                return Err((WITHHELD.to_string(), reason));
            }
            Payload::Json(other) if t.mapping.hides() && !other.is_object() => {
                return Err((WITHHELD.to_string(), "expected a JSON object".into()));
            }
            other => other,
        };
        let Some(route) = &t.route else { return Ok((payload, None)) };
        let image = match &payload {
            Payload::Json(Value::Object(map)) => map,
            Payload::Change(change) => &change.image,
            _ => return Ok((payload, None)),
        };
        match route.render(image, meta.route.as_deref()) {
            Ok(table) => Ok((payload, Some(table))),
            Err(reason) => {
                // The event as the rules left it, masks applied: the ledger keeps no more.
                let raw = match &payload {
                    Payload::Json(Value::Object(map)) => Value::Object(t.mapping.hidden(map)).to_string(),
                    Payload::Change(c) => t.mapping.hidden_change(c).to_string(),
                    _ => String::new(),
                };
                Err((raw, reason))
            }
        }
    }
}

impl TableBuilder {
    /// The builder of a stream with `transform`.
    pub(super) fn with_transform(mut self, transform: Option<Arc<Transform>>) -> Self {
        self.transform = transform.map(|transform| Kept { transform, original: self.schema.clone(), rows: Vec::new() });
        self
    }

    /// Note an event's row, when the transform's expressions may send it to the ledger.
    pub(super) fn keep_row(&mut self, ctx: &Ctx) {
        if let Some(kept) = self.transform.as_mut()
            && kept.transform.expressions.is_some()
        {
            kept.rows.push((ctx.seq, ctx.meta.received_us, source_coordinates(ctx.meta)));
        }
    }

    /// Finish the batch, then evaluate the transform's expressions over it: computed columns
    /// join it, skipped rows leave it, rows that fail a rule go to the ledger.
    pub(super) fn finish_transformed(
        mut self,
        table: &str,
        out: &mut Decoded,
    ) -> Result<(Option<TableWrite>, TableSchema, Vec<Reject>)> {
        let kept = self.transform.take();
        let (write, schema, mut rejects) = self.finish(table)?;
        let (mut kept, write) = match (kept, write) {
            (Some(kept), Some(write)) if kept.transform.expressions.is_some() => (kept, write),
            (_, write) => return Ok((write, schema, rejects)),
        };
        let (write, schema) = if kept.transform.scripted {
            match super::script::apply(&mut kept, write, &mut rejects, out)? {
                Some(done) => done,
                None => return Ok((None, kept.original, rejects)),
            }
        } else {
            (write, schema)
        };
        if !kept.transform.evaluates() {
            return Ok((Some(write), schema, rejects));
        }
        evaluate(kept, write, schema, rejects, out)
    }
}

fn evaluate(
    kept: Kept,
    mut write: TableWrite,
    mut schema: TableSchema,
    mut rejects: Vec<Reject>,
    out: &mut Decoded,
) -> Result<(Option<TableWrite>, TableSchema, Vec<Reject>)> {
    let t = &kept.transform;
    let Some((evaluated, mut errors)) = t.evaluate(&write.data)? else {
        return Ok((Some(write), schema, rejects));
    };
    let rows = write.data.num_rows();
    let mut fields: Vec<Field> = write.data.schema().fields().iter().map(|f| f.as_ref().clone()).collect();
    let mut columns: Vec<ArrayRef> = write.data.columns().to_vec();
    for ((name, declared), array) in t.computed.iter().zip(evaluated.computed) {
        if array.data_type() == &DataType::Null && declared.is_none() {
            // Every row failed, or the expression is a bare NULL: nothing to type the column by.
            continue;
        }
        let Some(ty) = declared.or_else(|| column_type_of(array.data_type())) else {
            let reason = format!(
                "computed column `{name}` is of type {}, which Sluice does not store: give the field a `type`",
                array.data_type()
            );
            errors.extend((0..rows).map(|row| (row, reason.clone())));
            continue;
        };
        let (i, ty) = place(&mut schema, &mut write.changes, name, ty);
        let array = match cast_to(&array, ty) {
            Ok(array) => array,
            Err(e) => {
                let reason = e.to_string();
                errors.extend((0..rows).map(|row| (row, reason.clone())));
                continue;
            }
        };
        let field = ty.field(&schema.columns()[i].name);
        // By name: after a script the batch's columns are in the script's order.
        if let Some(j) = fields.iter().position(|f| f.name().eq_ignore_ascii_case(field.name())) {
            (fields[j], columns[j]) = (field, array);
        } else {
            fields.push(field);
            columns.push(array);
        }
    }
    let data = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns)
        .map_err(|e| Error::new(ErrorKind::Fatal, "could not add computed columns").with_source(e))?;

    let mut keep = vec![true; rows];
    let reject = |row: usize, reason: String| -> Reject {
        let (sequence, received_us, source) = kept.rows.get(row).cloned().unwrap_or((out.last_sequence, 0, None));
        Reject {
            table: write.table.clone(),
            column: None,
            expected: None,
            value: row_json(&data, row),
            sequence,
            reason: reason.into(),
            received_us,
            source,
        }
    };
    errors.sort_by_key(|(row, _)| *row);
    errors.dedup_by_key(|(row, _)| *row);
    for (row, error) in errors {
        keep[row] = false;
        rejects.push(reject(row, format!("transform: {error}")));
    }
    if let Some(failed) = &evaluated.failed {
        for (row, k) in keep.iter_mut().enumerate() {
            if !*k || !failed.is_valid(row) {
                continue;
            }
            *k = false;
            let rule = usize::try_from(failed.value(row)).ok().and_then(|i| t.rules.get(i));
            let rule = rule.map_or("?", String::as_str);
            rejects.push(reject(row, format!("validate: rule `{rule}` failed")));
        }
    }
    if let Some(filter) = &evaluated.keep {
        for (row, k) in keep.iter_mut().enumerate() {
            if *k && !(filter.is_valid(row) && filter.value(row)) {
                *k = false;
                out.filtered_at.push(kept.rows.get(row).map_or(out.last_sequence, |r| r.0));
            }
        }
    }
    let kept_rows = keep.iter().filter(|k| **k).count();
    if kept_rows == 0 {
        // Nothing to write: the table stays as it was, and a later row brings its DDL.
        return Ok((None, kept.original, rejects));
    }
    write.data = if kept_rows == rows {
        data
    } else {
        arrow::compute::filter_record_batch(&data, &BooleanArray::from(keep))
            .map_err(|e| Error::new(ErrorKind::Fatal, "could not filter a batch").with_source(e))?
    };
    Ok((Some(write), schema, rejects))
}

/// Find or add computed column `name` of type `ty`; its index and the type it is stored as.
fn place(schema: &mut TableSchema, changes: &mut Vec<SchemaChange>, name: &str, ty: ColumnType) -> (usize, ColumnType) {
    if let Some(i) = schema.find(name) {
        let known = schema.columns()[i].ty;
        if known != ColumnType::Bigint || ty != ColumnType::Double {
            return (i, known);
        }
        // Integers that now have fractions: the column widens, as a decoded one would.
        schema.set_type(i, ColumnType::Double);
        let column = Column { name: schema.columns()[i].name.clone(), ty: ColumnType::Double };
        let introduced = changes.iter_mut().find_map(|c| match c {
            SchemaChange::Create(cols) => cols.iter_mut().find(|c| c.name == column.name),
            SchemaChange::Add(c) | SchemaChange::Widen(c) => (c.name == column.name).then_some(c),
        });
        match introduced {
            Some(c) => c.ty = ColumnType::Double,
            None => changes.push(SchemaChange::Widen(column)),
        }
        return (i, ColumnType::Double);
    }
    let column = Column { name: name.to_string(), ty };
    let i = schema.push(column.clone());
    match changes.first_mut() {
        Some(SchemaChange::Create(cols)) => cols.push(column),
        _ => changes.push(SchemaChange::Add(column)),
    }
    (i, ty)
}

/// One row as a JSON object, for the ledger.
pub(super) fn row_json(data: &RecordBatch, row: usize) -> String {
    let mut buf = Vec::new();
    let mut writer = arrow::json::LineDelimitedWriter::new(&mut buf);
    if writer.write(&data.slice(row, 1)).is_err() || writer.finish().is_err() {
        return String::new();
    }
    drop(writer);
    String::from_utf8_lossy(&buf).trim_end().to_string()
}
