//! A committed unit as feed events: a sample of its rows per table as JSON, its schema
//! changes and its rejects. A rows event stays small whatever the rows hold: long strings are
//! cut and rows stop once the event is full.

use arrow::record_batch::RecordBatch;
use serde_json::{Map, Value, json};
use sluice_core::WriteUnit;

/// Rows of one unit sent to the feed at most, over all its tables.
pub const ROWS_PER_UNIT: usize = 20;

/// Bytes of a string value kept at most; a longer one is cut to a valid UTF-8 prefix and ends
/// with "…".
const VALUE_BYTES: usize = 1024;

/// Bytes of one rows event at most, as JSON: rows that would pass it are left out.
const EVENT_BYTES: usize = 64 * 1024;

/// Bytes of an event's fields other than its rows and table name, at most (with numbers of 20
/// digits).
const EVENT_OVERHEAD: usize = 160;

/// Rejects of one unit described at most.
const REJECTS_PER_UNIT: usize = 10;

/// `{"table", "rows": [...], "total", "sampled", "truncated", "sequence"}` per table, with at
/// most [`ROWS_PER_UNIT`] rows in all. `total` counts the table's rows in the unit, `sampled`
/// those in `rows`; `truncated` says a string value was cut. Each event is at most
/// [`EVENT_BYTES`] as JSON.
pub fn rows(unit: &WriteUnit) -> Vec<Value> {
    let mut left = ROWS_PER_UNIT;
    let mut out = Vec::new();
    for write in &unit.tables {
        let total = write.data.num_rows();
        if total == 0 {
            continue;
        }
        let budget = EVENT_BYTES.saturating_sub(EVENT_OVERHEAD + json!(write.table).to_string().len());
        let (sample, truncated) = sample(&write.data, total.min(left), budget);
        left -= sample.len().min(left);
        out.push(json!({
            "table": write.table,
            "sampled": sample.len(),
            "rows": sample,
            "total": total,
            "truncated": truncated,
            "sequence": unit.checkpoint.sequence,
        }));
        if left == 0 {
            break;
        }
    }
    out
}

/// The first of `limit` rows of `batch` whose JSON fits in `budget` bytes, with long strings
/// cut, and whether any was. Rows are converted one at a time, so a unit of huge values is
/// never held as JSON all at once.
fn sample(batch: &RecordBatch, limit: usize, budget: usize) -> (Vec<Map<String, Value>>, bool) {
    let mut rows = Vec::new();
    let mut truncated = false;
    // The brackets of the array; each row adds its length and a comma.
    let mut size: usize = 2;
    for i in 0..limit {
        let Some(mut row) = as_json(&batch.slice(i, 1)).pop() else { break };
        let mut cut = false;
        for value in row.values_mut() {
            cut |= shorten(value);
        }
        let bytes = serde_json::to_string(&row).map_or(usize::MAX, |text| text.len());
        if size.saturating_add(bytes).saturating_add(1) > budget {
            break;
        }
        size += bytes + 1;
        truncated |= cut;
        rows.push(row);
    }
    (rows, truncated)
}

/// Cut every string in `value` (nested ones too) to [`VALUE_BYTES`] plus "…"; true if any was.
fn shorten(value: &mut Value) -> bool {
    match value {
        Value::String(text) if text.len() > VALUE_BYTES => {
            let mut end = VALUE_BYTES;
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            text.truncate(end);
            text.push('…');
            true
        }
        Value::Array(items) => items.iter_mut().fold(false, |cut, item| shorten(item) | cut),
        Value::Object(fields) => fields.values_mut().fold(false, |cut, item| shorten(item) | cut),
        _ => false,
    }
}

/// `{"table", "changes": [{"change", "column", "type", "sequence"}]}` per table with schema changes.
pub fn schema_changes(unit: &WriteUnit) -> Vec<Value> {
    let mut by_table: Vec<(String, Vec<Value>)> = Vec::new();
    for (table, change, column, ty, sequence) in sluice_connectors::workspace::schema_changes_of(unit) {
        let entry = json!({ "change": change, "column": column, "type": ty, "sequence": sequence });
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};
    use sluice_core::{Checkpoint, RejectBatch, TableWrite};

    use super::*;

    fn unit(ids: Vec<i64>, texts: Vec<String>) -> WriteUnit {
        let schema =
            Schema::new(vec![Field::new("id", DataType::Int64, false), Field::new("body", DataType::Utf8, false)]);
        let data = RecordBatch::try_new(
            Arc::new(schema),
            vec![Arc::new(Int64Array::from(ids)), Arc::new(StringArray::from(texts))],
        )
        .unwrap();
        WriteUnit {
            stream: "s".into(),
            tables: vec![TableWrite {
                table: "t".into(),
                changes: Vec::new(),
                brought_by: Vec::new(),
                data,
                mirror: None,
                snapshot: None,
            }],
            rejects: RejectBatch::default(),
            idempotency: Vec::new(),
            replayed: Vec::new(),
            checkpoint: Checkpoint::default(),
        }
    }

    #[test]
    fn a_megabyte_string_is_cut_and_the_event_stays_under_the_cap() {
        // 'é' is two bytes: the cut must not split one.
        let huge = format!("x{}", "é".repeat(512 * 1024));
        let events = rows(&unit(vec![1, 2], vec![huge, "short".into()]));
        assert_eq!(events.len(), 1);
        let event = &events[0];
        assert!(event.to_string().len() <= EVENT_BYTES, "{} bytes", event.to_string().len());
        assert_eq!((event["total"].as_u64(), event["sampled"].as_u64()), (Some(2), Some(2)));
        assert_eq!(event["truncated"], json!(true));
        let body = event["rows"][0]["body"].as_str().unwrap();
        assert!(body.ends_with('…') && body.len() <= VALUE_BYTES + '…'.len_utf8(), "{} bytes", body.len());
        assert!(body.starts_with("xéé"));
        assert_eq!(event["rows"][1], json!({"id": 2, "body": "short"}));
    }

    #[test]
    fn rows_stop_once_the_event_is_full() {
        // A kilobyte of control characters, not cut, is six as JSON (`\u0001`): 20 such rows
        // do not fit in 64 KiB.
        let controls = "\u{1}".repeat(VALUE_BYTES);
        let n = ROWS_PER_UNIT as i64;
        let events = rows(&unit((0..n).collect(), (0..n).map(|_| controls.clone()).collect()));
        let event = &events[0];
        let text = event.to_string();
        assert!(text.len() <= EVENT_BYTES, "{} bytes", text.len());
        let sampled = event["sampled"].as_u64().unwrap();
        assert!(0 < sampled && sampled < n as u64, "{sampled} of {n}");
        assert_eq!(event["rows"].as_array().unwrap().len() as u64, sampled);
        assert_eq!(event["total"].as_u64(), Some(n as u64));
        assert_eq!(event["truncated"], json!(false), "no value was cut, only rows left out");
    }

    #[test]
    fn small_rows_come_whole() {
        let events = rows(&unit(vec![1, 2, 3], vec!["a".into(), "b".into(), "c".into()]));
        assert_eq!(events[0]["sampled"], json!(3));
        assert_eq!(events[0]["truncated"], json!(false));
        assert_eq!(events[0]["rows"][2], json!({"id": 3, "body": "c"}));
    }
}
