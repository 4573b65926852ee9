//! Result values as text for SQL destinations: Postgres `COPY` text rows and MySQL literals.
//! Timestamps with a zone are written in UTC with their offset (Postgres) or as UTC wall time
//! (MySQL's DATETIME has no zone).

use std::fmt::Write;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::datatypes::{DataType, Field, Schema};
use arrow::record_batch::RecordBatch;
use arrow::util::display::{ArrayFormatter, FormatOptions};
use sluice_core::{Error, ErrorKind, Result};

use super::Dialect;

/// A batch with every zoned timestamp moved to UTC (the instant is unchanged).
fn in_utc(batch: &RecordBatch) -> Result<RecordBatch> {
    let mut fields = Vec::new();
    let mut columns = Vec::new();
    for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
        if let DataType::Timestamp(unit, Some(tz)) = field.data_type()
            && tz.as_ref() != "UTC"
        {
            let to = DataType::Timestamp(*unit, Some("UTC".into()));
            columns.push(arrow::compute::cast(column, &to).map_err(cast_error)?);
            fields.push(Field::new(field.name(), to, field.is_nullable()));
        } else {
            columns.push(column.clone());
            fields.push(field.as_ref().clone());
        }
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).map_err(cast_error)
}

fn cast_error(e: arrow::error::ArrowError) -> Error {
    Error::new(ErrorKind::Fatal, "cannot convert a result column").with_source(e)
}

/// The text of each cell of one batch, in one dialect.
pub(crate) struct Literals {
    batch: RecordBatch,
    dialect: Dialect,
}

impl Literals {
    /// Prepare `batch` for `dialect`.
    pub(crate) fn new(batch: &RecordBatch, dialect: Dialect) -> Result<Self> {
        Ok(Self { batch: in_utc(batch)?, dialect })
    }

    fn options(&self) -> FormatOptions<'static> {
        let (tz, naive) = match self.dialect {
            Dialect::Postgres => ("%Y-%m-%d %H:%M:%S%.6f+00", "%Y-%m-%d %H:%M:%S%.6f"),
            Dialect::MySql => ("%Y-%m-%d %H:%M:%S%.6f", "%Y-%m-%d %H:%M:%S%.6f"),
            Dialect::Sqlite => ("%Y-%m-%d %H:%M:%S%.6f+00:00", "%Y-%m-%d %H:%M:%S%.6f"),
        };
        FormatOptions::new().with_timestamp_tz_format(Some(tz)).with_timestamp_format(Some(naive))
    }

    /// Call `row` with the formatters of every column, then write each row with `write`.
    pub(crate) fn for_each_row(
        &self,
        mut write: impl FnMut(usize, &[(&ArrayRef, ArrayFormatter<'_>)]) -> Result<()>,
    ) -> Result<()> {
        let options = self.options();
        let cells = self
            .batch
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &options).map(|f| (c, f)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(cast_error)?;
        for row in 0..self.batch.num_rows() {
            write(row, &cells)?;
        }
        Ok(())
    }

    /// Append the batch as Postgres `COPY … (FORMAT text)` rows. Strings are escaped from
    /// their bytes; other values are formatted straight into `out`, with no copy per cell.
    pub(crate) fn write_copy(&self, out: &mut String) -> Result<()> {
        self.for_each_row(|row, cells| {
            for (i, (array, format)) in cells.iter().enumerate() {
                if i > 0 {
                    out.push('\t');
                }
                if array.is_null(row) {
                    out.push_str("\\N");
                    continue;
                }
                match array.data_type() {
                    DataType::Boolean => out.push(if array.as_boolean().value(row) { 't' } else { 'f' }),
                    DataType::Binary | DataType::LargeBinary | DataType::BinaryView | DataType::FixedSizeBinary(_) => {
                        out.push_str("\\\\x");
                        out.push_str(&hex::encode(binary(array, row)));
                    }
                    DataType::Utf8 => escape_copy(array.as_string::<i32>().value(row), out),
                    DataType::LargeUtf8 => escape_copy(array.as_string::<i64>().value(row), out),
                    DataType::Utf8View => escape_copy(array.as_string_view().value(row), out),
                    _ => {
                        let _ = write!(out, "{}", format.value(row));
                    }
                }
            }
            out.push('\n');
            Ok(())
        })
    }

    /// Append the batch as MySQL `(…), (…)` value lists, comma-separated after `first`.
    pub(crate) fn write_mysql_rows(&self, out: &mut String, mut first: bool) -> Result<()> {
        self.for_each_row(|row, cells| {
            if !first {
                out.push(',');
            }
            first = false;
            out.push('(');
            for (i, (array, format)) in cells.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&literal(array, format, row));
            }
            out.push(')');
            Ok(())
        })
    }
}

/// A string in `COPY` text format: backslash, newline, carriage return and tab escaped.
fn escape_copy(text: &str, out: &mut String) {
    if !text.bytes().any(|b| matches!(b, b'\\' | b'\n' | b'\r' | b'\t')) {
        out.push_str(text);
        return;
    }
    for ch in text.chars() {
        match ch {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c => out.push(c),
        }
    }
}

/// One cell as a MySQL literal.
fn literal(array: &ArrayRef, format: &ArrayFormatter<'_>, row: usize) -> String {
    if array.is_null(row) {
        return "NULL".into();
    }
    match array.data_type() {
        DataType::Boolean => (if array.as_boolean().value(row) { "1" } else { "0" }).into(),
        DataType::Int8
        | DataType::Int16
        | DataType::Int32
        | DataType::Int64
        | DataType::UInt8
        | DataType::UInt16
        | DataType::UInt32
        | DataType::UInt64
        | DataType::Decimal128(_, _)
        | DataType::Decimal256(_, _) => format.value(row).to_string(),
        DataType::Float16 | DataType::Float32 | DataType::Float64 => {
            let text = format.value(row).to_string();
            // MySQL has no NaN or infinity.
            if text.parse::<f64>().is_ok_and(f64::is_finite) { text } else { "NULL".into() }
        }
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView | DataType::FixedSizeBinary(_) => {
            format!("X'{}'", hex::encode(binary(array, row)))
        }
        _ => {
            let text = format.value(row).to_string();
            let mut out = String::with_capacity(text.len() + 2);
            out.push('\'');
            for ch in text.chars() {
                match ch {
                    '\'' => out.push_str("''"),
                    '\\' => out.push_str("\\\\"),
                    '\0' => out.push_str("\\0"),
                    c => out.push(c),
                }
            }
            out.push('\'');
            out
        }
    }
}

/// The bytes of a binary cell.
pub(crate) fn binary(array: &ArrayRef, row: usize) -> Vec<u8> {
    match array.data_type() {
        DataType::Binary => array.as_binary::<i32>().value(row).to_vec(),
        DataType::LargeBinary => array.as_binary::<i64>().value(row).to_vec(),
        DataType::BinaryView => array.as_binary_view().value(row).to_vec(),
        DataType::FixedSizeBinary(_) => array.as_fixed_size_binary().value(row).to_vec(),
        _ => Vec::new(),
    }
}
