//! A stream's custom SQL as statements to run: what the three SQL destinations share. The
//! deliveries carry every change of the unit in source order, with its op in [`OP_COLUMN`]
//! (`delivery::changes`). Each block runs its table's changes in source order, parents'
//! blocks first; only a key's final delete (the key's last change in the unit) waits, and runs
//! after every block, children's first, so a foreign key from a child to its parent holds.
//! Values go as text bind variables; each technology sends them its own way.

use std::collections::HashSet;

use arrow::array::{Array, AsArray};
use sluice_core::transform::{Block, CustomSql, Param};
use sluice_core::{Delivery, Error, ErrorKind, Result};

use super::{Dialect, Literals};
use crate::delivery::OP_COLUMN;

/// One block's statement and the values of each of its runs, in order.
pub(crate) struct Run<'a> {
    /// The block, for error messages.
    pub(crate) block: &'a Block,
    /// The statement with the dialect's placeholders.
    pub(crate) sql: String,
    /// Per run, each placeholder's value as text (`None`: NULL).
    pub(crate) rows: Vec<Vec<Option<String>>>,
}

/// The statements to run for `deliveries`, in order.
pub(crate) fn plan<'a>(custom: &'a CustomSql, deliveries: &[Delivery], dialect: Dialect) -> Result<Vec<Run<'a>>> {
    // Every table needs its block: rows of a table without one would be skipped in silence.
    if let Some(table) = deliveries.iter().filter_map(|d| d.table.as_deref()).find(|t| custom.block(t).is_none()) {
        return Err(Error::new(
            ErrorKind::Config,
            format!("destination.custom_sql has no block for table `{table}`: add `-- @sql key={table}` … `-- @end`"),
        ));
    }
    let forward = custom.blocks().iter().map(|b| (b, false));
    let backward = custom.blocks().iter().rev().map(|b| (b, true));
    let mut runs = Vec::new();
    for (block, deletes) in forward.chain(backward) {
        let (sql, params) = block.render(dialect == Dialect::Postgres);
        let mut rows = Vec::new();
        let ours = deliveries.iter().filter(|d| d.table.as_deref().is_some_and(|t| t.eq_ignore_ascii_case(&block.key)));
        for delivery in ours {
            for batch in &delivery.rows {
                let last = final_deletes(batch, &delivery.keys, dialect)?;
                values(batch, &params, &last, deletes, dialect, &mut rows)?;
            }
        }
        if !rows.is_empty() {
            runs.push(Run { block, sql, rows });
        }
    }
    Ok(runs)
}

/// Per row: whether it is its key's final delete in the batch (its key's last change).
fn final_deletes(batch: &arrow::record_batch::RecordBatch, keys: &[String], dialect: Dialect) -> Result<Vec<bool>> {
    let mut last = vec![false; batch.num_rows()];
    let Some(ops) = batch.column_by_name(OP_COLUMN).and_then(|c| c.as_string_opt::<i32>()) else { return Ok(last) };
    if keys.is_empty() {
        // No keys to tell changes apart: every delete counts as final.
        for (row, l) in last.iter_mut().enumerate() {
            *l = ops.value(row) == "d";
        }
        return Ok(last);
    }
    let schema = batch.schema();
    let indices: Vec<usize> = keys.iter().filter_map(|k| schema.index_of(k).ok()).collect();
    let mut texts: Vec<String> = vec![String::new(); batch.num_rows()];
    Literals::new(batch, dialect)?.for_each_row(|row, cells| {
        for &i in &indices {
            let (array, format) = &cells[i];
            texts[row].push_str(&if array.is_null(row) { "\0".to_string() } else { format.value(row).to_string() });
            texts[row].push('\u{1}');
        }
        Ok(())
    })?;
    let mut seen = HashSet::new();
    for row in (0..batch.num_rows()).rev() {
        if seen.insert(texts[row].as_str()) {
            last[row] = ops.value(row) == "d";
        }
    }
    Ok(last)
}

/// The placeholders' values for the batch's final deletes (or its other changes).
fn values(
    batch: &arrow::record_batch::RecordBatch,
    params: &[Param],
    last: &[bool],
    deletes: bool,
    dialect: Dialect,
    out: &mut Vec<Vec<Option<String>>>,
) -> Result<()> {
    if batch.column_by_name(OP_COLUMN).is_none() {
        return Ok(());
    }
    let schema = batch.schema();
    let columns: Vec<Option<usize>> = params
        .iter()
        .map(|p| match p {
            Param::Column(name) => schema.fields().iter().position(|f| f.name().eq_ignore_ascii_case(name)),
            Param::Op => schema.index_of(OP_COLUMN).ok(),
        })
        .collect();
    Literals::new(batch, dialect)?.for_each_row(|row, cells| {
        if last[row] != deletes {
            return Ok(());
        }
        let values = columns.iter().map(|c| {
            c.and_then(|i| {
                let (array, format) = &cells[i];
                (!array.is_null(row)).then(|| format.value(row).to_string())
            })
        });
        out.push(values.collect());
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};
    use arrow::record_batch::RecordBatch;

    use super::*;

    #[test]
    fn only_a_keys_last_change_waits_when_it_is_a_delete() {
        let schema =
            Schema::new(vec![Field::new("id", DataType::Int64, true), Field::new(OP_COLUMN, DataType::Utf8, false)]);
        let batch = RecordBatch::try_new(
            Arc::new(schema),
            vec![
                Arc::new(Int64Array::from(vec![1, 1, 1, 2, 3])),
                Arc::new(StringArray::from(vec!["c", "d", "c", "d", "u"])),
            ],
        )
        .unwrap();
        let last = final_deletes(&batch, &["id".to_string()], Dialect::Postgres).unwrap();
        assert_eq!(last, [false, false, false, true, false], "1 is created again: its delete runs in order");
    }
}
