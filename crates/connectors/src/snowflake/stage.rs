//! Bulk loads through a Snowflake stage: a delivery's rows as one Parquet file (typed columns;
//! the rest as the same text an INSERT would bind), put into the internal stage `SLUICE_STAGE`
//! under a folder of its own, then loaded inside the unit's transaction: `COPY INTO` the table
//! (append, replace), or `COPY INTO` a landing table, then a delete of its keys and an insert of
//! its rows not marked deleted (upsert, mirror: the effect of one `MERGE`).

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, BooleanArray, RecordBatch, StringBuilder, new_null_array};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use sluice_core::schema::is_json;
use sluice_core::{Delivery, Error, ErrorKind, Result, SyncMode};

use crate::files::{Compression, FileFormat};
use crate::sql_table::{Dialect, Literals};

/// The internal stage Sluice loads through, in the destination's schema. Server-side
/// encryption only, so a file is uploaded as it is (no client-side encryption to do).
pub(super) const STAGE: &str = "SLUICE_STAGE";
/// The landing table's column that marks a key deleted.
pub(super) const DELETED: &str = "_sluice_deleted";

fn failed(e: &dyn std::fmt::Display) -> Error {
    Error::new(ErrorKind::Fatal, format!("Snowflake: a staged file: {e}"))
}

/// The type a column is staged as: Parquet types Snowflake loads as they are, else text.
fn staged(data_type: &DataType) -> DataType {
    match data_type {
        DataType::Boolean => DataType::Boolean,
        DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64 => DataType::Int64,
        DataType::UInt8 | DataType::UInt16 | DataType::UInt32 => DataType::Int64,
        DataType::Float16 | DataType::Float32 | DataType::Float64 => DataType::Float64,
        DataType::Date32 => DataType::Date32,
        DataType::Decimal128(p, s) => DataType::Decimal128(*p, *s),
        DataType::Timestamp(_, tz) => DataType::Timestamp(TimeUnit::Microsecond, tz.clone()),
        _ => DataType::Utf8,
    }
}

/// `batch`'s columns as `schema` stages them (the same columns, in order, then the deleted mark
/// when `mark` is given): columns staged as text take the text an INSERT would bind.
fn stage_batch(batch: &RecordBatch, schema: &SchemaRef, mark: Option<bool>) -> Result<RecordBatch> {
    let n = batch.num_columns();
    let as_text: Vec<usize> = (0..n)
        .filter(|i| schema.field(*i).data_type() == &DataType::Utf8 && batch.column(*i).data_type() != &DataType::Utf8)
        .collect();
    let mut texts: Vec<Option<ArrayRef>> = vec![None; n];
    if !as_text.is_empty() {
        let mut builders: Vec<StringBuilder> = as_text.iter().map(|_| StringBuilder::new()).collect();
        Literals::new(batch, Dialect::Sqlite)?.for_each_row(|row, cells| {
            for (b, i) in as_text.iter().enumerate() {
                let (array, format) = &cells[*i];
                if array.is_null(row) {
                    builders[b].append_null();
                } else {
                    builders[b].append_value(format.value(row).to_string());
                }
            }
            Ok(())
        })?;
        for (b, i) in as_text.iter().enumerate() {
            texts[*i] = Some(Arc::new(builders[b].finish()));
        }
    }
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(n + 1);
    for (i, text) in texts.into_iter().enumerate() {
        let column = batch.column(i);
        let want = schema.field(i).data_type();
        columns.push(match text {
            Some(text) => text,
            None if column.data_type() == want => column.clone(),
            None => cast(column, want).map_err(|e| failed(&e))?,
        });
    }
    if let Some(mark) = mark {
        columns.push(Arc::new(BooleanArray::from(vec![mark; batch.num_rows()])));
    }
    RecordBatch::try_new(schema.clone(), columns).map_err(|e| failed(&e))
}

/// The delivery as one Parquet file whose columns carry the table's names (`name` folds a
/// column's name as the table has it). Keyed modes add the deleted mark: rows false, deletes
/// (their keys, the other columns null) true.
pub(super) fn parquet(delivery: &Delivery, name: impl Fn(&str) -> String) -> Result<Vec<u8>> {
    let keyed = delivery.mode.keyed();
    let mut fields: Vec<Field> =
        delivery.schema.fields().iter().map(|f| Field::new(name(f.name()), staged(f.data_type()), true)).collect();
    if keyed {
        fields.push(Field::new(name(DELETED), DataType::Boolean, true));
    }
    let schema: SchemaRef = Arc::new(Schema::new(fields));
    let mark = keyed.then_some(false);
    let mut staged = Vec::new();
    for batch in delivery.rows.iter().filter(|b| b.num_rows() > 0) {
        staged.push(stage_batch(batch, &schema, mark)?);
    }
    for deletes in delivery.deletes.iter().filter(|b| keyed && b.num_rows() > 0) {
        // Every column of the table, the keys from the delete and the rest null.
        let full: Vec<ArrayRef> = delivery
            .schema
            .fields()
            .iter()
            .map(|f| match deletes.column_by_name(f.name()) {
                Some(c) if c.data_type() != f.data_type() => cast(c, f.data_type()).map_err(|e| failed(&e)),
                Some(c) => Ok(c.clone()),
                None => Ok(new_null_array(f.data_type(), deletes.num_rows())),
            })
            .collect::<Result<_>>()?;
        let full = RecordBatch::try_new(delivery.schema.clone(), full).map_err(|e| failed(&e))?;
        staged.push(stage_batch(&full, &schema, Some(true))?);
    }
    crate::files::encode(FileFormat::Parquet, Compression::Snappy, &schema, &staged)
}

