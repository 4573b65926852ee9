//! How one delivery lands in a lake table inside the open transaction: the table created or
//! given the columns it lacks, the rows staged in a temporary table, then appended, replaced,
//! merged by key (deletes too), or applied as a multiset (a table without a key).

use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use arrow::record_batch::RecordBatch;
use duckdb::Connection;
use sluice_core::{Delivery, Error, ErrorKind, Result, SyncMode};

use super::Lakehouse;
use super::target::{arrow_error, lake_error};
use crate::workspace::quote;

/// DuckDB's integer types, as `duckdb_columns()` names them.
const INTEGERS: [&str; 4] = ["TINYINT", "SMALLINT", "INTEGER", "BIGINT"];

/// The delivery's table created, or given the columns it lacks and wider types.
pub(super) fn shape(conn: &Connection, config: &impl Lakehouse, delivery: &Delivery) -> Result<()> {
    let name = delivery.table.as_deref().unwrap_or(config.table());
    let table = format!("lake.{}.{}", quote(config.schema()), quote(name));
    let existing = existing_columns(conn, config.schema(), name)?;
    if existing.is_empty() {
        if config.schema() != "main" {
            conn.execute_batch(&format!("CREATE SCHEMA IF NOT EXISTS lake.{}", quote(config.schema())))
                .map_err(lake_error)?;
        }
        conn.execute_batch(&format!("CREATE TABLE {table} ({})", column_list(&delivery.schema)?))
            .map_err(lake_error)?;
    } else {
        for field in delivery.schema.fields() {
            // DuckDB matches names without regard to case: `Name` is the column `name`.
            let sql = match existing.iter().find(|(c, _)| c.eq_ignore_ascii_case(field.name())) {
                None => {
                    format!("ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {} {}", quote(field.name()), sql_type(field)?)
                }
                // Integers that now get fractions (the decoder widened the column): DuckLake
                // promotes the column's type in place, as the workspace does.
                Some((_, ty))
                    if config.widens_integers()
                        && INTEGERS.contains(&ty.as_str())
                        && field.data_type() == &DataType::Float64 =>
                {
                    format!("ALTER TABLE {table} ALTER COLUMN {} TYPE DOUBLE", quote(field.name()))
                }
                Some(_) => continue,
            };
            conn.execute_batch(&sql).map_err(lake_error)?;
        }
    }
    Ok(())
}

