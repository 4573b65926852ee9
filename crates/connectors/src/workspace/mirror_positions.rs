//! The source position applied to each key of a mirrored table, kept in memory beside
//! `sluice.positions__<table>`, so a unit whose positions interleave with those applied before
//! (a topic of several partitions, pushes from several clients) finds its replays without
//! joining the positions table: that join, and the SQL search for each key's last change it
//! forces, were about 11 ms of a 2,000-change unit's 26.
//!
//! Only for keys whose types DuckDB and Arrow's row format compare alike (as
//! [`super::mirror_last`]), and up to [`MOST_KEYS`] keys in all tables together; past that,
//! or for other keys, the SQL does it as before. Changed only by the writer, with the table,
//! and forgotten with the rest of the writer's memory when a write rolls back.

use std::collections::HashMap;

use arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use arrow::compute::filter_record_batch;
use arrow::datatypes::DataType;
use arrow::row::{RowConverter, SortField};
use duckdb::Connection;
use sluice_core::{ChangeOp, Error, ErrorKind, MirrorWrite, Result, TableWrite};

use super::db::{db_error, quote};

/// Keys held in memory at most, all tables together (about 100 bytes each, so about 25 MB):
/// a table that would pass it is checked by SQL.
pub(super) const MOST_KEYS: usize = 250_000;

/// One table's applied positions by key.
pub(super) struct AppliedPositions {
    keys: Vec<String>,
    types: Vec<DataType>,
    converter: RowConverter,
    /// Each key's row (Arrow's row format, from `converter`) and its applied position.
    by_key: HashMap<Box<[u8]>, String, foldhash::fast::RandomState>,
}

impl std::fmt::Debug for AppliedPositions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppliedPositions").field("keys", &self.keys).field("held", &self.by_key.len()).finish()
    }
}

/// The write's key columns, when memory can compare them as the SQL does.
fn key_columns(data: &RecordBatch, mirror: &MirrorWrite) -> Option<Vec<ArrayRef>> {
    if mirror.keys.is_empty() || mirror.whole_row {
        return None;
    }
    let columns: Vec<ArrayRef> = mirror.keys.iter().map(|k| data.column_by_name(k).cloned()).collect::<Option<_>>()?;
    columns.iter().all(|c| super::mirror_last::exact(c.data_type())).then_some(columns)
}

