//! Mirrored tables: a write's rows are changes. They are staged, the last change per key wins
//! (in source order), deleted keys and replaced rows go, the rest are inserted, and with
//! history every change is appended to `<table>__changes`. All inside the unit's transaction.
//! A truncate empties the table at its place in the unit; a column Debezium marks unavailable
//! (an unchanged TOASTed value) keeps the value its key has.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, BooleanArray, Int64Array, ListBuilder, StringArray, StringBuilder, TimestampMicrosecondArray,
};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use arrow::record_batch::RecordBatch;
use duckdb::Connection;
use sluice_core::{ChangeOp, Error, ErrorKind, MirrorWrite, Result, TableWrite};

use super::db::{db_error, quote};

use super::mirror_positions::{AppliedPositions, Held, KnownPositions, MOST_KEYS};

/// A unit's changes are staged in the connection's temporary catalog: in memory, and never
/// written to the WAL (the rows they become are). Created by their bare names, which `TEMP`
/// places there.
const STAGE: &str = "temp.main.__sluice_stage";
const LAST: &str = "temp.main.__sluice_last";
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

/// Where the source position of the last truncate applied to `table` is kept.
fn truncated_table(table: &str) -> String {
    format!("truncated__{table}")
}

/// Apply the changes in `write` to its table (and history). Returns the stream sequences of
/// changes skipped as already applied (a replay), whose ledger rows are not written again.
///
/// Truncates apply in stream order relative to the unit's other changes: the table is emptied
/// and only the changes after the unit's last truncate reach it. A truncate is skipped when its
/// source position is at or below the highest position already applied to the table (any key,
/// or an earlier truncate): changes arrive in source order, so that truncate was applied
/// before, and clearing again would remove rows written after it.
pub(crate) fn apply(
    conn: &Connection,
    write: &TableWrite,
    mirror: &MirrorWrite,
    known: &mut KnownPositions,
) -> Result<Vec<i64>> {
    let table = quote(&write.table);
    let rows = write.data.num_rows();
    if [
        mirror.ops.len(),
        mirror.orders.len(),
        mirror.recorded.len(),
        mirror.change_us.len(),
        mirror.sources.len(),
        mirror.source_orders.len(),
        mirror.unavailable.len(),
    ]
    .iter()
    .any(|n| *n != rows)
    {
        return Err(Error::new(ErrorKind::Fatal, "mirror write: change columns do not match the rows"));
    }
    let names: Vec<String> = write.data.schema().fields().iter().map(|f| f.name().clone()).collect();
    let quoted: Vec<String> = names.iter().map(|n| quote(n)).collect();
    let cols = quoted.join(", ");
    let keys: Vec<String> = mirror.keys.iter().map(|k| quote(k)).collect();
    let partition = keys.join(", ");
    let matches: Vec<String> = keys.iter().map(|k| format!("t.{k} IS NOT DISTINCT FROM l.{k}")).collect();
    let delete = ChangeOp::Delete.name();
    let truncate = ChangeOp::Truncate.name();
    let mut sql = String::new();
    let ordered = mirror.source_orders.iter().any(Option::is_some);
    let positions = quote(&positions_table(&write.table));
    let truncated = quote(&truncated_table(&write.table));
    // Whether the unit holds a truncate: most hold none, and skip the statements for them.
    let truncates = mirror.ops.contains(&ChangeOp::Truncate);
    // Whether a statement may drop staged changes (replays, repeats): only then are the
    // skipped ones looked for.
    let mut dropping = false;
    // Per change, whether it is a replay, when memory found them; and how many keys this
    // table may hold in memory beside the other tables'.
    let mut replays: Option<Vec<bool>> = None;
    let room = MOST_KEYS.saturating_sub(known.held_besides(&write.table));
    if ordered {
        // Idempotent by source position: drop truncates at or below the table's highest
        // position, changes at or below the position already applied to their key, and repeats
        // within the batch; then remember the new positions.
        let memo = (write.table.clone(), mirror.keys.clone());
        let checked = known.checked.contains(&memo);
        let have_positions = checked || exists(conn, &positions_table(&write.table))?;
        if truncates {
            let mut high = Vec::new();
            if have_positions {
                high.push(format!("SELECT max(_source_order) FROM sluice.{positions}"));
            }
            if exists(conn, &truncated_table(&write.table))? {
                high.push(format!("SELECT max(_source_order) FROM sluice.{truncated}"));
            }
            if !high.is_empty() {
                dropping = true;
                sql.push_str(&format!(
                    "DELETE FROM {STAGE} WHERE __op = '{truncate}' AND __so IS NOT NULL \
                     AND __so <= (SELECT max(h) FROM ({}) AS m(h));",
                    high.join(" UNION ALL ")
                ));
            }
            sql.push_str(&format!(
                "CREATE TABLE IF NOT EXISTS sluice.{truncated} (_source_order VARCHAR);
                 INSERT INTO sluice.{truncated} SELECT max(__so) FROM {STAGE} \
                 WHERE __op = '{truncate}' HAVING max(__so) IS NOT NULL;"
            ));
        }
        if !keys.is_empty() {
            let key_cols = keys.join(", ");
            let on_stage: Vec<String> = keys.iter().map(|k| format!("p.{k} IS NOT DISTINCT FROM s.{k}")).collect();
            let on_stage = on_stage.join(" AND ");
            if !have_positions {
                conn.execute_batch(&format!(
                    "CREATE TABLE sluice.{positions} AS SELECT {key_cols}, NULL::VARCHAR AS _source_order \
                     FROM main.{table} LIMIT 0;"
                ))
                .map_err(db_error)?;
            }
            // A keyless table's key is its whole row, which grows with ADD COLUMN.
            if !checked {
                add_key_columns(conn, &write.table, &mirror.keys)?;
                known.checked.insert(memo);
            }
            if !known.high.contains_key(&write.table) {
                let high = conn
                    .query_row(&format!("SELECT max(_source_order) FROM sluice.{positions}"), [], |r| r.get(0))
                    .map_err(db_error)?;
                known.high.insert(write.table.clone(), high);
            }
            // Identical snapshot rows of a keyless table share the snapshot's one position:
            // they are counted, never taken for repeats of each other.
            let counted =
                if mirror.whole_row { format!(" AND __op <> '{}'", ChangeOp::Snapshot.name()) } else { String::new() };
            let (low, top, repeats) = span(mirror);
            let high = known.high.get_mut(&write.table).expect("remembered above");
            // Replays are found in memory where the keys allow it; any other statement that
            // drops changes (a truncate, a repeat) leaves the positions to the SQL.
            let applied = known.applied.entry(write.table.clone()).or_insert(Held::Unknown);
            if truncates || repeats || !matches!(applied, Held::Some(p) if p.serves(&write.data, mirror)) {
                *applied = Held::Unknown;
            }
            // A change can be a replay only if its position is at or below the highest one
            // applied to the table: past that, no key's stored position can cover it.
            let maybe_replays = low.is_some_and(|low| high.as_deref().is_some_and(|h| low <= h));
            if maybe_replays && !truncates && !repeats && matches!(applied, Held::Unknown) {
                let loaded = AppliedPositions::load(conn, &positions_table(&write.table), (&write.data, mirror), room)?;
                *applied = loaded.map_or(Held::TooMany, Held::Some);
            }
            if let (true, Held::Some(positions)) = (maybe_replays && !truncates && !repeats, &*applied) {
                replays = Some(positions.replays(&write.data, mirror)?);
            } else if maybe_replays {
                dropping = true;
                sql.push_str(&format!(
                    "DELETE FROM {STAGE} s USING sluice.{positions} p \
                     WHERE {on_stage} AND s.__so IS NOT NULL AND p._source_order >= s.__so AND s.__op <> '{truncate}'{counted};"
                ));
            }
            if repeats {
                dropping = true;
                sql.push_str(&format!(
                    "DELETE FROM {STAGE} WHERE __so IS NOT NULL AND rowid NOT IN \
                     (SELECT min(rowid) FROM {STAGE} GROUP BY {partition}, __so, __rec){counted};"
                ));
            }
            // A change dropped as a replay was at or below its key's position, so the table's
            // highest position after the write is the higher of this and the unit's highest.
            if let Some(top) = top.filter(|t| high.as_deref().is_none_or(|h| *t > h)) {
                *high = Some(top.to_string());
            }
            sql.push_str(&format!(
                "DELETE FROM sluice.{positions} p USING {STAGE} s \
                 WHERE {on_stage} AND s.__so IS NOT NULL AND s.__op <> '{truncate}';
                 INSERT INTO sluice.{positions} ({key_cols}, _source_order) SELECT {key_cols}, max(__so) FROM {STAGE} \
                 WHERE __so IS NOT NULL AND __op <> '{truncate}' GROUP BY {key_cols};"
            ));
        }
    }
    // Replays found in memory leave the write before it is staged.
    let without;
    let (write, mirror, mut skipped) = match replays.filter(|r| r.contains(&true)) {
        Some(replays) => {
            without = super::mirror_positions::without(write, mirror, &replays)?;
            (&without.0, &without.1, without.2.clone())
        }
        None => (write, mirror, Vec::new()),
    };
    // As the positions statement: a unit with keys and no truncate (which leaves them to SQL).
    if let Some(Held::Some(positions)) = known.applied.get_mut(&write.table)
        && ordered
        && !keys.is_empty()
        && !truncates
        && !positions.record(&write.data, mirror, room)?
    {
        known.applied.insert(write.table.clone(), Held::TooMany);
    }
    // Where nothing staged can be dropped, the last change per key is found in memory.
    let last = if dropping { None } else { super::mirror_last::last_per_key(&write.data, mirror) };
    let in_memory = last.is_some();
    stage(conn, write, mirror, &table, &cols, last)?;
    if !sql.is_empty() {
        conn.execute_batch(&std::mem::take(&mut sql)).map_err(db_error)?;
    }
    if dropping {
        let kept: std::collections::HashSet<i64> =
            sequences(conn, &format!("SELECT DISTINCT __ord FROM {STAGE}"))?.into_iter().collect();
        let mut all = mirror.orders.clone();
        all.sort_unstable();
        all.dedup();
        skipped = all.into_iter().filter(|o| !kept.contains(o)).collect();
    }
    // The unit's last truncate: the table is emptied there, and only later changes reach it.
    let last_truncate = match truncates {
        true => sequences(conn, &format!("SELECT max(__ord) FROM {STAGE} WHERE __op = '{truncate}'"))?.pop(),
        false => None,
    };
    if !keys.is_empty() {
        fill_unavailable(conn, write, mirror, last_truncate)?;
    }
    if last_truncate.is_some() {
        sql.push_str(&format!("DELETE FROM main.{table};"));
    }
    if !keys.is_empty() && mirror.whole_row {
        sql.push_str(&counted(&table, &quoted, &keys, last_truncate.unwrap_or(i64::MIN)));
    } else if in_memory {
        // Every staged change reaches the table, so the last per key found in memory stands.
        sql.push_str(&format!(
            "DELETE FROM main.{table} t USING {STAGE} l WHERE l.__last AND {};
             INSERT INTO main.{table} ({cols}) SELECT {cols} FROM {STAGE} WHERE __last AND __op <> '{delete}';",
            matches.join(" AND ")
        ));
    } else if !keys.is_empty() {
        let after = last_truncate.unwrap_or(i64::MIN);
        sql.push_str(&format!(
            "CREATE OR REPLACE TEMP TABLE __sluice_last AS SELECT * FROM {STAGE} WHERE rowid IN \
             (SELECT arg_max(rowid, (coalesce(__so, ''), __ord, __rec)) FROM {STAGE} \
             WHERE __op <> '{truncate}' AND __ord > {after} GROUP BY {partition});
             DELETE FROM main.{table} t USING {LAST} l WHERE {};
             INSERT INTO main.{table} ({cols}) SELECT {cols} FROM {LAST} WHERE __op <> '{delete}';
             DROP TABLE {LAST};",
            matches.join(" AND ")
        ));
    }
    if mirror.history {
        let history = quote(&history_table(&write.table));
        sql.push_str(&format!(
            "INSERT INTO main.{history} ({cols}, _op, _change_time, _source_position, _sequence) \
             SELECT {cols}, __op, __ts, __src, __ord FROM {STAGE} WHERE __rec ORDER BY __ord;"
        ));
    }
    sql.push_str(&format!("DROP TABLE {STAGE};"));
    conn.execute_batch(&sql).map_err(db_error)?;
    Ok(skipped)
}

