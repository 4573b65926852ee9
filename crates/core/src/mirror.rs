//! The one mirror plan: a mirrored table's changes in a write unit as deliveries any
//! destination applies. Within a unit the last change per key wins; keys whose last change is
//! a delete are deleted, the others upserted (the destination matches on the key columns). A
//! truncate makes the unit replace the table with what follows it, and so does the first chunk
//! of a new snapshot copy. A column a change marks unavailable (Debezium's unchanged TOASTed
//! value) takes the value of the key's latest earlier change in the unit that has it; when the
//! unit has none, the row's delivery lists the column in `keep`, and the destination keeps the
//! value its table holds (NULL for a new key, and after the unit's truncate). With `history`,
//! every recorded change is also appended to `<table>__changes` with the columns
//! [`HISTORY_COLUMNS`] name.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array, StringArray, TimestampMicrosecondArray, UInt32Array};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use arrow::record_batch::RecordBatch;
use arrow::row::{RowConverter, SortField};

use crate::batch::{ChangeOp, MirrorWrite, TableWrite};
use crate::error::{Error, ErrorKind, Result};
use crate::sync::{Delivery, SyncMode};

/// The column that carries a change's op (`c`, `u`, `d`, `r`) to custom SQL.
pub const OP_COLUMN: &str = "__op";

/// The columns a history row adds to the row image, in the workspace and every destination
/// that keeps history: the op's name, when the change happened at the source, the source
/// position (JSON text), and the stream's sequence.
pub const HISTORY_COLUMNS: [&str; 4] = ["_op", "_change_time", "_source_position", "_sequence"];

/// Where a value of an unavailable column comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fill {
    /// The row of this index in the unit (an earlier change of the key that has it).
    Row(usize),
    /// The table's row of the key.
    Table,
    /// None: the key is new since the unit's truncate, or was deleted before.
    Null,
}

/// The changes of one mirrored table's write, with the keys and where they stand.
struct Changes<'a> {
    write: &'a TableWrite,
    mirror: &'a MirrorWrite,
    /// The changes of each key from the unit's last truncate on, in order (indices).
    by_key: Vec<Vec<usize>>,
    /// Per row, its key's entry in `by_key` (rows before the last truncate: none).
    key_of: Vec<Option<usize>>,
    /// The unit empties the table (a truncate, or the first chunk of a new snapshot copy):
    /// nothing of it is kept.
    cleared: bool,
}

impl<'a> Changes<'a> {
    fn new(write: &'a TableWrite, mirror: &'a MirrorWrite) -> Result<Self> {
        let data = &write.data;
        let rows = data.num_rows();
        if [mirror.ops.len(), mirror.orders.len(), mirror.recorded.len(), mirror.change_us.len(), mirror.sources.len()]
            .iter()
            .any(|n| *n != rows)
            || (!mirror.unavailable.is_empty() && mirror.unavailable.len() != rows)
        {
            return Err(Error::new(ErrorKind::Fatal, "mirror write: change columns do not match the rows"));
        }
        let truncate = mirror.ops.iter().rposition(|op| *op == ChangeOp::Truncate);
        let from = truncate.map_or(0, |t| t + 1);
        let key_indices = key_indices(data, &mirror.keys)?;
        let key_columns: Vec<ArrayRef> = key_indices.iter().map(|i| data.column(*i).clone()).collect();
        let fields = key_columns.iter().map(|c| SortField::new(c.data_type().clone())).collect();
        let converter = RowConverter::new(fields).map_err(arrow_error)?;
        let keyed = converter.convert_columns(&key_columns).map_err(arrow_error)?;
        let mut slot: HashMap<arrow::row::Row<'_>, usize> = HashMap::new();
        let (mut by_key, mut key_of) = (Vec::<Vec<usize>>::new(), vec![None; rows]);
        for (i, op) in mirror.ops.iter().enumerate().skip(from) {
            if *op == ChangeOp::Truncate {
                continue;
            }
            let next = by_key.len();
            let k = *slot.entry(keyed.row(i)).or_insert(next);
            if k == next {
                by_key.push(Vec::new());
            }
            by_key[k].push(i);
            key_of[i] = Some(k);
        }
        let cleared = truncate.is_some() || write.snapshot.as_ref().is_some_and(|s| s.clear);
        Ok(Self { write, mirror, by_key, key_of, cleared })
    }

