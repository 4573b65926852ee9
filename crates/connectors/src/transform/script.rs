//! `transform.script`: a DuckDB SELECT over each batch's events, as the view `event`.

use std::sync::Arc;

use arrow::record_batch::RecordBatch;
use duckdb::Connection;
use serde_json::Value;
use sluice_core::transform::column_type_of;
use sluice_core::{Error, ErrorKind, Result};

use super::{SqlExpressions, collect, db_error, first_line, located};
use crate::workspace::quote;

const FIELD: &str = "transform.script";

/// Check the script is one SELECT that calls no table function; the columns it names.
pub(super) fn parse(conn: &Connection, sql: &str) -> Result<Vec<String>> {
    let tree: String = conn
        .query_row("SELECT json_serialize_sql(?::VARCHAR)::VARCHAR", [sql], |row| row.get(0))
        .map_err(|e| Error::config(FIELD, e.to_string()))?;
    let tree: Value = serde_json::from_str(&tree).map_err(|e| Error::config(FIELD, e.to_string()))?;
    if tree["error"].as_bool() == Some(true) {
        let message = first_line(tree["error_message"].as_str().unwrap_or("syntax error"));
        let at = tree["position"].as_str().and_then(|p| p.parse::<usize>().ok()).and_then(|p| sql.get(..p));
        return Err(match at {
            Some(before) => Error::config(FIELD, format!("{message} (at character {})", before.chars().count())),
            None => Error::config(FIELD, message),
        });
    }
    if tree["statements"].as_array().map_or(0, Vec::len) != 1 {
        return Err(Error::config(FIELD, "must be one SELECT"));
    }
    let mut columns = Vec::new();
    walk(&tree["statements"][0]["node"], &mut columns).map_err(|e| Error::config(FIELD, e))?;
    // Bind it over its columns as NULLs: an unknown function is refused now, not on a batch.
    let nulls: Vec<String> = columns.iter().map(|c| format!("NULL AS {}", quote(c))).collect();
    let view =
        if nulls.is_empty() { "SELECT 1 AS \"__none\"".to_string() } else { format!("SELECT {}", nulls.join(", ")) };
    conn.execute_batch(&format!("CREATE OR REPLACE VIEW event AS {view}")).map_err(db_error)?;
    let bound = conn.prepare(sql).map(drop).map_err(|e| located(FIELD, &e.to_string(), sql, ""));
    conn.execute_batch("DROP VIEW event").map_err(db_error)?;
    bound?;
    Ok(columns)
}

fn walk(node: &Value, columns: &mut Vec<String>) -> std::result::Result<(), String> {
    match node {
        Value::Object(map) => {
            if map.get("type").and_then(Value::as_str) == Some("TABLE_FUNCTION") {
                return Err("may read only `event`, not a table function".into());
            }
            if map.get("class").and_then(Value::as_str) == Some("COLUMN_REF")
                && let Some(name) = map.get("column_names").and_then(|n| n.as_array()).and_then(|n| n.last())
                && let Some(name) = name.as_str()
                && !columns.iter().any(|c: &String| c.eq_ignore_ascii_case(name))
            {
                columns.push(name.to_string());
            }
            // `* EXCLUDE (a)` and `* REPLACE (… AS a)` name columns too.
            let excluded =
                map.get("exclude_list").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str);
            let replaced = map
                .get("replace_list")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|r| r["key"].as_str());
            for name in excluded.chain(replaced) {
                if !columns.iter().any(|c| c.eq_ignore_ascii_case(name)) {
                    columns.push(name.to_string());
                }
            }
            map.values().try_for_each(|v| walk(v, columns))
        }
        Value::Array(items) => items.iter().try_for_each(|v| walk(v, columns)),
        _ => Ok(()),
    }
}

impl SqlExpressions {
    /// Load `batch` as the view `event` and run the script over it.
    pub(super) fn run_script(&self, batch: &RecordBatch) -> Result<RecordBatch> {
        let Some((sql, named)) = &self.script else {
            return Err(Error::new(ErrorKind::Config, "this stream has no script"));
        };
        let schema = batch.schema();
        let mut keep = Vec::new();
        let mut columns = Vec::new();
        for (i, field) in schema.fields().iter().enumerate() {
            let Some(ty) = column_type_of(field.data_type()) else { continue };
            let sql_type = if field.data_type() == &arrow::datatypes::DataType::Utf8 {
                "VARCHAR".into()
            } else {
                ty.sql().into_owned()
            };
            columns.push((field.name().clone(), sql_type));
            keep.push(i);
        }
        let input = batch
            .project(&keep)
            .map_err(|e| Error::new(ErrorKind::Fatal, "could not project a batch").with_source(e))?;
        // Columns the script names that no event has had yet read as NULL.
        let missing: Vec<String> =
            named.iter().filter(|n| !columns.iter().any(|(c, _)| c.eq_ignore_ascii_case(n))).cloned().collect();
        let mut scratch = self.conn.lock().map_err(|_| Error::new(ErrorKind::Fatal, "scratch lock poisoned"))?;
        if scratch.script_columns.0 != columns || scratch.script_columns.1 != missing {
            let defs: Vec<String> = columns.iter().map(|(n, t)| format!("{} {t}", quote(n))).collect();
            let nulls: String = missing.iter().map(|m| format!(", NULL AS {}", quote(m))).collect();
            scratch
                .conn
                .execute_batch(&format!(
                    "DROP VIEW IF EXISTS event; CREATE OR REPLACE TABLE script_input ({}); \
                     CREATE VIEW event AS SELECT *{nulls} FROM script_input",
                    defs.join(", ")
                ))
                .map_err(db_error)?;
            scratch.script_columns = (columns, missing);
        } else {
            scratch.conn.execute_batch("DELETE FROM script_input").map_err(db_error)?;
        }
        {
            let mut appender = scratch.conn.appender("script_input").map_err(db_error)?;
            appender.append_record_batch(input).map_err(db_error)?;
            appender.flush().map_err(db_error)?;
        }
        let mut stmt = scratch.conn.prepare(sql).map_err(db_error)?;
        let out = collect(&mut stmt)?;
        Ok(out.unwrap_or_else(|| RecordBatch::new_empty(Arc::new(arrow::datatypes::Schema::empty()))))
    }
}