/// Stage the write's changes in `__sluice_stage`, shaped as `table` (quoted): its columns
/// (`cols`, quoted) and the change columns, with `__keep` only when a change holds Debezium's
/// placeholder and `__last` when the last change per key was found in memory.
fn stage(
    conn: &Connection,
    write: &TableWrite,
    mirror: &MirrorWrite,
    table: &str,
    cols: &str,
    last: Option<BooleanArray>,
) -> Result<()> {
    let keep = mirror.unavailable.iter().any(|u| !u.is_empty());
    let with_last = last.is_some();
    let staged = with_changes(&write.data, mirror, keep, last)?;
    conn.execute_batch(&format!(
        "CREATE OR REPLACE TEMP TABLE __sluice_stage AS SELECT {cols}, NULL::VARCHAR AS __op, NULL::BIGINT AS __ord, \
         NULL::BOOLEAN AS __rec, NULL::TIMESTAMPTZ AS __ts, NULL::VARCHAR AS __src, NULL::VARCHAR AS __so{}{} \
         FROM main.{table} LIMIT 0",
        if keep { ", NULL::VARCHAR[] AS __keep" } else { "" },
        if with_last { ", NULL::BOOLEAN AS __last" } else { "" },
    ))
    .map_err(db_error)?;
    // The staged batch has every column of the stage in its order: the plain appender takes it.
    let mut appender = conn.appender_to_catalog_and_db("__sluice_stage", "temp", "main").map_err(db_error)?;
    appender.append_record_batch(staged).map_err(db_error)?;
    appender.flush().map_err(db_error)
}

