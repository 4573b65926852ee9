//! A mirrored table's changes as deliveries: within a unit the last change per key wins; keys
//! whose last change is a delete are deleted, the others upserted (the destination matches on
//! the key columns). A truncate makes the unit replace the table with what follows it, and so
//! does the first chunk of a new snapshot copy. With
//! `history`, every recorded change is also appended to `<table>__changes` with its op, stream
//! sequence and change time.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array, StringArray, TimestampMicrosecondArray, UInt32Array};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use arrow::record_batch::RecordBatch;
use arrow::row::{RowConverter, SortField};
use sluice_core::{ChangeOp, Delivery, Error, ErrorKind, MirrorWrite, Result, SyncMode, TableWrite};

/// The deliveries of one mirrored table's write (the table's, then its history's).
pub(crate) fn deliveries(stream: &str, write: &TableWrite, mirror: &MirrorWrite) -> Result<Vec<Delivery>> {
    if mirror.whole_row {
        return Err(Error::new(
            ErrorKind::Fatal,
            format!(
                "table '{}' has no primary key (its rows are matched on every column): a destination mirror \
                 needs key columns; add a primary key at the source or set `keys` on the stream",
                write.table
            ),
        ));
    }
    let data = &write.data;
    let rows = data.num_rows();
    let last_truncate = mirror.ops.iter().rposition(|op| *op == ChangeOp::Truncate);
    let from = last_truncate.map_or(0, |t| t + 1);
    // The last change of each key, from the unit's last truncate on.
    let key_indices = key_indices(data, &mirror.keys)?;
    let key_columns: Vec<ArrayRef> = key_indices.iter().map(|i| data.column(*i).clone()).collect();
    let fields = key_columns.iter().map(|c| SortField::new(c.data_type().clone())).collect();
    let converter = RowConverter::new(fields).map_err(arrow_error)?;
    let keyed = converter.convert_columns(&key_columns).map_err(arrow_error)?;
    let mut last: HashMap<arrow::row::Row<'_>, usize> = HashMap::new();
    for i in from..rows {
        if mirror.ops[i] != ChangeOp::Truncate {
            last.insert(keyed.row(i), i);
        }
    }
    let mut winners: Vec<usize> = last.into_values().collect();
    winners.sort_unstable();
    let (gone, kept): (Vec<usize>, Vec<usize>) = winners.into_iter().partition(|i| mirror.ops[*i] == ChangeOp::Delete);
    let upserts = take(data, &kept)?;
    // After a truncate, or from the first chunk of a new snapshot copy, the rows are the table.
    let replace = last_truncate.is_some() || write.snapshot.as_ref().is_some_and(|s| s.clear);
    let keys_only = take(&data.project(&key_indices).map_err(arrow_error)?, &gone)?;
    let mut out = vec![Delivery {
        sync: stream.to_string(),
        run_id: String::new(),
        mode: if replace { SyncMode::Replace } else { SyncMode::Mirror },
        keys: mirror.keys.clone(),
        schema: data.schema(),
        rows: vec![upserts],
        deletes: if replace { Vec::new() } else { vec![keys_only] },
        table: Some(write.table.clone()),
        copy: None,
    }];
    if mirror.history {
        out.push(history(stream, write, mirror)?);
    }
    Ok(out)
}

/// Every recorded change, appended to `<table>__changes` with `_op`, `_sequence` and
/// `_change_time`.
fn history(stream: &str, write: &TableWrite, mirror: &MirrorWrite) -> Result<Delivery> {
    let recorded: Vec<usize> = (0..write.data.num_rows()).filter(|i| mirror.recorded[*i]).collect();
    let base = take(&write.data, &recorded)?;
    let mut fields: Vec<Field> = base.schema().fields().iter().map(|f| f.as_ref().clone()).collect();
    let mut columns = base.columns().to_vec();
    fields.push(Field::new("_op", DataType::Utf8, false));
    columns.push(Arc::new(StringArray::from_iter_values(recorded.iter().map(|i| mirror.ops[*i].name()))));
    fields.push(Field::new("_sequence", DataType::Int64, false));
    columns.push(Arc::new(Int64Array::from_iter_values(recorded.iter().map(|i| mirror.orders[*i]))));
    fields.push(Field::new("_change_time", DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())), true));
    columns.push(Arc::new(
        TimestampMicrosecondArray::from(recorded.iter().map(|i| mirror.change_us[*i]).collect::<Vec<_>>())
            .with_timezone("UTC"),
    ));
    let schema = Arc::new(Schema::new(fields));
    let batch = RecordBatch::try_new(schema.clone(), columns).map_err(arrow_error)?;
    Ok(Delivery {
        sync: stream.to_string(),
        run_id: String::new(),
        mode: SyncMode::Append,
        keys: Vec::new(),
        schema,
        rows: vec![batch],
        deletes: Vec::new(),
        table: Some(format!("{}__changes", write.table)),
        copy: None,
    })
}

fn key_indices(data: &RecordBatch, keys: &[String]) -> Result<Vec<usize>> {
    keys.iter()
        .map(|k| {
            data.schema()
                .index_of(k)
                .map_err(|_| Error::new(ErrorKind::Fatal, format!("mirror write: key column '{k}' is missing")))
        })
        .collect()
}

/// The rows of `batch` at `indices`, in that order.
fn take(batch: &RecordBatch, indices: &[usize]) -> Result<RecordBatch> {
    let indices = UInt32Array::from_iter_values(indices.iter().map(|i| *i as u32));
    arrow::compute::take_record_batch(batch, &indices).map_err(arrow_error)
}

fn arrow_error(e: arrow::error::ArrowError) -> Error {
    Error::new(ErrorKind::Fatal, "could not build a mirror delivery").with_source(e)
}

/// Every change of a table's write in source order, with its op (`c`, `u`, `d`, `r`) in
/// [`super::OP_COLUMN`]: what custom SQL runs over. An append's rows are inserts; a truncate,
/// which has no row, is left out.
pub(crate) fn changes(stream: &str, write: &TableWrite) -> Result<Delivery> {
    let data = &write.data;
    let (rows, ops): (Vec<usize>, Vec<&str>) = match &write.mirror {
        None => ((0..data.num_rows()).collect(), vec!["c"; data.num_rows()]),
        Some(m) => (0..data.num_rows())
            .filter(|i| m.ops[*i] != ChangeOp::Truncate)
            .map(|i| {
                let op = match m.ops[i] {
                    ChangeOp::Insert => "c",
                    ChangeOp::Delete => "d",
                    ChangeOp::Snapshot => "r",
                    ChangeOp::Update | ChangeOp::Upsert | ChangeOp::Truncate => "u",
                };
                (i, op)
            })
            .unzip(),
    };
    let base = take(data, &rows)?;
    let mut fields: Vec<Field> = base.schema().fields().iter().map(|f| f.as_ref().clone()).collect();
    let mut columns = base.columns().to_vec();
    fields.push(Field::new(super::OP_COLUMN, DataType::Utf8, false));
    columns.push(Arc::new(StringArray::from(ops)));
    let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).map_err(arrow_error)?;
    Ok(Delivery {
        sync: stream.to_string(),
        run_id: String::new(),
        mode: SyncMode::Append,
        keys: write.mirror.as_ref().map(|m| m.keys.clone()).unwrap_or_default(),
        schema: batch.schema(),
        rows: vec![batch],
        deletes: Vec::new(),
        table: Some(write.table.clone()),
        copy: None,
    })
}
