//! Postgres `COPY … (FORMAT binary)` rows from Arrow batches. Used only when every column's
//! destination type takes the Arrow value as it is (an `int8` column for an Int64, a
//! `timestamptz` for a zoned timestamp, `numeric` for a decimal, …), so the stored values are
//! the ones the text format would give; any other pair keeps the text format. Binary spares
//! formatting on our side and parsing on the server's (numbers and timestamps above all).

use arrow::array::{Array, ArrayRef, AsArray};
use arrow::datatypes::{DataType, Int64Type, Schema, TimeUnit};
use arrow::record_batch::RecordBatch;
use sluice_core::{Error, ErrorKind, Result};

/// The file header: signature, flags, header extension length.
pub(crate) const HEADER: &[u8] = b"PGCOPY\n\xff\r\n\0\0\0\0\0\0\0\0\0";
/// The file trailer: a field count of -1.
pub(crate) const TRAILER: &[u8] = &[0xff, 0xff];

// Type OIDs of the columns binary rows can go to (`pg_type.oid`, fixed for built-in types).
const BOOL: u32 = 16;
const BYTEA: u32 = 17;
const INT8: u32 = 20;
const INT2: u32 = 21;
const INT4: u32 = 23;
const TEXT: u32 = 25;
const FLOAT4: u32 = 700;
const FLOAT8: u32 = 701;
const BPCHAR: u32 = 1042;
const VARCHAR: u32 = 1043;
const DATE: u32 = 1082;
const TIMESTAMP: u32 = 1114;
const TIMESTAMPTZ: u32 = 1184;
const NUMERIC: u32 = 1700;

/// Microseconds and days from the Unix epoch to Postgres's (2000-01-01).
const PG_EPOCH_US: i64 = 946_684_800_000_000;
const PG_EPOCH_DAYS: i32 = 10_957;

/// How one column is written.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Encoder {
    Bool,
    /// An integer column of this many bytes (2, 4 or 8), from an Arrow integer whose values fit.
    Int(usize),
    Float4,
    Float8,
    Text,
    Bytea,
    Date,
    Timestamp(TimeUnit),
    /// A decimal with this many digits after the point.
    Numeric(u32),
}

/// Binary `COPY` rows for one column list.
#[derive(Debug, Clone)]
pub(crate) struct BinaryRows {
    encoders: Vec<Encoder>,
}

impl BinaryRows {
    /// The encoders for `batches` (all of `schema`) going to columns of types `oids` (one per
    /// field, in order; `None` where the type is unknown). `None` when some column has no exact
    /// binary form, or holds an integer its narrower column cannot: the caller then sends text,
    /// and the server answers as it always did.
    pub(crate) fn new(schema: &Schema, oids: &[Option<u32>], batches: &[RecordBatch]) -> Option<Self> {
        if schema.fields().len() != oids.len() {
            return None;
        }
        let mut encoders = Vec::with_capacity(oids.len());
        for (i, (field, oid)) in schema.fields().iter().zip(oids).enumerate() {
            let encoder = encoder(field.data_type(), (*oid)?)?;
            if let Encoder::Int(width) = encoder
                && !batches.iter().all(|b| b.num_columns() == oids.len() && fits(b.column(i), width))
            {
                return None;
            }
            encoders.push(encoder);
        }
        Some(Self { encoders })
    }

    /// Append every row of `batch` (whose columns are the ones given to `new`).
    pub(crate) fn write(&self, batch: &RecordBatch, out: &mut Vec<u8>) -> Result<()> {
        if batch.num_columns() != self.encoders.len() {
            return Err(Error::new(ErrorKind::Fatal, "binary COPY: the batch's columns do not match"));
        }
        let columns = batch
            .columns()
            .iter()
            .zip(&self.encoders)
            .map(|(column, encoder)| Column::new(column, *encoder))
            .collect::<Result<Vec<_>>>()?;
        let count = (columns.len() as i16).to_be_bytes();
        for row in 0..batch.num_rows() {
            out.extend_from_slice(&count);
            for column in &columns {
                column.write(row, out)?;
            }
        }
        Ok(())
    }
}

