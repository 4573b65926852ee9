//! Streams into DuckLake tables (SQLite catalog, data in a local folder): HTTP push appended
//! exactly once across two kill -9 with a column added mid-stream, and Postgres CDC mirrored
//! (snapshot, updates, deletes) equal to the source. The lake is read back by Python's duckdb
//! with the same ducklake extension, a reader independent of Sluice.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

use crate::harness::{DataDir, Server, wait_slowly, wait_until};
use crate::postgres::Postgres;

fn extensions() -> String {
    std::env::var("SLUICE_DUCKDB_EXTENSIONS").expect("SLUICE_DUCKDB_EXTENSIONS: run the tests through scripts/test.sh")
}

pub fn lake_destination(lake: &Path) -> Value {
    json!({"kind": "ducklake", "catalog": format!("sqlite:{}", lake.join("meta.sqlite").display()),
           "data_path": format!("{}/", lake.join("data").display())})
}

/// The rows of `sql` on the lake as `|`-joined values (NULL as `-`), read by Python's duckdb;
/// `None` while the lake cannot be read (not made yet, or its catalog busy).
pub fn read(lake: &Path, sql: &str) -> Option<Vec<String>> {
    let script = format!(
        "import duckdb, os, sys\n\
         meta = {meta:?}\n\
         if not os.path.exists(meta): sys.exit(3)\n\
         c = duckdb.connect(); c.execute('SET enable_progress_bar = false')\n\
         c.execute(\"SET extension_directory = '{ext}'; SET autoinstall_known_extensions = false; \
         SET autoload_known_extensions = false; LOAD ducklake; LOAD sqlite_scanner\")\n\
         c.execute(\"ATTACH 'ducklake:sqlite:\" + meta + \"' AS lake (DATA_PATH '{data}/', READ_ONLY)\")\n\
         c.execute('USE lake')\n\
         for r in c.execute({sql:?}).fetchall():\n    print('|'.join('-' if v is None else str(v) for v in r))\n",
        meta = lake.join("meta.sqlite").display().to_string(),
        data = lake.join("data").display(),
        ext = extensions(),
    );
    let python = std::env::var("PYTOOLS_PYTHON").expect("PYTOOLS_PYTHON: run the tests through scripts/test.sh");
    let out = std::process::Command::new(python).args(["-c", &script]).output().expect("run python");
    if !out.status.success() && out.status.code() != Some(3) {
        // Captured by the test harness: shown only when the test fails.
        println!("the lake could not be read: {}", String::from_utf8_lossy(&out.stderr).trim_end());
    }
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect())
}

/// Rows the stream has committed to its destination, from its metrics (cheap to poll).
async fn written(server: &Server, stream: &str) -> i64 {
    server.get(&format!("/api/streams/{stream}/metrics")).await.1["rows_written"].as_i64().unwrap_or(0)
}

pub fn count(lake: &Path, table: &str) -> i64 {
    read(lake, &format!("SELECT count(*) FROM \"{table}\""))
        .and_then(|l| l.first().and_then(|n| n.parse().ok()))
        .unwrap_or(0)
}

