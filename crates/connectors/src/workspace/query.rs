//! Read-only SQL on the workspace: one SELECT or WITH statement, checked by DuckDB's own parser,
//! then run inside a transaction that is always rolled back.

use arrow::record_batch::RecordBatch;
use duckdb::Connection;
use serde::Serialize;
use sluice_core::{Error, ErrorKind, Result};

use super::db_error;

/// Rows as JSON objects, with the column names and SQL types.
#[derive(Debug, Clone, Serialize)]
pub struct QueryResult {
    /// Column names and types, in order.
    pub columns: Vec<(String, String)>,
    /// One JSON object per row.
    pub rows: Vec<serde_json::Map<String, serde_json::Value>>,
    /// Whether more rows existed than the limit allowed.
    pub truncated: bool,
}

/// Refuse anything but exactly one SELECT (or WITH … SELECT) statement. DuckDB parses the text;
/// its serializer only accepts SELECT statements, so a DDL or DML statement, several
/// statements, or a PRAGMA are all refused with a reason.
pub fn check_read_only(conn: &Connection, sql: &str) -> Result<()> {
    let parsed: String =
        conn.query_row("SELECT json_serialize_sql(?::VARCHAR)::VARCHAR", [sql], |r| r.get(0)).map_err(db_error)?;
    let parsed: serde_json::Value = serde_json::from_str(&parsed)
        .map_err(|e| Error::new(ErrorKind::Fatal, "unreadable parse result").with_source(e))?;
    if parsed["error"].as_bool() == Some(true) {
        let message = parsed["error_message"].as_str().unwrap_or("not a SELECT statement");
        let message = if message.contains("Only SELECT") {
            "only a single SELECT or WITH statement is allowed (read-only)".to_string()
        } else {
            message.to_string()
        };
        return Err(Error::new(ErrorKind::Data, message));
    }
    match parsed["statements"].as_array().map(Vec::len) {
        Some(1) => Ok(()),
        Some(0) | None => Err(Error::new(ErrorKind::Data, "no statement given")),
        Some(_) => Err(Error::new(ErrorKind::Data, "only one statement is allowed")),
    }
}

/// Run a checked read-only query and return at most `limit` rows.
pub fn run_query(conn: &Connection, sql: &str, limit: usize) -> Result<QueryResult> {
    check_read_only(conn, sql)?;
    conn.execute_batch("BEGIN TRANSACTION").map_err(db_error)?;
    let result = collect(conn, sql, limit);
    let _ = conn.execute_batch("ROLLBACK");
    result
}

fn collect(conn: &Connection, sql: &str, limit: usize) -> Result<QueryResult> {
    let mut stmt = conn.prepare(sql).map_err(query_error)?;
    let arrow = stmt.query_arrow([]).map_err(query_error)?;
    let schema = arrow.get_schema();
    let columns = schema.fields().iter().map(|f| (f.name().clone(), sql_type(f.data_type()))).collect();
    let mut batches: Vec<RecordBatch> = Vec::new();
    let mut seen = 0usize;
    let mut truncated = false;
    for batch in arrow {
        if seen >= limit {
            truncated = true;
            break;
        }
        let take = batch.num_rows().min(limit - seen);
        truncated |= take < batch.num_rows();
        seen += take;
        batches.push(batch.slice(0, take));
    }
    let mut writer = arrow::json::ArrayWriter::new(Vec::new());
    let refs: Vec<&RecordBatch> = batches.iter().collect();
    writer
        .write_batches(&refs)
        .map_err(|e| Error::new(ErrorKind::Data, "cannot render the result as JSON").with_source(e))?;
    writer.finish().map_err(|e| Error::new(ErrorKind::Data, "cannot render the result as JSON").with_source(e))?;
    let bytes = writer.into_inner();
    let rows = if bytes.is_empty() {
        Vec::new()
    } else {
        serde_json::from_slice(&bytes).map_err(|e| Error::new(ErrorKind::Fatal, "bad JSON rows").with_source(e))?
    };
    Ok(QueryResult { columns, rows, truncated })
}

/// The SQL name of an Arrow type, for result headers.
fn sql_type(ty: &arrow::datatypes::DataType) -> String {
    use arrow::datatypes::DataType as T;
    match ty {
        T::Boolean => "BOOLEAN".into(),
        T::Int8 => "TINYINT".into(),
        T::Int16 => "SMALLINT".into(),
        T::Int32 => "INTEGER".into(),
        T::Int64 => "BIGINT".into(),
        T::UInt8 => "UTINYINT".into(),
        T::UInt16 => "USMALLINT".into(),
        T::UInt32 => "UINTEGER".into(),
        T::UInt64 => "UBIGINT".into(),
        T::Float32 => "FLOAT".into(),
        T::Float64 => "DOUBLE".into(),
        T::Utf8 | T::LargeUtf8 | T::Utf8View => "VARCHAR".into(),
        T::Date32 | T::Date64 => "DATE".into(),
        T::Timestamp(_, Some(_)) => "TIMESTAMPTZ".into(),
        T::Timestamp(_, None) => "TIMESTAMP".into(),
        T::Decimal128(p, s) => format!("DECIMAL({p},{s})"),
        other => other.to_string(),
    }
}

fn query_error(e: duckdb::Error) -> Error {
    Error::new(ErrorKind::Data, "query failed").with_source(e)
}

impl super::Workspace {
    /// Run one read-only statement on its own connection.
    pub async fn query(&self, sql: String, limit: usize) -> Result<QueryResult> {
        self.with_connection(move |c| run_query(c, &sql, limit)).await
    }
}

/// Run a read-only query on a connection the caller opened (the CLI without a server).
pub fn query_connection(conn: &Connection, sql: &str, limit: usize) -> Result<QueryResult> {
    run_query(conn, sql, limit)
}
