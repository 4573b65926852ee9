//! Reverse ETL to files, read back by independent readers (Python duckdb and pyarrow): Parquet,
//! CSV and JSON lines in a local folder, Parquet on S3 (moto), plus refused queries, preview
//! and the schedule.

use std::time::Duration;

use serde_json::json;

use crate::harness::{DataDir, Server, wait_until};
use crate::moto::{Moto, py};
use crate::reverse_etl::{QUERY, first_events, push, second_events, source};

/// Rows of files read with Python's duckdb, `id|amount|name|ts` (ts in UTC).
fn duckdb_rows(read: &str) -> Vec<String> {
    py(&format!(
        "import duckdb\nc = duckdb.connect(); c.execute('SET enable_progress_bar = false')\nc.execute(\"SET TimeZone = 'UTC'\")\n\
         for r in c.execute(\"SELECT id, amount, name, strftime(ts::TIMESTAMPTZ, '%Y-%m-%d %H:%M:%S.%f') FROM {read} ORDER BY id\").fetchall():\n    \
         print('|'.join('NULL' if v is None else str(v) for v in r))"
    ))
    .lines()
    .map(str::to_string)
    .collect()
}

const ROWS: [&str; 3] = [
    "1|12.5000|héllo 😀|2024-01-01 08:00:00.000000",
    "2|NULL|ñandú|2024-07-01 04:59:59.123456",
    "3|123456789.1234|plain|2024-03-01 00:00:00.000000",
];

#[tokio::test(flavor = "multi_thread")]
async fn local_files_in_every_format_and_mode() {
    let dir = DataDir::new("retl-files");
    let out = dir.0.join("out");
    let server = Server::start(&dir.0.join("data")).await;
    let key = source(&server).await;
    push(&server, &key, first_events(), 3).await;
    for (format, reader) in [("parquet", "read_parquet"), ("csv", "read_csv"), ("jsonl", "read_json")] {
        let name = format!("replace_{format}");
        let (status, body) = server
            .create_sync(json!({"name": name, "query": QUERY, "mode": "replace",
                                "destination": {"kind": "files", "location": out, "format": format}}))
            .await;
        assert_eq!(status, 201, "{body}");
        assert_eq!(server.run_sync(&name).await["status"], "succeeded");
        let file = out.join(format!("{name}.{format}"));
        let read = format!("{reader}('{}')", file.display());
        let rows = duckdb_rows(&read);
        if format == "parquet" {
            assert_eq!(rows, ROWS);
        } else {
            // Text formats carry the decimal's digits; a reader infers its own number type.
            assert_eq!(rows.len(), 3, "{rows:?}");
            assert!(rows[1].starts_with("2|NULL|ñandú|2024-07-01 04:59:59.123456"), "{rows:?}");
            assert!(rows[2].starts_with("3|123456789.1234|plain|"), "{rows:?}");
        }
    }
    let schema = py(&format!(
        "import pyarrow.parquet as pq\nprint(pq.read_schema('{}'))",
        out.join("replace_parquet.parquet").display()
    ));
    assert!(schema.contains("amount: decimal128(18, 4)"), "{schema}");
    assert!(schema.contains("ts: timestamp[us, tz="), "{schema}");

    // Mirror writes one change file per run, with _sluice_op; append one full file per run.
    for mode in ["mirror", "append", "upsert"] {
        let (status, body) = server
            .create_sync(json!({"name": mode, "query": QUERY, "mode": mode, "keys": ["id"],
                                "destination": {"kind": "files", "location": out, "format": "parquet"}}))
            .await;
        assert_eq!(status, 201, "{body}");
        assert_eq!(server.run_sync(mode).await["status"], "succeeded");
    }
    push(&server, &key, second_events(), 6).await;
    for mode in ["mirror", "append", "upsert"] {
        assert_eq!(server.run_sync(mode).await["status"], "succeeded");
    }
    // Nothing changed: mirror writes no empty file.
    assert_eq!(server.run_sync("mirror").await["rows_sent"].as_i64(), Some(0));
    let changes = py(&format!(
        "import duckdb\nfor r in duckdb.sql(\"SELECT _sluice_op, count(*), string_agg(id::VARCHAR, ',' ORDER BY id) \
         FROM read_parquet('{}/mirror/*.parquet') GROUP BY 1 ORDER BY 1\").fetchall(): print(r)",
        out.display()
    ));
    assert_eq!(changes.trim(), "('delete', 1, '3')\n('upsert', 5, '1,2,2,3,4')");
    let upserts = py(&format!(
        "import duckdb\nprint(duckdb.sql(\"SELECT string_agg(DISTINCT _sluice_op, ',') || ' ' || string_agg(id::VARCHAR, ',' ORDER BY id) \
         FROM read_parquet('{}/upsert/*.parquet')\").fetchone()[0])",
        out.display()
    ));
    assert_eq!(upserts.trim(), "upsert 1,2,2,3,4", "upsert never deletes");
    let files = std::fs::read_dir(out.join("append")).unwrap().count();
    assert_eq!(files, 2);
    let total = py(&format!(
        "import duckdb\nprint(duckdb.sql(\"SELECT count(*) FROM '{}/append/*.parquet'\").fetchone()[0])",
        out.display()
    ));
    assert_eq!(total.trim(), "6");
}

