//! The last change of each key in a mirror write, found in memory: the change with the highest
//! source position, then stream sequence, then recording (a moved key's new row over its old
//! one), as the apply's SQL orders them. It saves that statement (a third of a small unit's
//! fixed cost) when no staged change can be dropped before the table is written.

use std::collections::HashMap;
use std::collections::hash_map::Entry;

use arrow::array::{ArrayRef, BooleanArray, RecordBatch};
use arrow::datatypes::DataType;
use arrow::row::{RowConverter, SortField};
use sluice_core::{ChangeOp, MirrorWrite};

/// One flag per row of `data`: whether it is its key's last change. `None` where memory cannot
/// match keys as the SQL does, which compares them as the table's types: a key column missing,
/// of floating type (`-0.0` and `0.0` are one key to SQL, two to Arrow's row format), text
/// (which may be a UUID or an INTERVAL column, where two spellings are one value) or nested;
/// or a truncate in the unit.
pub(super) fn last_per_key(data: &RecordBatch, mirror: &MirrorWrite) -> Option<BooleanArray> {
    if mirror.keys.is_empty() || mirror.whole_row || mirror.ops.contains(&ChangeOp::Truncate) {
        return None;
    }
    let columns: Vec<ArrayRef> = mirror.keys.iter().map(|k| data.column_by_name(k).cloned()).collect::<Option<_>>()?;
    if !columns.iter().all(|c| exact(c.data_type())) {
        return None;
    }
    let converter = RowConverter::new(columns.iter().map(|c| SortField::new(c.data_type().clone())).collect()).ok()?;
    let rows = converter.convert_columns(&columns).ok()?;
    let rank = |i: usize| (mirror.source_orders[i].as_deref().unwrap_or(""), mirror.orders[i], mirror.recorded[i]);
    let mut last: HashMap<arrow::row::Row<'_>, usize> = HashMap::with_capacity(data.num_rows());
    for i in 0..data.num_rows() {
        match last.entry(rows.row(i)) {
            Entry::Vacant(e) => {
                e.insert(i);
            }
            Entry::Occupied(mut e) if rank(i) > rank(*e.get()) => {
                e.insert(i);
            }
            Entry::Occupied(_) => {}
        }
    }
    let mut flags = vec![false; data.num_rows()];
    for i in last.into_values() {
        flags[i] = true;
    }
    Some(BooleanArray::from(flags))
}

/// Types whose values are equal in DuckDB exactly when their bytes are equal in Arrow.
pub(super) fn exact(ty: &DataType) -> bool {
    matches!(
        ty,
        DataType::Boolean
            | DataType::Binary
            | DataType::Date32
            | DataType::Decimal128(..)
            | DataType::Time64(_)
            | DataType::Timestamp(..)
    ) || ty.is_integer()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Float64Array, Int64Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    fn write(ids: Vec<Option<i64>>, names: Vec<&str>) -> RecordBatch {
        let schema =
            Schema::new(vec![Field::new("id", DataType::Int64, true), Field::new("name", DataType::Utf8, true)]);
        RecordBatch::try_new(
            Arc::new(schema),
            vec![Arc::new(Int64Array::from(ids)), Arc::new(StringArray::from(names))],
        )
        .unwrap()
    }

    fn changes(n: usize, orders: Vec<i64>, positions: Vec<Option<&str>>, recorded: Vec<bool>) -> MirrorWrite {
        MirrorWrite {
            keys: vec!["id".into()],
            ops: vec![ChangeOp::Update; n],
            orders,
            source_orders: positions.into_iter().map(|p| p.map(str::to_string)).collect(),
            recorded,
            ..MirrorWrite::default()
        }
    }

    #[test]
    fn the_highest_position_then_sequence_then_recording_wins_and_nulls_are_one_key() {
        let data = write(vec![Some(1), Some(1), Some(2), Some(2), None, None, Some(3), Some(3)], vec!["a"; 8]);
        let m = changes(
            8,
            vec![1, 2, 3, 4, 5, 6, 7, 7],
            // Key 1: a higher position beats a later sequence. Key 2: equal positions, the
            // later sequence. NULL keys match each other. Key 3: one change's two rows, the
            // recorded one.
            vec![Some("0009"), Some("0008"), Some("5"), Some("5"), None, None, Some("7"), Some("7")],
            vec![true, true, true, true, true, true, false, true],
        );
        let flags = last_per_key(&data, &m).unwrap();
        let got: Vec<bool> = flags.iter().map(Option::unwrap).collect();
        assert_eq!(got, vec![true, false, false, true, false, true, false, true]);
    }

    #[test]
    fn truncates_floating_keys_and_keyless_tables_are_left_to_sql() {
        let data = write(vec![Some(1), Some(2)], vec!["a", "b"]);
        let mut m = changes(2, vec![1, 2], vec![Some("1"), Some("2")], vec![true, true]);
        m.ops[1] = ChangeOp::Truncate;
        assert!(last_per_key(&data, &m).is_none());
        m.ops[1] = ChangeOp::Update;
        m.whole_row = true;
        assert!(last_per_key(&data, &m).is_none());
        m.whole_row = false;
        m.keys = vec!["missing".into()];
        assert!(last_per_key(&data, &m).is_none());
        let schema = Schema::new(vec![Field::new("id", DataType::Float64, true)]);
        let floats =
            RecordBatch::try_new(Arc::new(schema), vec![Arc::new(Float64Array::from(vec![0.0, -0.0]))]).unwrap();
        m.keys = vec!["id".into()];
        assert!(last_per_key(&floats, &m).is_none());
        // Text may be a UUID column, where two spellings are one key.
        m.keys = vec!["name".into()];
        assert!(last_per_key(&data, &m).is_none());
    }
}