impl AppliedPositions {
    /// The positions table `positions` (unquoted name in schema `sluice`) read for the write's
    /// keys; `None` when it holds more than `room` keys or its key columns do not have the
    /// write's types.
    pub(super) fn load(
        conn: &Connection,
        positions: &str,
        (data, mirror): (&RecordBatch, &MirrorWrite),
        room: usize,
    ) -> Result<Option<Self>> {
        let Some(columns) = key_columns(data, mirror) else { return Ok(None) };
        let table = format!("sluice.{}", quote(positions));
        let types: Vec<DataType> = columns.iter().map(|c| c.data_type().clone()).collect();
        let names: Vec<String> = mirror.keys.iter().map(|k| quote(k)).collect();
        let select = format!("SELECT {}, _source_order FROM {table}", names.join(", "));
        // The columns' types first, from no rows: memory compares the bytes of the write's.
        let mut stmt = conn.prepare(&format!("{select} LIMIT 0")).map_err(db_error)?;
        let schema = stmt.query_arrow([]).map_err(db_error)?.get_schema();
        let stored: Vec<&DataType> = schema.fields().iter().map(|f| f.data_type()).collect();
        if stored[..names.len()] != types.iter().collect::<Vec<_>>()[..] || stored[names.len()] != &DataType::Utf8 {
            return Ok(None);
        }
        let held: i64 = conn.query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0)).map_err(db_error)?;
        if held as usize > room {
            return Ok(None);
        }
        let converter = RowConverter::new(types.iter().map(|t| SortField::new(t.clone())).collect()).map_err(failed)?;
        let mut loaded = Self { keys: mirror.keys.clone(), types, converter, by_key: HashMap::default() };
        let mut stmt = conn.prepare(&select).map_err(db_error)?;
        for batch in stmt.query_arrow([]).map_err(db_error)? {
            let keys: Vec<ArrayRef> = batch.columns()[..names.len()].to_vec();
            let rows = loaded.converter.convert_columns(&keys).map_err(failed)?;
            let Some(orders) = batch.column(names.len()).as_string_opt::<i32>() else { return Ok(None) };
            for (i, row) in rows.iter().enumerate().filter(|(i, _)| orders.is_valid(*i)) {
                // Rows written under another key set may repeat a key: the highest covers it,
                // as the SQL's check finds any row at or above a change.
                loaded.raise(row.as_ref(), orders.value(i));
            }
        }
        Ok(Some(loaded))
    }

    /// Whether these positions serve `write`: the same keys, of the same types.
    pub(super) fn serves(&self, data: &RecordBatch, mirror: &MirrorWrite) -> bool {
        key_columns(data, mirror)
            .is_some_and(|c| self.keys == mirror.keys && c.iter().map(|a| a.data_type()).eq(self.types.iter()))
    }

    /// Per change, whether it is a replay: a row change (not a truncate) with a position at
    /// or below the one applied to its key, as the SQL's check drops it.
    pub(super) fn replays(&self, data: &RecordBatch, mirror: &MirrorWrite) -> Result<Vec<bool>> {
        let columns = key_columns(data, mirror).ok_or_else(|| failed("the write's keys changed"))?;
        let rows = self.converter.convert_columns(&columns).map_err(failed)?;
        Ok((0..data.num_rows())
            .map(|i| match (&mirror.source_orders[i], mirror.ops[i]) {
                (Some(so), op) if op != ChangeOp::Truncate => {
                    self.by_key.get(rows.row(i).as_ref()).is_some_and(|applied| applied.as_str() >= so.as_str())
                }
                _ => false,
            })
            .collect())
    }

    /// How many keys are held.
    pub(super) fn held(&self) -> usize {
        self.by_key.len()
    }

    /// Remember the positions the write applies (each key's highest, as the SQL stores them);
    /// false when the table now holds more than `room` keys.
    pub(super) fn record(&mut self, data: &RecordBatch, mirror: &MirrorWrite, room: usize) -> Result<bool> {
        let columns = key_columns(data, mirror).ok_or_else(|| failed("the write's keys changed"))?;
        let rows = self.converter.convert_columns(&columns).map_err(failed)?;
        for (i, so) in mirror.source_orders.iter().enumerate() {
            let Some(so) = so.as_deref().filter(|_| mirror.ops[i] != ChangeOp::Truncate) else { continue };
            self.raise(rows.row(i).as_ref(), so);
        }
        Ok(self.by_key.len() <= room)
    }

    /// The key `row` is applied up to `order`, unless it holds a higher position already.
    fn raise(&mut self, row: &[u8], order: &str) {
        match self.by_key.get_mut(row) {
            Some(applied) if applied.as_str() < order => *applied = order.to_string(),
            Some(_) => {}
            None => {
                self.by_key.insert(row.into(), order.to_string());
            }
        }
    }
}

/// What the writer holds in memory of one table's applied positions.
#[derive(Debug)]
pub(super) enum Held {
    /// Not read yet, or changed by SQL since.
    Unknown,
    /// Too many keys, or keys memory cannot compare: SQL finds the replays.
    TooMany,
    /// Held: replays are found here.
    Some(AppliedPositions),
}