#[tokio::test(flavor = "multi_thread")]
async fn parquet_on_s3_with_a_failed_delivery() {
    let moto = Moto::start();
    py(&format!("{}s3.create_bucket(Bucket='lake')", moto.boto()));
    let dir = DataDir::new("retl-s3");
    let server = Server::start(&dir.0).await;
    let key = source(&server).await;
    push(&server, &key, first_events(), 3).await;
    let s3 = json!({"endpoint": moto.endpoint, "access_key_id": "test", "secret_access_key": "test"});
    for mode in ["replace", "mirror"] {
        let (status, body) = server
            .create_sync(json!({"name": mode, "query": QUERY, "mode": mode, "keys": ["id"],
                "destination": {"kind": "files", "location": "s3://lake/exports", "format": "parquet", "s3": s3}}))
            .await;
        assert_eq!(status, 201, "{body}");
        assert!(!body.to_string().contains("secret_access_key"), "{body}");
    }
    assert_eq!(server.run_sync("replace").await["status"], "succeeded");
    let read = py(&format!(
        "{}import pyarrow.parquet as pq\nt = pq.read_table(io.BytesIO(s3.get_object(Bucket='lake', Key='exports/replace.parquet')['Body'].read()))\n\
         print(t.num_rows, t.schema.field('amount').type, sorted(t.column('name').to_pylist()))",
        moto.boto()
    ));
    assert_eq!(read.trim(), "3 decimal128(18, 4) ['héllo 😀', 'plain', 'ñandú']");

    // The bucket goes away: the put fails, the run fails, and the next run resends every row.
    py(&format!(
        "{}for o in s3.list_objects_v2(Bucket='lake').get('Contents', []): s3.delete_object(Bucket='lake', Key=o['Key'])\n\
         s3.delete_bucket(Bucket='lake')",
        moto.boto()
    ));
    let run = server.run_sync("mirror").await;
    assert_eq!(run["status"], "failed", "{run}");
    py(&format!("{}s3.create_bucket(Bucket='lake')", moto.boto()));
    let run = server.run_sync("mirror").await;
    assert_eq!(run["inserted"].as_i64(), Some(3), "{run}");
    let listed = py(&format!(
        "{}print(len(s3.list_objects_v2(Bucket='lake', Prefix='exports/mirror/')['Contents']))",
        moto.boto()
    ));
    assert_eq!(listed.trim(), "1");
}