    fn unavailable(&self, row: usize) -> &[String] {
        self.mirror.unavailable.get(row).map_or(&[], Vec::as_slice)
    }

    /// Where row `row`'s value of `column` comes from, when the row lacks it.
    fn fill(&self, row: usize, column: &str) -> Fill {
        let Some(k) = self.key_of[row] else { return Fill::Null };
        for &earlier in self.by_key[k].iter().rev().filter(|j| **j < row) {
            if self.mirror.ops[earlier] == ChangeOp::Delete {
                return Fill::Null;
            }
            if !self.unavailable(earlier).iter().any(|c| c == column) {
                return Fill::Row(earlier);
            }
        }
        if self.cleared { Fill::Null } else { Fill::Table }
    }

    /// The columns of `rows` (indices), each unavailable value taken from the earlier change
    /// it comes from; and per row, the columns it still lacks (kept from the table).
    fn filled(&self, rows: &[usize]) -> Result<(RecordBatch, Vec<Vec<String>>)> {
        let data = &self.write.data;
        let schema = data.schema();
        let mut sources: Vec<Vec<u32>> = vec![rows.iter().map(|i| *i as u32).collect(); schema.fields().len()];
        let mut lacking = vec![Vec::new(); rows.len()];
        for (n, &row) in rows.iter().enumerate() {
            for column in self.unavailable(row) {
                let Ok(c) = schema.index_of(column) else { continue };
                if self.mirror.keys.contains(column) {
                    continue;
                }
                match self.fill(row, column) {
                    Fill::Row(earlier) => sources[c][n] = earlier as u32,
                    Fill::Table => lacking[n].push(column.clone()),
                    Fill::Null => {}
                }
            }
        }
        let columns = data
            .columns()
            .iter()
            .zip(sources)
            .map(|(column, from)| arrow::compute::take(column, &UInt32Array::from(from), None).map_err(arrow_error))
            .collect::<Result<Vec<_>>>()?;
        let batch = RecordBatch::try_new(schema, columns).map_err(arrow_error)?;
        for l in &mut lacking {
            l.sort();
        }
        Ok((batch, lacking))
    }
}