/// The encoder for an Arrow type going to a column of type `oid`, where the binary value is the
/// one the text would give (integers: if they fit, see `fits`).
fn encoder(ty: &DataType, oid: u32) -> Option<Encoder> {
    use DataType as T;
    let integer = matches!(ty, T::Int8 | T::Int16 | T::Int32 | T::Int64 | T::UInt8 | T::UInt16 | T::UInt32);
    let encoder = match (ty, oid) {
        (T::Boolean, BOOL) => Encoder::Bool,
        (_, INT2) if integer => Encoder::Int(2),
        (_, INT4) if integer => Encoder::Int(4),
        (_, INT8) if integer => Encoder::Int(8),
        (T::Float32, FLOAT4) => Encoder::Float4,
        (T::Float64, FLOAT8) => Encoder::Float8,
        (T::Utf8 | T::LargeUtf8 | T::Utf8View, TEXT | VARCHAR | BPCHAR) => Encoder::Text,
        (T::Binary | T::LargeBinary | T::BinaryView | T::FixedSizeBinary(_), BYTEA) => Encoder::Bytea,
        (T::Date32, DATE) => Encoder::Date,
        (T::Timestamp(unit, Some(_)), TIMESTAMPTZ) | (T::Timestamp(unit, None), TIMESTAMP) => Encoder::Timestamp(*unit),
        (T::Decimal128(_, scale), NUMERIC) if *scale >= 0 => Encoder::Numeric(*scale as u32),
        _ => return None,
    };
    Some(encoder)
}

/// One column of a batch, its array's type resolved once, ready to be written cell by cell.
struct Column {
    /// Which rows are NULL.
    nulls: Option<arrow::buffer::NullBuffer>,
    values: Values,
}

/// A column's values, downcast once per batch (per cell, a downcast and the null check
/// through `dyn Array` were a fifth of the encoding's time).
enum Values {
    Bool(arrow::array::BooleanArray),
    Int(usize, arrow::array::Int64Array),
    Float4(arrow::array::Float32Array),
    Float8(arrow::array::Float64Array),
    Text(arrow::array::StringArray),
    LargeText(arrow::array::LargeStringArray),
    TextView(arrow::array::StringViewArray),
    Bytes(arrow::array::BinaryArray),
    LargeBytes(arrow::array::LargeBinaryArray),
    BytesView(arrow::array::BinaryViewArray),
    FixedBytes(arrow::array::FixedSizeBinaryArray),
    Date(arrow::array::Date32Array),
    /// The values as stored, in the array's unit.
    Timestamp(TimeUnit, arrow::array::Int64Array),
    Numeric(u32, arrow::array::Decimal128Array),
}

impl Column {
    fn new(array: &ArrayRef, encoder: Encoder) -> Result<Self> {
        // Integers of every width are read as Int64 (a widening cast; the encoder narrows them
        // back to the column's width, which holds them).
        let array = match encoder {
            Encoder::Int(_) if array.data_type() != &DataType::Int64 => arrow::compute::cast(array, &DataType::Int64)
                .map_err(|e| {
                Error::new(ErrorKind::Fatal, "binary COPY: cannot widen an integer column").with_source(e)
            })?,
            _ => array.clone(),
        };
        let values =
            match encoder {
                Encoder::Bool => Values::Bool(array.as_boolean().clone()),
                Encoder::Int(width) => Values::Int(width, array.as_primitive::<Int64Type>().clone()),
                Encoder::Float4 => Values::Float4(array.as_primitive().clone()),
                Encoder::Float8 => Values::Float8(array.as_primitive().clone()),
                Encoder::Text => match array.data_type() {
                    DataType::Utf8 => Values::Text(array.as_string::<i32>().clone()),
                    DataType::LargeUtf8 => Values::LargeText(array.as_string::<i64>().clone()),
                    _ => Values::TextView(array.as_string_view().clone()),
                },
                Encoder::Bytea => match array.data_type() {
                    DataType::Binary => Values::Bytes(array.as_binary::<i32>().clone()),
                    DataType::LargeBinary => Values::LargeBytes(array.as_binary::<i64>().clone()),
                    DataType::BinaryView => Values::BytesView(array.as_binary_view().clone()),
                    _ => Values::FixedBytes(array.as_fixed_size_binary().clone()),
                },
                Encoder::Date => Values::Date(array.as_primitive().clone()),
                // The values of any unit, as i64s (the unit says how to reach microseconds).
                Encoder::Timestamp(unit) => {
                    let raw =
                        array.to_data().into_builder().data_type(DataType::Int64).build().map_err(|e| {
                            Error::new(ErrorKind::Fatal, "binary COPY: a timestamp column").with_source(e)
                        })?;
                    Values::Timestamp(unit, arrow::array::Int64Array::from(raw))
                }
                Encoder::Numeric(scale) => Values::Numeric(scale, array.as_primitive().clone()),
            };
        Ok(Self { nulls: array.logical_nulls(), values })
    }