#[tokio::test]
async fn http_push_to_ducklake_exactly_once_across_two_kill_9_with_a_column_added_mid_stream() {
    let dir = DataDir::new("dest-ducklake");
    let lake = DataDir::new("dest-ducklake-lake");
    let mut server = Server::start(&dir.0).await;
    let key = server
        .create_stream(json!({"name": "o", "table": "events", "destination": lake_destination(&lake.0),
                              "flush": {"max_wait_ms": 50}}))
        .await;
    // 300 pushes of 10 events, a `coupon` from the 150th on, each retried with its
    // Idempotency-Key across the restart.
    const PUSHES: usize = 300;
    const TOTAL: i64 = (PUSHES * 10) as i64;
    let base = Arc::new(Mutex::new(server.base.clone()));
    let pushing = crate::harness::push_orders(base.clone(), "o", key, PUSHES, 30);
    // Two kills, at random points of the first and the second half.
    for half in 0..2i64 {
        let threshold = 300 + half * 1200 + (rand::random::<u64>() % 600) as i64;
        wait_until("events in the lake", Duration::from_secs(240), || async {
            written(&server, "o").await >= threshold
        })
        .await;
        server.kill9();
        let seen = count(&lake.0, "events");
        assert!(seen < TOTAL, "the kill came after the last event ({seen}): it tests nothing");
        server = Server::start(&dir.0).await;
        *base.lock().unwrap() = server.base.clone();
    }
    pushing.await.unwrap();
    wait_slowly("every event in the lake", Duration::from_secs(240), || count(&lake.0, "events") >= TOTAL).await;
    let (_, metrics) = server.get("/api/streams/o/metrics").await;
    let check = read(
        &lake.0,
        "SELECT count(*), count(DISTINCT id), count(coupon), min(id), max(id), \
         sum((coupon IS DISTINCT FROM (CASE WHEN id >= 1500 THEN 'c' || id END))::int), \
         sum((amount IS DISTINCT FROM (id % 97) + 0.5)::int) FROM events",
    );
    assert_eq!(check, Some(vec!["3000|3000|1500|0|2999|0|0".to_string()]), "each event once: {metrics}");
    // The position is in the lake, committed in the same snapshot as the rows.
    let positions = read(&lake.0, "SELECT owner, json_valid(checkpoint)::int FROM sluice_positions");
    assert_eq!(positions, Some(vec!["o|1".to_string()]));
    assert_eq!(metrics["state"], "running", "{metrics}");
}

#[tokio::test]
async fn postgres_cdc_mirrored_into_ducklake_equals_the_source() {
    let pg = Postgres::start();
    pg.sql(
        "CREATE TABLE accounts (id int PRIMARY KEY, name text, amount numeric(12,2), at timestamptz);
         INSERT INTO accounts SELECT g, 'n' || g, g * 1.25, timestamptz '2024-01-01 00:00:00+00' + g * interval '1 minute'
           FROM generate_series(1, 5000) g;",
    );
    let dir = DataDir::new("dest-ducklake-cdc");
    let lake = DataDir::new("dest-ducklake-cdc-lake");
    let mut server = Server::start(&dir.0).await;
    server
        .create_stream(json!({
            "name": "m", "table": "[table]", "destination": lake_destination(&lake.0),
            "source": {"type": "postgres", "host": "127.0.0.1", "port": pg.port, "database": "etltest",
                       "user": "etl", "password": "etl", "tables": ["public.accounts"], "snapshot_chunk_rows": 1000},
            "flush": {"max_wait_ms": 20},
        }))
        .await;
    wait_slowly("the snapshot in the lake", Duration::from_secs(240), || count(&lake.0, "accounts") >= 5000).await;
    pg.sql(
        "UPDATE accounts SET amount = amount + 1, name = NULL WHERE id % 7 = 0;
         DELETE FROM accounts WHERE id % 11 = 0;
         INSERT INTO accounts VALUES (9001, 'new', 0.5, now());",
    );
    server.kill9();
    server = Server::start(&dir.0).await;
    pg.sql("UPDATE accounts SET name = 'after' WHERE id <= 20;");
    const ROWS: &str = "SELECT count(*), count(name), sum(amount), sum(id), \
                        count(*) FILTER (WHERE name = 'after') FROM accounts";
    let want = pg.lines(ROWS);
    // psql prints numeric sums as they are; duckdb's DECIMAL sum prints the same digits.
    wait_slowly("the lake to equal the source", Duration::from_secs(240), || {
        read(&lake.0, ROWS).is_some_and(|got| got == want)
    })
    .await;
    let (_, metrics) = server.get("/api/streams/m/metrics").await;
    assert_eq!(metrics["state"], "running", "{metrics}");
}

