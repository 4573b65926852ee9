//! Rows as ClickHouse's `Native` format: a block of columns, each named, typed as its table
//! column is, and laid out as ClickHouse keeps it in memory. ClickHouse 18.16 takes it over HTTP
//! at 2.7-2.8M rows/s on this machine's kind against about 1M for `JSONEachRow` (BENCHMARKS.md),
//! and Sluice copies Arrow's buffers instead of writing JSON text.
//!
//! Only what maps exactly is encoded here; a block with any other column type (a table made by
//! hand with `Int32`, `LowCardinality`, …) or value (an instant before 1970 for `DateTime`) is
//! `None`, and the caller writes `JSONEachRow` instead, where ClickHouse converts.

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use arrow::datatypes::{
    DataType, Date32Type, Decimal128Type, Float64Type, Int64Type, TimeUnit, TimestampMicrosecondType, UInt8Type,
    UInt64Type,
};

/// The block of `batch` plus the constant columns (`_version`, `_deleted`, `_sluice_unit`),
/// typed as `table`'s columns (name, type); its column names, for the `INSERT`'s column list.
pub(super) fn native_block(
    batch: &RecordBatch,
    constants: &[(&str, u64)],
    table: &[(String, String)],
) -> Option<(Vec<String>, Vec<u8>)> {
    let rows = batch.num_rows();
    let type_of = |name: &str| table.iter().find(|(n, _)| n == name).map(|(_, t)| t.as_str());
    let mut out = Vec::with_capacity(rows * 64);
    varuint(&mut out, (batch.num_columns() + constants.len()) as u64);
    varuint(&mut out, rows as u64);
    let mut names = Vec::with_capacity(batch.num_columns() + constants.len());
    for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
        let ty = type_of(field.name())?;
        header(&mut out, field.name(), ty);
        column_data(&mut out, column, ty)?;
        names.push(field.name().clone());
    }
    for (name, value) in constants {
        let ty = type_of(name)?;
        header(&mut out, name, ty);
        match ty {
            "UInt64" => (0..rows).for_each(|_| out.extend_from_slice(&value.to_le_bytes())),
            "UInt8" => out.extend(std::iter::repeat_n(u8::try_from(*value).ok()?, rows)),
            _ => return None,
        }
        names.push((*name).to_string());
    }
    Some((names, out))
}

fn header(out: &mut Vec<u8>, name: &str, ty: &str) {
    string(out, name.as_bytes());
    string(out, ty.as_bytes());
}

/// A column's data: a `Nullable`'s null map and then its values, an `Array`'s end offsets and
/// then its items, or the values.
fn column_data(out: &mut Vec<u8>, column: &ArrayRef, ty: &str) -> Option<()> {
    if let Some(inner) = unwrap(ty, "Nullable(") {
        match column.nulls() {
            Some(nulls) => out.extend(nulls.iter().map(|valid| u8::from(!valid))),
            None => out.resize(out.len() + column.len(), 0),
        }
        return values(out, column, inner);
    }
    if let Some(item) = unwrap(ty, "Array(") {
        let list = column.as_list_opt::<i32>()?;
        let offsets = list.value_offsets();
        // A NULL list is an empty array, as `JSONEachRow` leaves it (the key left out, the
        // column's default): taken as it is when it spans no items.
        if (0..list.len()).any(|i| list.is_null(i) && offsets[i + 1] != offsets[i]) {
            return None;
        }
        let first = *offsets.first()?;
        for end in &offsets[1..] {
            out.extend_from_slice(&u64::try_from(end - first).ok()?.to_le_bytes());
        }
        let last = *offsets.last()?;
        let items = list.values().slice(usize::try_from(first).ok()?, usize::try_from(last - first).ok()?);
        return column_data(out, &items, item);
    }
    // A scalar column that is not `Nullable` has no place for a NULL.
    if column.null_count() > 0 {
        return None;
    }
    values(out, column, ty)
}