/// The value a semi-structured column takes from `column`: JSON text (`json`) parsed, text
/// that is not JSON (a mask's output, say) kept as a string rather than failing the load; any
/// other value as the VARIANT of itself.
pub(super) fn variant(column: &str, json: bool) -> String {
    if json {
        format!("COALESCE(TRY_PARSE_JSON({column}), TO_VARIANT({column}))")
    } else {
        format!("TO_VARIANT({column})")
    }
}

/// The statements that load a staged delivery inside the transaction: `stage` is the folder's
/// reference (`@db.schema.SLUICE_STAGE/<load>/<n>`), `table` and `landing` qualified names,
/// `name` quotes a column as the table has it, `variants` marks the delivery's columns the
/// table holds as VARIANT: staged as text, they go through the landing table and [`variant`]
/// (a Parquet string copied into a VARIANT would stay one string).
pub(super) fn statements(
    delivery: &Delivery,
    stage: &str,
    table: &str,
    landing: &str,
    name: impl Fn(&str) -> String,
    variants: &[bool],
) -> Vec<String> {
    let copy = |into: &str| {
        format!(
            "COPY INTO {into} FROM {stage} FILE_FORMAT = (TYPE = PARQUET) MATCH_BY_COLUMN_NAME = CASE_INSENSITIVE \
             PURGE = TRUE"
        )
    };
    let columns: Vec<String> = delivery.schema.fields().iter().map(|f| name(f.name())).collect();
    let values: Vec<String> = (columns.iter().zip(variants).zip(delivery.schema.fields()))
        .map(|((c, semi), field)| if *semi { variant(c, is_json(field)) } else { c.clone() })
        .collect();
    let (columns, values) = (columns.join(", "), values.join(", "));
    match delivery.mode {
        SyncMode::Append | SyncMode::Replace if variants.contains(&true) => {
            let mut out = Vec::new();
            if delivery.mode == SyncMode::Replace {
                out.push(format!("DELETE FROM {table}"));
            }
            out.extend([
                copy(landing),
                format!("INSERT INTO {table} ({columns}) SELECT {values} FROM {landing}"),
                format!("DELETE FROM {landing}"),
            ]);
            out
        }
        SyncMode::Append => vec![copy(table)],
        SyncMode::Replace => vec![format!("DELETE FROM {table}"), copy(table)],
        SyncMode::Upsert | SyncMode::Mirror => {
            // The landing table's keys leave the table, then its rows not marked deleted come
            // in: the effect of one MERGE (fakesnow cannot run MERGE inside a transaction: it
            // writes its own catalog, another database, for it).
            let on: Vec<String> = delivery.keys.iter().map(|k| format!("t.{0} = s.{0}", name(k))).collect();
            if !delivery.keep.is_empty() {
                // Rows that lack columns: their keys' rows are updated but those columns, and
                // new keys inserted (a delivery with `keep` deletes nothing).
                let sets: Vec<String> = (delivery.schema.fields().iter().zip(variants))
                    .filter(|(f, _)| !delivery.keys.contains(f.name()) && !delivery.keep.contains(f.name()))
                    .map(|(f, semi)| {
                        let c = format!("s.{}", name(f.name()));
                        let value = if *semi { variant(&c, is_json(f)) } else { c };
                        format!("{} = {value}", name(f.name()))
                    })
                    .collect();
                let mut out = vec![copy(landing)];
                if !sets.is_empty() {
                    out.push(format!(
                        "UPDATE {table} AS t SET {} FROM {landing} AS s WHERE {}",
                        sets.join(", "),
                        on.join(" AND ")
                    ));
                }
                out.extend([
                    format!(
                        "INSERT INTO {table} ({columns}) SELECT {values} FROM {landing} AS s WHERE NOT EXISTS \
                         (SELECT 1 FROM {table} AS t WHERE {})",
                        on.join(" AND ")
                    ),
                    format!("DELETE FROM {landing}"),
                ]);
                return out;
            }
            vec![
                copy(landing),
                format!("DELETE FROM {table} AS t USING {landing} AS s WHERE {}", on.join(" AND ")),
                format!("INSERT INTO {table} ({columns}) SELECT {values} FROM {landing} WHERE NOT {}", name(DELETED)),
                format!("DELETE FROM {landing}"),
            ]
        }
    }
}
