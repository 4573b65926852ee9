//! Debezium change events over Kafka, mirrored into a MariaDB table: the last change per key
//! wins, deletes delete, a column appears mid-stream, history keeps every change, and two
//! kill -9 of Sluice change nothing (the position commits with the rows in MariaDB).

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{Value, json};

use crate::broker::{Broker, produce_keyed};
use crate::harness::{DataDir, Server, wait_until};
use crate::mariadb::MariaDb;

/// A MySQL-connector change event for `customers` (row `n` of binlog position `n`).
fn event(n: u64, op: &str, before: Value, after: Value) -> String {
    json!({"schema": null, "payload": {"op": op, "before": before, "after": after, "ts_ms": 1_700_000_000_000u64 + n,
        "source": {"connector": "mysql", "db": "shop", "table": "customers", "file": "binlog.000001",
                   "pos": 1000 + n, "row": 0, "ts_ms": 1_700_000_000_000u64 + n}}})
    .to_string()
}

/// A Kafka message: key and value (`None`: a tombstone).
pub type Message = (Option<String>, Option<String>);

/// The changes, and the final rows as `id|name|balance|tier` lines.
pub fn changes(total: u64) -> (Vec<Message>, Vec<String>) {
    let mut rows: BTreeMap<u64, Value> = BTreeMap::new();
    let mut out = Vec::new();
    for n in 0..total {
        let id = n % 500;
        // From the middle on, rows carry a `tier`: a column added mid-stream.
        let row = |version: u64| {
            let mut r =
                json!({"id": id, "name": format!("c{id}-v{version}"), "balance": (version % 1000) as f64 / 4.0});
            if n >= total / 2 {
                r["tier"] = json!(format!("t{}", version % 3));
            }
            r
        };
        let key = Some(json!({"schema": null, "payload": {"id": id}}).to_string());
        let (value, tombstone) = match (rows.get(&id).cloned(), n % 7) {
            (None, _) => {
                rows.insert(id, row(n));
                (event(n, "c", Value::Null, row(n)), false)
            }
            (Some(old), 3) => {
                rows.remove(&id);
                (event(n, "d", old, Value::Null), true)
            }
            (Some(old), _) => {
                rows.insert(id, row(n));
                (event(n, "u", old, row(n)), false)
            }
        };
        out.push((key.clone(), Some(value)));
        if tombstone {
            out.push((key, None));
        }
    }
    let want = rows
        .values()
        .map(|r| {
            let tier = r.get("tier").and_then(Value::as_str).unwrap_or("NULL");
            format!("{}|{}|{}|{tier}", r["id"], r["name"].as_str().unwrap(), r["balance"].as_f64().unwrap())
        })
        .collect();
    (out, want)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debezium_over_kafka_mirrored_into_mariadb_exactly_once_across_two_kill_9() {
    let db = MariaDb::start();
    let broker = Broker::start();
    broker.create_topic("cdc", 1);
    let dir = DataDir::new("dest-mariadb");
    let mut server = Server::start(&dir.0).await;
    let mut stream = crate::kafka::kafka_stream("m", "customers", &broker, json!(["cdc"]));
    stream["mode"] = json!("mirror");
    stream["format"] = json!("debezium");
    stream["history"] = json!(true);
    // Small units, so that a backlog after a restart is written in many steps a kill can split.
    stream["flush"] = json!({"max_rows": 500, "max_wait_ms": 50});
    stream["destination"] = json!({"kind": "mysql", "host": "127.0.0.1", "port": db.port, "database": "etltest",
                                   "user": "etl", "password": "etl"});
    server.create_stream(stream).await;

    const TOTAL: u64 = 20_000;
    let (messages, want) = changes(TOTAL);
    let recorded = messages.iter().filter(|(_, v)| v.is_some()).count();
    let producer = broker.producer(&[]);
    let producing = tokio::spawn(async move {
        // About ten seconds of changes.
        for chunk in messages.chunks(200) {
            produce_keyed(&producer, "cdc", chunk).await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let history = |db: &MariaDb| -> i64 {
        let exists = db.lines("SELECT count(*) FROM information_schema.tables WHERE table_name = 'customers__changes'");
        if exists[0] == "0" {
            return 0;
        }
        db.lines("SELECT count(*) FROM customers__changes")[0].parse().unwrap()
    };
    for round in 0..2 {
        let threshold = 3_000 * (round + 1) + (rand::random::<u64>() % 3_000) as i64;
        wait_until("changes in MariaDB", Duration::from_secs(120), || async { history(&db) >= threshold }).await;
        server.kill9();
        let seen = history(&db);
        assert!(seen < recorded as i64, "the kill came after the last change ({seen}): it tests nothing");
        server = Server::start(&dir.0).await;
    }
    producing.await.unwrap();
    wait_until("every change in the history", Duration::from_secs(180), || async { history(&db) >= recorded as i64 })
        .await;
    let rows = db.lines("SELECT id, name, balance, coalesce(tier, 'NULL') FROM customers ORDER BY id");
    assert_eq!(rows, want, "the mirror equals the final state");
    let once = db.lines("SELECT count(*), count(DISTINCT _sequence) FROM customers__changes");
    assert_eq!(once, [format!("{recorded}|{recorded}")], "every change once in the history");
    let key = db.lines(
        "SELECT column_name FROM information_schema.key_column_usage WHERE table_name = 'customers' \
         AND constraint_name = 'PRIMARY'",
    );
    assert_eq!(key, ["id"]);
    let stamp = db.lines("SELECT owner FROM sluice_positions");
    assert_eq!(stamp, ["m"]);
    let (_, metrics) = server.get("/api/streams/m/metrics").await;
    assert_eq!(metrics["state"], "running", "{metrics}");
}

/// A push stream into a MariaDB table it names starts from that table's columns: a value that
/// does not fit goes to the ledger (also after a restart), and a column of integers that gets
/// fractions becomes DOUBLE.
#[tokio::test]
async fn values_are_fitted_to_the_mariadb_table_and_widen_it() {
    let db = MariaDb::start();
    db.admin("CREATE TABLE etltest.people (id BIGINT, score INT, name VARCHAR(20))");
    let dir = DataDir::new("dest-mariadb-fit");
    let mut server = Server::start(&dir.0).await;
    let destination = json!({"kind": "mysql", "host": "127.0.0.1", "port": db.port, "database": "etltest",
                             "user": "etl", "password": "etl"});
    let key = server
        .create_stream(
            json!({"name": "p", "table": "people", "destination": destination, "flush": {"max_wait_ms": 20}}),
        )
        .await;
    let rows = || db.lines("SELECT id, COALESCE(score, 'NULL'), name FROM people ORDER BY id");
    let (status, answer) = server
        .push("p", &key, r#"[{"id": 1, "score": 5, "name": "a"}, {"id": 2, "score": "lots", "name": "b"}]"#)
        .await;
    assert_eq!((status, answer["accepted"].clone(), answer["rejected"].clone()), (202, json!(2), json!(1)), "{answer}");
    wait_until("the fitting rows", Duration::from_secs(30), || async { rows() == ["1|5|a", "2|NULL|b"] }).await;
    server.kill9();
    server = Server::start(&dir.0).await;
    let (status, answer) = server.push("p", &key, r#"{"id": 4, "score": "x", "name": "d"}"#).await;
    assert_eq!((status, answer["rejected"].clone()), (202, json!(1)), "{answer}");
    let (status, answer) = server.push("p", &key, r#"{"id": 3, "score": 2.5, "name": "c"}"#).await;
    assert_eq!(status, 202, "{answer}");
    wait_until("the widened row", Duration::from_secs(30), || async {
        rows() == ["1|5|a", "2|NULL|b", "3|2.5|c", "4|NULL|d"]
    })
    .await;
    let types = db.lines(
        "SELECT data_type FROM information_schema.columns WHERE table_schema = 'etltest' AND table_name = 'people' \
         AND column_name = 'score'",
    );
    assert_eq!(types, ["double"]);
    let ledger = server.sql(r#"SELECT "column" FROM sluice.rejects ORDER BY 1"#).await;
    assert_eq!(ledger.len(), 2, "{ledger:?}");
    let (_, metrics) = server.get("/api/streams/p/metrics").await;
    assert_eq!(metrics["state"], "running", "{metrics}");
}