/// A push stream into a DuckLake table starts from the table's columns after a restart: text
/// in an integer column goes to the ledger, fractions widen the column to DOUBLE. A sync
/// delivers into the lake through the same destination: upserts by key, one snapshot a run.
#[tokio::test]
async fn lake_columns_are_fitted_and_widened_and_a_sync_upserts_into_the_lake() {
    let dir = DataDir::new("dest-ducklake-fit");
    let lake = DataDir::new("dest-ducklake-fit-lake");
    let mut server = Server::start(&dir.0).await;
    let key = server
        .create_stream(json!({"name": "p", "table": "scores", "destination": lake_destination(&lake.0),
                              "flush": {"max_wait_ms": 20}}))
        .await;
    let (status, answer) = server.push("p", &key, r#"[{"id": 1, "score": 5}, {"id": 2, "score": 6}]"#).await;
    assert_eq!(status, 202, "{answer}");
    wait_slowly("the first rows", Duration::from_secs(120), || count(&lake.0, "scores") == 2).await;
    server.kill9();
    server = Server::start(&dir.0).await;
    let (status, answer) = server.push("p", &key, r#"{"id": 3, "score": "lots"}"#).await;
    assert_eq!((status, answer["rejected"].clone()), (202, json!(1)), "{answer}");
    let (status, answer) = server.push("p", &key, r#"{"id": 4, "score": 2.5}"#).await;
    assert_eq!(status, 202, "{answer}");
    let rows = || read(&lake.0, "SELECT id, score, typeof(score) FROM scores ORDER BY id");
    wait_slowly("the widened column", Duration::from_secs(120), || {
        rows().is_some_and(|r| r == ["1|5.0|DOUBLE", "2|6.0|DOUBLE", "3|-|DOUBLE", "4|2.5|DOUBLE"])
    })
    .await;

    // A sync from the workspace into the lake, upserting by key.
    let source = server
        .create_stream(json!({"name": "people", "table": "people", "metadata": {"position": true},
                              "flush": {"max_wait_ms": 20}}))
        .await;
    let (status, _) = server.push("people", &source, r#"[{"id": 1, "name": "a"}, {"id": 2, "name": "b"}]"#).await;
    assert_eq!(status, 202);
    wait_until("people in the workspace", Duration::from_secs(30), || async { server.count("people").await == 2 })
        .await;
    let mut destination = lake_destination(&lake.0);
    destination["table"] = json!("people_copy");
    let (status, body) = server
        .create_sync(json!({"name": "to_lake", "mode": "upsert", "keys": ["id"], "destination": destination,
                            "query": "SELECT id, arg_max(name, _position) AS name FROM people GROUP BY id"}))
        .await;
    assert_eq!(status, 201, "{body}");
    let run = server.run_sync("to_lake").await;
    assert_eq!(run["status"], "succeeded", "{run}");
    let (status, _) = server.push("people", &source, r#"[{"id": 2, "name": "B"}, {"id": 3, "name": "c"}]"#).await;
    assert_eq!(status, 202);
    wait_until("more people", Duration::from_secs(30), || async { server.count("people").await == 4 }).await;
    let run = server.run_sync("to_lake").await;
    assert_eq!(
        (run["status"].clone(), run["inserted"].clone(), run["updated"].clone()),
        (json!("succeeded"), json!(1), json!(1)),
        "{run}"
    );
    assert_eq!(
        read(&lake.0, "SELECT id, name FROM people_copy ORDER BY id"),
        Some(vec!["1|a".to_string(), "2|B".to_string(), "3|c".to_string()])
    );

    // Without the extensions the destination is refused, saying what is missing and where.
    let mut destination = lake_destination(&lake.0);
    destination["table"] = json!("t");
    destination["extension_directory"] = json!("/nonexistent");
    let (status, body) = server
        .create_sync(json!({"name": "no_ext", "mode": "replace", "destination": destination, "query": "SELECT 1 AS x"}))
        .await;
    assert_eq!(status, 422, "{body}");
    let text = body.to_string();
    assert!(text.contains("ducklake extension") && text.contains("/nonexistent"), "{text}");

    // A catalog that cannot be reached: refused, and its password is in no answer (DuckDB's
    // Postgres scanner puts the whole connection string in its error).
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let destination = json!({"kind": "ducklake", "table": "t", "data_path": "/tmp/nowhere/",
                             "catalog": format!("postgres:host=127.0.0.1 port={closed} dbname=x user=etl"),
                             "catalog_password": "pw-with 'quote' and \\ backslash"});
    let (status, body) = server
        .create_sync(json!({"name": "no_pg", "mode": "replace", "destination": destination, "query": "SELECT 1 AS x"}))
        .await;
    assert_eq!(status, 422, "{body}");
    assert!(!body.to_string().contains("pw-with"), "{body}");
}

/// A lake whose catalog is a Postgres database and whose files are on S3 (moto): pushed rows
/// land once, read back by Python's duckdb through the same catalog and bucket.
#[tokio::test]
async fn a_lake_with_a_postgres_catalog_and_files_on_s3() {
    let pg = Postgres::start();
    let moto = crate::moto::Moto::start();
    crate::moto::py(&format!("{}s3.create_bucket(Bucket='lake')\n", moto.boto()));
    let dir = DataDir::new("dest-ducklake-s3");
    let server = Server::start(&dir.0).await;
    let destination = json!({
        "kind": "ducklake", "catalog": format!("postgres:host=127.0.0.1 port={} dbname=etltest user=etl", pg.port),
        "catalog_password": "etl", "data_path": "s3://lake/tables/",
        "s3": {"endpoint": moto.endpoint, "access_key_id": "test", "secret_access_key": "test"},
    });
    let key = server
        .create_stream(
            json!({"name": "s", "table": "events", "destination": destination, "flush": {"max_wait_ms": 20}}),
        )
        .await;
    for round in 0..3 {
        let events: Vec<Value> = (0..20).map(|i| json!({"id": round * 20 + i, "v": format!("r{round}")})).collect();
        let (status, answer) = server.push("s", &key, Value::Array(events).to_string()).await;
        assert_eq!(status, 202, "{answer}");
    }
    let host = moto.endpoint.trim_start_matches("http://").to_string();
    let script = format!(
        "import duckdb\n\
         c = duckdb.connect(); c.execute('SET enable_progress_bar = false')\n\
         c.execute(\"SET extension_directory = '{ext}'; SET autoinstall_known_extensions = false; \
         SET autoload_known_extensions = false; LOAD ducklake; LOAD postgres_scanner; LOAD httpfs\")\n\
         c.execute(\"CREATE SECRET (TYPE s3, KEY_ID 'test', SECRET 'test', REGION 'us-east-1', ENDPOINT '{host}', \
         URL_STYLE 'path', USE_SSL false)\")\n\
         c.execute(\"ATTACH 'ducklake:postgres:host=127.0.0.1 port={port} dbname=etltest user=etl password=etl' AS lake \
         (DATA_PATH 's3://lake/tables/', READ_ONLY)\")\n\
         print(c.execute('SELECT count(*), count(DISTINCT id), min(id), max(id) FROM lake.events').fetchone())\n",
        ext = extensions(),
        port = pg.port,
    );
    let python = std::env::var("PYTOOLS_PYTHON").expect("PYTOOLS_PYTHON: run the tests through scripts/test.sh");
    let out = std::process::Command::new(python).args(["-c", &script]).output().expect("run python");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "(60, 60, 0, 59)");
    // The files are in the bucket.
    let listed = crate::moto::py(&format!(
        "{}print(sum(1 for o in s3.list_objects_v2(Bucket='lake').get('Contents', []) if o['Key'].endswith('.parquet')))\n",
        moto.boto()
    ));
    assert!(listed.trim().parse::<u32>().unwrap() >= 1, "{listed}");
}