/// The apply of a table whose key is its whole row, where identical rows may repeat: each
/// distinct row's changes, in source order, move its count (an insert or a snapshot row adds
/// one, a delete takes one away, never below zero), and the table then loses or gains that
/// many copies. Deleting one of two identical rows leaves the other.
fn counted(table: &str, names: &[String], keys: &[String], after: i64) -> String {
    let delete = ChangeOp::Delete.name();
    let truncate = ChangeOp::Truncate.name();
    let cols = names.join(", ");
    let key_cols = keys.join(", ");
    // Columns outside the image (dropped at the source) take the value of the key's last change.
    let others: Vec<String> =
        names.iter().filter(|n| !keys.contains(n)).map(|c| format!("arg_max({c}, __ord) AS {c}")).collect();
    let others = if others.is_empty() { String::new() } else { format!("{}, ", others.join(", ")) };
    let on = |a: &str, b: &str| -> String {
        keys.iter().map(|c| format!("{a}.{c} IS NOT DISTINCT FROM {b}.{c}")).collect::<Vec<_>>().join(" AND ")
    };
    let (on_table, on_removed) = (on("t", "g"), on("t", "r"));
    // With the count before (c0), the running sums s_k of the changes and their total S, the
    // count after is S - least(-c0, min s_k): the sum, less what the floor at zero absorbed.
    format!(
        "CREATE OR REPLACE TEMP TABLE __sluice_last AS \
         WITH d AS (SELECT {cols}, __ord, sum(CASE WHEN __op = '{delete}' THEN -1 ELSE 1 END) OVER \
             (PARTITION BY {key_cols} ORDER BY coalesce(__so, ''), __ord, rowid ROWS UNBOUNDED PRECEDING) AS __s, \
             CASE WHEN __op = '{delete}' THEN -1 ELSE 1 END AS __d \
             FROM {STAGE} WHERE __op <> '{truncate}' AND __ord > {after}), \
         g AS (SELECT {key_cols}, {others}sum(__d) AS __total, min(__s) AS __low FROM d GROUP BY {key_cols}), \
         c AS (SELECT g.*, (SELECT count(*) FROM main.{table} t WHERE {on_table}) AS __before FROM g) \
         SELECT * EXCLUDE (__total, __low), (__total - least(-__before, __low))::BIGINT AS __after FROM c \
         WHERE __total - least(-__before, __low) <> __before;
         DELETE FROM main.{table} WHERE rowid IN (SELECT __row FROM (SELECT t.rowid AS __row, \
             row_number() OVER (PARTITION BY r.__n ORDER BY t.rowid) AS __i, r.__before - r.__after AS __drop \
             FROM main.{table} t JOIN (SELECT *, row_number() OVER () AS __n FROM {LAST} \
             WHERE __after < __before) r ON {on_removed}) WHERE __i <= __drop);
         INSERT INTO main.{table} ({cols}) SELECT {cols} FROM (SELECT *, unnest(range(__after - __before)) \
             FROM {LAST} WHERE __after > __before);
         DROP TABLE {LAST};"
    )
}

