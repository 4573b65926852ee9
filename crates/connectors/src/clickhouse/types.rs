//! Column types in ClickHouse, and rows as `JSONEachRow`.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, StringBuilder, UInt8Array, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use arrow::record_batch::RecordBatch;
use arrow::util::display::{ArrayFormatter, FormatOptions};
use sluice_core::schema::{ColumnType, Scalar};
use sluice_core::{Error, ErrorKind, Result};

/// The ClickHouse type of an Arrow column, without `Nullable`. `modern`: the server has
/// `DateTime64` (20.1 and later); older ones keep instants to the second.
pub(super) fn column_type(ty: &DataType, modern: bool) -> String {
    match ty {
        DataType::Boolean => "UInt8".into(),
        DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64 => "Int64".into(),
        DataType::UInt8 | DataType::UInt16 | DataType::UInt32 | DataType::UInt64 => "UInt64".into(),
        DataType::Float16 | DataType::Float32 | DataType::Float64 => "Float64".into(),
        DataType::Timestamp(_, _) if modern => "DateTime64(6, 'UTC')".into(),
        DataType::Timestamp(_, _) => "DateTime('UTC')".into(),
        DataType::Date32 | DataType::Date64 => "Date".into(),
        DataType::Decimal128(p, s) => format!("Decimal({p}, {s})"),
        DataType::List(item) => format!("Array(Nullable({}))", column_type(item.data_type(), modern)),
        _ => "String".into(),
    }
}

/// The column type Sluice reads back from a ClickHouse type, for a stream that resumes.
pub(super) fn column_of(ty: &str) -> Option<ColumnType> {
    let ty = ty.trim();
    let inner = ty.strip_prefix("Nullable(").and_then(|t| t.strip_suffix(')')).unwrap_or(ty);
    if let Some(item) = inner.strip_prefix("Array(").and_then(|t| t.strip_suffix(')')) {
        return Some(ColumnType::List(match column_of(item)? {
            ColumnType::Boolean => Scalar::Boolean,
            ColumnType::Bigint => Scalar::Bigint,
            ColumnType::Double => Scalar::Double,
            _ => Scalar::Varchar,
        }));
    }
    if let Some(args) = inner.strip_prefix("Decimal(").and_then(|t| t.strip_suffix(')')) {
        let (p, s) = args.split_once(',')?;
        return Some(ColumnType::Decimal(p.trim().parse().ok()?, s.trim().parse().ok()?));
    }
    Some(match inner {
        "UInt8" => ColumnType::Boolean,
        "Int8" | "Int16" | "Int32" | "Int64" | "UInt16" | "UInt32" | "UInt64" => ColumnType::Bigint,
        "Float32" | "Float64" => ColumnType::Double,
        "Date" => ColumnType::Date,
        t if t.starts_with("DateTime") => ColumnType::Timestamptz,
        _ => ColumnType::Varchar,
    })
}

/// Rows of `batch` as JSON lines ClickHouse reads, with constant columns appended (`_version`,
/// `_deleted`, `_sluice_unit`). Booleans become 0/1 and instants UTC text.
pub(super) fn json_rows(batch: &RecordBatch, constants: &[(&str, u64)], modern: bool) -> Result<Vec<u8>> {
    let rows = batch.num_rows();
    let mut fields: Vec<Field> = Vec::new();
    let mut columns: Vec<ArrayRef> = Vec::new();
    let format = if modern { "%Y-%m-%d %H:%M:%S%.6f" } else { "%Y-%m-%d %H:%M:%S" };
    let options = FormatOptions::new().with_timestamp_tz_format(Some(format)).with_timestamp_format(Some(format));
    for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
        let column: ArrayRef = match field.data_type() {
            DataType::Boolean => arrow::compute::cast(column, &DataType::UInt8).map_err(cast_error)?,
            DataType::Timestamp(_, Some(_)) => {
                let utc = arrow::compute::cast(column, &DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())))
                    .map_err(cast_error)?;
                text(&utc, &options)?
            }
            DataType::Timestamp(_, None) | DataType::Time32(_) | DataType::Time64(_) | DataType::Binary => {
                text(column, &options)?
            }
            _ => column.clone(),
        };
        fields.push(Field::new(field.name(), column.data_type().clone(), true));
        columns.push(column);
    }
    for (name, value) in constants {
        let array: ArrayRef = if *name == "_deleted" {
            Arc::new(UInt8Array::from(vec![u8::try_from(*value).unwrap_or(1); rows]))
        } else {
            Arc::new(UInt64Array::from(vec![*value; rows]))
        };
        fields.push(Field::new(*name, array.data_type().clone(), false));
        columns.push(array);
    }
    let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).map_err(cast_error)?;
    let mut out = Vec::with_capacity(rows * 128);
    let mut writer = arrow::json::LineDelimitedWriter::new(&mut out);
    writer.write(&batch).map_err(cast_error)?;
    writer.finish().map_err(cast_error)?;
    drop(writer);
    Ok(out)
}

fn text(column: &ArrayRef, options: &FormatOptions<'_>) -> Result<ArrayRef> {
    let formatter = ArrayFormatter::try_new(column.as_ref(), options).map_err(cast_error)?;
    let mut out = StringBuilder::new();
    for row in 0..column.len() {
        if column.is_null(row) {
            out.append_null();
        } else {
            out.append_value(formatter.value(row).to_string());
        }
    }
    Ok(Arc::new(out.finish()))
}

fn cast_error(e: arrow::error::ArrowError) -> Error {
    Error::new(ErrorKind::Fatal, "cannot write rows for ClickHouse").with_source(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_map_both_ways() {
        assert_eq!(
            column_type(&DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())), false),
            "DateTime('UTC')"
        );
        assert_eq!(column_type(&DataType::Decimal128(12, 2), true), "Decimal(12, 2)");
        assert_eq!(column_of("Nullable(Int64)"), Some(ColumnType::Bigint));
        assert_eq!(column_of("Nullable(Decimal(12, 2))"), Some(ColumnType::Decimal(12, 2)));
        assert_eq!(column_of("Array(Nullable(Float64))"), Some(ColumnType::List(Scalar::Double)));
        assert_eq!(column_of("DateTime('UTC')"), Some(ColumnType::Timestamptz));
    }
}