/// The deliveries of one mirrored table's write: its rows and deletes (rows that lack a column
/// in deliveries of their own, with it in `keep`), then its history's. A table without a key
/// (`whole_row`) is a multiset, for a destination that `multiset` says can apply one.
pub fn plan(stream: &str, write: &TableWrite, mirror: &MirrorWrite, multiset: bool) -> Result<Vec<Delivery>> {
    if mirror.whole_row && multiset {
        let changes = Changes::new(write, mirror)?;
        let mut out = vec![counted(stream, &changes)?];
        if mirror.history {
            out.push(history(stream, &changes)?);
        }
        return Ok(out);
    }
    if mirror.whole_row {
        return Err(Error::new(
            ErrorKind::Fatal,
            format!(
                "table '{}' has no primary key (its rows are matched on every column): a destination mirror \
                 needs key columns; add a primary key at the source or set `keys` on the stream",
                write.table
            ),
        ));
    }
    let changes = Changes::new(write, mirror)?;
    let data = &write.data;
    // The last change of each key, from the unit's last truncate on.
    let mut winners: Vec<usize> = changes.by_key.iter().filter_map(|rows| rows.last().copied()).collect();
    winners.sort_unstable();
    let (gone, kept): (Vec<usize>, Vec<usize>) = winners.into_iter().partition(|i| mirror.ops[*i] == ChangeOp::Delete);
    let (upserts, lacking) = changes.filled(&kept)?;
    // After a truncate, or from the first chunk of a new snapshot copy, the rows are the table.
    let replace = changes.cleared;
    let key_indices = key_indices(data, &mirror.keys)?;
    let keys_only = take(&data.project(&key_indices).map_err(arrow_error)?, &gone)?;
    // Rows grouped by the columns they lack; the whole ones (and the deletes) first.
    let mut groups: BTreeMap<Vec<String>, Vec<usize>> = BTreeMap::new();
    groups.entry(Vec::new()).or_default();
    for (n, lacks) in lacking.into_iter().enumerate() {
        groups.entry(lacks).or_default().push(n);
    }
    let delivery = |mode, rows, deletes, keep| Delivery {
        sync: stream.to_string(),
        run_id: String::new(),
        mode,
        keys: mirror.keys.clone(),
        schema: data.schema(),
        rows: vec![rows],
        deletes,
        table: Some(write.table.clone()),
        copy: None,
        keep,
        multiset: false,
    };
    let mut out = Vec::new();
    for (keep, members) in groups {
        let rows = take(&upserts, &members)?;
        if keep.is_empty() {
            let mode = if replace { SyncMode::Replace } else { SyncMode::Mirror };
            let deletes = if replace { Vec::new() } else { vec![keys_only.clone()] };
            out.push(delivery(mode, rows, deletes, keep));
        } else {
            out.push(delivery(SyncMode::Mirror, rows, Vec::new(), keep));
        }
    }
    if mirror.history {
        out.push(history(stream, &changes)?);
    }
    Ok(out)
}

/// A table without a key as a multiset: per distinct row, the unit's inserts less its deletes.
/// More inserts: that many copies appended; more deletes: that many rows removed (one per entry
/// of `deletes`, matched on every key column). After a truncate, or from a new copy, the
/// copies replace the table.
fn counted(stream: &str, changes: &Changes<'_>) -> Result<Delivery> {
    let (mirror, data) = (changes.mirror, &changes.write.data);
    let (mut added, mut removed) = (Vec::new(), Vec::new());
    for rows in &changes.by_key {
        let net: i64 = rows.iter().map(|i| if mirror.ops[*i] == ChangeOp::Delete { -1 } else { 1 }).sum();
        let last = *rows.last().expect("a key has a change");
        let copies = usize::try_from(net.unsigned_abs()).unwrap_or(usize::MAX);
        if net > 0 {
            added.extend(std::iter::repeat_n(last, copies));
        } else if net < 0 && !changes.cleared {
            removed.extend(std::iter::repeat_n(last, copies));
        }
    }
    let key_indices = key_indices(data, &mirror.keys)?;
    Ok(Delivery {
        sync: stream.to_string(),
        run_id: String::new(),
        mode: if changes.cleared { SyncMode::Replace } else { SyncMode::Mirror },
        keys: mirror.keys.clone(),
        schema: data.schema(),
        rows: vec![take(data, &added)?],
        deletes: vec![take(&data.project(&key_indices).map_err(arrow_error)?, &removed)?],
        table: Some(changes.write.table.clone()),
        copy: None,
        keep: Vec::new(),
        multiset: true,
    })
}

