//! Mirrored tables: a write's rows are changes. They are staged, the last change per key wins
//! (in source order), deleted keys and replaced rows go, the rest are inserted, and with
//! history every change is appended to `<table>__changes`. All inside the unit's transaction.

use std::sync::Arc;

use arrow::array::{ArrayRef, BooleanArray, Int64Array, StringArray, TimestampMicrosecondArray};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use arrow::record_batch::RecordBatch;
use duckdb::Connection;
use sluice_core::{ChangeOp, Error, ErrorKind, MirrorWrite, Result, TableWrite};

use super::{db_error, quote};

const STAGE: &str = "__sluice_stage";
const LAST: &str = "__sluice_last";
/// The columns a history row adds to the row image.
pub(crate) const HISTORY_COLUMNS: [(&str, &str); 4] =
    [("_op", "VARCHAR"), ("_change_time", "TIMESTAMPTZ"), ("_source_position", "JSON"), ("_sequence", "BIGINT")];

/// Where the source position applied to each key of `table` is kept (deleted keys included).
pub(crate) fn positions_table(table: &str) -> String {
    format!("positions__{table}")
}

/// The history table of `table`.
pub(crate) fn history_table(table: &str) -> String {
    format!("{table}__changes")
}

/// Apply the changes in `write` to its table (and history).
pub(crate) fn apply(conn: &Connection, write: &TableWrite, mirror: &MirrorWrite) -> Result<()> {
    let table = quote(&write.table);
    let rows = write.data.num_rows();
    if [
        mirror.ops.len(),
        mirror.orders.len(),
        mirror.recorded.len(),
        mirror.change_us.len(),
        mirror.sources.len(),
        mirror.source_orders.len(),
    ]
    .iter()
    .any(|n| *n != rows)
    {
        return Err(Error::new(ErrorKind::Fatal, "mirror write: change columns do not match the rows"));
    }
    let staged = with_changes(&write.data, mirror)?;
    let names: Vec<String> = write.data.schema().fields().iter().map(|f| f.name().clone()).collect();
    let cols: Vec<String> = names.iter().map(|n| quote(n)).collect();
    let cols = cols.join(", ");
    conn.execute_batch(&format!(
        "CREATE OR REPLACE TABLE sluice.{STAGE} AS SELECT {cols}, NULL::VARCHAR AS __op, NULL::BIGINT AS __ord, \
         NULL::BOOLEAN AS __rec, NULL::TIMESTAMPTZ AS __ts, NULL::VARCHAR AS __src, NULL::VARCHAR AS __so \
         FROM main.{table} LIMIT 0"
    ))
    .map_err(db_error)?;
    let mut stage_names: Vec<&str> = names.iter().map(String::as_str).collect();
    stage_names.extend(["__op", "__ord", "__rec", "__ts", "__src", "__so"]);
    let mut appender = conn.appender_with_columns_to_db(STAGE, super::SCHEMA, &stage_names).map_err(db_error)?;
    appender.append_record_batch(staged).map_err(db_error)?;
    appender.flush().map_err(db_error)?;
    drop(appender);

    let keys: Vec<String> = mirror.keys.iter().map(|k| quote(k)).collect();
    let partition = keys.join(", ");
    let matches: Vec<String> = keys.iter().map(|k| format!("t.{k} IS NOT DISTINCT FROM l.{k}")).collect();
    let delete = ChangeOp::Delete.name();
    let mut sql = String::new();
    let ordered = mirror.source_orders.iter().any(Option::is_some);
    if ordered {
        // Idempotent by source position: drop changes at or below the position already applied
        // to their key, and repeats within the batch; then remember the new positions.
        let positions = quote(&positions_table(&write.table));
        let key_cols = keys.join(", ");
        let on_stage: Vec<String> = keys.iter().map(|k| format!("p.{k} IS NOT DISTINCT FROM s.{k}")).collect();
        let on_stage = on_stage.join(" AND ");
        sql.push_str(&format!(
            "CREATE TABLE IF NOT EXISTS sluice.{positions} AS SELECT {key_cols}, NULL::VARCHAR AS _source_order \
             FROM main.{table} LIMIT 0;
             DELETE FROM sluice.{STAGE} s USING sluice.{positions} p \
             WHERE {on_stage} AND s.__so IS NOT NULL AND p._source_order >= s.__so;
             DELETE FROM sluice.{STAGE} WHERE __so IS NOT NULL AND rowid NOT IN \
             (SELECT min(rowid) FROM sluice.{STAGE} GROUP BY {partition}, __so, __rec);
             DELETE FROM sluice.{positions} p USING sluice.{STAGE} s WHERE {on_stage} AND s.__so IS NOT NULL;
             INSERT INTO sluice.{positions} SELECT {key_cols}, max(__so) FROM sluice.{STAGE} \
             WHERE __so IS NOT NULL GROUP BY {key_cols};"
        ));
    }
    sql.push_str(&format!(
        "CREATE OR REPLACE TABLE sluice.{LAST} AS SELECT * FROM sluice.{STAGE} \
         QUALIFY row_number() OVER (PARTITION BY {partition} ORDER BY coalesce(__so, '') DESC, __ord DESC, __rec DESC) = 1;
         DELETE FROM main.{table} t USING sluice.{LAST} l WHERE {};
         INSERT INTO main.{table} ({cols}) SELECT {cols} FROM sluice.{LAST} WHERE __op <> '{delete}';",
        matches.join(" AND ")
    ));
    if mirror.history {
        let history = quote(&history_table(&write.table));
        sql.push_str(&format!(
            "INSERT INTO main.{history} ({cols}, _op, _change_time, _source_position, _sequence) \
             SELECT {cols}, __op, __ts, __src, __ord FROM sluice.{STAGE} WHERE __rec ORDER BY __ord;"
        ));
    }
    sql.push_str(&format!("DROP TABLE sluice.{STAGE}; DROP TABLE sluice.{LAST};"));
    conn.execute_batch(&sql).map_err(db_error)
}

/// The write's batch plus the change columns the staging table has.
fn with_changes(data: &RecordBatch, m: &MirrorWrite) -> Result<RecordBatch> {
    let mut fields: Vec<Field> = data.schema().fields().iter().map(|f| f.as_ref().clone()).collect();
    let mut arrays: Vec<ArrayRef> = data.columns().to_vec();
    fields.push(Field::new("__op", DataType::Utf8, false));
    arrays.push(Arc::new(StringArray::from_iter_values(m.ops.iter().map(|o| o.name()))));
    fields.push(Field::new("__ord", DataType::Int64, false));
    arrays.push(Arc::new(Int64Array::from(m.orders.clone())));
    fields.push(Field::new("__rec", DataType::Boolean, false));
    arrays.push(Arc::new(BooleanArray::from(m.recorded.clone())));
    fields.push(Field::new("__ts", DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())), true));
    arrays.push(Arc::new(TimestampMicrosecondArray::from(m.change_us.clone()).with_timezone("UTC")));
    fields.push(Field::new("__src", DataType::Utf8, true));
    arrays.push(Arc::new(StringArray::from(m.sources.clone())));
    fields.push(Field::new("__so", DataType::Utf8, true));
    arrays.push(Arc::new(StringArray::from(m.source_orders.clone())));
    RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays)
        .map_err(|e| Error::new(ErrorKind::Fatal, "could not stage a mirror write").with_source(e))
}
