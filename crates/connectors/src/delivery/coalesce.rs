//! Deliveries of many units as fewer, bigger ones, with the same end state: a staged load
//! applies an interval's units in one transaction, and one COPY per table beats one per unit.
//! A delivery joins the last one for its table when the columns match: an append adds its
//! rows, a mirror's upserts and deletes replace the earlier ones of the same keys, and a
//! replace makes everything before it for that table moot.

use std::collections::HashSet;

use arrow::array::{ArrayRef, BooleanArray};
use arrow::compute::{concat_batches, filter_record_batch};
use arrow::record_batch::RecordBatch;
use arrow::row::{OwnedRow, RowConverter, SortField};
use sluice_core::{Delivery, Error, ErrorKind, Result, SyncMode};

/// `deliveries`, in order, merged where that keeps the end state.
pub(crate) fn coalesce(deliveries: Vec<Delivery>) -> Result<Vec<Delivery>> {
    let mut out: Vec<Delivery> = Vec::new();
    for next in deliveries {
        if next.mode == SyncMode::Replace {
            out.retain(|d| d.table != next.table);
            out.push(next);
            continue;
        }
        let Some(last) = out.iter_mut().rev().find(|d| d.table == next.table) else {
            out.push(next);
            continue;
        };
        if last.schema != next.schema
            || last.keys != next.keys
            || last.keep != next.keep
            || last.multiset
            || next.multiset
        {
            out.push(next);
            continue;
        }
        match (last.mode, next.mode) {
            // A snapshot copy's keys only say what key its table gets.
            (SyncMode::Append | SyncMode::Replace, SyncMode::Append)
                if last.keys.is_empty() || (last.copy.is_some() && next.copy.is_some()) =>
            {
                last.rows.extend(next.rows);
                last.copy = next.copy.max(last.copy);
            }
            (SyncMode::Mirror | SyncMode::Replace, SyncMode::Mirror) if !last.keys.is_empty() => {
                merge_mirror(last, next)?;
            }
            _ => out.push(next),
        }
    }
    Ok(out)
}

/// `next` applied after `last`: `last` keeps the rows and deletes of keys `next` does not
/// touch. A replace keeps no deletes (its rows are the whole table).
fn merge_mirror(last: &mut Delivery, next: Delivery) -> Result<()> {
    let converter = key_converter(&last.schema, &last.keys)?;
    let upserted = keys_of(&converter, &next.rows, &last.keys)?;
    let deleted = keys_of(&converter, &next.deletes, &last.keys)?;
    let touched: HashSet<&OwnedRow> = upserted.iter().chain(deleted.iter()).collect();
    let mut rows = without(&converter, &last.rows, &last.keys, &touched)?;
    rows.extend(next.rows);
    last.rows = rows;
    if last.mode == SyncMode::Mirror {
        let mut deletes = without(&converter, &last.deletes, &last.keys, &touched)?;
        deletes.extend(next.deletes);
        last.deletes = deletes;
    }
    Ok(())
}

fn key_converter(schema: &arrow::datatypes::SchemaRef, keys: &[String]) -> Result<RowConverter> {
    let fields = keys
        .iter()
        .map(|k| {
            let field = schema.field_with_name(k).map_err(arrow_error)?;
            Ok(SortField::new(field.data_type().clone()))
        })
        .collect::<Result<Vec<_>>>()?;
    RowConverter::new(fields).map_err(arrow_error)
}

fn key_columns(batch: &RecordBatch, keys: &[String]) -> Result<Vec<ArrayRef>> {
    keys.iter()
        .map(|k| {
            batch.column_by_name(k).cloned().ok_or_else(|| {
                Error::new(ErrorKind::Fatal, format!("staged load: key column '{k}' is missing from a batch"))
            })
        })
        .collect()
}

fn keys_of(converter: &RowConverter, batches: &[RecordBatch], keys: &[String]) -> Result<Vec<OwnedRow>> {
    let mut out = Vec::new();
    for batch in batches {
        let rows = converter.convert_columns(&key_columns(batch, keys)?).map_err(arrow_error)?;
        out.extend(rows.iter().map(|r| r.owned()));
    }
    Ok(out)
}

/// The rows of `batches` whose key is not in `touched`, as one batch (none when empty).
fn without(
    converter: &RowConverter,
    batches: &[RecordBatch],
    keys: &[String],
    touched: &HashSet<&OwnedRow>,
) -> Result<Vec<RecordBatch>> {
    let mut kept = Vec::new();
    for batch in batches {
        let rows = converter.convert_columns(&key_columns(batch, keys)?).map_err(arrow_error)?;
        let keep: BooleanArray = rows.iter().map(|r| Some(!touched.contains(&r.owned()))).collect();
        let filtered = filter_record_batch(batch, &keep).map_err(arrow_error)?;
        if filtered.num_rows() > 0 {
            kept.push(filtered);
        }
    }
    match kept.first() {
        None => Ok(Vec::new()),
        Some(first) => Ok(vec![concat_batches(&first.schema(), &kept).map_err(arrow_error)?]),
    }
}

