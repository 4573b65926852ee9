//! Quarantine: when a sink refuses a write unit for good, find the rows it refuses by trying
//! parts of the unit and rolling them back, move those rows to the ledger with the sink's
//! error, and write the rest. A stream never restarts forever on the same input.
//!
//! Every try is rolled back ([`Sink::probe`]), and the unit that is finally written keeps the
//! original checkpoint: exactly once holds, and the poison rows are in the ledger, not lost.

use std::sync::Arc;

use arrow::array::{BooleanArray, RecordBatch};

use crate::batch::{MirrorWrite, Reject, TableWrite, WriteUnit};
use crate::error::Error;
use crate::rejects::Rejects;
use crate::sink::Sink;

/// Most tries spent on one unit before the rest of a table's rows go to the ledger whole.
const MAX_PROBES: usize = 256;

/// What isolation found.
pub enum Isolated {
    /// The unit goes through as it is now (the refusal did not last).
    Unchanged,
    /// The unit without the refused rows, which are in its rejects.
    Cleaned(Box<WriteUnit>, usize),
    /// The sink cannot try writes, or refuses even a unit without rows: not the data's fault.
    NotData,
    /// A try failed with an error that may pass (out of memory, a conflict): it says nothing of
    /// the rows, so nothing was decided; the unit is written again as it is.
    Retry,
}

/// What one try of a part came to.
enum Try {
    Taken,
    Refused,
    Undecided,
}

async fn try_part(sink: &dyn Sink, lane: usize, unit: WriteUnit) -> Try {
    match sink.probe_on(lane, Arc::new(unit)).await {
        Some(Ok(())) => Try::Taken,
        Some(Err(e)) if e.may_pass() => Try::Undecided,
        _ => Try::Refused,
    }
}

/// Find what `sink` refuses in `unit`, which it refused with `error`, trying parts on `lane`
/// (the lane `unit` was written on: [`Sink::probe_on`]).
pub async fn isolate(sink: &dyn Sink, unit: &WriteUnit, error: &Error, lane: usize) -> Isolated {
    let mut probes = 0usize;
    match sink.probe_on(lane, Arc::new(unit.clone())).await {
        None => return Isolated::NotData,
        Some(Ok(())) => return Isolated::Unchanged,
        Some(Err(e)) if e.may_pass() => return Isolated::Retry,
        Some(Err(_)) => {}
    }
    // Without any table the unit must go through, or the fault is not in the rows.
    match try_part(sink, lane, part(unit, Vec::new())).await {
        Try::Taken => {}
        Try::Refused => return Isolated::NotData,
        Try::Undecided => return Isolated::Retry,
    }
    let reason = format!("the destination refused this row: {error}");
    let mut extra = Rejects::default();
    let mut tables = Vec::with_capacity(unit.tables.len());
    let mut refused = 0usize;
    for write in &unit.tables {
        let Some(keep) = refused_rows(sink, lane, unit, write, &mut probes).await else {
            return Isolated::Retry;
        };
        let bad: Vec<usize> = (0..write.data.num_rows()).filter(|i| !keep[*i]).collect();
        if bad.is_empty() {
            tables.push(write.clone());
            continue;
        }
        refused += bad.len();
        for i in &bad {
            extra.push(Reject {
                table: write.table.clone(),
                column: None,
                expected: None,
                value: row_json(&write.data, *i),
                sequence: write
                    .mirror
                    .as_ref()
                    .and_then(|m| m.orders.get(*i).copied())
                    .unwrap_or(unit.checkpoint.sequence),
                reason: reason.clone().into(),
                received_us: crate::batch::now_us(),
                source: None,
            });
        }
        // A table none of whose rows is taken is left out whole, schema changes included: they
        // may be what the destination refuses.
        if keep.iter().any(|k| *k)
            && let Some(kept) = filtered(write, &keep)
        {
            tables.push(kept);
        }
    }
    let mut cleaned = part(unit, tables);
    cleaned.rejects = unit.rejects.with(extra.finish());
    cleaned.idempotency = unit.idempotency.clone();
    cleaned.replayed = unit.replayed.clone();
    Isolated::Cleaned(Box::new(cleaned), refused)
}

/// `unit` with only `tables`, and no rejects or keys: what a try writes.
fn part(unit: &WriteUnit, tables: Vec<TableWrite>) -> WriteUnit {
    WriteUnit {
        stream: unit.stream.clone(),
        tables,
        rejects: Default::default(),
        idempotency: Vec::new(),
        replayed: Vec::new(),
        checkpoint: unit.checkpoint.clone(),
    }
}