/// What this writer knows of the positions tables, forgotten when a write rolls back.
#[derive(Debug, Default)]
pub(crate) struct KnownPositions {
    /// Each table's applied positions by key, where held in memory.
    pub(super) applied: std::collections::HashMap<String, Held>,
    /// Tables whose positions table has the columns of a set of keys: not checked again.
    pub(super) checked: std::collections::HashSet<(String, Vec<String>)>,
    /// The highest position applied to each table (whatever its keys were): a unit whose
    /// changes all lie above it is no replay.
    pub(super) high: std::collections::HashMap<String, Option<String>>,
}

impl KnownPositions {
    /// Keys held in memory for tables other than `table`.
    pub(super) fn held_besides(&self, table: &str) -> usize {
        let held = |h: &Held| if let Held::Some(p) = h { p.held() } else { 0 };
        self.applied.iter().filter(|(t, _)| *t != table).map(|(_, h)| held(h)).sum()
    }
}

/// `write` and `mirror` without the changes `drop` marks, and the stream sequences of the
/// dropped changes that no kept change shares (their ledger rows are written already).
pub(super) fn without(
    write: &TableWrite,
    mirror: &MirrorWrite,
    drop: &[bool],
) -> Result<(TableWrite, MirrorWrite, Vec<i64>)> {
    let keep: Vec<bool> = drop.iter().map(|d| !d).collect();
    let mask = arrow::array::BooleanArray::from(keep.clone());
    let data = filter_record_batch(&write.data, &mask).map_err(failed)?;
    fn kept<T: Clone>(values: &[T], keep: &[bool]) -> Vec<T> {
        values.iter().zip(keep).filter(|(_, k)| **k).map(|(v, _)| v.clone()).collect()
    }
    let filtered = MirrorWrite {
        keys: mirror.keys.clone(),
        whole_row: mirror.whole_row,
        history: mirror.history,
        ops: kept(&mirror.ops, &keep),
        orders: kept(&mirror.orders, &keep),
        recorded: kept(&mirror.recorded, &keep),
        change_us: kept(&mirror.change_us, &keep),
        sources: kept(&mirror.sources, &keep),
        source_orders: kept(&mirror.source_orders, &keep),
        unavailable: kept(&mirror.unavailable, &keep),
    };
    let still: std::collections::HashSet<i64> = filtered.orders.iter().copied().collect();
    let mut skipped: Vec<i64> =
        (mirror.orders.iter().zip(drop)).filter(|(o, d)| **d && !still.contains(o)).map(|(o, _)| *o).collect();
    skipped.sort_unstable();
    skipped.dedup();
    // The apply reads the changes from `filtered`, not from the write.
    let write = TableWrite {
        table: write.table.clone(),
        changes: write.changes.clone(),
        brought_by: write.brought_by.clone(),
        data,
        mirror: None,
        snapshot: write.snapshot.clone(),
    };
    Ok((write, filtered, skipped))
}

