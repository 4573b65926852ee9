//! Delta's schema (the `schemaString` of the table's metadata) from and to Arrow, the types
//! columns are stored as, how a table's columns change as a stream's do, and batches conformed
//! to the table's columns before they are written.

use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch, new_null_array};
use arrow::compute::{CastOptions, cast_with_options};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use serde_json::{Value, json};
use sluice_core::schema::{Column, ColumnType, TableSchema};
use sluice_core::{Error, ErrorKind, Result};

/// The Delta type a column of `data_type` is stored as.
fn delta_type(name: &str, data_type: &DataType) -> Result<Value> {
    Ok(match data_type {
        DataType::Boolean => json!("boolean"),
        DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64 => json!("long"),
        DataType::UInt8 | DataType::UInt16 | DataType::UInt32 | DataType::UInt64 => json!("long"),
        DataType::Float16 | DataType::Float32 | DataType::Float64 => json!("double"),
        // Delta has no time of day: kept as its text.
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View | DataType::Time32(_) | DataType::Time64(_) => {
            json!("string")
        }
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView => json!("binary"),
        DataType::Date32 | DataType::Date64 => json!("date"),
        DataType::Timestamp(_, Some(_)) => json!("timestamp"),
        DataType::Timestamp(_, None) => json!("timestamp_ntz"),
        DataType::Decimal128(p, s) => json!(format!("decimal({p},{s})")),
        DataType::List(item) | DataType::LargeList(item) => json!({
            "type": "array", "elementType": delta_type(name, item.data_type())?, "containsNull": true,
        }),
        other => {
            return Err(Error::new(
                ErrorKind::Fatal,
                format!("delta: column '{name}' has a type Delta tables do not take here ({other})"),
            ));
        }
    })
}

/// The Arrow type Sluice writes and reads a Delta type as.
fn arrow_type(name: &str, delta: &Value) -> Result<DataType> {
    let unknown =
        || Error::new(ErrorKind::Fatal, format!("delta: column '{name}' has a type Sluice does not read ({delta})"));
    if let Some(object) = delta.as_object() {
        if object.get("type").and_then(Value::as_str) != Some("array") {
            return Err(unknown());
        }
        let item = arrow_type(name, object.get("elementType").ok_or_else(unknown)?)?;
        return Ok(DataType::List(Arc::new(Field::new("element", item, true))));
    }
    let text = delta.as_str().ok_or_else(unknown)?;
    Ok(match text {
        "boolean" => DataType::Boolean,
        // Another writer's narrower columns keep their types: values are cast into them.
        "byte" => DataType::Int8,
        "short" => DataType::Int16,
        "integer" => DataType::Int32,
        "long" => DataType::Int64,
        "float" => DataType::Float32,
        "double" => DataType::Float64,
        "string" => DataType::Utf8,
        "binary" => DataType::Binary,
        "date" => DataType::Date32,
        "timestamp" => DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
        "timestamp_ntz" => DataType::Timestamp(TimeUnit::Microsecond, None),
        decimal if decimal.starts_with("decimal(") => {
            let inner = decimal.trim_start_matches("decimal(").trim_end_matches(')');
            let (p, s) = inner.split_once(',').ok_or_else(unknown)?;
            DataType::Decimal128(p.trim().parse().map_err(|_| unknown())?, s.trim().parse().map_err(|_| unknown())?)
        }
        _ => return Err(unknown()),
    })
}

/// The type a column of `data_type` has in the table (what [`arrow_type`] reads back).
pub(crate) fn stored(name: &str, data_type: &DataType) -> Result<DataType> {
    arrow_type(name, &delta_type(name, data_type)?)
}

