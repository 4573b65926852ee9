//! A stream's SQL expressions (filter, validation rules, computed columns), evaluated by an
//! in-memory DuckDB over each batch's Arrow columns: the batch's referenced columns are
//! appended to a scratch table and one SELECT computes every expression for every row.
//!
//! Why DuckDB: it is already linked, it is the SQL the workspace speaks, and it evaluates a
//! whole micro-batch column by column (BENCHMARKS.md has the cost per event). The instance has
//! no file or network access and one thread, and expressions may not hold subqueries.

use std::sync::{Arc, Mutex};

use arrow::array::{Array, AsArray};
use arrow::datatypes::Int32Type;
use arrow::record_batch::RecordBatch;
use duckdb::Connection;
use serde_json::Value;
use sluice_core::transform::{Evaluated, Expressions, Transform, TransformConfig, column_type_of};
use sluice_core::{Error, ErrorKind, Result};

use crate::workspace::quote;

/// The transform `config` describes, its expressions checked and ready to run; `None` when it
/// is empty.
pub fn build(config: Option<&TransformConfig>) -> Result<Option<Arc<Transform>>> {
    let Some(config) = config.filter(|c| !c.is_empty()) else { return Ok(None) };
    let expressions = if config.expressions().is_empty() && config.script.is_none() {
        None
    } else {
        Some(Box::new(SqlExpressions::new(config)?) as Box<dyn Expressions>)
    };
    Ok(Some(Arc::new(Transform::new(config, expressions)?)))
}

/// The transform for events replayed from the ledger, which holds them as they were after the
/// field rules: only the expressions and the route.
pub fn build_for_ledger(config: Option<&TransformConfig>) -> Result<Option<Arc<Transform>>> {
    let config = config.map(|c| TransformConfig {
        fields: c.fields.iter().filter(|f| f.sql.is_some()).cloned().collect(),
        script: None,
        ..c.clone()
    });
    build(config.as_ref())
}

/// Check every expression of `config` with DuckDB's parser and binder; the error names the
/// field and, for a syntax error, the character where it is.
pub fn check(config: &TransformConfig) -> Result<()> {
    if config.expressions().is_empty() && config.script.is_none() {
        return Ok(());
    }
    SqlExpressions::new(config).map(drop)
}

/// The expressions of one stream.
pub struct SqlExpressions {
    conn: Mutex<Scratch>,
    computed: Vec<String>,
    filter: Option<String>,
    rules: Vec<String>,
    /// Every column an expression names, as written there.
    referenced: Vec<String>,
    /// The script, and the columns it names.
    script: Option<(String, Vec<String>)>,
}

struct Scratch {
    conn: Connection,
    /// The scratch table's columns as created: name and SQL type.
    columns: Vec<(String, String)>,
    /// The script's input table's columns, and the columns its `event` view adds as NULLs.
    script_columns: (Vec<(String, String)>, Vec<String>),
}

impl std::fmt::Debug for SqlExpressions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlExpressions").field("referenced", &self.referenced).finish_non_exhaustive()
    }
}

fn db_error(e: duckdb::Error) -> Error {
    let message = e.to_string();
    // A value an expression cannot take fails the rows that hold it; anything else (a type
    // that no longer binds) fails the batch's rows as one.
    let kind =
        if ["Conversion Error", "Out of Range Error", "Invalid Input Error"].iter().any(|p| message.starts_with(p)) {
            ErrorKind::Data
        } else if message.starts_with("Out of Memory Error") {
            // The scratch database's memory is full: a later try may fit.
            ErrorKind::Transient
        } else if message.starts_with("INTERNAL Error") || message.starts_with("FATAL Error") {
            ErrorKind::Fatal
        } else {
            ErrorKind::Config
        };
    Error::new(kind, message)
}

impl SqlExpressions {
    /// Open the scratch database and check every expression.
    pub fn new(config: &TransformConfig) -> Result<Self> {
        let conn = Connection::open_in_memory().map_err(db_error)?;
        conn.execute_batch(
            "SET threads = 1; SET memory_limit = '128MB'; SET enable_external_access = false; \
             SET autoload_known_extensions = false; SET lock_configuration = true;",
        )
        .map_err(db_error)?;
        let mut referenced: Vec<String> = Vec::new();
        for (field, sql) in config.expressions() {
            for column in parse(&conn, &field, sql)? {
                if !referenced.iter().any(|r| r.eq_ignore_ascii_case(&column)) {
                    referenced.push(column);
                }
            }
        }
        let script = match &config.script {
            Some(sql) => Some((sql.clone(), script::parse(&conn, sql)?)),
            None => None,
        };
        let this = Self {
            script,
            computed: config.fields.iter().filter_map(|f| f.sql.clone()).collect(),
            filter: config.filter.clone(),
            rules: config.validate.iter().map(|r| r.sql.clone()).collect(),
            referenced,
            conn: Mutex::new(Scratch { conn, columns: Vec::new(), script_columns: Default::default() }),
        };
        // Bind every expression against its columns as NULLs: unknown functions and wrong
        // argument counts are refused now, not on the first batch.
        for (field, sql) in config.expressions() {
            let nulls: Vec<String> = this.referenced.iter().map(|c| format!("NULL AS {}", quote(c))).collect();
            let from = if nulls.is_empty() { String::new() } else { format!(" FROM (SELECT {})", nulls.join(", ")) };
            let scratch = this.conn.lock().map_err(|_| Error::new(ErrorKind::Fatal, "scratch lock poisoned"))?;
            let query = format!("SELECT ({sql}){from}");
            scratch.conn.prepare(&query).map_err(|e| located(&field, &e.to_string(), &query, "SELECT ("))?;
        }
        Ok(this)
    }

