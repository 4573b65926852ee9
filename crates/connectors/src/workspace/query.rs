//! Read-only SQL on the workspace: one SELECT or WITH statement, checked by DuckDB's own parser
//! (and, for users, against the internal tables: see `access`), then run inside a transaction
//! that is always rolled back. Rows are streamed from DuckDB and rendered to JSON as they come,
//! so a result never sits in memory whole: past the byte limit the query stops.

use std::future::Future;
use std::io::Write;
use std::path::Path;
use std::time::Duration;

use arrow::json::writer::{JsonArray, Writer, WriterBuilder};
use arrow::record_batch::RecordBatch;
use duckdb::Connection;
use serde_json::{Map, Value};
use sluice_core::{Error, ErrorKind, Result};

use super::access;
use super::control::{self, Stop};
use super::db::Db;

/// Read-only SQL on the workspace for users and syncs. Cheap to clone.
#[derive(Clone)]
pub struct Query {
    db: Db,
}

/// A query's answer, rendered once: `{"columns": [[name, type], …], "rows": [{…}, …],
/// "truncated": bool}`, NULL columns included as `null`. The rows are written into this text as
/// DuckDB hands them over, never held as values.
#[derive(Debug, Clone)]
pub struct QueryResult {
    /// Column names and types, in order.
    pub columns: Vec<(String, String)>,
    /// The whole answer as JSON.
    pub json: String,
    /// How many rows it holds.
    pub row_count: usize,
    /// Whether more rows existed than the row limit allowed.
    pub truncated: bool,
}

impl QueryResult {
    /// The rows parsed into objects.
    pub fn rows(&self) -> Result<Vec<Map<String, Value>>> {
        #[derive(serde::Deserialize)]
        struct Body {
            rows: Vec<Map<String, Value>>,
        }
        let body: Body = serde_json::from_str(&self.json)
            .map_err(|e| Error::new(ErrorKind::Fatal, "bad JSON rows").with_source(e))?;
        Ok(body.rows)
    }
}

/// Who asks: a user (the API) may not read the internal tables; the operator's offline CLI,
/// which opens the database file itself, may.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// `/api/sql` and sync queries.
    User,
    /// `sluice sql` without a server.
    Full,
}

/// How much one query may return.
#[derive(Debug, Clone, Copy)]
pub struct QueryLimits {
    /// Most rows; more set `truncated`.
    pub rows: usize,
    /// Most bytes of rendered JSON rows; more is an error.
    pub max_bytes: usize,
}

/// Why a query failed; each maps to its own HTTP status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueryErrorKind {
    /// Not one read-only statement, or DuckDB refused it (bind error, bad cast…).
    Invalid,
    /// It names an internal table or a forbidden function.
    Forbidden,
    /// The rendered rows passed the byte limit.
    TooLarge,
    /// It ran past its time limit.
    Timeout,
    /// DuckDB's memory limit was reached.
    OutOfMemory,
    /// Stopped because the server is shutting down (or the caller left).
    Stopped,
    /// The disk of the data folder is full, and the workspace is being reopened.
    Unavailable,
    /// Anything else.
    Failed,
}

/// A failed query: a kind and a message without the workspace's path.
#[derive(Debug, Clone)]
pub struct QueryError {
    /// What went wrong.
    pub kind: QueryErrorKind,
    /// For the person who asked.
    pub message: String,
}

impl QueryError {
    fn new(kind: QueryErrorKind, message: impl Into<String>) -> Self {
        Self { kind, message: message.into() }
    }
}

impl std::fmt::Display for QueryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for QueryError {}

/// Refuse anything but exactly one SELECT (or WITH … SELECT) statement that a user may run:
/// no internal table but the ledger and run records (see `access`). For sync queries.
pub(crate) fn check_read_only(conn: &Connection, sql: &str) -> Result<()> {
    check(conn, sql, Access::User).map_err(|e| Error::new(ErrorKind::Data, e.message))
}

