//! Stream management, config files, restarts, SQL and metrics.

use std::process::Command;

use serde_json::json;

use crate::harness::{BIN, DataDir, Server};

#[tokio::test]
async fn stream_crud_keeps_tables_unless_asked() {
    let dir = DataDir::new("crud");
    let server = Server::start(&dir.0).await;
    let http = &server.http;

    let r =
        http.post(server.url("/api/streams")).json(&json!({"name": "bad name!", "table": "t"})).send().await.unwrap();
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap().contains("name"));
    let r = http
        .post(server.url("/api/streams"))
        .json(&json!({"name": "a", "table": "t", "flush": {"max_rows": 0}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap().contains("flush.max_rows"));
    let r = http.post(server.url("/api/streams")).json(&json!({"name": "a", "tabel": "t"})).send().await.unwrap();
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap().contains("tabel"));

    let r = http.post(server.url("/api/streams")).body(r#"{"name": "a", "table": "t"}"#).send().await.unwrap();
    assert_eq!(r.status(), 415, "a body without a JSON content type");
    let body: serde_json::Value = r.json().await.unwrap();
    assert!(body["error"].as_str().unwrap().contains("application/json"), "{body}");
    let r = http.post(server.url("/api/sql")).json(&json!({"query": "SELECT 1"})).send().await.unwrap();
    assert_eq!(r.status(), 422);
    assert!(r.text().await.unwrap().contains("query"), "the unknown field is named");

    let key = server.create_stream(json!({"name": "a", "table": "ta"})).await;
    assert!(key.starts_with("sk_"));
    server.create_stream(json!({"name": "b", "table": "tb"})).await;
    let r = http.post(server.url("/api/streams")).json(&json!({"name": "a", "table": "other"})).send().await.unwrap();
    assert_eq!(r.status(), 409);
    let r = http.post(server.url("/api/streams")).json(&json!({"name": "c", "table": "TA"})).send().await.unwrap();
    assert_eq!(r.status(), 409, "one table, one stream");

    let (_, list) = server.get("/api/streams").await;
    let names: Vec<&str> = list["streams"].as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap()).collect();
    assert_eq!(names, ["a", "b"]);
    let (status, one) = server.get("/api/streams/a").await;
    assert_eq!(status, 200);
    assert!(one.get("push_key").is_none() && !one.to_string().contains(&key), "the key is shown once");

    let r = http
        .patch(server.url("/api/streams/a"))
        .json(&json!({"flush": {"max_wait_ms": 50}, "metadata": {"received_at": true}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let patched: serde_json::Value = r.json().await.unwrap();
    assert_eq!(patched["config"]["flush"]["max_wait_ms"], json!(50));
    assert_eq!(patched["config"]["metadata"]["received_at"], json!(true));
    let r = http.patch(server.url("/api/streams/a")).json(&json!({"name": "z"})).send().await.unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(server.push("a", &key, r#"{"x": 1}"#).await.0, 202, "the key survives a patch");
    assert_eq!(server.count("ta").await, 1);
    let cols =
        server.sql("SELECT column_name FROM information_schema.columns WHERE table_name = 'ta' ORDER BY 1").await;
    assert_eq!(cols, vec![json!({"column_name": "_received_at"}), json!({"column_name": "x"})]);

    assert_eq!(http.delete(server.url("/api/streams/a")).send().await.unwrap().status(), 204);
    assert_eq!(server.get("/api/streams/a").await.0, 404);
    assert_eq!(server.count("ta").await, 1, "deleting a stream keeps its table");
    assert_eq!(server.push("a", &key, "{}").await.0, 401, "the old key opens no stream of that name");

    let key_b = server.create_stream(json!({"name": "b2", "table": "tb2"})).await;
    server.push("b2", &key_b, r#"{"x": 1}"#).await;
    assert_eq!(http.delete(server.url("/api/streams/b2?drop_table=true")).send().await.unwrap().status(), 204);
    assert_eq!(server.sql_raw("SELECT * FROM tb2").await.0, 400, "dropped on request");
    assert_eq!(http.delete(server.url("/api/streams/b2")).send().await.unwrap().status(), 404);
}

#[tokio::test]
async fn sql_is_read_only_and_cli_prints_tables() {
    let dir = DataDir::new("sql");
    let server = Server::start(&dir.0).await;
    let key = server.create_stream(json!({"name": "s", "table": "t"})).await;
    server.push("s", &key, r#"[{"id": 1, "name": "ada"}, {"id": 2, "name": "grace"}]"#).await;

    for bad in [
        "DELETE FROM t",
        "DROP TABLE t",
        "INSERT INTO t VALUES (3, 'x')",
        "SELECT 1; DROP TABLE t",
        "COPY t TO '/tmp/x.csv'",
        "ATTACH '/tmp/other.db'",
        "CREATE TABLE u AS SELECT 1",
        "PRAGMA database_list",
        "not sql at all",
    ] {
        let (status, body) = server.sql_raw(bad).await;
        assert_eq!(status, 400, "{bad}: {body}");
        assert!(!body["error"].as_str().unwrap().is_empty());
    }
    for forbidden in ["SELECT * FROM read_text('/etc/hostname')", "SELECT * FROM read_csv('/etc/passwd')"] {
        let (status, body) = server.sql_raw(forbidden).await;
        assert_eq!(status, 403, "{forbidden}: {body}");
    }
    assert_eq!(server.count("t").await, 2);
    let rows = server.sql("WITH x AS (SELECT * FROM t) SELECT name FROM x ORDER BY id").await;
    assert_eq!(rows, vec![json!({"name": "ada"}), json!({"name": "grace"})]);

    let port = server.base.rsplit(':').next().unwrap().to_string();
    let out = Command::new(BIN)
        .args(["sql", "--server", &format!("127.0.0.1:{port}"), "SELECT id, name FROM t ORDER BY id"])
        .env("SLUICE_TOKEN", &server.token)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("grace") && text.contains("(2 rows)"), "{text}");
    let out = Command::new(BIN)
        .args(["sql", "--server", &format!("127.0.0.1:{port}"), "DROP TABLE t"])
        .env("SLUICE_TOKEN", &server.token)
        .output()
        .unwrap();
    assert!(!out.status.success());

    // Without a server the CLI opens the workspace itself.
    server.stop();
    let out = Command::new(BIN)
        .args(["sql", "--server", "127.0.0.1:1", "--data-dir", dir.0.to_str().unwrap(), "SELECT count(*) AS n FROM t"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("| 2"), "{text} {}", String::from_utf8_lossy(&out.stderr));
}

#[tokio::test]
async fn restart_keeps_streams_keys_tables_and_totals() {
    let dir = DataDir::new("restart");
    let server = Server::start(&dir.0).await;
    let key = server.create_stream(json!({"name": "s", "table": "t", "metadata": {"position": true}})).await;
    server.push("s", &key, "{\"a\": 1}\n{\"a\": 2}\nbad\n").await;
    let (_, before) = server.get("/api/streams/s/metrics").await;
    assert_eq!((before["events_in"].as_u64(), before["rows_written"].as_u64()), (Some(3), Some(2)));
    server.stop();

    let server = Server::start(&dir.0).await;
    let (_, after) = server.get("/api/streams/s/metrics").await;
    for field in ["events_in", "rows_written", "rejects", "bytes_in", "batches", "last_event_time"] {
        assert_eq!(before[field], after[field], "{field}");
    }
    assert_eq!(server.push("s", &key, r#"{"a": 3}"#).await.0, 202, "the key still works");
    let rows = server.sql("SELECT a, _position FROM t ORDER BY _position").await;
    assert_eq!(
        rows,
        vec![json!({"a": 1, "_position": 1}), json!({"a": 2, "_position": 2}), json!({"a": 3, "_position": 4})]
    );
}

#[tokio::test]
async fn metrics_in_json_and_prometheus() {
    let dir = DataDir::new("metrics");
    let server = Server::start(&dir.0).await;
    let key = server.create_stream(json!({"name": "m", "table": "t"})).await;
    for i in 0..5 {
        server.push("m", &key, format!("{{\"i\": {i}, \"x\": \"{}\"}}", if i == 4 { "y" } else { "z" })).await;
    }
    server.push("m", &key, r#"{"i": "not a number"}"#).await;
    let (_, m) = server.get("/api/streams/m/metrics").await;
    assert_eq!(m["events_in"], json!(6));
    assert_eq!(m["rows_written"], json!(6));
    assert_eq!(m["rejects"], json!(1));
    assert_eq!(m["batches"], json!(6));
    assert_eq!(m["state"], json!("running"));
    assert!(m["bytes_in"].as_u64().unwrap() > 60);
    assert!(m["last_event_time"].is_string());
    let lat = &m["latency_ms"];
    assert_eq!(lat["count"], json!(6));
    assert!(
        lat["min"].as_f64().unwrap() > 0.0
            && lat["min"].as_f64() <= lat["avg"].as_f64()
            && lat["avg"].as_f64() <= lat["max"].as_f64()
    );
    assert!(lat["p99"].as_f64().unwrap() <= lat["max"].as_f64().unwrap());
    assert!(m["messages_per_sec"].is_number());
    let (_, all) = server.get("/api/metrics").await;
    assert_eq!(all["streams"]["m"]["events_in"], json!(6));
    let text = server.http.get(server.url("/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(text.contains("sluice_stream_events_in_total{stream=\"m\"} 6"), "{text}");
    assert!(text.contains("sluice_stream_rejects_total{stream=\"m\"} 1"));
    assert!(text.contains("# TYPE sluice_stream_latency_p99_seconds gauge"));
    assert!(text.contains("sluice_stream_last_event_timestamp_seconds{stream=\"m\"}"));
}

#[tokio::test]
async fn declared_streams_from_yaml_and_bad_config_names_the_field() {
    let dir = DataDir::new("yaml");
    let file = dir.0.join("sluice.yaml");
    std::fs::write(&file, "streams:\n  - name: orders\n    table: orders\n    push_key: sk_test_0123456789abcdef\n    flush:\n      max_wait_ms: 20\n").unwrap();
    let server = Server::start_with(&dir.0, &["--config", file.to_str().unwrap()]).await;
    let (status, body) = server.push("orders", "sk_test_0123456789abcdef", r#"{"id": 1}"#).await;
    assert_eq!(status, 202, "{body}");
    let (_, s) = server.get("/api/streams/orders").await;
    assert_eq!(s["config"]["flush"]["max_wait_ms"], json!(20));
    assert!(!s.to_string().contains("sk_test"), "secrets never serialize");
    server.stop();

    // Declared again with a change: updated, key and rows kept.
    std::fs::write(&file, "streams:\n  - name: orders\n    table: orders\n    flush:\n      max_wait_ms: 30\n")
        .unwrap();
    let server = Server::start_with(&dir.0, &["--config", file.to_str().unwrap()]).await;
    let (_, s) = server.get("/api/streams/orders").await;
    assert_eq!(s["config"]["flush"]["max_wait_ms"], json!(30));
    assert_eq!(server.push("orders", "sk_test_0123456789abcdef", r#"{"id": 2}"#).await.0, 202);
    assert_eq!(server.count("orders").await, 2);
    server.stop();

    // A declared sync is created at start, its password kept apart.
    let db = dir.0.join("out.db");
    std::fs::write(
        &file,
        format!(
            "syncs:\n  - name: daily\n    query: SELECT count(*) AS n FROM orders\n    destination:\n      kind: sqlite\n      path: {}\n      table: counts\n",
            db.display()
        ),
    )
    .unwrap();
    let server = Server::start_with(&dir.0, &["--config", file.to_str().unwrap()]).await;
    let (status, sync) = server.get("/api/syncs/daily").await;
    assert_eq!(status, 200, "{sync}");
    assert_eq!(server.run_sync("daily").await["rows_sent"], json!(1));
    server.stop();

    // A declared destination that is down does not stop the server: each run reports it.
    std::fs::write(
        &file,
        "syncs:\n  - name: later\n    query: SELECT 1 AS n\n    destination:\n      kind: postgres\n      host: 127.0.0.1\n      port: 9\n      database: d\n      user: u\n      table: t\n",
    )
    .unwrap();
    let server = Server::start_with(&dir.0, &["--config", file.to_str().unwrap()]).await;
    let run = server.run_sync("later").await;
    assert_eq!(run["status"], "failed");
    assert!(run["error"].as_str().unwrap().contains("cannot connect"), "{run}");
    server.stop();

    for (yaml, field) in [
        ("streams:\n  - name: x\n    tabel: y\n", "tabel"),
        ("streams:\n  - name: x\n    table: y\n    flush:\n      max_wait_ms: 0\n", "flush.max_wait_ms"),
        ("streams:\n  - name: x\n    table: y\n    source:\n      type: carrier_pigeon\n", "carrier_pigeon"),
        (
            "syncs:\n  - name: s\n    query: SELECT 1 AS id\n    mode: upsert\n    destination:\n      kind: sqlite\n      path: /tmp/x.db\n      table: t\n",
            "syncs[0].keys",
        ),
        (
            "syncs:\n  - name: s\n    query: SELECT 1\n    schedule:\n      cron: every day\n    destination:\n      kind: sqlite\n      path: /tmp/x.db\n      table: t\n",
            "syncs[0].schedule.cron",
        ),
        ("syncs:\n  - name: s\n    query: SELECT 1\n    destination:\n      kind: fax\n", "fax"),
    ] {
        std::fs::write(&file, yaml).unwrap();
        let out = Command::new(BIN)
            .args([
                "serve",
                "--data-dir",
                dir.0.to_str().unwrap(),
                "--listen",
                "127.0.0.1:0",
                "--config",
                file.to_str().unwrap(),
            ])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{yaml}");
        assert!(err.contains(field), "{field} not named in: {err}");
    }
}