    fn query(&self, present: &[String]) -> String {
        let mut select: Vec<String> = Vec::new();
        for (i, sql) in self.computed.iter().enumerate() {
            select.push(format!("({sql}) AS \"c{i}\""));
        }
        if let Some(filter) = &self.filter {
            select.push(format!("CAST(coalesce(({filter}), false) AS BOOLEAN) AS \"__keep\""));
        }
        if !self.rules.is_empty() {
            let arms: Vec<String> =
                self.rules.iter().enumerate().map(|(i, sql)| format!("WHEN ({sql}) IS NOT TRUE THEN {i}")).collect();
            select.push(format!("CAST(CASE {} END AS INTEGER) AS \"__failed\"", arms.join(" ")));
        }
        let mut inner: Vec<String> = vec!["\"__row\"".to_string()];
        for column in &self.referenced {
            match present.iter().find(|p| p.eq_ignore_ascii_case(column)) {
                Some(p) => inner.push(quote(p)),
                // Not in the table yet: NULL, which takes any type.
                None => inner.push(format!("NULL AS {}", quote(column))),
            }
        }
        format!(
            "WITH t AS (SELECT {} FROM scratch) SELECT {} FROM t ORDER BY \"__row\"",
            inner.join(", "),
            select.join(", ")
        )
    }
}

impl Expressions for SqlExpressions {
    fn evaluate(&self, batch: &RecordBatch) -> Result<Evaluated> {
        let schema = batch.schema();
        // The columns the expressions name, and a row number that keeps the order.
        let mut fields = vec![arrow::datatypes::Field::new("__row", arrow::datatypes::DataType::Int64, false)];
        let mut arrays: Vec<Arc<dyn Array>> =
            vec![Arc::new(arrow::array::Int64Array::from_iter_values(0..batch.num_rows() as i64))];
        let mut columns = vec![("__row".to_string(), "BIGINT".to_string())];
        for (i, field) in schema.fields().iter().enumerate() {
            if !self.referenced.iter().any(|r| r.eq_ignore_ascii_case(field.name())) {
                continue;
            }
            let Some(ty) = column_type_of(field.data_type()) else { continue };
            let sql_type = match field.data_type() {
                arrow::datatypes::DataType::Utf8 => "VARCHAR".to_string(),
                _ => ty.sql().into_owned(),
            };
            columns.push((field.name().clone(), sql_type));
            fields.push(field.as_ref().clone());
            arrays.push(batch.column(i).clone());
        }
        let input = RecordBatch::try_new(Arc::new(arrow::datatypes::Schema::new(fields)), arrays)
            .map_err(|e| Error::new(ErrorKind::Fatal, "could not build the expressions' input").with_source(e))?;
        let present: Vec<String> = columns.iter().skip(1).map(|(n, _)| n.clone()).collect();
        let mut scratch = self.conn.lock().map_err(|_| Error::new(ErrorKind::Fatal, "scratch lock poisoned"))?;
        if scratch.columns != columns {
            let defs: Vec<String> = columns.iter().map(|(n, t)| format!("{} {t}", quote(n))).collect();
            scratch
                .conn
                .execute_batch(&format!("CREATE OR REPLACE TABLE scratch ({})", defs.join(", ")))
                .map_err(db_error)?;
            scratch.columns = columns;
        } else {
            scratch.conn.execute_batch("DELETE FROM scratch").map_err(db_error)?;
        }
        {
            let mut appender = scratch.conn.appender("scratch").map_err(db_error)?;
            appender.append_record_batch(input).map_err(db_error)?;
            appender.flush().map_err(db_error)?;
        }
        let sql = self.query(&present);
        let mut stmt = scratch.conn.prepare(&sql).map_err(db_error)?;
        let out = collect(&mut stmt)?;
        let out = match out {
            Some(out) => out,
            None => return Err(Error::new(ErrorKind::Fatal, "the expressions returned nothing")),
        };
        if out.num_rows() != batch.num_rows() {
            return Err(Error::new(ErrorKind::Fatal, "the expressions returned another number of rows"));
        }
        let computed = (0..self.computed.len()).map(|i| out.column(i).clone()).collect();
        let mut next = self.computed.len();
        let odd = || Error::new(ErrorKind::Config, "an expression returned another type than it should");
        let keep = match &self.filter {
            Some(_) => {
                next += 1;
                Some(out.column(next - 1).as_boolean_opt().ok_or_else(odd)?.clone())
            }
            None => None,
        };
        let failed = match self.rules.is_empty() {
            true => None,
            false => Some(out.column(next).as_primitive_opt::<Int32Type>().ok_or_else(odd)?.clone()),
        };
        Ok(Evaluated { computed, keep, failed })
    }

