//! Staged loads into PostgreSQL: units land in a local stage and are loaded every few hundred
//! milliseconds in one transaction each. Kafka orders arrive exactly once across two kill -9
//! (a column added mid-stream), in far fewer transactions than units; Debezium changes
//! pushed in many small units end equal to their last images, merged across units.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Value, json};

use crate::broker::Broker;
use crate::harness::{DataDir, Server, wait_until};
use crate::postgres::Postgres;

fn postgres_destination(pg: &Postgres) -> Value {
    json!({"kind": "postgres", "host": "127.0.0.1", "port": pg.port, "database": "etltest", "user": "etl",
           "password": "etl", "schema": "public"})
}

fn pg_count(pg: &Postgres, table: &str) -> i64 {
    pg.count_in("etltest", &format!("public.{table}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_to_postgres_staged_exactly_once_across_two_kill_9_in_few_transactions() {
    let pg = Postgres::start();
    let broker = Broker::start();
    broker.create_topic("orders", 3);
    let dir = DataDir::new("dest-staged");
    let mut server = Server::start(&dir.0).await;
    let mut stream = crate::kafka::kafka_stream("o", "events", &broker, json!(["orders"]));
    stream["destination"] = postgres_destination(&pg);
    stream["stage"] = json!({"every_ms": 400});
    stream["flush"] = json!({"max_rows": 200, "max_wait_ms": 20});
    server.create_stream(stream).await;

    const TOTAL: usize = 20_000;
    let producer = broker.producer(&[]);
    // The producer stays at most 4,000 orders ahead of each kill's threshold: on a loaded
    // machine it once finished during a restart, and one load took the rest.
    let limit = Arc::new(AtomicUsize::new(0));
    let producing = crate::broker::produce_orders_up_to(producer, "orders", TOTAL, 200, 120, limit.clone());
    for round in 0..2 {
        let threshold = 3_000 * (round + 1) + (rand::random::<u64>() % 4_000) as i64;
        limit.store(threshold as usize + 4_000, Ordering::SeqCst);
        wait_until("rows in the destination", Duration::from_secs(120), || async {
            pg_count(&pg, "events") >= threshold
        })
        .await;
        server.kill9();
        let seen = pg_count(&pg, "events");
        assert!(seen < TOTAL as i64, "the kill came after the last row ({seen}): it tests nothing");
        server = Server::start(&dir.0).await;
    }
    limit.store(TOTAL, Ordering::SeqCst);
    producing.await.unwrap();
    wait_until("every order in the destination", Duration::from_secs(180), || async {
        pg_count(&pg, "events") >= TOTAL as i64
    })
    .await;
    let check = pg.lines(
        "SELECT count(*), count(DISTINCT id), count(coupon), \
         count(*) FILTER (WHERE coupon IS DISTINCT FROM CASE WHEN id >= 10000 THEN 'c' || id END) FROM events",
    );
    assert_eq!(check, ["20000|20000|10000|0"], "each order once, coupons where sent");
    // Units of at most 200 rows, loaded in bulk: far fewer transactions than units.
    let transactions: i64 = pg.lines("SELECT count(DISTINCT xmin::text) FROM events")[0].parse().unwrap();
    assert!(transactions < (TOTAL / 200 / 3) as i64, "{transactions} transactions for at least 100 units");
    wait_until("nothing left in the stage", Duration::from_secs(10), || async {
        server.get("/api/streams/o/metrics").await.1["destination"]["pending_rows"].as_f64() == Some(0.0)
    })
    .await;
    let (_, metrics) = server.get("/api/streams/o/metrics").await;
    assert!(metrics["destination"]["last_load_ms"].as_f64() > Some(0.0), "{metrics}");
}

/// A Debezium change for `public.items` at `lsn`, as a pushed key/value pair.
fn change(op: &str, lsn: u64, id: i64, before: Value, after: Value) -> String {
    let value = json!({
        "before": before, "after": after, "op": op, "ts_ms": 1_700_000_000_000u64 + lsn,
        "source": {"version": "3.6.3.Final", "connector": "postgresql", "name": "dbserver1",
                   "ts_ms": 1_700_000_000_000u64 + lsn, "snapshot": "false",
                   "db": "inventory", "schema": "public", "table": "items", "txId": 700 + lsn, "lsn": lsn},
    });
    json!({"key": {"id": id}, "value": value}).to_string()
}

#[tokio::test]
async fn staged_mirror_changes_across_many_units_end_at_the_last_image() {
    let pg = Postgres::start();
    let dir = DataDir::new("dest-staged-mirror");
    let server = Server::start(&dir.0).await;
    let key = server
        .create_stream(json!({
            "name": "m", "table": "[table]", "mode": "mirror", "format": "debezium", "keys": ["id"],
            "history": true, "destination": postgres_destination(&pg), "stage": {"every_ms": 500},
            "flush": {"max_wait_ms": 10},
        }))
        .await;
    // 60 keys, each inserted, updated twice and every third deleted (then one re-inserted),
    // one push per change: many small units merged into few loads.
    let mut lsn = 10;
    let mut want = Vec::new();
    for id in 0..60i64 {
        let row = |qty: i64| json!({"id": id, "qty": qty});
        let mut changes = vec![
            change("c", lsn, id, Value::Null, row(0)),
            change("u", lsn + 1, id, row(0), row(1)),
            change("u", lsn + 2, id, row(1), row(2)),
        ];
        if id % 3 == 0 {
            changes.push(change("d", lsn + 3, id, row(2), Value::Null));
            if id == 30 {
                changes.push(change("c", lsn + 4, id, Value::Null, row(9)));
                want.push(format!("{id}|9"));
            }
        } else {
            want.push(format!("{id}|2"));
        }
        lsn += 5;
        for c in changes {
            let (status, body) = server.push("m", &key, c).await;
            assert_eq!(status, 202, "{body}");
        }
    }
    want.sort();
    wait_until("the mirror at its last images", Duration::from_secs(60), || async {
        pg_count(&pg, "items") > 0 && {
            let mut got = pg.lines("SELECT id, qty FROM items");
            got.sort();
            got == want
        }
    })
    .await;
    let history = pg.lines("SELECT _op, count(*) FROM items__changes GROUP BY 1 ORDER BY 1");
    assert_eq!(history, ["delete|20", "insert|61", "update|120"], "every change once in the history");
    let transactions: i64 = pg.lines("SELECT count(DISTINCT xmin::text) FROM items__changes")[0].parse().unwrap();
    assert!(transactions < 100, "{transactions} transactions for 201 pushed units");
}
