//! What `/api/sql` may read and what its answers show: internal tables hidden except the ledger
//! and run records, no workspace path in errors, NULL columns kept.

use std::process::Command;

use serde_json::json;

use crate::harness::{BIN, DataDir, Server};

#[tokio::test]
async fn sql_hides_internal_tables_but_not_the_ledger() {
    let dir = DataDir::new("sql-access");
    let server = Server::start(&dir.0).await;
    let key = server.create_stream(json!({"name": "s", "table": "t"})).await;
    server.push("s", &key, r#"[{"id": 1, "name": "ada"}, {"id": 2}, {"id": "three"}]"#).await;

    for (sql, named) in [
        ("SELECT key_hash FROM sluice.streams", "sluice.streams"),
        (r#"SELECT * FROM "SLUICE"."Streams""#, "sluice.streams"),
        ("SELECT * FROM workspace.sluice.streams", "sluice.streams"),
        ("FROM sluice.streams", "sluice.streams"),
        ("WITH rejects AS (SELECT key_hash FROM sluice.streams) SELECT * FROM rejects", "sluice.streams"),
        ("SELECT (SELECT max(key_hash) FROM sluice.streams) AS h", "sluice.streams"),
        ("SELECT 1 AS n UNION ALL SELECT count(*) FROM sluice.checkpoints", "sluice.checkpoints"),
        ("SELECT * FROM t WHERE id IN (SELECT 1 FROM sluice.syncs)", "sluice.syncs"),
        ("SUMMARIZE sluice.streams", "sluice.streams"),
        ("DESCRIBE SELECT * FROM sluice.streams", "sluice.streams"),
        ("SELECT * FROM query_table('sluice.streams')", "query_table"),
        ("SELECT * FROM query('SELECT key_hash FROM sluice.streams')", "query"),
        ("SELECT * FROM pragma_storage_info('sluice.streams')", "pragma_storage_info"),
        ("SELECT * FROM duckdb_databases()", "duckdb_databases"),
        ("SELECT path FROM duckdb_databases", "duckdb_databases"),
        ("SELECT current_setting('temp_directory') AS d", "current_setting"),
        ("SELECT * FROM read_text('/etc/hostname')", "read_text"),
    ] {
        let (status, body) = server.sql_raw(sql).await;
        assert_eq!(status, 403, "{sql}: {body}");
        let error = body["error"].as_str().unwrap();
        assert!(error.contains(named), "{sql}: {error}");
    }

    // The ledger and the run records stay readable; so are the catalog views.
    assert_eq!(server.sql("SELECT count(*) AS n FROM sluice.rejects").await, vec![json!({"n": 1})]);
    assert_eq!(server.sql(r#"SELECT count(*) AS n FROM "sluice"."SYNC_RUNS""#).await, vec![json!({"n": 0})]);
    let tables = server.sql("SELECT table_name FROM information_schema.tables WHERE table_schema = 'main'").await;
    assert_eq!(tables, vec![json!({"table_name": "t"})]);
    assert_eq!(server.sql("SELECT count(*) AS n FROM range(3)").await, vec![json!({"n": 3})]);

    // A sync's query is user SQL too: it could send the registry to a destination.
    let (status, body) = server
        .create_sync(json!({"name": "leak", "query": "SELECT key_hash FROM sluice.streams",
            "destination": {"kind": "sqlite", "path": dir.0.join("out.db"), "table": "t"}}))
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(body["error"].as_str().unwrap().contains("sluice.streams"), "{body}");

    // Through the server the CLI follows the API's rules; without one it reads the file itself.
    let port = server.base.rsplit(':').next().unwrap().to_string();
    let out = Command::new(BIN)
        .args(["sql", "--server", &format!("127.0.0.1:{port}"), "SELECT key_hash FROM sluice.streams"])
        .env("SLUICE_TOKEN", &server.token)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("internal"), "{out:?}");
    server.stop();
    let out = Command::new(BIN)
        .args(["sql", "--server", "127.0.0.1:1", "--data-dir", dir.0.to_str().unwrap()])
        .arg("SELECT count(*) AS n FROM sluice.streams")
        .output()
        .unwrap();
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("| 1"), "{out:?}");
}

#[tokio::test]
async fn sql_rows_keep_null_columns() {
    let dir = DataDir::new("sql-nulls");
    let server = Server::start(&dir.0).await;
    let key = server.create_stream(json!({"name": "s", "table": "t"})).await;
    server.push("s", &key, r#"[{"id": 1, "name": "ada"}, {"id": 2}]"#).await;
    let rows = server.sql("SELECT id, name FROM t ORDER BY id").await;
    assert_eq!(rows, vec![json!({"id": 1, "name": "ada"}), json!({"id": 2, "name": null})]);
    let rows = server.sql("SELECT NULL AS a, [1, NULL] AS b, {'x': NULL} AS c").await;
    assert_eq!(rows, vec![json!({"a": null, "b": [1, null], "c": {"x": null}})]);
}

#[tokio::test]
async fn sql_errors_hide_the_workspace_path() {
    let dir = DataDir::new("sql-path");
    // The temp folder DuckDB spills to cannot be created: its error names the path. A small
    // memory limit makes the sort below spill.
    std::fs::write(dir.0.join("workspace.duckdb.tmp"), "in the way").unwrap();
    let server = Server::start_env(&dir.0, &[], &[("SLUICE_DUCKDB_MEMORY", "64MB")]).await;
    let absolute = std::path::absolute(&dir.0).unwrap().display().to_string();
    let spill = "SELECT i, repeat('x', 50) AS pad FROM range(20000000) t(i) ORDER BY random()";
    let r = server.http.post(server.url("/api/sql")).json(&json!({"sql": spill, "limit": 1})).send().await.unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("workspace.duckdb.tmp") && text.contains("<data-dir>"), "{text}");
    assert!(!text.contains(&absolute) && !text.contains(dir.0.to_str().unwrap()), "{text}");
}

#[tokio::test]
async fn push_keys_are_stored_as_keyed_hashes() {
    let dir = DataDir::new("sql-keys");
    let server = Server::start(&dir.0).await;
    let key = server.create_stream(json!({"name": "s", "table": "t"})).await;
    server.stop();
    let out = Command::new(BIN)
        .args(["sql", "--server", "127.0.0.1:1", "--data-dir", dir.0.to_str().unwrap(), "--json"])
        .arg("SELECT key_hash FROM sluice.streams")
        .output()
        .unwrap();
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let stored = rows[0]["key_hash"].as_str().unwrap();
    assert!(stored.starts_with("hmac-sha256:") && stored.len() == 12 + 64, "{stored}");
    // Keyed under secret.key: the key still works after a restart, and not without that file.
    let server = Server::start(&dir.0).await;
    assert_eq!(server.push("s", &key, r#"{"id": 1}"#).await.0, 202);
    server.stop();
    std::fs::remove_file(dir.0.join("secret.key")).unwrap();
    let server = Server::start(&dir.0).await;
    assert_eq!(server.push("s", &key, r#"{"id": 2}"#).await.0, 401, "another secret key, another hash");
}
