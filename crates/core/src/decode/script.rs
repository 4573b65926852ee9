//! A stream's script over a finished batch: what it returns is the batch, fitted to the
//! table's schema as it was before the batch (new columns added, integers widened to
//! doubles, other values cast to their column's type; a value that does not fit sends its
//! row to the ledger).

use std::sync::Arc;

use arrow::array::{Array, BooleanArray};
use arrow::datatypes::{DataType, Schema};
use arrow::record_batch::RecordBatch;

use super::MAX_COLUMNS;
use super::transformed::{Kept, row_json};
use crate::batch::{Reject, TableWrite};
use crate::error::{Error, ErrorKind, Result};
use crate::schema::{Column, ColumnType, SchemaChange, TableSchema};
use crate::transform::{cast_to, column_type_of};

/// Run the script over `write`; `None` when no row is left.
pub(super) fn apply(
    kept: &mut Kept,
    mut write: TableWrite,
    rejects: &mut Vec<Reject>,
    out: &mut super::Decoded,
) -> Result<Option<(TableWrite, TableSchema)>> {
    let last_sequence = out.last_sequence;
    let Some((output, errors)) = kept.transform.run_script(&write.data)? else {
        return Ok(Some((write, kept.original.clone())));
    };
    // Events the script's WHERE left out count as filtered.
    let returned = output.as_ref().map_or(0, RecordBatch::num_rows);
    let input = write.data.num_rows();
    let reject =
        |data: &RecordBatch, row: usize, ctx: Option<&(i64, i64, Option<serde_json::Value>)>, reason: String| {
            let (sequence, received_us, source) = ctx.cloned().unwrap_or((last_sequence, 0, None));
            Reject {
                table: write.table.clone(),
                column: None,
                expected: None,
                value: row_json(data, row),
                sequence,
                reason: reason.into(),
                received_us,
                source,
            }
        };
    if returned + errors.len() > input {
        // A join or unnest made rows of its own: which event is which can no longer be told.
        for row in 0..input {
            let reason = "script: it returned more rows than it was given events (one row in, at most one out)";
            rejects.push(reject(&write.data, row, kept.rows.get(row), reason.to_string()));
        }
        kept.rows.clear();
        return Ok(None);
    }
    let skipped = input.saturating_sub(errors.len() + returned);
    // A script's rows do not say which events they came from: when it skipped some of the
    // events and returned others, the skipped ones are taken to be the last events that did not
    // fail (exact when it skipped all of them, or when the unit is one push).
    let failed: std::collections::HashSet<usize> = errors.iter().map(|(row, _)| *row).collect();
    let mut candidates: Vec<i64> = (0..input)
        .filter(|row| !failed.contains(row))
        .map(|row| kept.rows.get(row).map_or(last_sequence, |r| r.0))
        .collect();
    out.filtered_at.extend(candidates.split_off(candidates.len().saturating_sub(skipped)));
    for (row, error) in errors {
        rejects.push(reject(&write.data, row, kept.rows.get(row), format!("script: {error}")));
    }
    // The script's rows no longer line up with the events they came from.
    kept.rows.clear();
    let Some(output) = output.filter(|o| o.num_rows() > 0) else { return Ok(None) };
    let (data, schema, changes, misfits) = match reshape(&kept.original, &output) {
        Ok(reshaped) => reshaped,
        // A column Sluice cannot store, or a table at its column limit: the same every time,
        // so the rows go to the ledger rather than the batch failing again and again.
        Err(e) if e.kind() == ErrorKind::Data => {
            for row in 0..output.num_rows() {
                rejects.push(reject(&output, row, None, format!("script: {}", e.message())));
            }
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    for (row, reason) in misfits {
        rejects.push(reject(&output, row, None, reason));
    }
    let data = match data {
        Some(data) => data,
        None => return Ok(None),
    };
    write.data = data;
    write.changes = changes;
    Ok(Some((write, schema)))
}

type Reshaped = (Option<RecordBatch>, TableSchema, Vec<SchemaChange>, Vec<(usize, String)>);

/// `output` fitted to `original`: the batch (without rows that did not fit), the schema it
/// moves the table to, the DDL, and the rows that did not fit with why.
fn reshape(original: &TableSchema, output: &RecordBatch) -> Result<Reshaped> {
    let mut schema = original.clone();
    let (mut created, mut changes) = (Vec::new(), Vec::new());
    let (mut fields, mut arrays) = (Vec::new(), Vec::new());
    let mut fits = vec![true; output.num_rows()];
    let mut misfits = Vec::new();
    let out_schema = output.schema();
    let names: Vec<String> = out_schema.fields().iter().map(|f| f.name().to_lowercase()).collect();
    for (i, (field, array)) in out_schema.fields().iter().zip(output.columns()).enumerate() {
        // A column named twice (`SELECT *, upper(kind) AS kind`): the last one is written.
        let later = names[i + 1..].contains(&names[i]);
        if later || field.name().starts_with("__") || field.data_type() == &DataType::Null {
            continue;
        }
        let Some(ty) = column_type_of(field.data_type()) else {
            return Err(Error::new(
                ErrorKind::Data,
                format!(
                    "the script's column `{}` is of type {}: CAST it to a type Sluice stores",
                    field.name(),
                    field.data_type()
                ),
            ));
        };
        let (name, ty) = match schema.find(field.name()) {
            Some(i) => {
                let known = schema.columns()[i].ty;
                let name = schema.columns()[i].name.clone();
                if known == ColumnType::Bigint && ty == ColumnType::Double {
                    schema.set_type(i, ColumnType::Double);
                    changes.push(SchemaChange::Widen(Column { name: name.clone(), ty: ColumnType::Double }));
                    (name, ColumnType::Double)
                } else {
                    (name, known)
                }
            }
            None if schema.columns().len() >= MAX_COLUMNS => {
                return Err(Error::new(ErrorKind::Data, super::table_full()));
            }
            None => {
                let column = Column { name: field.name().clone(), ty };
                schema.push(column.clone());
                if original.exists() {
                    changes.push(SchemaChange::Add(column));
                } else {
                    created.push(column);
                }
                (field.name().clone(), ty)
            }
        };
        let fitted = cast_to(array, ty)?;
        for (row, f) in fits.iter_mut().enumerate() {
            if !*f || array.is_null(row) || fitted.is_valid(row) {
                continue;
            }
            *f = false;
            misfits.push((row, format!("script: the value of `{name}` does not fit its column's type {ty}")));
        }
        fields.push(ty.field(&name));
        arrays.push(fitted);
    }
    if !created.is_empty() {
        changes.insert(0, SchemaChange::Create(created));
    }
    if fields.is_empty() {
        return Ok((None, original.clone(), Vec::new(), misfits));
    }
    schema.set_exists();
    let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays)
        .map_err(|e| Error::new(ErrorKind::Fatal, "could not build the script's batch").with_source(e))?;
    let batch = if misfits.is_empty() {
        batch
    } else {
        arrow::compute::filter_record_batch(&batch, &BooleanArray::from(fits))
            .map_err(|e| Error::new(ErrorKind::Fatal, "could not filter a batch").with_source(e))?
    };
    Ok((Some(batch).filter(|b| b.num_rows() > 0), schema, changes, misfits))
}
