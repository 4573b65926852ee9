//! Streams and syncs into Iceberg tables of a SQL catalog (the JDBC catalog's tables), written
//! through DuckDB's iceberg extension and Sluice's REST front for the catalog, and read back by
//! pyiceberg's SqlCatalog and DuckDB: HTTP push into a SQLite catalog exactly once across two
//! kill -9 with a column added mid-stream, then compacted; Postgres CDC mirrored into a catalog
//! kept in Postgres; a mirror sync whose inserts, updates and deletes show after each run, its
//! files (metadata and data) in an S3 bucket (moto), and a run that fails at its commit leaves
//! the table as it was.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;

use crate::harness::{DataDir, Server, wait_slowly, wait_until};
use crate::iceberg_sql::IcebergSql;
use crate::postgres::Postgres;

async fn written(server: &Server, stream: &str) -> i64 {
    server.get(&format!("/api/streams/{stream}/metrics")).await.1["rows_written"].as_i64().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn http_push_into_an_iceberg_sql_catalog_exactly_once_across_two_kill_9_then_compacted() {
    let catalog = IcebergSql::sqlite();
    catalog.made_by_pyiceberg();
    let dir = DataDir::new("dest-iceberg-sql");
    let mut server = Server::start(&dir.0).await;
    let key = server
        .create_stream(json!({"name": "o", "table": "events", "destination": catalog.destination(),
                              "flush": {"max_wait_ms": 50}}))
        .await;
    const PUSHES: usize = 200;
    const TOTAL: i64 = (PUSHES * 10) as i64;
    let base = Arc::new(Mutex::new(server.base.clone()));
    let pushing = crate::harness::push_orders(base.clone(), "o", key, PUSHES, 30);
    for half in 0..2i64 {
        let threshold = 200 + half * 800 + (rand::random::<u64>() % 400) as i64;
        wait_until("events in the table", Duration::from_secs(240), || async {
            written(&server, "o").await >= threshold
        })
        .await;
        server.kill9();
        let seen = catalog.count("events");
        assert!(seen < TOTAL, "the kill came after the last event ({seen}): it tests nothing");
        server = Server::start(&dir.0).await;
        *base.lock().unwrap() = server.base.clone();
    }
    pushing.await.unwrap();
    wait_slowly("every event in the table", Duration::from_secs(240), || catalog.count("events") >= TOTAL).await;
    const CHECK: &str = "SELECT count(*), count(DISTINCT id), count(coupon), min(id), max(id), \
         sum((coupon IS DISTINCT FROM (CASE WHEN id >= 1000 THEN 'c' || id END))::int), \
         sum((amount IS DISTINCT FROM (id % 97) + 0.5)::int) FROM t";
    let want = Some(vec!["2000|2000|1000|0|1999|0|0".to_string()]);
    let (_, metrics) = server.get("/api/streams/o/metrics").await;
    assert_eq!(catalog.read("events", CHECK), want, "each event once, by pyiceberg: {metrics}");
    assert_eq!(catalog.duckdb_read("events", CHECK), want, "each event once, by DuckDB");
    // The stream's position rides in the table's properties, committed with the rows.
    assert_eq!(catalog.property_keys("events", "sluice.position."), vec!["sluice.position.o".to_string()]);
    // Compaction commits through the same front: one file, the same rows, for both readers.
    let r = server.http.post(server.url("/api/streams/o/compact")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let report: serde_json::Value = r.json().await.unwrap();
    assert!(report["before"]["files"].as_u64() > Some(1) && report["after"]["files"] == 1, "{report}");
    assert_eq!(catalog.read("events", CHECK), want, "after the compaction: {report}");
    assert_eq!(catalog.duckdb_read("events", CHECK), want);
    assert_eq!(metrics["state"], "running", "{metrics}");
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_cdc_mirrored_into_an_iceberg_catalog_kept_in_postgres() {
    let pg = Postgres::start();
    let catalog = IcebergSql::postgres(&pg);
    // The catalog's tables as the JDBC catalog's first version made them (Trino's too): without
    // `iceberg_type`.
    pg.sql(
        "CREATE TABLE iceberg_tables (catalog_name varchar(255) NOT NULL, table_namespace varchar(255) NOT NULL,
           table_name varchar(255) NOT NULL, metadata_location varchar(1000), previous_metadata_location varchar(1000),
           PRIMARY KEY (catalog_name, table_namespace, table_name));
         CREATE TABLE iceberg_namespace_properties (catalog_name varchar(255) NOT NULL, namespace varchar(255) NOT NULL,
           property_key varchar(255), property_value varchar(1000), PRIMARY KEY (catalog_name, namespace, property_key));",
    );
    let read = |sql: &str| catalog.read("accounts", sql);
    let (_dir, server, want) = crate::destinations_iceberg::postgres_cdc_mirror_equals_the_source(
        &pg,
        "dest-iceberg-sql-cdc",
        catalog.destination(),
        2000,
        read,
    )
    .await;
    let figures = format!("{} FROM t", crate::destinations_iceberg::ACCOUNT_FIGURES);
    assert_eq!(catalog.duckdb_read("accounts", &figures), Some(want));
    // The catalog's row, as the JDBC catalog keeps it, in the same Postgres.
    let row = pg.lines(
        "SELECT catalog_name, table_namespace, table_name, previous_metadata_location IS NOT NULL FROM iceberg_tables",
    );
    assert_eq!(row, vec!["lake|bronze|accounts|t".to_string()]);
    let (_, metrics) = server.get("/api/streams/m/metrics").await;
    assert_eq!(metrics["state"], "running", "{metrics}");
}

/// The catalog's database commits the second run's swap, and its answer is lost
/// (`SLUICE_LOSE_AT`): the front reads the pointer again, finds the new metadata there and
/// answers the commit, so the run succeeds and the table reads (before, it answered 503 and
/// DuckDB removed the files of the snapshot the pointer named).
#[tokio::test(flavor = "multi_thread")]
async fn a_lost_answer_from_the_catalog_database_leaves_the_sync_succeeded_and_the_table_whole() {
    let catalog = IcebergSql::sqlite();
    let rows = || catalog.read("people_copy", "SELECT id, name FROM t ORDER BY id");
    let log = DataDir::new("dest-iceberg-sql-lost-log");
    let log = log.0.join("sluice.log");
    let env = [("SLUICE_LOSE_AT", "iceberg-sql.swap:2")];
    let _run = crate::destinations_iceberg::mirror_sync_shows_each_run_with(
        "dest-iceberg-sql-lost",
        catalog.destination(),
        rows,
        Some((&log, &env)),
    )
    .await;
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("SLUICE_LOSE_AT reached iceberg-sql.swap"), "the second run's answer was lost");
    // The front found the swap in the database: the writer heard a success, not a failure it
    // then had to read back.
    assert!(!text.contains("answer was lost; the table holds it"), "the front answered the commit");
    let by_duckdb = catalog.duckdb_read("people_copy", "SELECT id, name FROM t ORDER BY id");
    assert_eq!(by_duckdb, Some(vec!["2|B".to_string(), "3|c".to_string()]));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_mirror_sync_into_an_iceberg_sql_catalog_on_s3_shows_inserts_updates_and_deletes() {
    let moto = crate::moto::Moto::start();
    crate::moto::py(&format!("{}s3.create_bucket(Bucket='ice')\n", moto.boto()));
    let catalog = IcebergSql::sqlite_on_s3(&moto.endpoint, "ice");
    let rows = || catalog.read("people_copy", "SELECT id, name FROM t ORDER BY id");
    let (_dir, server, key) =
        crate::destinations_iceberg::mirror_sync_shows_each_run("dest-iceberg-sql-sync", catalog.destination(), rows)
            .await;
    let by_duckdb = catalog.duckdb_read("people_copy", "SELECT id, name FROM t ORDER BY id");
    assert_eq!(by_duckdb, Some(vec!["2|B".to_string(), "3|c".to_string()]));
    // The table's metadata and data files are in the bucket.
    let listed = crate::moto::py(&format!(
        "{}keys = [o['Key'] for o in s3.list_objects_v2(Bucket='ice')['Contents']]\n\
         print(sum(k.endswith('.metadata.json') for k in keys), sum(k.endswith('.parquet') for k in keys))\n",
        moto.boto()
    ));
    let counts: Vec<u32> = listed.split_whitespace().map(|n| n.parse().unwrap()).collect();
    assert!(counts.len() == 2 && counts[0] >= 3 && counts[1] >= 2, "metadata and data files in the bucket: {listed}");
    // A run that fails halfway: its files are written, then the catalog cannot take the
    // commit (another client holds the SQLite catalog's write lock). Nothing is committed, and
    // the next run delivers every change since the last good one (the hashes did not move).
    let body =
        r#"[{"id": 3, "name": "C", "gone": false}, {"id": 4, "name": "d", "gone": false}, {"id": 2, "gone": true}]"#;
    assert_eq!(server.push("people", &key, body).await.0, 202);
    wait_until("the changes in the workspace", Duration::from_secs(30), || async { server.count("people").await == 8 })
        .await;
    let before = catalog.metadata_location("people_copy");
    assert!(before.is_some());
    let lock = catalog.hold_write_lock();
    let run = server.run_sync("to_ice").await;
    drop(lock);
    assert_eq!(run["status"], "failed", "{run}");
    assert_eq!(catalog.metadata_location("people_copy"), before, "no commit");
    assert_eq!(rows(), Some(vec!["2|B".to_string(), "3|c".to_string()]));
    let run = server.run_sync("to_ice").await;
    assert_eq!(
        (run["status"].clone(), run["inserted"].clone(), run["updated"].clone(), run["deleted"].clone()),
        (json!("succeeded"), json!(1), json!(1), json!(1)),
        "{run}"
    );
    assert_eq!(rows(), Some(vec!["3|C".to_string(), "4|d".to_string()]));
    // A config that names no database for the catalog is refused with the field.
    let mut wrong = catalog.destination();
    wrong["table"] = json!("x");
    wrong["sql"] = json!({"location": "file:///tmp/w"});
    let (status, body) = server
        .create_sync(json!({"name": "bad", "mode": "append", "destination": wrong, "query": "SELECT 1 AS a"}))
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(body.to_string().contains("destination.sql.host"), "{body}");
}
