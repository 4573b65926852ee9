//! What user SQL (`/api/sql`, sync queries) may read.
//!
//! DuckDB has no per-table permissions, and every connection to one database sees the same
//! catalog, so the internals cannot simply be left out of a user's connection: a second
//! database instance cannot open the same file, and views in another schema would not stop a
//! query from naming `sluice.streams` directly. The check is therefore made on DuckDB's own
//! parse tree (`json_serialize_sql`), walking every node whatever its nesting (subqueries,
//! CTEs, joins, set operations, PIVOT, SUMMARIZE/DESCRIBE, scalar subqueries):
//!
//! - a table reference in the schema `sluice` (any case, quoted or not, with or without the
//!   catalog) is refused unless it is one of [`READABLE`]: the rejects ledger and the sync run
//!   records. An unqualified name never resolves to `sluice` (only `main` is searched), and a
//!   CTE name is an unqualified name;
//! - a table function must be on [`TABLE_FUNCTIONS`]: deny by default, because functions such
//!   as `query('…')`, `query_table('…')` or `pragma_storage_info('…')` take a table or a whole
//!   statement as a string, which no parse tree shows;
//! - the catalog views and functions that show settings or file paths are refused.
//!
//! The catalog views (`information_schema`, `duckdb_tables()`, …) still list the internal
//! tables' names and columns: that is the documented schema, not data.

use serde_json::{Map, Value};

/// Internal tables a user may read.
pub const READABLE: &[&str] = &["rejects", "sync_runs"];

/// Table functions user SQL may call: generators and catalog listings without paths.
const TABLE_FUNCTIONS: &[&str] = &[
    "range",
    "generate_series",
    "unnest",
    "json_each",
    "json_tree",
    "duckdb_tables",
    "duckdb_columns",
    "duckdb_views",
    "duckdb_schemas",
    "duckdb_types",
    "duckdb_functions",
    "duckdb_constraints",
    "duckdb_indexes",
    "duckdb_keywords",
    "duckdb_sequences",
];

/// Catalog views that show settings or file paths (the workspace's among them).
const HIDDEN_VIEWS: &[&str] = &[
    "duckdb_databases",
    "duckdb_settings",
    "duckdb_temporary_files",
    "duckdb_extensions",
    "duckdb_secrets",
    "duckdb_memory",
    "duckdb_logs",
    "pg_settings",
];

/// Scalar functions that show settings (the temp directory is inside the data folder).
const HIDDEN_FUNCTIONS: &[&str] = &["current_setting"];

/// Why a parsed statement is refused, naming the table or function; `None` when allowed.
pub fn refusal(parsed: &Value) -> Option<String> {
    match parsed {
        Value::Object(node) => node_refusal(node).or_else(|| node.values().find_map(refusal)),
        Value::Array(items) => items.iter().find_map(refusal),
        _ => None,
    }
}

fn node_refusal(node: &Map<String, Value>) -> Option<String> {
    let text = |key: &str| node.get(key).and_then(Value::as_str).unwrap_or("").to_ascii_lowercase();
    match node.get("type").and_then(Value::as_str) {
        Some("BASE_TABLE") => {
            let (catalog, schema, table) = (text("catalog_name"), text("schema_name"), text("table_name"));
            if (schema == super::SCHEMA || catalog == super::SCHEMA) && !READABLE.contains(&table.as_str()) {
                let readable = READABLE.iter().map(|t| format!("sluice.{t}")).collect::<Vec<_>>().join(" and ");
                return Some(format!(
                    "table sluice.{table} is internal and cannot be queried; of the sluice schema only {readable} \
                     can"
                ));
            }
            if HIDDEN_VIEWS.contains(&table.as_str()) {
                return Some(format!("{table} shows the server's settings or paths and cannot be queried"));
            }
            None
        }
        Some("TABLE_FUNCTION") => {
            let function = node.get("function")?;
            let name = function.get("function_name").and_then(Value::as_str).unwrap_or("").to_ascii_lowercase();
            if TABLE_FUNCTIONS.contains(&name.as_str()) {
                None
            } else {
                Some(format!(
                    "table function {name}() is not allowed; allowed are {} and the tables and views",
                    TABLE_FUNCTIONS.join(", ")
                ))
            }
        }
        Some("FUNCTION") => {
            let name = text("function_name");
            HIDDEN_FUNCTIONS
                .contains(&name.as_str())
                .then(|| format!("{name}() shows the server's settings and cannot be called"))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn finds_internal_tables_anywhere() {
        let table = |schema: &str, name: &str| json!({"type": "BASE_TABLE", "schema_name": schema, "table_name": name, "catalog_name": ""});
        assert!(refusal(&json!({"x": [{"y": table("SLUICE", "Streams")}]})).unwrap().contains("sluice.streams"));
        assert_eq!(refusal(&table("sluice", "REJECTS")), None);
        assert_eq!(refusal(&table("", "streams")), None);
        assert!(refusal(&table("main", "duckdb_settings")).is_some());
        let function = json!({"type": "TABLE_FUNCTION", "function": {"function_name": "query_table"}});
        assert!(refusal(&function).unwrap().contains("query_table"));
        let range = json!({"type": "TABLE_FUNCTION", "function": {"type": "FUNCTION", "function_name": "range"}});
        assert_eq!(refusal(&range), None);
    }
}
