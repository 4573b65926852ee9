//! A stream's custom SQL as statements to run: what the three SQL destinations share. The
//! deliveries carry every change of the unit in source order, with its op in [`OP_COLUMN`]
//! (`delivery::changes`). Inserts and updates run block by block, parents first; deletes run
//! after them, children first, so a foreign key from a child to its parent holds at every
//! statement. Values go as text bind variables; each technology sends them its own way.

use arrow::array::{Array, AsArray};
use sluice_core::transform::{Block, CustomSql, Param};
use sluice_core::{Delivery, Result};

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
    let forward = custom.blocks().iter().map(|b| (b, false));
    let backward = custom.blocks().iter().rev().map(|b| (b, true));
    let mut runs = Vec::new();
    for (block, deletes) in forward.chain(backward) {
        let (sql, params) = block.render(dialect == Dialect::Postgres);
        let mut rows = Vec::new();
        let ours = deliveries.iter().filter(|d| d.table.as_deref().is_some_and(|t| t.eq_ignore_ascii_case(&block.key)));
        for batch in ours.flat_map(|d| d.rows.iter()) {
            values(batch, &params, deletes, dialect, &mut rows)?;
        }
        if !rows.is_empty() {
            runs.push(Run { block, sql, rows });
        }
    }
    Ok(runs)
}

/// The placeholders' values for the batch's deletes (or its other changes).
fn values(
    batch: &arrow::record_batch::RecordBatch,
    params: &[Param],
    deletes: bool,
    dialect: Dialect,
    out: &mut Vec<Vec<Option<String>>>,
) -> Result<()> {
    let Some(ops) = batch.column_by_name(OP_COLUMN).map(|c| c.as_string::<i32>().clone()) else { return Ok(()) };
    let schema = batch.schema();
    let columns: Vec<Option<usize>> = params
        .iter()
        .map(|p| match p {
            Param::Column(name) => schema.fields().iter().position(|f| f.name().eq_ignore_ascii_case(name)),
            Param::Op => schema.index_of(OP_COLUMN).ok(),
        })
        .collect();
    Literals::new(batch, dialect)?.for_each_row(|row, cells| {
        if (ops.value(row) == "d") != deletes {
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