/// The lowest and highest source positions of the unit's row changes (truncates aside), and
/// whether two changes (truncates included) share a position and recording, which a repeated
/// change would.
fn span(mirror: &MirrorWrite) -> (Option<&str>, Option<&str>, bool) {
    let positioned = mirror
        .source_orders
        .iter()
        .zip(&mirror.ops)
        .zip(&mirror.recorded)
        .filter_map(|((so, op), rec)| Some((so.as_deref()?, *op, *rec)));
    let (mut low, mut top) = (None::<&str>, None::<&str>);
    let mut seen = std::collections::HashSet::new();
    let mut repeats = false;
    for (so, op, rec) in positioned {
        // A truncate delivered twice is a repeat too: the statement for repeats drops it.
        repeats |= !seen.insert((so, rec));
        if op != ChangeOp::Truncate {
            low = Some(low.map_or(so, |l| l.min(so)));
            top = Some(top.map_or(so, |t| t.max(so)));
        }
    }
    (low, top, repeats)
}

/// Give the positions table of `table` every key column it lacks, typed as in the table.
fn add_key_columns(conn: &Connection, table: &str, keys: &[String]) -> Result<()> {
    let columns = |schema: &str, name: &str| -> Result<Vec<(String, String)>> {
        let mut stmt = conn
            .prepare("SELECT column_name, data_type FROM duckdb_columns() WHERE schema_name = ? AND table_name = ?")
            .map_err(db_error)?;
        let rows = stmt.query_map([schema, name], |r| Ok((r.get(0)?, r.get(1)?))).map_err(db_error)?;
        rows.collect::<std::result::Result<Vec<_>, _>>().map_err(db_error)
    };
    let have = columns(super::SCHEMA, &positions_table(table))?;
    let types = columns("main", table)?;
    for key in keys.iter().filter(|k| !have.iter().any(|(name, _)| name == *k)) {
        if let Some((_, ty)) = types.iter().find(|(name, _)| name == key) {
            conn.execute_batch(&format!(
                "ALTER TABLE sluice.{} ADD COLUMN {} {ty}",
                quote(&positions_table(table)),
                quote(key)
            ))
            .map_err(db_error)?;
        }
    }
    Ok(())
}

