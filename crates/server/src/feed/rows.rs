//! A committed unit as feed events: a sample of its rows per table as JSON, its schema
//! changes and its rejects.

use arrow::record_batch::RecordBatch;
use serde_json::{Map, Value, json};
use sluice_core::WriteUnit;

/// Rows of one unit sent to the feed at most, over all its tables.
pub const ROWS_PER_UNIT: usize = 20;

/// Rejects of one unit described at most.
const REJECTS_PER_UNIT: usize = 10;

/// `{"table", "rows": [...], "total", "sequence"}` per table, with at most [`ROWS_PER_UNIT`]
/// rows in all.
pub fn rows(unit: &WriteUnit) -> Vec<Value> {
    let mut left = ROWS_PER_UNIT;
    let mut out = Vec::new();
    for write in &unit.tables {
        let total = write.data.num_rows();
        if total == 0 {
            continue;
        }
        let sample = as_json(&write.data.slice(0, total.min(left)));
        left -= sample.len().min(left);
        out.push(json!({
            "table": write.table,
            "rows": sample,
            "total": total,
            "sequence": unit.checkpoint.sequence,
        }));
        if left == 0 {
            break;
        }
    }
    out
}

/// `{"table", "changes": [{"change", "column", "type"}]}` per table with schema changes.
pub fn schema_changes(unit: &WriteUnit) -> Vec<Value> {
    let mut by_table: Vec<(String, Vec<Value>)> = Vec::new();
    for (table, change, column, ty) in sluice_connectors::workspace::schema_changes_of(unit) {
        let entry = json!({ "change": change, "column": column, "type": ty });
        match by_table.iter_mut().find(|(t, _)| *t == table) {
            Some((_, changes)) => changes.push(entry),
            None => by_table.push((table, vec![entry])),
        }
    }
    by_table.into_iter().map(|(table, changes)| json!({ "table": table, "changes": changes })).collect()
}

/// `{"count", "sample": [{"sequence", "column", "reason"}]}`, or `None` without rejects.
pub fn rejects(unit: &WriteUnit) -> Option<Value> {
    if unit.rejects.is_empty() {
        return None;
    }
    let sample: Vec<Value> = unit
        .rejects
        .summaries()
        .take(REJECTS_PER_UNIT)
        .map(|(sequence, column, reason)| json!({ "sequence": sequence, "column": column, "reason": reason }))
        .collect();
    Some(json!({ "count": unit.rejects.len(), "sample": sample }))
}

/// Rows as JSON objects (NULLs left out, as arrow-json writes them).
fn as_json(batch: &RecordBatch) -> Vec<Map<String, Value>> {
    let mut writer = arrow::json::ArrayWriter::new(Vec::new());
    if writer.write(batch).and_then(|()| writer.finish()).is_err() {
        return Vec::new();
    }
    let bytes = writer.into_inner();
    serde_json::from_slice(&bytes).unwrap_or_default()
}