#[tokio::test(flavor = "multi_thread")]
async fn queries_that_write_are_refused() {
    let dir = DataDir::new("retl-refuse");
    let server = Server::start(&dir.0).await;
    let key = source(&server).await;
    push(&server, &key, first_events(), 3).await;
    let target = json!({"kind": "files", "location": dir.0.join("out"), "format": "csv"});
    for sql in [
        "INSERT INTO src (id) VALUES (9)",
        "DELETE FROM src",
        "UPDATE src SET name = 'x'",
        "DROP TABLE src",
        "CREATE TABLE t AS SELECT * FROM src",
        "SELECT 1; DELETE FROM src",
        "COPY src TO '/tmp/stolen.csv'",
        "ATTACH '/tmp/other.duckdb' AS other",
        "CALL checkpoint()",
        "PRAGMA version",
        "SET threads = 1",
    ] {
        let (status, body) = server.create_sync(json!({"name": "w", "query": sql, "destination": target})).await;
        assert_eq!(status, 400, "{sql}: {body}");
        assert!(body["error"].as_str().unwrap().starts_with("query refused"), "{sql}: {body}");
    }
    // A SELECT that reads files is refused too: read_csv() is not an allowed table function
    // (and the workspace has no file access anyway).
    let (status, body) = server
        .create_sync(json!({"name": "r", "query": "SELECT * FROM read_csv('/etc/passwd')", "destination": target}))
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(body["error"].as_str().unwrap().contains("read_csv"), "{body}");
    assert_eq!(server.count("src").await, 3, "nothing was written");

    // Keys must be columns of the result, unique and not NULL.
    for (query, expected) in [
        ("SELECT id, name FROM src", "key column 'nope' is not in the query's result"),
        ("SELECT 1 AS nope FROM src", "not unique in the result: 2 rows repeat a key"),
        ("SELECT NULL::INT AS nope", "1 rows have a NULL key"),
    ] {
        let name = format!("k{}", rand::random::<u16>());
        let (status, body) = server
            .create_sync(
                json!({"name": name, "query": query, "mode": "upsert", "keys": ["nope"], "destination": target}),
            )
            .await;
        assert_eq!(status, 201, "{body}");
        let run = server.run_sync(&name).await;
        assert!(run["error"].as_str().unwrap_or_default().contains(expected), "{query}: {run}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn preview_and_schedule() {
    let dir = DataDir::new("retl-sched");
    let server = Server::start(&dir.0.join("data")).await;
    let key = source(&server).await;
    push(&server, &key, first_events(), 3).await;
    let db = dir.0.join("out.db");
    let destination = json!({"kind": "sqlite", "path": db, "table": "t"});
    for (schedule, field) in [
        (json!({"cron": "every day"}), "schedule.cron"),
        (json!({"cron": "* * * * *", "timezone": "Mars/Olympus"}), "schedule.timezone"),
    ] {
        let (status, body) = server
            .create_sync(json!({"name": "s", "query": QUERY, "destination": destination, "schedule": schedule}))
            .await;
        assert_eq!(status, 400, "{body}");
        assert!(body["error"].as_str().unwrap().contains(field), "{body}");
    }
    let (status, body) = server
        .create_sync(json!({"name": "s", "query": QUERY, "mode": "mirror", "keys": ["id"], "destination": destination}))
        .await;
    assert_eq!(status, 201, "{body}");
    server.run_sync("s").await;
    push(&server, &key, second_events(), 6).await;
    let (status, preview) = server.get("/api/syncs/s/preview").await;
    assert_eq!(status, 200, "{preview}");
    assert_eq!(
        (preview["inserted"].as_i64(), preview["updated"].as_i64(), preview["deleted"].as_i64()),
        (Some(1), Some(1), Some(1))
    );
    let ops: Vec<(i64, &str)> = preview["sample"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["id"].as_i64().unwrap(), r["_op"].as_str().unwrap()))
        .collect();
    let mut ops = ops;
    ops.sort();
    assert_eq!(ops, [(2, "update"), (3, "delete"), (4, "insert")]);
    // A preview sends nothing: the next run still has the same changes.
    let run = server.run_sync("s").await;
    assert_eq!(
        (run["inserted"].as_i64(), run["updated"].as_i64(), run["deleted"].as_i64()),
        (Some(1), Some(1), Some(1))
    );

    // Every second, in a named zone: the schedule fires on its own.
    let (status, body) = server
        .create_sync(
            json!({"name": "tick", "query": QUERY, "destination": {"kind": "sqlite", "path": db, "table": "tick"},
                            "schedule": {"cron": "* * * * * *", "timezone": "Europe/Paris"}}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    assert!(body["next_run_at"].is_string(), "{body}");
    wait_until("two scheduled runs", Duration::from_secs(30), || async {
        let (_, runs) = server.get("/api/syncs/tick/runs").await;
        runs["runs"]
            .as_array()
            .is_some_and(|r| r.iter().filter(|x| x["trigger"] == "schedule" && x["status"] == "succeeded").count() >= 2)
    })
    .await;
    // Run outcomes in Prometheus.
    let text = server.http.get(server.url("/metrics")).send().await.unwrap().text().await.unwrap();
    let runs = text
        .lines()
        .find_map(|l| l.strip_prefix("sluice_sync_runs_total{sync=\"tick\",status=\"succeeded\"} "))
        .and_then(|n| n.parse::<u64>().ok());
    assert!(runs.is_some_and(|n| n >= 2), "{text}");
    assert!(text.contains("sluice_sync_last_run_success{sync=\"s\"} 1"), "{text}");
    assert!(text.contains("sluice_sync_runs_total{sync=\"s\",status=\"failed\"} 0"), "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn keys_with_dots_and_quotes_in_their_names() {
    let dir = DataDir::new("retl-odd-keys");
    let server = Server::start(&dir.0.join("data")).await;
    let key = source(&server).await;
    push(&server, &key, first_events(), 3).await;
    let query = r#"SELECT id AS "bank.k", name AS "it's ""n""" FROM src QUALIFY row_number() OVER (PARTITION BY id ORDER BY version DESC) = 1"#;
    let destination = json!({"kind": "sqlite", "path": dir.0.join("out.db"), "table": "odd"});
    let (status, body) = server
        .create_sync(
            json!({"name": "odd", "query": query, "mode": "mirror", "keys": ["bank.k"], "destination": destination}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let counts = |run: &serde_json::Value| (run["inserted"].as_i64(), run["updated"].as_i64(), run["deleted"].as_i64());
    assert_eq!(counts(&server.run_sync("odd").await), (Some(3), Some(0), Some(0)));
    assert_eq!(counts(&server.run_sync("odd").await), (Some(0), Some(0), Some(0)), "an idle run sends nothing");
    push(&server, &key, json!([{"id": 2, "version": 2, "name": "renamed", "gone": false}]), 4).await;
    assert_eq!(counts(&server.run_sync("odd").await), (Some(0), Some(1), Some(0)));
}