fn arrow_error(e: arrow::error::ArrowError) -> Error {
    Error::new(ErrorKind::Fatal, "staged load: could not merge deliveries").with_source(e)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    fn schema() -> arrow::datatypes::SchemaRef {
        Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false), Field::new("v", DataType::Utf8, true)]))
    }

    fn rows(ids: &[i64], v: &str) -> RecordBatch {
        let values: Vec<String> = ids.iter().map(|i| format!("{v}{i}")).collect();
        RecordBatch::try_new(
            schema(),
            vec![Arc::new(Int64Array::from(ids.to_vec())), Arc::new(StringArray::from(values))],
        )
        .unwrap()
    }

    fn keys(ids: &[i64]) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
        RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(ids.to_vec()))]).unwrap()
    }

    fn delivery(table: &str, mode: SyncMode, rows: Vec<RecordBatch>, deletes: Vec<RecordBatch>) -> Delivery {
        let keys = if mode == SyncMode::Append { Vec::new() } else { vec!["id".to_string()] };
        Delivery {
            sync: "s".into(),
            run_id: String::new(),
            mode,
            keys,
            schema: schema(),
            rows,
            deletes,
            table: Some(table.into()),
            copy: None,
            keep: Vec::new(),
            multiset: false,
        }
    }

    fn ids(batches: &[RecordBatch]) -> Vec<(i64, String)> {
        let mut out = Vec::new();
        for b in batches {
            let id = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
            let v = b.num_columns().gt(&1).then(|| b.column(1).as_any().downcast_ref::<StringArray>().unwrap());
            for i in 0..b.num_rows() {
                out.push((id.value(i), v.map_or(String::new(), |v| v.value(i).to_string())));
            }
        }
        out.sort();
        out
    }

    #[test]
    fn rows_that_keep_columns_are_not_merged_with_whole_ones() {
        let mut lacking = delivery("a", SyncMode::Mirror, vec![rows(&[2], "x")], Vec::new());
        lacking.keep = vec!["name".into()];
        let out = coalesce(vec![
            delivery("a", SyncMode::Mirror, vec![rows(&[1], "x")], Vec::new()),
            lacking,
            delivery("a", SyncMode::Mirror, vec![rows(&[3], "y")], Vec::new()),
        ])
        .unwrap();
        assert_eq!(out.iter().map(|d| d.keep.len()).collect::<Vec<_>>(), [0, 1, 0], "{out:?}");
    }

    #[test]
    fn appends_of_a_table_become_one_and_other_tables_keep_theirs() {
        let out = coalesce(vec![
            delivery("a", SyncMode::Append, vec![rows(&[1, 2], "x")], vec![]),
            delivery("b", SyncMode::Append, vec![rows(&[9], "x")], vec![]),
            delivery("a", SyncMode::Append, vec![rows(&[3], "x")], vec![]),
        ])
        .unwrap();
        assert_eq!(out.len(), 2);
        assert_eq!(ids(&out[0].rows).len(), 3);
    }

    #[test]
    fn a_later_mirror_change_wins_per_key() {
        let out = coalesce(vec![
            delivery("a", SyncMode::Mirror, vec![rows(&[1, 2, 3], "old")], vec![keys(&[7, 8])]),
            delivery("a", SyncMode::Mirror, vec![rows(&[2, 8], "new")], vec![keys(&[3])]),
        ])
        .unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(ids(&out[0].rows), [(1, "old1".into()), (2, "new2".into()), (8, "new8".into())]);
        assert_eq!(ids(&out[0].deletes), [(3, String::new()), (7, String::new())]);
    }

    #[test]
    fn a_replace_drops_what_came_before_and_takes_later_changes() {
        let out = coalesce(vec![
            delivery("a", SyncMode::Mirror, vec![rows(&[1], "x")], vec![keys(&[2])]),
            delivery("a", SyncMode::Replace, vec![rows(&[5, 6], "r")], vec![]),
            delivery("a", SyncMode::Mirror, vec![rows(&[6], "m")], vec![keys(&[5])]),
        ])
        .unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].mode, SyncMode::Replace);
        assert_eq!(ids(&out[0].rows), [(6, "m6".into())]);
        assert!(out[0].deletes.is_empty());
    }

    #[test]
    fn new_columns_start_a_new_delivery() {
        let mut wider = delivery("a", SyncMode::Append, vec![], vec![]);
        wider.schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
        let out = coalesce(vec![delivery("a", SyncMode::Append, vec![rows(&[1], "x")], vec![]), wider]).unwrap();
        assert_eq!(out.len(), 2);
    }
}