/// The values of a column of type `ty` (not `Nullable`); a NULL's place holds any value.
fn values(out: &mut Vec<u8>, column: &ArrayRef, ty: &str) -> Option<()> {
    let source = column.data_type();
    match ty {
        "Int64" if source.is_integer() && !matches!(source, DataType::UInt64) => {
            let ints = cast(column, &DataType::Int64)?;
            little_endian(out, ints.as_primitive::<Int64Type>().values(), i64::to_le_bytes);
        }
        "UInt64" if source.is_unsigned_integer() => {
            let ints = cast(column, &DataType::UInt64)?;
            little_endian(out, ints.as_primitive::<UInt64Type>().values(), u64::to_le_bytes);
        }
        // NaN and infinities are NULL in the JSON rows; a `Float32` is written there as its
        // shortest text, not widened: both are left to them.
        "Float64" if source.is_integer() || matches!(source, DataType::Float64) => {
            let floats = cast(column, &DataType::Float64)?;
            let values = floats.as_primitive::<Float64Type>().values();
            if values.iter().enumerate().any(|(i, v)| !v.is_finite() && !floats.is_null(i)) {
                return None;
            }
            little_endian(out, values, f64::to_le_bytes);
        }
        "UInt8" if matches!(source, DataType::Boolean | DataType::UInt8) => {
            out.extend_from_slice(cast(column, &DataType::UInt8)?.as_primitive::<UInt8Type>().values());
        }
        "String" if matches!(source, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View) => {
            let text = cast(column, &DataType::Utf8)?;
            let text = text.as_string::<i32>();
            for i in 0..text.len() {
                string(out, if text.is_null(i) { b"" } else { text.value(i).as_bytes() });
            }
        }
        "Date" if matches!(source, DataType::Date32) => {
            for (i, days) in column.as_primitive::<Date32Type>().values().iter().enumerate() {
                let days = if column.is_null(i) { 0 } else { u16::try_from(*days).ok()? };
                out.extend_from_slice(&days.to_le_bytes());
            }
        }
        // Instants from 1970 to 2106 (`DateTime`'s range); the JSON rows' text for the rest.
        "DateTime('UTC')" if matches!(source, DataType::Timestamp(..)) => {
            for micros in instants(column)? {
                out.extend_from_slice(&u32::try_from(micros / 1_000_000).ok()?.to_le_bytes());
            }
        }
        "DateTime64(6, 'UTC')" if matches!(source, DataType::Timestamp(..)) => {
            for micros in instants(column)? {
                out.extend_from_slice(&micros.to_le_bytes());
            }
        }
        _ => return decimals(out, column, ty),
    }
    Some(())
}

/// A timestamp column's values as microseconds since 1970 (0 for a NULL), if every value lies
/// within `DateTime`'s range, 1970 to 2106.
fn instants(column: &ArrayRef) -> Option<Vec<i64>> {
    let micros = cast(column, &DataType::Timestamp(TimeUnit::Microsecond, None))?;
    let micros = micros.as_primitive::<TimestampMicrosecondType>();
    (0..column.len())
        .map(|i| match (column.is_null(i), micros.is_null(i)) {
            (true, _) => Some(0),
            // Out of range for microseconds.
            (false, true) => None,
            (false, false) => {
                let v = micros.value(i);
                (0..=i64::from(u32::MAX) * 1_000_000).contains(&v).then_some(v)
            }
        })
        .collect()
}

/// `Decimal(p, s)` from Arrow decimals of the same scale and no more digits: 4, 8 or 16 bytes
/// by precision.
fn decimals(out: &mut Vec<u8>, column: &ArrayRef, ty: &str) -> Option<()> {
    let (p, s) = unwrap(ty, "Decimal(")?.split_once(',')?;
    let (p, s): (u8, i8) = (p.trim().parse().ok()?, s.trim().parse().ok()?);
    let DataType::Decimal128(precision, scale) = column.data_type() else { return None };
    if *scale != s || *precision > p {
        return None;
    }
    for (i, v) in column.as_primitive::<Decimal128Type>().values().iter().enumerate() {
        let v = if column.is_null(i) { 0 } else { *v };
        match p {
            0..=9 => out.extend_from_slice(&i32::try_from(v).ok()?.to_le_bytes()),
            10..=18 => out.extend_from_slice(&i64::try_from(v).ok()?.to_le_bytes()),
            _ => out.extend_from_slice(&v.to_le_bytes()),
        }
    }
    Some(())
}