/// Every recorded change, appended to `<table>__changes` with [`HISTORY_COLUMNS`], its
/// unavailable values taken from the key's earlier changes in the unit (NULL where the unit has
/// none).
fn history(stream: &str, changes: &Changes<'_>) -> Result<Delivery> {
    let mirror = changes.mirror;
    let recorded: Vec<usize> = (0..changes.write.data.num_rows()).filter(|i| mirror.recorded[*i]).collect();
    let (base, _) = changes.filled(&recorded)?;
    let mut fields: Vec<Field> = base.schema().fields().iter().map(|f| f.as_ref().clone()).collect();
    let mut columns = base.columns().to_vec();
    let [op, change_time, source_position, sequence] = HISTORY_COLUMNS;
    fields.push(Field::new(op, DataType::Utf8, false));
    columns.push(Arc::new(StringArray::from_iter_values(recorded.iter().map(|i| mirror.ops[*i].name()))));
    fields.push(Field::new(change_time, DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())), true));
    columns.push(Arc::new(
        TimestampMicrosecondArray::from(recorded.iter().map(|i| mirror.change_us[*i]).collect::<Vec<_>>())
            .with_timezone("UTC"),
    ));
    fields.push(Field::new(source_position, DataType::Utf8, true));
    columns.push(Arc::new(StringArray::from(recorded.iter().map(|i| mirror.sources[*i].clone()).collect::<Vec<_>>())));
    fields.push(Field::new(sequence, DataType::Int64, false));
    columns.push(Arc::new(Int64Array::from_iter_values(recorded.iter().map(|i| mirror.orders[*i]))));
    let schema = Arc::new(Schema::new(fields));
    let batch = RecordBatch::try_new(schema.clone(), columns).map_err(arrow_error)?;
    Ok(Delivery {
        sync: stream.to_string(),
        run_id: String::new(),
        mode: SyncMode::Append,
        keys: Vec::new(),
        schema,
        rows: vec![batch],
        deletes: Vec::new(),
        table: Some(format!("{}__changes", changes.write.table)),
        copy: None,
        keep: Vec::new(),
        multiset: false,
    })
}

fn key_indices(data: &RecordBatch, keys: &[String]) -> Result<Vec<usize>> {
    keys.iter()
        .map(|k| {
            data.schema()
                .index_of(k)
                .map_err(|_| Error::new(ErrorKind::Fatal, format!("mirror write: key column '{k}' is missing")))
        })
        .collect()
}

/// The rows of `batch` at `indices`, in that order.
fn take(batch: &RecordBatch, indices: &[usize]) -> Result<RecordBatch> {
    let indices = UInt32Array::from_iter_values(indices.iter().map(|i| *i as u32));
    arrow::compute::take_record_batch(batch, &indices).map_err(arrow_error)
}

fn arrow_error(e: arrow::error::ArrowError) -> Error {
    Error::new(ErrorKind::Fatal, "could not build a mirror delivery").with_source(e)
}

/// Every change of a table's write in source order, with its op (`c`, `u`, `d`, `r`) in
/// [`OP_COLUMN`]: what custom SQL runs over. An append's rows are inserts; a truncate,
/// which has no row, is left out.
pub fn changes(stream: &str, write: &TableWrite) -> Result<Delivery> {
    let data = &write.data;
    let (rows, ops): (Vec<usize>, Vec<&str>) = match &write.mirror {
        None => ((0..data.num_rows()).collect(), vec!["c"; data.num_rows()]),
        Some(m) => (0..data.num_rows())
            .filter(|i| m.ops[*i] != ChangeOp::Truncate)
            .map(|i| {
                let op = match m.ops[i] {
                    ChangeOp::Insert => "c",
                    ChangeOp::Delete => "d",
                    ChangeOp::Snapshot => "r",
                    ChangeOp::Update | ChangeOp::Upsert | ChangeOp::Truncate => "u",
                };
                (i, op)
            })
            .unzip(),
    };
    let base = take(data, &rows)?;
    let mut fields: Vec<Field> = base.schema().fields().iter().map(|f| f.as_ref().clone()).collect();
    let mut columns = base.columns().to_vec();
    fields.push(Field::new(OP_COLUMN, DataType::Utf8, false));
    columns.push(Arc::new(StringArray::from(ops)));
    let batch = RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).map_err(arrow_error)?;
    Ok(Delivery {
        sync: stream.to_string(),
        run_id: String::new(),
        mode: SyncMode::Append,
        keys: write.mirror.as_ref().map(|m| m.keys.clone()).unwrap_or_default(),
        schema: batch.schema(),
        rows: vec![batch],
        deletes: Vec::new(),
        table: Some(write.table.clone()),
        copy: None,
        keep: Vec::new(),
        multiset: false,
    })
}