/// Whether `sluice.<name>` exists.
fn exists(conn: &Connection, name: &str) -> Result<bool> {
    let n: i64 = conn
        .query_row(
            "SELECT count(*) FROM duckdb_tables() WHERE schema_name = 'sluice' AND table_name = ?",
            [name],
            |r| r.get(0),
        )
        .map_err(db_error)?;
    Ok(n > 0)
}

/// The non-null integers a query returns.
fn sequences(conn: &Connection, sql: &str) -> Result<Vec<i64>> {
    let mut stmt = conn.prepare(sql).map_err(db_error)?;
    let rows = stmt.query_map([], |r| r.get::<_, Option<i64>>(0)).map_err(db_error)?;
    let mut out = Vec::new();
    for r in rows {
        if let Some(v) = r.map_err(db_error)? {
            out.push(v);
        }
    }
    Ok(out)
}

/// Staged changes whose column holds Debezium's unavailable-value placeholder take the value
/// the key had: from the latest earlier change of the key in this unit that has the column,
/// else from the table (NULL when the key is new, or after the unit's truncate).
fn fill_unavailable(conn: &Connection, write: &TableWrite, mirror: &MirrorWrite, truncate: Option<i64>) -> Result<()> {
    let schema = write.data.schema();
    let mut columns: Vec<&str> = mirror.unavailable.iter().flatten().map(String::as_str).collect();
    columns.sort_unstable();
    columns.dedup();
    columns.retain(|c| schema.field_with_name(c).is_ok() && !mirror.keys.iter().any(|k| k == c));
    if columns.is_empty() {
        return Ok(());
    }
    let table = quote(&write.table);
    let keys: Vec<String> = mirror.keys.iter().map(|k| quote(k)).collect();
    let after = truncate.unwrap_or(i64::MIN);
    let partition = format!("{}, __ord > {after}", keys.join(", "));
    let on_table: Vec<String> = keys.iter().map(|k| format!("t.{k} IS NOT DISTINCT FROM s.{k}")).collect();
    let on_table = on_table.join(" AND ");
    let (mut helpers, mut replaced, mut drop) = (Vec::new(), Vec::new(), Vec::new());
    for (i, c) in columns.iter().enumerate() {
        let col = quote(c);
        let lit = c.replace('\'', "''");
        let missing = format!("list_contains(__keep, '{lit}')");
        helpers.push(format!(
            "sum(CASE WHEN list_contains(s.__keep, '{lit}') THEN 0 ELSE 1 END) \
             OVER (PARTITION BY {partition} ORDER BY s.__ord, s.rowid ROWS UNBOUNDED PRECEDING) AS __g{i}, \
             CASE WHEN s.__ord > {after} AND {} THEN NULL \
             ELSE (SELECT t.{col} FROM main.{table} t WHERE {on_table}) END AS __t{i}",
            truncate.is_some()
        ));
        replaced.push(format!(
            "CASE WHEN NOT {missing} THEN {col} WHEN __g{i} = 0 THEN __t{i} \
             ELSE first_value({col}) OVER (PARTITION BY {partition}, __g{i} ORDER BY __ord, __rid) END AS {col}"
        ));
        drop.push(format!("__g{i}, __t{i}"));
    }
    conn.execute_batch(&format!(
        "CREATE OR REPLACE TEMP TABLE __sluice_stage AS \
         WITH g AS (SELECT s.*, s.rowid AS __rid, {} FROM {STAGE} s) \
         SELECT * EXCLUDE (__rid, {}) REPLACE ({}) FROM g ORDER BY __rid",
        helpers.join(", "),
        drop.join(", "),
        replaced.join(", ")
    ))
    .map_err(db_error)
}