/// One delivery inside the open transaction: the rows appended, replaced, or merged by key
/// (deletes too). The table's name.
pub(super) fn apply(conn: &Connection, config: &impl Lakehouse, delivery: &Delivery) -> Result<String> {
    let name = delivery.table.as_deref().unwrap_or(config.table());
    let table = format!("lake.{}.{}", quote(config.schema()), quote(name));
    let columns: Vec<String> = delivery.schema.fields().iter().map(|f| quote(f.name())).collect();
    let list = columns.join(", ");
    stage(conn, "sluice_stage", &delivery.schema, &delivery.rows)?;
    if !config.widens_integers() {
        refuse_fractions(conn, config, name, delivery)?;
    }
    let keys: Vec<String> = delivery.keys.iter().map(|k| quote(k)).collect();
    let matching =
        keys.iter().map(|k| format!("s.{k} IS NOT DISTINCT FROM {table}.{k}")).collect::<Vec<_>>().join(" AND ");
    let sql = match delivery.mode {
        SyncMode::Append => format!("INSERT INTO {table} ({list}) SELECT {list} FROM temp.main.sluice_stage"),
        SyncMode::Replace => {
            format!("DELETE FROM {table}; INSERT INTO {table} ({list}) SELECT {list} FROM temp.main.sluice_stage")
        }
        SyncMode::Upsert | SyncMode::Mirror if delivery.multiset => {
            let mut sql = String::new();
            if delivery.delete_count() > 0 {
                stage_deletes(conn, delivery)?;
                // Each delete removes one matching row: the matching rows are set aside,
                // numbered per distinct row, all removed, and those beyond the count put back.
                let all: Vec<String> =
                    existing_columns(conn, config.schema(), name)?.into_iter().map(|(c, _)| quote(&c)).collect();
                // Names no column of the table has.
                let fresh = |base: &str| {
                    let mut name = base.to_string();
                    while all.iter().any(|c| c.trim_matches('"').eq_ignore_ascii_case(&name)) {
                        name.push('_');
                    }
                    quote(&name)
                };
                let (n, rn) = (fresh("sluice_n"), fresh("sluice_rn"));
                let same = |l: &str, r: &str| {
                    keys.iter()
                        .map(|k| format!("{l}.{k} IS NOT DISTINCT FROM {r}.{k}"))
                        .collect::<Vec<_>>()
                        .join(" AND ")
                };
                let picked: Vec<String> = all.iter().map(|c| format!("sluice_t.{c}")).collect();
                let partition: Vec<String> = keys.iter().map(|k| format!("sluice_t.{k}")).collect();
                sql.push_str(&format!(
                    "CREATE OR REPLACE TEMP TABLE sluice_counts AS SELECT {k}, count(*) AS {n} \
                     FROM temp.main.sluice_gone GROUP BY {k}; \
                     CREATE OR REPLACE TEMP TABLE sluice_matched AS SELECT {picked}, row_number() OVER \
                     (PARTITION BY {partition}) AS {rn} FROM {table} sluice_t \
                     WHERE EXISTS (SELECT 1 FROM temp.main.sluice_counts sluice_g WHERE {tg}); \
                     DELETE FROM {table} WHERE EXISTS \
                     (SELECT 1 FROM temp.main.sluice_counts sluice_g WHERE {table_g}); \
                     INSERT INTO {table} ({all}) SELECT {all} FROM temp.main.sluice_matched sluice_m \
                     WHERE sluice_m.{rn} > (SELECT sluice_g.{n} FROM temp.main.sluice_counts sluice_g WHERE {mg}); ",
                    k = keys.join(", "),
                    picked = picked.join(", "),
                    partition = partition.join(", "),
                    tg = same("sluice_t", "sluice_g"),
                    table_g = same(&table, "sluice_g"),
                    all = all.join(", "),
                    mg = same("sluice_m", "sluice_g"),
                ));
            }
            if delivery.row_count() > 0 {
                sql.push_str(&format!("INSERT INTO {table} ({list}) SELECT {list} FROM temp.main.sluice_stage"));
            }
            sql
        }
        SyncMode::Upsert | SyncMode::Mirror => {
            let mut sql = String::new();
            if delivery.delete_count() > 0 {
                stage_deletes(conn, delivery)?;
                sql.push_str(&format!(
                    "DELETE FROM {table} WHERE EXISTS (SELECT 1 FROM temp.main.sluice_gone s WHERE {}); ",
                    matching
                ));
            }
            if delivery.row_count() > 0 {
                // Columns the rows lack keep the values their keys have in the table.
                if !delivery.keep.is_empty() {
                    let sets: Vec<String> = delivery.keep.iter().map(|c| format!("{0} = t.{0}", quote(c))).collect();
                    let on: Vec<String> = keys.iter().map(|k| format!("s.{k} IS NOT DISTINCT FROM t.{k}")).collect();
                    sql.push_str(&format!(
                        "UPDATE temp.main.sluice_stage AS s SET {} FROM {table} AS t WHERE {}; ",
                        sets.join(", "),
                        on.join(" AND ")
                    ));
                }
                sql.push_str(&format!(
                    "DELETE FROM {table} WHERE EXISTS (SELECT 1 FROM temp.main.sluice_stage s WHERE {}); \
                     INSERT INTO {table} ({list}) SELECT {list} FROM temp.main.sluice_stage",
                    matching
                ));
            }
            sql
        }
    };
    if !sql.is_empty() {
        conn.execute_batch(&sql).map_err(lake_error)?;
    }
    Ok(name.to_string())
}

/// Doubles bound for an integer column the format cannot widen (Iceberg): whole values go in as
/// integers; a value with a fraction is refused as data, so the quarantine sends its row to the
/// ledger and the rest is written (the stream does not stop on it).
fn refuse_fractions(conn: &Connection, config: &impl Lakehouse, name: &str, delivery: &Delivery) -> Result<()> {
    let existing = existing_columns(conn, config.schema(), name)?;
    for field in delivery.schema.fields().iter().filter(|f| f.data_type() == &DataType::Float64) {
        let integer =
            existing.iter().any(|(c, ty)| c.eq_ignore_ascii_case(field.name()) && INTEGERS.contains(&ty.as_str()));
        if !integer {
            continue;
        }
        let column = quote(field.name());
        let sql = format!(
            "SELECT count(*) FROM temp.main.sluice_stage WHERE {column} IS NOT NULL AND {column} <> trunc({column})"
        );
        let fractions: i64 = conn.query_row(&sql, [], |row| row.get(0)).map_err(lake_error)?;
        if fractions > 0 {
            return Err(Error::new(
                ErrorKind::Data,
                format!(
                    "{}: column '{}' of table '{name}' holds integers, and {} cannot widen it to double: \
                     a value with a fraction does not fit",
                    config.label(),
                    field.name(),
                    config.label()
                ),
            ));
        }
    }
    Ok(())
}

