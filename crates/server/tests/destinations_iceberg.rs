//! Streams and syncs into Iceberg tables of a real REST catalog (lakana-server, PyPI), written
//! through DuckDB's iceberg extension and read back by pyiceberg: HTTP push and Kafka appended
//! exactly once across two kill -9 with a column added mid-stream, Postgres CDC mirrored (snapshot,
//! updates, deletes) equal to the source, a Debezium mirror compacted (its position deletes
//! folded into one file), a mirror sync whose inserts, updates and deletes show
//! after each run, and a warehouse on S3 (moto), compacted there.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;

use crate::harness::{DataDir, Server, wait_slowly, wait_until};
use crate::iceberg_rest::IcebergRest;
use crate::postgres::Postgres;

async fn written(server: &Server, stream: &str) -> i64 {
    server.get(&format!("/api/streams/{stream}/metrics")).await.1["rows_written"].as_i64().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn http_push_to_iceberg_exactly_once_across_two_kill_9_with_a_column_added_mid_stream() {
    let catalog = IcebergRest::start();
    let dir = DataDir::new("dest-iceberg");
    let mut server = Server::start(&dir.0).await;
    let key = server
        .create_stream(json!({"name": "o", "table": "events", "destination": catalog.destination(),
                              "flush": {"max_wait_ms": 50}}))
        .await;
    const PUSHES: usize = 300;
    const TOTAL: i64 = (PUSHES * 10) as i64;
    let base = Arc::new(Mutex::new(server.base.clone()));
    let pushing = crate::harness::push_orders(base.clone(), "o", key, PUSHES, 30);
    for half in 0..2i64 {
        let threshold = 300 + half * 1200 + (rand::random::<u64>() % 600) as i64;
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
    let (_, metrics) = server.get("/api/streams/o/metrics").await;
    let check = catalog.read(
        "events",
        "SELECT count(*), count(DISTINCT id), count(coupon), min(id), max(id), \
         sum((coupon IS DISTINCT FROM (CASE WHEN id >= 1500 THEN 'c' || id END))::int), \
         sum((amount IS DISTINCT FROM (id % 97) + 0.5)::int) FROM t",
    );
    assert_eq!(check, Some(vec!["3000|3000|1500|0|2999|0|0".to_string()]), "each event once: {metrics}");
    assert_eq!(metrics["state"], "running", "{metrics}");
}

#[tokio::test(flavor = "multi_thread")]
async fn kafka_to_iceberg_append_exactly_once_across_two_kill_9() {
    let catalog = IcebergRest::start();
    let broker = crate::broker::Broker::start();
    broker.create_topic("orders", 3);
    let dir = DataDir::new("dest-iceberg-kafka");
    let mut server = Server::start(&dir.0).await;
    let mut stream = crate::kafka::kafka_stream("k", "orders", &broker, json!(["orders"]));
    stream["destination"] = catalog.destination();
    stream["flush"] = json!({"max_rows": 1000, "max_wait_ms": 50});
    server.create_stream(stream).await;
    // 6,000 orders over about six seconds; from the 3,000th on they carry a `coupon`.
    const TOTAL: usize = 6_000;
    let producing = crate::broker::produce_orders(broker.producer(&[]), "orders", TOTAL, 100, 100);
    for round in 0..2i64 {
        let threshold = 800 * (round + 1) + (rand::random::<u64>() % 1_200) as i64;
        wait_until("orders in the table", Duration::from_secs(180), || async {
            written(&server, "k").await >= threshold
        })
        .await;
        server.kill9();
        let seen = catalog.count("orders");
        assert!(seen < TOTAL as i64, "the kill came after the last order ({seen}): it tests nothing");
        server = Server::start(&dir.0).await;
    }
    producing.await.unwrap();
    wait_slowly("every order in the table", Duration::from_secs(240), || catalog.count("orders") >= TOTAL as i64).await;
    let check = catalog.read(
        "orders",
        "SELECT count(*), count(DISTINCT id), count(coupon), min(id), max(id), \
         count(*) FILTER (WHERE coupon IS DISTINCT FROM CASE WHEN id >= 3000 THEN 'c' || id END) FROM t",
    );
    assert_eq!(check, Some(vec!["6000|6000|3000|0|5999|0".to_string()]), "each order once");
}

/// Debezium change events over Kafka mirrored into an Iceberg table (deletes as position
/// deletes, a column added mid-stream), across two kill -9: the table equals the final state.
#[tokio::test(flavor = "multi_thread")]
async fn debezium_over_kafka_mirrored_into_iceberg_across_two_kill_9() {
    let catalog = IcebergRest::start();
    let broker = crate::broker::Broker::start();
    broker.create_topic("cdc", 1);
    let dir = DataDir::new("dest-iceberg-debezium");
    let mut server = Server::start(&dir.0).await;
    let mut stream = crate::kafka::kafka_stream("d", "customers", &broker, json!(["cdc"]));
    stream["mode"] = json!("mirror");
    stream["format"] = json!("debezium");
    stream["flush"] = json!({"max_rows": 500, "max_wait_ms": 50});
    stream["destination"] = catalog.destination();
    server.create_stream(stream).await;
    const TOTAL: u64 = 6_000;
    let (messages, want) = crate::destinations_mariadb::changes(TOTAL);
    let producer = broker.producer(&[]);
    let producing = tokio::spawn(async move {
        for chunk in messages.chunks(200) {
            crate::broker::produce_keyed(&producer, "cdc", chunk).await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    for round in 0..2i64 {
        let threshold = 1_000 * (round + 1) + (rand::random::<u64>() % 1_000) as i64;
        wait_until("changes in the table", Duration::from_secs(180), || async {
            written(&server, "d").await >= threshold
        })
        .await;
        server.kill9();
        server = Server::start(&dir.0).await;
    }
    producing.await.unwrap();
    // printf('%g'): whole balances print as Rust prints them (250, not 250.0).
    let rows = || {
        catalog
            .read("customers", "SELECT id, name, printf('%g', balance), coalesce(tier, 'NULL') FROM t ORDER BY id")
            .unwrap_or_default()
    };
    let last = want.last().cloned();
    wait_slowly("the last change in the table", Duration::from_secs(240), || rows().last() == last.as_ref()).await;
    wait_slowly("the table to equal the final state", Duration::from_secs(60), || rows() == want).await;
    assert_eq!(rows(), want);
    // A compaction folds the mirror's position deletes into one file of the live rows.
    let r = server.http.post(server.url("/api/streams/d/compact")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let report: serde_json::Value = r.json().await.unwrap();
    assert!(report["before"]["delete_files"].as_u64() > Some(0), "{report}");
    assert_eq!((report["after"]["files"].as_u64(), report["after"]["delete_files"].as_u64()), (Some(1), Some(0)));
    assert_eq!(rows(), want, "the final state after the compaction: {report}");
    let (_, metrics) = server.get("/api/streams/d/metrics").await;
    assert_eq!(metrics["state"], "running", "{metrics}");
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_cdc_mirrored_into_iceberg_equals_the_source() {
    let catalog = IcebergRest::start();
    let pg = Postgres::start();
    let read = |sql: &str| catalog.read("accounts", sql);
    let (_dir, server, _) =
        postgres_cdc_mirror_equals_the_source(&pg, "dest-iceberg-cdc", catalog.destination(), 3000, read).await;
    let (_, metrics) = server.get("/api/streams/m/metrics").await;
    assert_eq!(metrics["state"], "running", "{metrics}");
}

/// What a mirror of `accounts` is compared with the source by, over `t` or `accounts`.
pub const ACCOUNT_FIGURES: &str =
    "SELECT count(*), count(name), sum(amount), sum(id), count(*) FILTER (WHERE name = 'after')";

/// `rows` accounts in `pg`, mirrored by a Postgres CDC stream `m` into `destination`: the
/// snapshot, then updates, deletes and an insert, a kill -9, and more updates; waits until
/// `read` (SQL over the table as `t`) gives the source's [`ACCOUNT_FIGURES`]. The server and
/// those figures, for more checks.
pub async fn postgres_cdc_mirror_equals_the_source(
    pg: &Postgres,
    dir: &str,
    destination: serde_json::Value,
    rows: i64,
    read: impl Fn(&str) -> Option<Vec<String>>,
) -> (DataDir, Server, Vec<String>) {
    pg.sql(&format!(
        "CREATE TABLE accounts (id int PRIMARY KEY, name text, amount numeric(12,2));
         INSERT INTO accounts SELECT g, 'n' || g, g * 1.25 FROM generate_series(1, {rows}) g;"
    ));
    let dir = DataDir::new(dir);
    let mut server = Server::start(&dir.0).await;
    server
        .create_stream(json!({
            "name": "m", "table": "accounts", "destination": destination,
            "source": {"type": "postgres", "host": "127.0.0.1", "port": pg.port, "database": "etltest",
                       "user": "etl", "password": "etl", "tables": ["public.accounts"], "snapshot_chunk_rows": 1000},
            "flush": {"max_wait_ms": 20},
        }))
        .await;
    let count = || read("SELECT count(*) FROM t").and_then(|l| l.first().and_then(|n| n.parse::<i64>().ok()));
    wait_slowly("the snapshot in the table", Duration::from_secs(240), || count().unwrap_or(0) >= rows).await;
    pg.sql(
        "UPDATE accounts SET amount = amount + 1, name = NULL WHERE id % 7 = 0;
         DELETE FROM accounts WHERE id % 11 = 0;
         INSERT INTO accounts VALUES (9001, 'new', 0.5);",
    );
    server.kill9();
    server = Server::start(&dir.0).await;
    pg.sql("UPDATE accounts SET name = 'after' WHERE id <= 20;");
    let want = pg.lines(&format!("{ACCOUNT_FIGURES} FROM accounts"));
    wait_slowly("the table to equal the source", Duration::from_secs(240), || {
        read(&format!("{ACCOUNT_FIGURES} FROM t")).is_some_and(|got| got == want)
    })
    .await;
    (dir, server, want)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_mirror_sync_into_iceberg_shows_inserts_updates_and_deletes_after_each_run() {
    let catalog = IcebergRest::start();
    let rows = || catalog.read("people_copy", "SELECT id, name FROM t ORDER BY id");
    mirror_sync_shows_each_run("dest-iceberg-sync", catalog.destination(), rows).await;
}

/// A workspace table of people and a mirror sync of it into `destination`'s table
/// `people_copy`, run twice: the rows after each (`rows`, `id|name` in id order) show the
/// inserts, then an insert, an update and a delete. The server and the stream's push key, for
/// more checks.
pub async fn mirror_sync_shows_each_run(
    dir: &str,
    destination: serde_json::Value,
    rows: impl Fn() -> Option<Vec<String>>,
) -> (DataDir, Server, String) {
    mirror_sync_shows_each_run_with(dir, destination, rows, None).await
}

/// [`mirror_sync_shows_each_run`] on a server started with `env`, its log written to `log`.
pub async fn mirror_sync_shows_each_run_with(
    dir: &str,
    mut destination: serde_json::Value,
    rows: impl Fn() -> Option<Vec<String>>,
    logged: Option<(&std::path::Path, &[(&str, &str)])>,
) -> (DataDir, Server, String) {
    let dir = DataDir::new(dir);
    let server = match logged {
        Some((log, env)) => Server::start_logged_env(&dir.0, log, env).await,
        None => Server::start(&dir.0).await,
    };
    let key = server
        .create_stream(json!({"name": "people", "table": "people", "metadata": {"position": true},
                              "flush": {"max_wait_ms": 20}}))
        .await;
    let first = r#"[{"id": 1, "name": "a", "gone": false}, {"id": 2, "name": "b", "gone": false}]"#;
    assert_eq!(server.push("people", &key, first).await.0, 202);
    wait_until("people in the workspace", Duration::from_secs(30), || async { server.count("people").await == 2 })
        .await;
    destination["table"] = json!("people_copy");
    let query = "SELECT id, arg_max(name, _position) AS name FROM people GROUP BY id HAVING NOT bool_or(gone)";
    let (status, body) = server
        .create_sync(json!({"name": "to_ice", "mode": "mirror", "keys": ["id"], "destination": destination,
                            "query": query}))
        .await;
    assert_eq!(status, 201, "{body}");
    let run = server.run_sync("to_ice").await;
    assert_eq!(run["status"], "succeeded", "{run}");
    assert_eq!(rows(), Some(vec!["1|a".to_string(), "2|b".to_string()]));
    let body =
        r#"[{"id": 2, "name": "B", "gone": false}, {"id": 3, "name": "c", "gone": false}, {"id": 1, "gone": true}]"#;
    assert_eq!(server.push("people", &key, body).await.0, 202);
    wait_until("the changes in the workspace", Duration::from_secs(30), || async { server.count("people").await == 5 })
        .await;
    let run = server.run_sync("to_ice").await;
    assert_eq!(
        (run["status"].clone(), run["inserted"].clone(), run["updated"].clone(), run["deleted"].clone()),
        (json!("succeeded"), json!(1), json!(1), json!(1)),
        "{run}"
    );
    assert_eq!(rows(), Some(vec!["2|B".to_string(), "3|c".to_string()]));
    (dir, server, key)
}

/// A warehouse on S3 (moto): the rows of a push stream, exactly once across a kill -9, in data
/// files in the bucket, read back by pyiceberg from there.
#[tokio::test(flavor = "multi_thread")]
async fn an_iceberg_table_with_its_files_on_s3() {
    let moto = crate::moto::Moto::start();
    crate::moto::py(&format!("{}s3.create_bucket(Bucket='ice')\n", moto.boto()));
    let catalog = IcebergRest::start_on_s3(&moto.endpoint, "ice");
    let dir = DataDir::new("dest-iceberg-s3");
    let mut server = Server::start(&dir.0).await;
    let key = server
        .create_stream(json!({"name": "s", "table": "events", "destination": catalog.destination(),
                              "flush": {"max_wait_ms": 20}}))
        .await;
    for round in 0..6 {
        if round == 3 {
            server.kill9();
            server = Server::start(&dir.0).await;
        }
        let events: Vec<serde_json::Value> = (0..20).map(|i| json!({"id": round * 20 + i})).collect();
        let body = serde_json::Value::Array(events).to_string();
        let r = server
            .http
            .post(server.url("/api/streams/s/push"))
            .bearer_auth(&key)
            .header("idempotency-key", format!("round-{round}"))
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 202, "{}", r.text().await.unwrap());
    }
    wait_slowly("every row in the table", Duration::from_secs(120), || catalog.count("events") >= 120).await;
    assert_eq!(catalog.read("events", "SELECT count(*), count(DISTINCT id) FROM t"), Some(vec!["120|120".to_string()]));
    let listed = crate::moto::py(&format!(
        "{}print(sum(o['Key'].endswith('.parquet') for o in s3.list_objects_v2(Bucket='ice')['Contents']))\n",
        moto.boto()
    ));
    assert!(listed.trim().parse::<u32>().unwrap() >= 1, "data files in the bucket: {listed}");
    // Compaction writes its file and manifests into the bucket too.
    let r = server.http.post(server.url("/api/streams/s/compact")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let report: serde_json::Value = r.json().await.unwrap();
    assert!(report["before"]["files"].as_u64() > Some(1) && report["after"]["files"] == 1, "{report}");
    assert_eq!(catalog.read("events", "SELECT count(*), count(DISTINCT id) FROM t"), Some(vec!["120|120".to_string()]));
}

/// An integer column that then gets fractions: Iceberg cannot widen an integer column to double,
/// so the rows whose value has a fraction go to the ledger with that reason, whole values land,
/// and the stream goes on (it used to retry the same write for ever).
#[tokio::test(flavor = "multi_thread")]
async fn fractions_for_an_iceberg_integer_column_go_to_the_ledger_and_the_stream_goes_on() {
    let catalog = IcebergRest::start();
    let dir = DataDir::new("dest-iceberg-fractions");
    let server = Server::start(&dir.0).await;
    let key = server
        .create_stream(json!({"name": "f", "table": "events", "destination": catalog.destination(),
                              "flush": {"max_wait_ms": 20}}))
        .await;
    let first: Vec<serde_json::Value> = (0..5).map(|i| json!({"id": i, "n": i * 10})).collect();
    assert_eq!(server.push("f", &key, serde_json::Value::Array(first).to_string()).await.0, 202);
    wait_slowly("the first rows", Duration::from_secs(120), || catalog.count("events") >= 5).await;
    // 5..9: two with fractions, three whole (as doubles: the stream's column is now a double).
    let second =
        r#"[{"id": 5, "n": 5.5}, {"id": 6, "n": 60.0}, {"id": 7, "n": 7.25}, {"id": 8, "n": 80}, {"id": 9, "n": 90}]"#;
    assert_eq!(server.push("f", &key, second).await.0, 202);
    let later = r#"[{"id": 10, "n": 100}]"#;
    assert_eq!(server.push("f", &key, later).await.0, 202);
    wait_slowly("the whole values", Duration::from_secs(120), || catalog.count("events") >= 9).await;
    assert_eq!(
        catalog.read("events", "SELECT count(*), sum(n), max(id) FROM t"),
        Some(vec![format!("9|{}|10", 10 + 20 + 30 + 40 + 60 + 80 + 90 + 100)])
    );
    let ledger = server.lines("SELECT reason LIKE '%cannot widen%' FROM sluice.rejects WHERE stream = 'f'").await;
    assert_eq!(ledger, ["true", "true"], "the two rows with fractions, with the reason");
    let (_, metrics) = server.get("/api/streams/f/metrics").await;
    assert_eq!(metrics["state"], "running", "{metrics}");
}