    fn write(&self, row: usize, out: &mut Vec<u8>) -> Result<()> {
        if self.nulls.as_ref().is_some_and(|n| n.is_null(row)) {
            out.extend_from_slice(&(-1i32).to_be_bytes());
            return Ok(());
        }
        match &self.values {
            Values::Bool(a) => field(out, &[u8::from(a.value(row))]),
            Values::Int(width, a) => {
                let v = a.value(row);
                match width {
                    2 => field(out, &(v as i16).to_be_bytes()),
                    4 => field(out, &(v as i32).to_be_bytes()),
                    _ => field(out, &v.to_be_bytes()),
                }
            }
            Values::Float4(a) => field(out, &a.value(row).to_be_bytes()),
            Values::Float8(a) => field(out, &a.value(row).to_be_bytes()),
            Values::Text(a) => long_field(out, a.value(row).as_bytes())?,
            Values::LargeText(a) => long_field(out, a.value(row).as_bytes())?,
            Values::TextView(a) => long_field(out, a.value(row).as_bytes())?,
            Values::Bytes(a) => long_field(out, a.value(row))?,
            Values::LargeBytes(a) => long_field(out, a.value(row))?,
            Values::BytesView(a) => long_field(out, a.value(row))?,
            Values::FixedBytes(a) => long_field(out, a.value(row))?,
            Values::Date(a) => {
                let days = a.value(row).checked_sub(PG_EPOCH_DAYS).ok_or_else(|| out_of_range("date"))?;
                field(out, &days.to_be_bytes());
            }
            Values::Timestamp(unit, a) => {
                // As the text format does, sub-microsecond digits are cut (toward the past).
                let v = a.value(row);
                let us = match unit {
                    TimeUnit::Second => v.checked_mul(1_000_000),
                    TimeUnit::Millisecond => v.checked_mul(1_000),
                    TimeUnit::Microsecond => Some(v),
                    TimeUnit::Nanosecond => Some(v.div_euclid(1_000)),
                };
                let us = us.and_then(|us| us.checked_sub(PG_EPOCH_US)).ok_or_else(|| out_of_range("timestamp"))?;
                field(out, &us.to_be_bytes());
            }
            Values::Numeric(scale, a) => numeric(a.value(row), *scale, out),
        }
        Ok(())
    }
}

/// Whether every value of an integer column fits a column of `width` bytes.
fn fits(column: &ArrayRef, width: usize) -> bool {
    let (lo, hi) = match width {
        2 => (i64::from(i16::MIN), i64::from(i16::MAX)),
        4 => (i64::from(i32::MIN), i64::from(i32::MAX)),
        _ => (i64::MIN, i64::MAX),
    };
    let narrow = match column.data_type() {
        DataType::Int8 | DataType::UInt8 | DataType::Int16 => 2,
        DataType::Int32 | DataType::UInt16 => 4,
        _ => 8,
    };
    if narrow <= width {
        return true;
    }
    let Ok(wide) = arrow::compute::cast(column, &DataType::Int64) else { return false };
    let wide = wide.as_primitive::<Int64Type>();
    let min = arrow::compute::min(wide).unwrap_or(0);
    let max = arrow::compute::max(wide).unwrap_or(0);
    lo <= min && max <= hi
}

fn field(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as i32).to_be_bytes());
    out.extend_from_slice(bytes);
}

fn long_field(out: &mut Vec<u8>, bytes: &[u8]) -> Result<()> {
    let len = i32::try_from(bytes.len())
        .map_err(|_| Error::new(ErrorKind::Fatal, "binary COPY: a value is larger than Postgres takes"))?;
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(bytes);
    Ok(())
}

fn out_of_range(what: &str) -> Error {
    Error::new(ErrorKind::Fatal, format!("binary COPY: a {what} is out of range"))
}