fn failed(e: impl std::fmt::Display) -> Error {
    Error::new(ErrorKind::Fatal, format!("mirror positions in memory: {e}"))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Int64Array, StringArray};
    use arrow::datatypes::{Field, Schema};

    use super::*;

    fn unit(ids: &[i64], positions: &[&str]) -> (TableWrite, MirrorWrite) {
        let schema = Schema::new(vec![Field::new("id", DataType::Int64, true), Field::new("v", DataType::Utf8, true)]);
        let names: Vec<String> = ids.iter().map(|i| format!("v{i}")).collect();
        let data = RecordBatch::try_new(
            Arc::new(schema),
            vec![Arc::new(Int64Array::from(ids.to_vec())), Arc::new(StringArray::from(names))],
        )
        .unwrap();
        let n = ids.len();
        let mirror = MirrorWrite {
            keys: vec!["id".into()],
            ops: vec![ChangeOp::Update; n],
            orders: (100..100 + n as i64).collect(),
            recorded: vec![true; n],
            change_us: vec![None; n],
            sources: vec![None; n],
            source_orders: positions.iter().map(|p| Some(p.to_string())).collect(),
            unavailable: vec![Vec::new(); n],
            ..MirrorWrite::default()
        };
        let write = TableWrite {
            table: "t".into(),
            changes: Vec::new(),
            brought_by: Vec::new(),
            data,
            mirror: Some(mirror.clone()),
            snapshot: None,
        };
        (write, mirror)
    }

    /// Positions interleave: a change below the table's highest position is a replay only when
    /// its own key's position covers it.
    #[test]
    fn replays_are_found_by_each_keys_own_position_and_recorded_positions_only_rise() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(
            "CREATE SCHEMA sluice; CREATE TABLE sluice.\"positions__t\" (id BIGINT, _source_order VARCHAR);
             INSERT INTO sluice.\"positions__t\" VALUES (1, '10'), (2, '30'), (NULL, '15'), (2, '24');",
        )
        .unwrap();
        let (write, mirror) = unit(&[1, 2, 3, 2], &["20", "25", "05", "31"]);
        let mut held = AppliedPositions::load(&conn, "positions__t", (&write.data, &mirror), 4).unwrap().unwrap();
        assert!(held.serves(&write.data, &mirror));
        let replays = held.replays(&write.data, &mirror).unwrap();
        assert_eq!(replays, [false, true, false, false]);
        let (kept, kept_mirror, skipped) = without(&write, &mirror, &replays).unwrap();
        assert_eq!(kept.data.num_rows(), 3);
        assert_eq!(kept_mirror.orders, [100, 102, 103]);
        assert_eq!(skipped, [101]);
        assert!(!held.record(&kept.data, &kept_mirror, 3).unwrap(), "key 3 makes four keys");
        assert!(held.record(&kept.data, &kept_mirror, 4).unwrap());
        assert_eq!(held.held(), 4);
        // Key 1 now at 20, key 2 at 31: 19 and 31 are replays, 21 is not; a NULL key matches
        // the NULL key's position.
        let (again, again_mirror) = unit(&[1, 1, 2], &["19", "21", "31"]);
        assert_eq!(held.replays(&again.data, &again_mirror).unwrap(), [true, false, true]);
        let mut nulls = again_mirror.clone();
        nulls.source_orders = vec![Some("14".into()), Some("16".into()), None];
        let ids: arrow::array::ArrayRef = Arc::new(Int64Array::from(vec![None, None, Some(2)]));
        let data = RecordBatch::try_new(again.data.schema(), vec![ids, again.data.column(1).clone()]).unwrap();
        // A change without a position is never a replay.
        assert_eq!(held.replays(&data, &nulls).unwrap(), [true, false, false]);
    }

    #[test]
    fn text_keys_and_other_key_sets_are_left_to_sql() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(
            "CREATE SCHEMA sluice; CREATE TABLE sluice.\"positions__t\" (v VARCHAR, _source_order VARCHAR);",
        )
        .unwrap();
        let (write, mut mirror) = unit(&[1], &["1"]);
        mirror.keys = vec!["v".into()];
        assert!(AppliedPositions::load(&conn, "positions__t", (&write.data, &mirror), MOST_KEYS).unwrap().is_none());
        mirror.keys = vec!["id".into()];
        conn.execute_batch("CREATE TABLE sluice.\"positions__u\" (id INTEGER, _source_order VARCHAR); INSERT INTO sluice.\"positions__u\" VALUES (1, '1')").unwrap();
        // The table's key is INTEGER, the write's BIGINT: memory would compare other bytes.
        assert!(AppliedPositions::load(&conn, "positions__u", (&write.data, &mirror), MOST_KEYS).unwrap().is_none());
        conn.execute_batch("CREATE TABLE sluice.\"positions__w\" (id BIGINT, _source_order VARCHAR)").unwrap();
        let held = AppliedPositions::load(&conn, "positions__w", (&write.data, &mirror), MOST_KEYS).unwrap().unwrap();
        mirror.keys = vec!["id".into(), "v".into()];
        assert!(!held.serves(&write.data, &mirror));
    }
}