/// DuckDB parses the text; its serializer only accepts SELECT statements, so a DDL or DML
/// statement, several statements, or a PRAGMA are all refused with a reason.
fn check(conn: &Connection, sql: &str, access: Access) -> std::result::Result<(), QueryError> {
    let parsed: String = conn
        .query_row("SELECT json_serialize_sql(?::VARCHAR)::VARCHAR", [sql], |r| r.get(0))
        .map_err(|e| QueryError::new(QueryErrorKind::Failed, format!("cannot parse the query: {e}")))?;
    let parsed: Value = serde_json::from_str(&parsed)
        .map_err(|_| QueryError::new(QueryErrorKind::Invalid, "the query is too deeply nested to check"))?;
    if parsed["error"].as_bool() == Some(true) {
        let message = parsed["error_message"].as_str().unwrap_or("not a SELECT statement");
        let message = if message.contains("Only SELECT") {
            "only a single SELECT or WITH statement is allowed (read-only)".to_string()
        } else {
            message.to_string()
        };
        return Err(QueryError::new(QueryErrorKind::Invalid, message));
    }
    match parsed["statements"].as_array().map(Vec::len) {
        Some(1) => {}
        Some(0) | None => return Err(QueryError::new(QueryErrorKind::Invalid, "no statement given")),
        Some(_) => return Err(QueryError::new(QueryErrorKind::Invalid, "only one statement is allowed")),
    }
    if access == Access::User
        && let Some(why) = access::refusal(&parsed)
    {
        return Err(QueryError::new(QueryErrorKind::Forbidden, why));
    }
    Ok(())
}

/// Run a checked read-only query within `limits`.
fn run_query(
    conn: &Connection,
    sql: &str,
    limits: QueryLimits,
    access: Access,
) -> std::result::Result<QueryResult, QueryError> {
    check(conn, sql, access)?;
    // DuckDB fills a streamed result's buffer up to this size before the first fetch, counting
    // only the fixed part of each chunk: with its default (976 KiB) about 30 chunks of long
    // strings were buffered whatever they weighed (a 500 MB result held whole, outside its
    // memory limit). A session setting: each query's connection sets it. 0 streams nothing.
    conn.execute_batch("SET streaming_buffer_size = '32KB'").map_err(query_error)?;
    conn.execute_batch("BEGIN TRANSACTION").map_err(query_error)?;
    let result = collect(conn, sql, limits);
    let _ = conn.execute_batch("ROLLBACK");
    result
}

/// A buffer that refuses to grow past its limit.
struct Bounded {
    buf: Vec<u8>,
    max: usize,
    over: bool,
}