/// The table's columns as the `schemaString` of its metadata. A column the table had (in
/// `original`) keeps its entry as it was (nullability, comments, metadata of another writer),
/// unless its type changed.
pub(crate) fn schema_string(schema: &Schema, original: Option<&str>) -> Result<String> {
    let before: Vec<Value> = original
        .and_then(|text| serde_json::from_str::<Value>(text).ok())
        .and_then(|v| v["fields"].as_array().cloned())
        .unwrap_or_default();
    let fields = schema
        .fields()
        .iter()
        .map(|f| {
            let kept = before.iter().find(|old| {
                old["name"].as_str() == Some(f.name().as_str())
                    && arrow_type(f.name(), &old["type"]).is_ok_and(|t| &t == f.data_type())
            });
            match kept {
                Some(entry) => Ok(entry.clone()),
                None => Ok(json!({"name": f.name(), "type": delta_type(f.name(), f.data_type())?, "nullable": true,
                                  "metadata": {}})),
            }
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(json!({"type": "struct", "fields": fields}).to_string())
}

/// The columns a `schemaString` declares, as Arrow.
pub(crate) fn parse_schema(text: &str) -> Result<SchemaRef> {
    let value: Value = serde_json::from_str(text)
        .map_err(|e| Error::new(ErrorKind::Fatal, format!("delta: the table's schema is not JSON: {e}")))?;
    let fields = value["fields"].as_array().cloned().unwrap_or_default();
    let fields = fields
        .iter()
        .map(|f| {
            let name = f["name"].as_str().unwrap_or_default();
            Ok(Field::new(name, arrow_type(name, &f["type"])?, true))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Arc::new(Schema::new(fields)))
}

/// What a write does to the table's columns.
pub(crate) struct Evolution {
    /// The columns after the write.
    pub schema: SchemaRef,
    /// A column's type widened: every file is rewritten to the new type in the same commit.
    pub widened: bool,
}

/// `table`'s columns with `incoming`'s added, and widened where the stream widened them
/// (integers that got fractions become doubles; anything that became text becomes text).
pub(crate) fn evolve(table: &Schema, incoming: &Schema) -> Result<Evolution> {
    let mut fields: Vec<Field> = table.fields().iter().map(|f| f.as_ref().clone()).collect();
    let mut widened = false;
    for field in incoming.fields() {
        let want = stored(field.name(), field.data_type())?;
        // Delta matches column names without regard to case.
        match fields.iter_mut().find(|f| f.name().eq_ignore_ascii_case(field.name())) {
            None => {
                fields.push(Field::new(field.name(), want, true));
            }
            Some(existing) if existing.data_type() != &want => {
                let wider = matches!(
                    (existing.data_type(), &want),
                    (DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64, DataType::Float64)
                        | (DataType::Float32, DataType::Float64)
                        | (_, DataType::Utf8)
                );
                if wider {
                    *existing = Field::new(existing.name(), want, true);
                    widened = true;
                }
            }
            Some(_) => {}
        }
    }
    Ok(Evolution { schema: Arc::new(Schema::new(fields)), widened })
}

/// `batch` with exactly `schema`'s columns, in its order and types: a column the batch lacks is
/// null (older files, rows without it). A value that does not fit is an error, not a null.
pub(crate) fn conform(batch: &RecordBatch, schema: &SchemaRef) -> Result<RecordBatch> {
    let options = CastOptions { safe: false, ..CastOptions::default() };
    let columns = schema
        .fields()
        .iter()
        .map(|field| {
            let found =
                batch.schema().index_of(field.name()).ok().or_else(|| {
                    batch.schema().fields().iter().position(|f| f.name().eq_ignore_ascii_case(field.name()))
                });
            let Some(column) = found.map(|i| batch.column(i)) else {
                return Ok(new_null_array(field.data_type(), batch.num_rows()));
            };
            if column.data_type() == field.data_type() {
                return Ok(column.clone());
            }
            cast_with_options(column, field.data_type(), &options).map_err(|e| {
                Error::new(
                    ErrorKind::Fatal,
                    format!("delta: column '{}' cannot be stored as {}: {e}", field.name(), field.data_type()),
                )
            })
        })
        .collect::<Result<Vec<ArrayRef>>>()?;
    RecordBatch::try_new(schema.clone(), columns).map_err(|e| Error::new(ErrorKind::Fatal, format!("delta: {e}")))
}

/// The table's columns as the decoder's types, so a stream resumes knowing them.
pub(crate) fn table_schema(schema: &Schema) -> TableSchema {
    let ty = |data_type: &DataType| match data_type {
        DataType::Boolean => ColumnType::Boolean,
        DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64 => ColumnType::Bigint,
        DataType::Float32 | DataType::Float64 => ColumnType::Double,
        DataType::Date32 => ColumnType::Date,
        DataType::Binary => ColumnType::Blob,
        DataType::Timestamp(_, Some(_)) => ColumnType::Timestamptz,
        DataType::Timestamp(_, None) => ColumnType::Timestamp,
        DataType::Decimal128(p, s) => ColumnType::Decimal(*p, u8::try_from(*s).unwrap_or(0)),
        _ => ColumnType::Varchar,
    };
    TableSchema::existing(
        schema.fields().iter().map(|f| Column { name: f.name().clone(), ty: ty(f.data_type()) }).collect(),
    )
}

#[cfg(test)]
mod tests {
    use arrow::array::{Float64Array, Int64Array, StringArray};

    use super::*;

    #[test]
    fn schemas_round_trip_through_the_schema_string() {
        let schema = Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("at", DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())), true),
            Field::new("local", DataType::Timestamp(TimeUnit::Microsecond, None), true),
            Field::new("amount", DataType::Decimal128(12, 2), true),
            Field::new("tags", DataType::List(Arc::new(Field::new("item", DataType::Utf8, true))), true),
            Field::new("t", DataType::Time64(TimeUnit::Microsecond), true),
        ]);
        let back = parse_schema(&schema_string(&schema, None).unwrap()).unwrap();
        let types: Vec<String> = back.fields().iter().map(|f| f.data_type().to_string()).collect();
        assert_eq!(
            types,
            [
                "Int64",
                "Timestamp(µs, \"UTC\")",
                "Timestamp(µs)",
                "Decimal128(12, 2)",
                "List(Utf8, field: 'element')",
                "Utf8"
            ]
        );
    }

    #[test]
    fn columns_are_added_and_widened_never_narrowed() {
        let table = Schema::new(vec![Field::new("id", DataType::Int64, true), Field::new("n", DataType::Int64, true)]);
        let incoming =
            Schema::new(vec![Field::new("n", DataType::Float64, true), Field::new("x", DataType::Utf8, true)]);
        let evolution = evolve(&table, &incoming).unwrap();
        assert!(evolution.widened);
        let names: Vec<&String> = evolution.schema.fields().iter().map(|f| f.name()).collect();
        assert_eq!(names, ["id", "n", "x"]);
        assert_eq!(evolution.schema.field(1).data_type(), &DataType::Float64);
        let same = evolve(&evolution.schema, &table).unwrap();
        assert!(!same.widened, "an integer column into a double one is no change");
        assert_eq!(same.schema, evolution.schema);
    }

    #[test]
    fn batches_take_the_tables_columns_and_refuse_what_does_not_fit() {
        let schema: SchemaRef = Arc::new(Schema::new(vec![
            Field::new("n", DataType::Float64, true),
            Field::new("missing", DataType::Utf8, true),
        ]));
        let batch = RecordBatch::try_from_iter([("n", Arc::new(Int64Array::from(vec![1, 2])) as ArrayRef)]).unwrap();
        let out = conform(&batch, &schema).unwrap();
        assert_eq!(out.column(0).as_any().downcast_ref::<Float64Array>().unwrap().value(1), 2.0);
        assert_eq!(out.column(1).null_count(), 2);
        let narrow: SchemaRef = Arc::new(Schema::new(vec![Field::new("n", DataType::Int64, true)]));
        let text = RecordBatch::try_from_iter([("n", Arc::new(StringArray::from(vec!["x"])) as ArrayRef)]).unwrap();
        assert!(conform(&text, &narrow).unwrap_err().message().contains("cannot be stored"));
    }
}