/// The key columns of the delivery's deletes in the temporary table `sluice_gone`.
fn stage_deletes(conn: &Connection, delivery: &Delivery) -> Result<()> {
    let key_fields: Vec<Field> = delivery
        .keys
        .iter()
        .map(|k| delivery.schema.field_with_name(k).cloned().map_err(|e| arrow_error(&e)))
        .collect::<Result<_>>()?;
    stage(conn, "sluice_gone", &Arc::new(Schema::new(key_fields)), &delivery.deletes)
}

/// `rows` in a new temporary table `name` of `schema`'s columns.
fn stage(conn: &Connection, name: &str, schema: &Arc<Schema>, rows: &[RecordBatch]) -> Result<()> {
    conn.execute_batch(&format!(
        "DROP TABLE IF EXISTS temp.main.{name}; CREATE TEMP TABLE {name} ({})",
        column_list(schema)?
    ))
    .map_err(lake_error)?;
    let mut appender = conn.appender_to_catalog_and_db(name, "temp", "main").map_err(lake_error)?;
    for batch in rows.iter().filter(|b| b.num_rows() > 0) {
        appender.append_record_batch(batch.clone()).map_err(lake_error)?;
    }
    appender.flush().map_err(lake_error)
}

/// The columns of `schema.table` in the lake with their types (names matched without regard to
/// case, as DuckDB does); empty when it does not exist.
pub(crate) fn existing_columns(conn: &Connection, schema: &str, table: &str) -> Result<Vec<(String, String)>> {
    let mut statement = conn
        .prepare(
            "SELECT column_name, data_type FROM duckdb_columns() WHERE database_name = 'lake' \
             AND lower(schema_name) = lower(?) AND lower(table_name) = lower(?) ORDER BY column_index",
        )
        .map_err(lake_error)?;
    let rows = statement
        .query_map([schema, table], |row| Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?)))
        .map_err(lake_error)?;
    rows.collect::<std::result::Result<_, _>>().map_err(lake_error)
}

fn column_list(schema: &Schema) -> Result<String> {
    let columns: Vec<String> =
        schema.fields().iter().map(|f| Ok(format!("{} {}", quote(f.name()), sql_type(f)?))).collect::<Result<_>>()?;
    Ok(columns.join(", "))
}

/// The DuckDB type of an Arrow column.
fn sql_type(field: &Field) -> Result<String> {
    Ok(match field.data_type() {
        DataType::Boolean => "BOOLEAN".into(),
        DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64 => "BIGINT".into(),
        DataType::UInt8 | DataType::UInt16 | DataType::UInt32 => "BIGINT".into(),
        DataType::UInt64 => "UBIGINT".into(),
        DataType::Float16 | DataType::Float32 | DataType::Float64 => "DOUBLE".into(),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => "VARCHAR".into(),
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView => "BLOB".into(),
        DataType::Date32 | DataType::Date64 => "DATE".into(),
        DataType::Time64(_) | DataType::Time32(_) => "TIME".into(),
        DataType::Timestamp(_, Some(_)) => "TIMESTAMPTZ".into(),
        DataType::Timestamp(TimeUnit::Nanosecond, None) => "TIMESTAMP_NS".into(),
        DataType::Timestamp(_, None) => "TIMESTAMP".into(),
        DataType::Decimal128(p, s) => format!("DECIMAL({p},{s})"),
        DataType::List(item) | DataType::LargeList(item) => format!("{}[]", sql_type(item)?),
        other => {
            return Err(Error::new(
                ErrorKind::Fatal,
                format!("lake: column '{}' has a type the destination does not take ({other})", field.name()),
            ));
        }
    })
}