/// A decimal `v × 10^-scale` in Postgres's binary `numeric` form: the digit count, the weight
/// (the power of 10000 of the first digit), the sign, the display scale, then base-10000 digits.
fn numeric(v: i128, scale: u32, out: &mut Vec<u8>) {
    // Decimal digits of |v|, least significant first.
    let mut decimal = [0u8; 40];
    let mut n = 0usize;
    let mut abs = v.unsigned_abs();
    while abs > u128::from(u64::MAX) {
        decimal[n] = (abs % 10) as u8;
        abs /= 10;
        n += 1;
    }
    let mut small = abs as u64;
    while small > 0 {
        decimal[n] = (small % 10) as u8;
        small /= 10;
        n += 1;
    }
    // Decimal digit i stands for 10^(i - scale); it falls in base-10000 group
    // floor((i - scale) / 4), the groups numbered by their power of 10000.
    let scale_i = scale as i64;
    let mut groups = [0i16; 16];
    let (mut ndigits, mut weight) = (0usize, 0i64);
    if n > 0 {
        let lowest = (-scale_i).div_euclid(4);
        weight = (n as i64 - 1 - scale_i).div_euclid(4);
        for (i, d) in decimal.iter().enumerate().take(n) {
            let e = i as i64 - scale_i;
            let slot = (weight - e.div_euclid(4)) as usize;
            groups[slot] += i16::from(*d) * [1, 10, 100, 1000][e.rem_euclid(4) as usize];
        }
        ndigits = (weight - lowest + 1) as usize;
        while ndigits > 0 && groups[ndigits - 1] == 0 {
            ndigits -= 1;
        }
    }
    let len = 8 + 2 * ndigits;
    out.extend_from_slice(&(len as i32).to_be_bytes());
    out.extend_from_slice(&(ndigits as i16).to_be_bytes());
    out.extend_from_slice(&(weight as i16).to_be_bytes());
    out.extend_from_slice(&(if v < 0 { 0x4000u16 } else { 0 }).to_be_bytes());
    out.extend_from_slice(&(scale as i16).to_be_bytes());
    for group in &groups[..ndigits] {
        out.extend_from_slice(&group.to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{
        BooleanArray, Date32Array, Decimal128Array, Float64Array, Int32Array, Int64Array, StringArray,
        TimestampMicrosecondArray, TimestampNanosecondArray,
    };
    use arrow::datatypes::Field;

    use super::*;

    /// (ndigits, weight, sign, dscale, digits) of an encoded numeric.
    fn decoded(v: i128, scale: u32) -> (i16, i16, u16, i16, Vec<i16>) {
        let mut out = Vec::new();
        numeric(v, scale, &mut out);
        let be = |i: usize| i16::from_be_bytes([out[i], out[i + 1]]);
        let len = i32::from_be_bytes(out[..4].try_into().unwrap()) as usize;
        assert_eq!(len, out.len() - 4);
        let n = be(4);
        let digits = (0..n as usize).map(|k| be(12 + 2 * k)).collect();
        (n, be(6), be(8) as u16, be(10), digits)
    }

    #[test]
    fn numerics_are_base_10000_groups_around_the_point() {
        // 1234.56 → 1234 | 5600, weight 0.
        assert_eq!(decoded(123_456, 2), (2, 0, 0, 2, vec![1234, 5600]));
        // -12345.6789 → 1 | 2345 | 6789, weight 1.
        assert_eq!(decoded(-123_456_789, 4), (3, 1, 0x4000, 4, vec![1, 2345, 6789]));
        // 0.05 → 500 at weight -1.
        assert_eq!(decoded(5, 2), (1, -1, 0, 2, vec![500]));
        // 0.00001 (scale 5) → 0000 | 1000 → weight -2, one digit 1000.
        assert_eq!(decoded(1, 5), (1, -2, 0, 5, vec![1000]));
        // 10000 → 1 at weight 1 (trailing zero group dropped).
        assert_eq!(decoded(10_000, 0), (1, 1, 0, 0, vec![1]));
        // 100.00 → 100, weight 0, the fraction's zero group dropped.
        assert_eq!(decoded(10_000, 2), (1, 0, 0, 2, vec![100]));
        assert_eq!(decoded(0, 3), (0, 0, 0, 3, vec![]));
        // The largest magnitude Decimal128 holds, scale 38: 38 nines after the point.
        let max = 10i128.pow(38) - 1;
        let (n, weight, sign, dscale, digits) = decoded(-max, 38);
        assert_eq!((n, weight, sign, dscale), (10, -1, 0x4000, 38));
        assert_eq!(&digits[..9], &[9999; 9]);
        assert_eq!(digits[9], 9900);
        let (n, weight, _, _, digits) = decoded(max, 0);
        assert_eq!((n, weight), (10, 9));
        assert_eq!((digits[0], digits[9]), (99, 9999));
    }

    #[test]
    fn only_exact_type_pairs_are_binary() {
        let schema = |ty: DataType| Schema::new(vec![Field::new("c", ty, true)]);
        let binary = |ty: DataType, oid: Option<u32>| BinaryRows::new(&schema(ty), &[oid], &[]).is_some();
        assert!(binary(DataType::Int64, Some(INT8)));
        assert!(binary(DataType::Int32, Some(INT8)));
        // A value the server would have to convert from text stays text.
        assert!(!binary(DataType::Float32, Some(FLOAT8)));
        assert!(!binary(DataType::Utf8, Some(3802))); // jsonb
        assert!(!binary(DataType::Int64, Some(NUMERIC)));
        let naive = DataType::Timestamp(TimeUnit::Microsecond, None);
        assert!(!binary(naive.clone(), Some(TIMESTAMPTZ)));
        assert!(binary(naive, Some(TIMESTAMP)));
        assert!(!binary(DataType::Decimal128(10, -2), Some(NUMERIC)));
        assert!(!binary(DataType::Utf8, None));
        assert!(!binary(DataType::Null, Some(TEXT)));
        // Integers go to a narrower column when every value fits it; else the server refuses
        // the text as before.
        let ints = |values: Vec<Option<i64>>| {
            let schema = Arc::new(schema(DataType::Int64));
            let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(Int64Array::from(values))]).unwrap();
            (schema, batch)
        };
        let (s, fitting) = ints(vec![Some(-32_768), None, Some(2_147_483_647)]);
        assert!(BinaryRows::new(&s, &[Some(INT4)], std::slice::from_ref(&fitting)).is_some());
        assert!(BinaryRows::new(&s, &[Some(INT2)], std::slice::from_ref(&fitting)).is_none());
        let (_, too_big) = ints(vec![Some(2_147_483_648)]);
        assert!(BinaryRows::new(&s, &[Some(INT4)], &[fitting, too_big]).is_none());
    }

    #[test]
    fn rows_are_field_counts_then_length_prefixed_values() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("i", DataType::Int32, true),
            Field::new("s", DataType::Utf8, true),
            Field::new("b", DataType::Boolean, true),
            Field::new("f", DataType::Float64, true),
            Field::new("d", DataType::Date32, true),
            Field::new("t", DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())), true),
            Field::new("n", DataType::Timestamp(TimeUnit::Nanosecond, None), true),
            Field::new("m", DataType::Decimal128(12, 2), true),
        ]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int32Array::from(vec![Some(-2), None])),
                Arc::new(StringArray::from(vec![Some("a\tb\\"), None])),
                Arc::new(BooleanArray::from(vec![Some(true), None])),
                Arc::new(Float64Array::from(vec![Some(0.5), None])),
                Arc::new(Date32Array::from(vec![Some(10_958), None])),
                Arc::new(TimestampMicrosecondArray::from(vec![Some(PG_EPOCH_US + 1), None]).with_timezone("UTC")),
                Arc::new(TimestampNanosecondArray::from(vec![Some(-1), None])),
                Arc::new(Decimal128Array::from(vec![Some(-150), None]).with_precision_and_scale(12, 2).unwrap()),
            ],
        )
        .unwrap();
        let oids = [INT4, TEXT, BOOL, FLOAT8, DATE, TIMESTAMPTZ, TIMESTAMP, NUMERIC].map(Some);
        let rows = BinaryRows::new(&schema, &oids, std::slice::from_ref(&batch)).unwrap();
        let mut out = Vec::new();
        rows.write(&batch, &mut out).unwrap();
        let mut want: Vec<u8> = vec![0, 8];
        want.extend([0, 0, 0, 4, 0xff, 0xff, 0xff, 0xfe]);
        want.extend([0, 0, 0, 4, b'a', b'\t', b'b', b'\\']);
        want.extend([0, 0, 0, 1, 1]);
        want.extend([0, 0, 0, 8]);
        want.extend(0.5f64.to_be_bytes());
        want.extend([0, 0, 0, 4, 0, 0, 0, 1]);
        want.extend([0, 0, 0, 8]);
        want.extend(1i64.to_be_bytes());
        want.extend([0, 0, 0, 8]);
        want.extend((-1 - PG_EPOCH_US).to_be_bytes());
        // -1.50: one digit 1, then 5000, weight 0, negative, scale 2.
        want.extend([0, 0, 0, 12, 0, 2, 0, 0, 0x40, 0, 0, 2, 0, 1, 0x13, 0x88]);
        want.extend([0, 8]);
        for _ in 0..8 {
            want.extend([0xff, 0xff, 0xff, 0xff]);
        }
        assert_eq!(out, want);
        // A slice (how a batch is cut into messages) writes its own rows: here the second.
        let mut second = Vec::new();
        rows.write(&batch.slice(1, 1), &mut second).unwrap();
        assert_eq!(second, want[want.len() - 34..]);
        let mut first = Vec::new();
        rows.write(&batch.slice(0, 1), &mut first).unwrap();
        assert_eq!(first, want[..want.len() - 34]);
    }
}