/// The write's batch plus the change columns the staging table has.
fn with_changes(data: &RecordBatch, m: &MirrorWrite, keep: bool, last: Option<BooleanArray>) -> Result<RecordBatch> {
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
    if keep {
        let mut keep = ListBuilder::new(StringBuilder::new());
        for names in &m.unavailable {
            for n in names {
                keep.values().append_value(n);
            }
            keep.append(true);
        }
        let keep = keep.finish();
        fields.push(Field::new("__keep", keep.data_type().clone(), true));
        arrays.push(Arc::new(keep));
    }
    if let Some(last) = last {
        fields.push(Field::new("__last", DataType::Boolean, false));
        arrays.push(Arc::new(last));
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays)
        .map_err(|e| Error::new(ErrorKind::Fatal, "could not stage a mirror write").with_source(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_truncate_delivered_twice_is_a_repeat_and_truncates_bound_no_span() {
        let mirror = MirrorWrite {
            ops: vec![ChangeOp::Truncate, ChangeOp::Insert, ChangeOp::Truncate],
            recorded: vec![true; 3],
            source_orders: vec![Some("5".into()), Some("7".into()), Some("5".into())],
            ..MirrorWrite::default()
        };
        assert_eq!(span(&mirror), (Some("7"), Some("7"), true));
        let once = MirrorWrite { ops: vec![ChangeOp::Truncate, ChangeOp::Insert], ..mirror.clone() };
        let once =
            MirrorWrite { recorded: vec![true; 2], source_orders: vec![Some("5".into()), Some("7".into())], ..once };
        assert_eq!(span(&once), (Some("7"), Some("7"), false));
    }
}
