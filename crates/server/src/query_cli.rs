//! `sluice sql`: ask the running server, or open the workspace read-only when none answers.
//! Through the server, the API's rules apply (internal tables hidden, time and size limits);
//! without one, the operator reads their own file: every table, no time limit. The server is
//! sent `SLUICE_TOKEN`, or else the data dir's `admin.token`.

use std::net::SocketAddr;
use std::path::Path;

use comfy_table::Table;

use crate::auth;
use serde_json::{Map, Value, json};
use sluice_connectors::workspace::{QueryLimits, Workspace, query_connection};

/// Most bytes of JSON rows read from the workspace without a server (as the server's default).
const OFFLINE_MAX_BYTES: usize = 64 * 1024 * 1024;

/// Rows to print.
struct Rows {
    columns: Vec<(String, String)>,
    rows: Vec<Map<String, Value>>,
    truncated: bool,
}

/// Run one statement and print the rows.
pub async fn run(sql: &str, server: SocketAddr, data_dir: &Path, as_json: bool, limit: usize) -> Result<(), String> {
    let result = match ask_server(sql, server, data_dir, limit).await? {
        Some(result) => result,
        None => {
            let conn = Workspace::open_read_only(data_dir).map_err(|e| e.to_string())?;
            let limits = QueryLimits { rows: limit, max_bytes: OFFLINE_MAX_BYTES };
            let result = query_connection(&conn, sql, limits).map_err(|e| e.to_string())?;
            Rows {
                rows: result.rows().map_err(|e| e.to_string())?,
                columns: result.columns,
                truncated: result.truncated,
            }
        }
    };
    if as_json {
        println!("{}", serde_json::to_string_pretty(&result.rows).map_err(|e| e.to_string())?);
    } else {
        print_table(&result);
    }
    Ok(())
}

/// `Ok(None)` when no server listens.
async fn ask_server(sql: &str, server: SocketAddr, data_dir: &Path, limit: usize) -> Result<Option<Rows>, String> {
    let mut request =
        reqwest::Client::new().post(format!("http://{server}/api/sql")).json(&json!({"sql": sql, "limit": limit}));
    if let Some(token) = auth::setup::cli_token(data_dir) {
        request = request.bearer_auth(token);
    }
    let response = match request.send().await {
        Ok(r) => r,
        Err(e) if e.is_connect() => return Ok(None),
        Err(e) => return Err(format!("server at {server}: {e}")),
    };
    let status = response.status();
    let body: Value = response.json().await.map_err(|e| format!("server at {server}: {e}"))?;
    if status == reqwest::StatusCode::UNAUTHORIZED {
        return Err(auth::setup::cli_hint(data_dir));
    }
    if !status.is_success() {
        return Err(body["error"].as_str().unwrap_or("query failed").to_string());
    }
    let columns = body["columns"]
        .as_array()
        .map(|cols| {
            cols.iter()
                .map(|c| (c[0].as_str().unwrap_or("").to_string(), c[1].as_str().unwrap_or("").to_string()))
                .collect()
        })
        .unwrap_or_default();
    let rows = body["rows"]
        .as_array()
        .map(|rows| rows.iter().filter_map(|r| r.as_object().cloned()).collect())
        .unwrap_or_default();
    Ok(Some(Rows { columns, rows, truncated: body["truncated"].as_bool().unwrap_or(false) }))
}

fn print_table(result: &Rows) {
    let mut table = Table::new();
    table.set_header(result.columns.iter().map(|(name, _)| name.clone()));
    for row in &result.rows {
        table.add_row(result.columns.iter().map(|(name, _)| match row.get(name) {
            None | Some(Value::Null) => "NULL".to_string(),
            Some(Value::String(s)) => s.clone(),
            Some(v) => v.to_string(),
        }));
    }
    println!("{table}");
    let n = result.rows.len();
    println!("({n} row{}{})", if n == 1 { "" } else { "s" }, if result.truncated { ", truncated" } else { "" });
}