    fn script(&self, batch: &RecordBatch) -> Result<RecordBatch> {
        self.run_script(batch)
    }
}

/// A statement's result as one batch; `None` when it has no columns.
fn collect(stmt: &mut duckdb::Statement<'_>) -> Result<Option<RecordBatch>> {
    let batches: Vec<RecordBatch> = stmt.query_arrow([]).map_err(db_error)?.collect();
    let schema = match batches.first() {
        Some(first) => first.schema(),
        None => match stmt.schema() {
            schema if schema.fields().is_empty() => return Ok(None),
            schema => schema,
        },
    };
    arrow::compute::concat_batches(&schema, &batches)
        .map(Some)
        .map_err(|e| Error::new(ErrorKind::Fatal, "could not join results").with_source(e))
}

/// Parse `SELECT <sql>` and return the columns it names; refuse subqueries and anything but
/// one expression.
fn parse(conn: &Connection, field: &str, sql: &str) -> Result<Vec<String>> {
    const PREFIX: &str = "SELECT ";
    let wrapped = format!("{PREFIX}{sql}");
    let tree: String = conn
        .query_row("SELECT json_serialize_sql(?::VARCHAR)::VARCHAR", [&wrapped], |row| row.get(0))
        .map_err(|e| Error::config(field, e.to_string()))?;
    let tree: Value = serde_json::from_str(&tree).map_err(|e| Error::config(field, e.to_string()))?;
    if tree["error"].as_bool() == Some(true) {
        let message = tree["error_message"].as_str().unwrap_or("syntax error");
        let at = tree["position"]
            .as_str()
            .and_then(|p| p.parse::<usize>().ok())
            .and_then(|p| wrapped.get(..p))
            .map(|before| before.chars().count().saturating_sub(PREFIX.len()));
        let message = first_line(message);
        return Err(match at {
            Some(at) => Error::config(field, format!("{message} (at character {at})")),
            None => Error::config(field, message),
        });
    }
    let statements = tree["statements"].as_array().map_or(0, Vec::len);
    let node = &tree["statements"][0]["node"];
    let list = node["select_list"].as_array().map_or(0, Vec::len);
    if statements != 1 || list != 1 || node["from_table"]["type"].as_str().is_some_and(|t| t != "EMPTY") {
        return Err(Error::config(field, "must be one SQL expression, without FROM or `;`"));
    }
    let mut columns = Vec::new();
    walk(&node["select_list"][0], &mut columns).map_err(|problem| Error::config(field, problem))?;
    Ok(columns)
}

fn walk(node: &Value, columns: &mut Vec<String>) -> std::result::Result<(), String> {
    match node {
        Value::Object(map) => {
            match map.get("class").and_then(Value::as_str) {
                Some("SUBQUERY") => return Err("may not hold a subquery".into()),
                Some("COLUMN_REF") => {
                    if let Some(name) = map.get("column_names").and_then(|n| n.as_array()).and_then(|n| n.last())
                        && let Some(name) = name.as_str()
                    {
                        columns.push(name.to_string());
                    }
                }
                _ => {}
            }
            map.values().try_for_each(|v| walk(v, columns))
        }
        Value::Array(items) => items.iter().try_for_each(|v| walk(v, columns)),
        _ => Ok(()),
    }
}

pub(super) fn first_line(message: &str) -> String {
    message.lines().next().unwrap_or(message).to_string()
}

/// DuckDB's error about `query`, as the error of config field `field`: its first line, and the
/// character of the user's text it points at (`query` is that text after `prefix`, 0-based, as
/// the parser's positions are counted).
pub(super) fn located(field: &str, message: &str, query: &str, prefix: &str) -> Error {
    let first = first_line(message);
    match error_at(message, query).and_then(|at| at.checked_sub(prefix.chars().count())) {
        Some(at) => Error::config(field, format!("{first} (at character {at})")),
        None => Error::config(field, first),
    }
}

/// The character of `query` that a DuckDB error message points at: its `LINE n: …` shows the
/// statement's line (cut to a window with `...` when long) and the next line a caret under it.
pub(super) fn error_at(message: &str, query: &str) -> Option<usize> {
    let mut lines = message.lines();
    let shown = lines.by_ref().find_map(|l| l.strip_prefix("LINE ").and_then(|l| l.split_once(": ")))?;
    let label = "LINE ".len() + shown.0.len() + ": ".len();
    let caret = lines.next()?.chars().position(|c| c == '^')?.checked_sub(label)?;
    let (cut, text) = match shown.1.strip_prefix("...") {
        Some(rest) => (3, rest),
        None => (0, shown.1),
    };
    let text = text.strip_suffix("...").unwrap_or(text);
    let start = query.find(text)?;
    Some(query[..start].chars().count() + caret.checked_sub(cut)?)
}

mod script;
#[cfg(test)]
mod tests;