/// Which rows of `write` the sink takes (`true`) and which it refuses; `None` when a try failed
/// with an error that may pass, which tells nothing of the rows.
async fn refused_rows(
    sink: &dyn Sink,
    lane: usize,
    unit: &WriteUnit,
    write: &TableWrite,
    probes: &mut usize,
) -> Option<Vec<bool>> {
    let n = write.data.num_rows();
    let mut keep = vec![true; n];
    let tries = |rows: std::ops::Range<usize>| {
        let mut mask = vec![false; n];
        mask[rows].iter_mut().for_each(|m| *m = true);
        filtered(write, &mask).map(|t| part(unit, vec![t]))
    };
    // The table's schema changes alone: if they are refused, so is every row.
    let ddl_only = tries(0..0).unwrap_or_else(|| part(unit, Vec::new()));
    *probes += 1;
    match try_part(sink, lane, ddl_only).await {
        Try::Taken => {}
        Try::Refused => return Some(vec![false; n]),
        Try::Undecided => return None,
    }
    let mut ranges: Vec<std::ops::Range<usize>> = Vec::new();
    ranges.push(0..n);
    while let Some(range) = ranges.pop() {
        if range.is_empty() {
            continue;
        }
        if *probes >= MAX_PROBES {
            // Out of tries: what is left unproven goes to the ledger, where it is not lost.
            keep[range].iter_mut().for_each(|k| *k = false);
            continue;
        }
        *probes += 1;
        let Some(try_unit) = tries(range.clone()) else { continue };
        match try_part(sink, lane, try_unit).await {
            Try::Taken => continue,
            Try::Refused => {}
            Try::Undecided => return None,
        }
        if range.len() == 1 {
            keep[range.start] = false;
            continue;
        }
        let mid = range.start + range.len() / 2;
        ranges.push(mid..range.end);
        ranges.push(range.start..mid);
    }
    Some(keep)
}

/// `write` with only the rows where `mask` is true; `None` when that leaves no rows and there
/// is no schema change to keep.
fn filtered(write: &TableWrite, mask: &[bool]) -> Option<TableWrite> {
    let rows = mask.iter().filter(|m| **m).count();
    if rows == 0 && write.changes.is_empty() && write.snapshot.is_none() {
        return None;
    }
    let predicate = BooleanArray::from(mask.to_vec());
    let data = arrow::compute::filter_record_batch(&write.data, &predicate).ok()?;
    let pick = |v: &[bool]| v.iter().zip(mask).filter(|(_, m)| **m).map(|(x, _)| *x).collect::<Vec<_>>();
    let mirror = write.mirror.as_ref().map(|m| MirrorWrite {
        keys: m.keys.clone(),
        whole_row: m.whole_row,
        history: m.history,
        ops: m.ops.iter().zip(mask).filter(|(_, k)| **k).map(|(o, _)| *o).collect(),
        orders: m.orders.iter().zip(mask).filter(|(_, k)| **k).map(|(o, _)| *o).collect(),
        recorded: pick(&m.recorded),
        change_us: m.change_us.iter().zip(mask).filter(|(_, k)| **k).map(|(o, _)| *o).collect(),
        sources: m.sources.iter().zip(mask).filter(|(_, k)| **k).map(|(o, _)| o.clone()).collect(),
        source_orders: m.source_orders.iter().zip(mask).filter(|(_, k)| **k).map(|(o, _)| o.clone()).collect(),
        unavailable: m.unavailable.iter().zip(mask).filter(|(_, k)| **k).map(|(o, _)| o.clone()).collect(),
    });
    Some(TableWrite {
        table: write.table.clone(),
        changes: write.changes.clone(),
        brought_by: write.brought_by.clone(),
        data,
        mirror,
        snapshot: write.snapshot.clone(),
    })
}

/// Row `i` of `batch` as a JSON object, for the ledger.
fn row_json(batch: &RecordBatch, i: usize) -> String {
    let row = batch.slice(i, 1);
    let mut writer = arrow::json::LineDelimitedWriter::new(Vec::new());
    if writer.write(&row).is_err() || writer.finish().is_err() {
        return format!("row {i} of {} columns", row.num_columns());
    }
    String::from_utf8_lossy(&writer.into_inner()).trim_end().to_string()
}