/// Eight-byte values in ClickHouse's order, little-endian: Arrow's buffer as it is on a
/// little-endian machine.
fn little_endian<T: arrow::datatypes::ArrowNativeType>(
    out: &mut Vec<u8>,
    values: &arrow::buffer::ScalarBuffer<T>,
    to_le_bytes: fn(T) -> [u8; 8],
) {
    if cfg!(target_endian = "little") {
        out.extend_from_slice(values.inner().as_slice());
    } else {
        values.iter().for_each(|v| out.extend_from_slice(&to_le_bytes(*v)));
    }
}

fn unwrap<'a>(ty: &'a str, prefix: &str) -> Option<&'a str> {
    ty.strip_prefix(prefix)?.strip_suffix(')')
}

fn cast(column: &ArrayRef, to: &DataType) -> Option<ArrayRef> {
    arrow::compute::cast(column, to).ok()
}

fn varuint(out: &mut Vec<u8>, mut n: u64) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

fn string(out: &mut Vec<u8>, bytes: &[u8]) {
    varuint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Int64Array, ListArray, StringArray};
    use arrow::datatypes::{Field, Int64Type as I, Schema};

    use super::*;

    fn table(columns: &[(&str, &str)]) -> Vec<(String, String)> {
        columns.iter().map(|(n, t)| (n.to_string(), t.to_string())).collect()
    }

    #[test]
    fn a_block_is_laid_out_as_clickhouse_reads_it() {
        let schema = Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
            Field::new("tags", DataType::List(Arc::new(Field::new("item", DataType::Int64, true))), false),
        ]);
        let tags = ListArray::from_iter_primitive::<I, _, _>(vec![Some(vec![Some(7)]), Some(vec![])]);
        let batch = RecordBatch::try_new(
            Arc::new(schema),
            vec![
                Arc::new(Int64Array::from(vec![1, 2])),
                Arc::new(StringArray::from(vec![Some("ab"), None])),
                Arc::new(tags),
            ],
        )
        .unwrap();
        let columns = table(&[
            ("id", "Int64"),
            ("name", "Nullable(String)"),
            ("tags", "Array(Nullable(Int64))"),
            ("_u", "UInt64"),
        ]);
        let (names, body) = native_block(&batch, &[("_u", 5)], &columns).unwrap();
        assert_eq!(names, ["id", "name", "tags", "_u"]);
        let mut want = vec![4, 2];
        want.extend([2, b'i', b'd', 5]);
        want.extend(b"Int64");
        want.extend(1i64.to_le_bytes());
        want.extend(2i64.to_le_bytes());
        want.extend([4]);
        want.extend(b"name");
        want.extend([16]);
        want.extend(b"Nullable(String)");
        want.extend([0, 1, 2, b'a', b'b', 0]);
        want.extend([4]);
        want.extend(b"tags");
        want.extend([22]);
        want.extend(b"Array(Nullable(Int64))");
        want.extend(1u64.to_le_bytes());
        want.extend(1u64.to_le_bytes());
        want.extend([0]);
        want.extend(7i64.to_le_bytes());
        want.extend([2, b'_', b'u', 6]);
        want.extend(b"UInt64");
        want.extend(5u64.to_le_bytes());
        want.extend(5u64.to_le_bytes());
        assert_eq!(body, want);
    }

    /// A sliced batch (a unit cut from a larger one) starts its values and null bits at an
    /// offset: the whole-buffer copies must begin there too.
    #[test]
    fn a_sliced_batch_writes_only_its_own_values_and_nulls() {
        use arrow::array::{Float64Array, UInt64Array};
        let schema = Schema::new(vec![
            Field::new("i", DataType::Int64, true),
            Field::new("u", DataType::UInt64, false),
            Field::new("f", DataType::Float64, true),
        ]);
        let batch = RecordBatch::try_new(
            Arc::new(schema),
            vec![
                Arc::new(Int64Array::from(vec![Some(1), None, Some(3), Some(4), None])),
                Arc::new(UInt64Array::from(vec![10, 20, 30, 40, 50])),
                Arc::new(Float64Array::from(vec![None, Some(0.5), None, Some(2.5), Some(3.5)])),
            ],
        )
        .unwrap()
        .slice(1, 3);
        let columns = table(&[("i", "Nullable(Int64)"), ("u", "UInt64"), ("f", "Nullable(Float64)")]);
        let (_, body) = native_block(&batch, &[], &columns).unwrap();
        let mut want = vec![3, 3];
        want.extend([1, b'i', 15]);
        want.extend(b"Nullable(Int64)");
        want.extend([1, 0, 0]);
        for v in [0i64, 3, 4] {
            want.extend(v.to_le_bytes());
        }
        want.extend([1, b'u', 6]);
        want.extend(b"UInt64");
        for v in [20u64, 30, 40] {
            want.extend(v.to_le_bytes());
        }
        want.extend([1, b'f', 17]);
        want.extend(b"Nullable(Float64)");
        want.extend([0, 1, 0]);
        for v in [0.5f64, 0.0, 2.5] {
            want.extend(v.to_le_bytes());
        }
        assert_eq!(body, want);
    }

    #[test]
    fn a_null_list_is_an_empty_array() {
        let item = Arc::new(Field::new("item", DataType::Int64, true));
        let schema = Schema::new(vec![Field::new("tags", DataType::List(item), true)]);
        let tags = ListArray::from_iter_primitive::<I, _, _>(vec![None, Some(vec![Some(3)])]);
        let batch = RecordBatch::try_new(Arc::new(schema), vec![Arc::new(tags)]).unwrap();
        let (_, body) = native_block(&batch, &[], &table(&[("tags", "Array(Nullable(Int64))")])).unwrap();
        let data = &body[body.len() - 25..];
        let mut want = Vec::new();
        want.extend(0u64.to_le_bytes());
        want.extend(1u64.to_le_bytes());
        want.extend([0]);
        want.extend(3i64.to_le_bytes());
        assert_eq!(data, want);
    }

    #[test]
    fn what_does_not_map_exactly_is_left_to_json() {
        let schema = Schema::new(vec![Field::new("id", DataType::Int64, true)]);
        let batch =
            RecordBatch::try_new(Arc::new(schema), vec![Arc::new(Int64Array::from(vec![Some(1), None]))]).unwrap();
        // A NULL for a column without `Nullable`, a type of a hand-made table, a missing column.
        assert!(native_block(&batch, &[], &table(&[("id", "Int64")])).is_none());
        assert!(native_block(&batch, &[], &table(&[("id", "Nullable(Int32)")])).is_none());
        assert!(native_block(&batch, &[], &table(&[("other", "Nullable(Int64)")])).is_none());
        assert!(native_block(&batch, &[], &table(&[("id", "Nullable(Int64)")])).is_some());
        // NaN (NULL in the JSON rows), an instant before 1970, a decimal wider than its column.
        let nan = Arc::new(arrow::array::Float64Array::from(vec![f64::NAN])) as ArrayRef;
        let before = Arc::new(arrow::array::TimestampMicrosecondArray::from(vec![-1])) as ArrayRef;
        let wide =
            Arc::new(arrow::array::Decimal128Array::from(vec![1]).with_precision_and_scale(20, 2).unwrap()) as ArrayRef;
        for (column, ty) in [(nan, "Float64"), (before, "DateTime('UTC')"), (wide, "Decimal(12, 2)")] {
            let schema = Schema::new(vec![Field::new("v", column.data_type().clone(), false)]);
            let batch = RecordBatch::try_new(Arc::new(schema), vec![column]).unwrap();
            assert!(native_block(&batch, &[], &table(&[("v", ty)])).is_none(), "{ty}");
        }
    }
}