impl Write for Bounded {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        if self.buf.len() + data.len() > self.max {
            self.over = true;
            return Err(std::io::Error::other("result too large"));
        }
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn collect(conn: &Connection, sql: &str, limits: QueryLimits) -> std::result::Result<QueryResult, QueryError> {
    let mut stmt = conn.prepare(sql).map_err(query_error)?;
    // Streaming: DuckDB hands over one chunk at a time instead of materializing the result.
    let schema = stmt.stream_arrow([]).map_err(query_error)?.get_schema();
    let columns: Vec<(String, String)> =
        schema.fields().iter().map(|f| (f.name().clone(), sql_type(f.data_type()))).collect();
    // The answer is written in place around the rows. Reserved at once (pages are only taken
    // as they are written): growing by doubling would copy and hold twice the limit.
    let head = format!(
        "{{\"columns\":{},\"rows\":",
        serde_json::to_string(&columns).map_err(|e| QueryError::new(QueryErrorKind::Failed, e.to_string()))?
    );
    let max = limits.max_bytes.saturating_add(head.len());
    let mut buf = Vec::with_capacity(max.saturating_add(32));
    buf.extend_from_slice(head.as_bytes());
    let sink = Bounded { buf, max, over: false };
    let mut writer: Writer<Bounded, JsonArray> = WriterBuilder::new().with_explicit_nulls(true).build(sink);
    let mut seen = 0usize;
    let mut truncated = false;
    while let Some(chunk) = stmt.step().map_err(query_error)? {
        let batch = RecordBatch::from(&chunk);
        if seen >= limits.rows {
            truncated = true;
            break;
        }
        let take = batch.num_rows().min(limits.rows - seen);
        truncated |= take < batch.num_rows();
        seen += take;
        if let Err(e) = writer.write(&batch.slice(0, take)) {
            return Err(if writer.get_ref().over { too_large(limits.max_bytes) } else { render_error(e) });
        }
    }
    if let Err(e) = writer.finish() {
        return Err(if writer.get_ref().over { too_large(limits.max_bytes) } else { render_error(e) });
    }
    let mut buf = writer.into_inner().buf;
    buf.extend_from_slice(if truncated { b",\"truncated\":true}" } else { b",\"truncated\":false}" });
    let json = String::from_utf8(buf).map_err(|_| QueryError::new(QueryErrorKind::Failed, "the rows are not UTF-8"))?;
    Ok(QueryResult { columns, json, row_count: seen, truncated })
}

fn too_large(max: usize) -> QueryError {
    QueryError::new(
        QueryErrorKind::TooLarge,
        format!(
            "the result passed the limit of {max} bytes of JSON rows (sluice serve --sql-max-result-bytes); \
             select fewer rows or columns, or aggregate"
        ),
    )
}

fn render_error(e: arrow::error::ArrowError) -> QueryError {
    QueryError::new(QueryErrorKind::Failed, format!("cannot render the result as JSON: {e}"))
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

fn query_error(e: duckdb::Error) -> QueryError {
    let text = e.to_string();
    if super::db::disk_fault(&text).is_some() {
        return unavailable(&text);
    }
    let kind = if text.contains("Out of Memory") { QueryErrorKind::OutOfMemory } else { QueryErrorKind::Invalid };
    let message = if kind == QueryErrorKind::OutOfMemory {
        format!(
            "the query needed more memory than DuckDB's limit for the workspace (SLUICE_DUCKDB_MEMORY, \
             {} by default); aggregate, filter or add a LIMIT: {text}",
            super::DUCKDB_MEMORY
        )
    } else {
        format!("query failed: {text}")
    };
    QueryError::new(kind, message)
}

/// The query cannot run while the workspace's disk is full.
fn unavailable(why: &str) -> QueryError {
    QueryError::new(
        QueryErrorKind::Unavailable,
        format!(
            "the workspace cannot answer while the disk of its data folder is full; free space there and retry ({why})"
        ),
    )
}

/// Replace the data folder's path (as given and absolute) in a message.
fn scrub(message: &str, dir: &Path) -> String {
    let mut paths = vec![dir.display().to_string()];
    if let Ok(absolute) = std::path::absolute(dir) {
        paths.push(absolute.display().to_string());
    }
    if let Ok(canonical) = dir.canonicalize() {
        paths.push(canonical.display().to_string());
    }
    paths.retain(|p| p.len() > 1);
    paths.sort_by_key(|p| std::cmp::Reverse(p.len()));
    paths.into_iter().fold(message.to_string(), |text, path| text.replace(&path, "<data-dir>"))
}

impl Query {
    pub(crate) fn new(db: Db) -> Self {
        Self { db }
    }

    /// Run one read-only user statement on its own connection, within `limits`: interrupted
    /// after `timeout`, when `shutdown` resolves, or when this future is dropped.
    pub async fn run<S>(
        &self,
        sql: String,
        limits: QueryLimits,
        timeout: Duration,
        shutdown: S,
    ) -> std::result::Result<QueryResult, QueryError>
    where
        S: Future<Output = ()> + Send + 'static,
    {
        let dir = self.db.path().parent().map(Path::to_path_buf).unwrap_or_default();
        // While the workspace is reopened after a full disk (detached for a moment), say so.
        if let Some(fault) = self.db.fault() {
            return Err(unavailable(&fault));
        }
        let conn = self.db.connection().map_err(|e| match e.kind() {
            ErrorKind::Storage => unavailable(e.message()),
            _ => QueryError::new(QueryErrorKind::Failed, e.to_string()),
        })?;
        let (control, guard, done) = control::watch(conn.interrupt_handle(), timeout, shutdown);
        let job = tokio::task::spawn_blocking(move || {
            let result = run_query(&conn, &sql, limits, Access::User);
            drop(conn);
            drop(done);
            result
        });
        let result = job.await;
        guard.finish();
        let result = result.map_err(|_| QueryError::new(QueryErrorKind::Failed, "the query job panicked"))?;
        result.map_err(|e| {
            let e = match control.reason() {
                Some(Stop::Timeout) => QueryError::new(
                    QueryErrorKind::Timeout,
                    format!(
                        "the query was stopped at its time limit of {} ms (timeout_ms, at most sluice serve \
                         --sql-timeout-ms)",
                        timeout.as_millis()
                    ),
                ),
                Some(Stop::Shutdown | Stop::Abandoned) => {
                    QueryError::new(QueryErrorKind::Stopped, "the query was stopped: the server is shutting down")
                }
                None => e,
            };
            QueryError::new(e.kind, scrub(&e.message, &dir))
        })
    }
}

/// Run a read-only query on a connection the caller opened (the CLI without a server): the
/// operator's own file, so every table is readable; no time limit (Ctrl-C stops it).
pub fn query_connection(conn: &Connection, sql: &str, limits: QueryLimits) -> Result<QueryResult> {
    run_query(conn, sql, limits, Access::Full).map_err(|e| Error::new(ErrorKind::Data, e.message))
}