#[cfg(test)]
mod tests {
    use arrow::array::{Array, AsArray};
    use arrow::datatypes::Int64Type;

    use super::*;

    /// One change: its op, key, body (`None`: NULL) and whether the body is unavailable.
    type Step = (ChangeOp, i64, Option<&'static str>, bool);

    fn write(steps: &[Step], history: bool) -> TableWrite {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("body", DataType::Utf8, true),
        ]));
        let ids = Int64Array::from_iter_values(steps.iter().map(|s| s.1));
        let bodies = StringArray::from(steps.iter().map(|s| s.2).collect::<Vec<_>>());
        let data = RecordBatch::try_new(schema, vec![Arc::new(ids), Arc::new(bodies)]).unwrap();
        let n = steps.len();
        let mirror = MirrorWrite {
            keys: vec!["id".into()],
            history,
            ops: steps.iter().map(|s| s.0).collect(),
            orders: (0..n as i64).map(|i| 10 + i).collect(),
            recorded: steps.iter().map(|s| s.0 != ChangeOp::Truncate).collect(),
            change_us: vec![Some(1); n],
            sources: (0..n).map(|i| Some(format!("{{\"lsn\":{i}}}"))).collect(),
            source_orders: vec![None; n],
            unavailable: steps.iter().map(|s| if s.3 { vec!["body".to_string()] } else { Vec::new() }).collect(),
            ..MirrorWrite::default()
        };
        TableWrite {
            table: "docs".into(),
            changes: Vec::new(),
            brought_by: Vec::new(),
            data,
            mirror: Some(mirror),
            snapshot: None,
        }
    }

    fn plan_of(steps: &[Step], history: bool) -> Vec<Delivery> {
        let w = write(steps, history);
        plan("s", &w, w.mirror.as_ref().unwrap(), false).unwrap()
    }

    /// `id=body` of a delivery's rows (`-` for NULL), in order.
    fn rows(d: &Delivery) -> Vec<String> {
        let b = &d.rows[0];
        let (ids, bodies) = (b.column(0).as_primitive::<Int64Type>(), b.column(1).as_string::<i32>());
        (0..b.num_rows())
            .map(|i| format!("{}={}", ids.value(i), if bodies.is_null(i) { "-" } else { bodies.value(i) }))
            .collect()
    }

    fn deleted(d: &Delivery) -> Vec<i64> {
        d.deletes.iter().flat_map(|b| b.column(0).as_primitive::<Int64Type>().values().to_vec()).collect()
    }

    use ChangeOp::{Delete, Insert, Truncate, Update};

    #[test]
    fn the_last_change_per_key_wins_and_deletes_go() {
        let out = plan_of(
            &[
                (Insert, 1, Some("a"), false),
                (Insert, 2, Some("b"), false),
                (Update, 1, Some("A"), false),
                (Delete, 2, None, false),
                (Insert, 3, Some("c"), false),
            ],
            false,
        );
        assert_eq!(out.len(), 1);
        assert_eq!(
            (out[0].mode, rows(&out[0]), deleted(&out[0])),
            (SyncMode::Mirror, vec!["1=A".into(), "3=c".into()], vec![2])
        );
        assert!(out[0].keep.is_empty());
    }

    #[test]
    fn an_unavailable_value_comes_from_the_keys_earlier_change_else_is_kept_from_the_table() {
        let out = plan_of(
            &[
                // Key 1: set in the unit, then unavailable twice: the unit's value.
                (Insert, 1, Some("one"), false),
                (Update, 1, None, true),
                (Update, 1, None, true),
                // Key 2: unavailable, nothing earlier in the unit: the table's value is kept.
                (Update, 2, None, true),
                // Key 3: a whole row.
                (Update, 3, Some("three"), false),
                // Key 4: deleted, inserted again without the value, then unavailable: NULL.
                (Delete, 4, None, false),
                (Insert, 4, None, false),
                (Update, 4, None, true),
            ],
            false,
        );
        assert_eq!(out.len(), 2, "{out:?}");
        assert_eq!(rows(&out[0]), ["1=one", "3=three", "4=-"]);
        assert!(out[0].keep.is_empty());
        assert_eq!(
            (rows(&out[1]), out[1].keep.clone(), out[1].mode),
            (vec!["2=-".to_string()], vec!["body".to_string()], SyncMode::Mirror)
        );
        assert!(out[1].deletes.is_empty());
    }

    #[test]
    fn after_a_truncate_the_rows_replace_the_table_and_nothing_is_kept() {
        let out = plan_of(
            &[
                (Insert, 1, Some("a"), false),
                (Truncate, 0, None, false),
                (Update, 2, None, true),
                (Insert, 3, Some("c"), false),
            ],
            false,
        );
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!((out[0].mode, rows(&out[0])), (SyncMode::Replace, vec!["2=-".into(), "3=c".into()]));
        assert!(out[0].keep.is_empty() && out[0].deletes.is_empty());
    }

    #[test]
    fn the_first_chunk_of_a_new_copy_keeps_nothing() {
        let mut w = write(&[(Update, 1, None, true), (Insert, 2, Some("b"), false)], false);
        w.snapshot = Some(crate::batch::SnapshotWrite { clear: true, ..Default::default() });
        let out = plan("s", &w, w.mirror.as_ref().unwrap(), false).unwrap();
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!((out[0].mode, rows(&out[0])), (SyncMode::Replace, vec!["1=-".into(), "2=b".into()]));
        assert!(out[0].keep.is_empty());
    }

    #[test]
    fn history_has_every_recorded_change_with_one_shape_and_filled_values() {
        let out = plan_of(&[(Insert, 1, Some("one"), false), (Update, 1, None, true), (Delete, 1, None, false)], true);
        let history = out.last().unwrap();
        assert_eq!(history.table.as_deref(), Some("docs__changes"));
        assert_eq!(history.mode, SyncMode::Append);
        let names: Vec<&str> = history.schema.fields().iter().map(|f| f.name().as_str()).collect();
        assert_eq!(names, ["id", "body", "_op", "_change_time", "_source_position", "_sequence"]);
        assert_eq!(rows(history), ["1=one", "1=one", "1=-"]);
        let b = &history.rows[0];
        assert_eq!(b.column(2).as_string::<i32>().iter().flatten().collect::<Vec<_>>(), ["insert", "update", "delete"]);
        assert_eq!(b.column(4).as_string::<i32>().value(1), r#"{"lsn":1}"#);
        assert_eq!(b.column(5).as_primitive::<Int64Type>().values().to_vec(), [10, 11, 12]);
    }

    #[test]
    fn a_table_without_a_key_is_a_multiset() {
        // Two identical rows, one deleted; a row updated (its old image deleted, the new one
        // inserted); a row inserted and deleted in the unit.
        let mut w = write(
            &[
                (Insert, 1, Some("x"), false),
                (Insert, 1, Some("x"), false),
                (Delete, 1, Some("x"), false),
                (Delete, 2, None, false),
                (Insert, 3, None, false),
                (Insert, 4, Some("y"), false),
                (Delete, 4, Some("y"), false),
                (Delete, 5, Some("z"), false),
                (Delete, 5, Some("z"), false),
            ],
            false,
        );
        let m = w.mirror.as_mut().unwrap();
        m.keys = vec!["id".into(), "body".into()];
        m.whole_row = true;
        let m = w.mirror.clone().unwrap();
        assert!(plan("s", &w, &m, false).is_err(), "a destination that cannot apply a multiset refuses it");
        let out = plan("s", &w, &m, true).unwrap();
        assert_eq!(out.len(), 1);
        assert!(out[0].multiset && out[0].mode == SyncMode::Mirror);
        assert_eq!(rows(&out[0]), ["1=x", "3=-"]);
        assert_eq!(deleted(&out[0]), [2, 5, 5]);
        assert_eq!(out[0].deletes[0].num_columns(), 2, "matched on every key column");
    }
}
