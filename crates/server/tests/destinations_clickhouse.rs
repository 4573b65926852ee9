//! Streams and syncs into ClickHouse (a real 18.16 server), checked with `clickhouse-client`:
//! Kafka appended exactly once across two kill -9 (a position table, and the rows of a unit
//! that never ended deleted before it is written again); Debezium over Kafka mirrored through a
//! ReplacingMergeTree across a kill -9, equal to the final state; a sync in upsert mode.

use std::time::Duration;

use serde_json::json;

use crate::broker::{Broker, produce_keyed};
use crate::clickhouse::ClickHouse;
use crate::harness::{DataDir, Server, wait_until};

fn destination(ch: &ClickHouse) -> serde_json::Value {
    json!({"kind": "clickhouse", "url": ch.url()})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_to_clickhouse_append_exactly_once_across_two_kill_9() {
    let ch = ClickHouse::start();
    let broker = Broker::start();
    broker.create_topic("orders", 3);
    let dir = DataDir::new("dest-ch");
    let mut server = Server::start(&dir.0).await;
    let mut stream = crate::kafka::kafka_stream("o", "events", &broker, json!(["orders"]));
    stream["destination"] = destination(&ch);
    stream["flush"] = json!({"max_rows": 1000, "max_wait_ms": 50});
    server.create_stream(stream).await;

    // From the 15,000th on, orders carry a `coupon`: a column added mid-stream.
    const TOTAL: usize = 30_000;
    let producing = crate::broker::produce_orders(broker.producer(&[]), "orders", TOTAL, 500, 100);
    for round in 0..2 {
        let threshold = 4_000 * (round + 1) + (rand::random::<u64>() % 6_000) as i64;
        wait_until("rows in ClickHouse", Duration::from_secs(120), || async { ch.count("events") >= threshold }).await;
        server.kill9();
        assert!(ch.count("events") < TOTAL as i64, "the kill came after the last row: it tests nothing");
        server = Server::start(&dir.0).await;
    }
    producing.await.unwrap();
    wait_until("every order in ClickHouse", Duration::from_secs(180), || async {
        ch.lines("SELECT count(DISTINCT id) FROM events")[0] == TOTAL.to_string()
    })
    .await;
    // Wait a moment longer than the stream's units for a duplicate to show, if there were one.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let check = ch.lines(
        "SELECT count(), uniqExact(id), count(coupon), min(id), max(id), \
         countIf(coupon != concat('c', toString(id))) FROM events",
    );
    assert_eq!(check, ["30000|30000|15000|0|29999|0"], "each order once, coupons where sent");
    let types = ch.lines("SELECT name, type FROM system.columns WHERE table = 'events' AND name IN ('id', 'amount', 'coupon') ORDER BY name");
    assert_eq!(types, ["amount|Nullable(Float64)", "coupon|Nullable(String)", "id|Nullable(Int64)"]);
    assert_eq!(ch.lines("SELECT DISTINCT owner FROM sluice_positions"), ["o"]);

    // A crash between a unit's rows and its `done` row, made by hand: a marker, and rows of
    // that unit. On the next start they are deleted before the stream resumes.
    server.kill9();
    ch.lines(
        "INSERT INTO sluice_positions (owner, unit, state, tables, checkpoint, written) \
         VALUES ('o', 999999999, 'writing', ['events'], '', 4611686018427387904)",
    );
    ch.lines("INSERT INTO events (id, amount, coupon, _sluice_unit) SELECT id, amount, coupon, 999999999 FROM events LIMIT 100");
    assert_eq!(ch.count("events"), 30_100);
    let server = Server::start(&dir.0).await;
    wait_until("the unfinished unit's rows deleted", Duration::from_secs(60), || async {
        ch.count("events") == 30_000
    })
    .await;
    assert_eq!(ch.lines("SELECT count(), uniqExact(id) FROM events"), ["30000|30000"]);
    wait_until("the stream running again", Duration::from_secs(60), || async {
        server.get("/api/streams/o/metrics").await.1["state"] == "running"
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debezium_over_kafka_mirrored_into_clickhouse_equals_the_final_state_across_kill_9() {
    let ch = ClickHouse::start();
    let broker = Broker::start();
    broker.create_topic("cdc", 1);
    let dir = DataDir::new("dest-ch-mirror");
    let mut server = Server::start(&dir.0).await;
    let mut stream = crate::kafka::kafka_stream("m", "customers", &broker, json!(["cdc"]));
    stream["mode"] = json!("mirror");
    stream["format"] = json!("debezium");
    stream["history"] = json!(true);
    stream["flush"] = json!({"max_rows": 500, "max_wait_ms": 50});
    stream["destination"] = destination(&ch);
    server.create_stream(stream).await;

    const TOTAL: u64 = 10_000;
    let (messages, want) = crate::destinations_mariadb::changes(TOTAL);
    let recorded = messages.iter().filter(|(_, v)| v.is_some()).count() as i64;
    let producer = broker.producer(&[]);
    let producing = tokio::spawn(async move {
        for chunk in messages.chunks(200) {
            produce_keyed(&producer, "cdc", chunk).await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let threshold = 2_000 + (rand::random::<u64>() % 3_000) as i64;
    wait_until("changes in ClickHouse", Duration::from_secs(120), || async {
        ch.count("customers__changes") >= threshold
    })
    .await;
    server.kill9();
    assert!(ch.count("customers__changes") < recorded, "the kill came after the last change: it tests nothing");
    server = Server::start(&dir.0).await;
    producing.await.unwrap();
    wait_until("every change in the history", Duration::from_secs(180), || async {
        ch.count("customers__changes") >= recorded
    })
    .await;
    let rows =
        ch.lines("SELECT id, name, balance, ifNull(tier, 'NULL') FROM customers FINAL WHERE _deleted = 0 ORDER BY id");
    assert_eq!(rows, want, "the mirror equals the final state");
    let once = ch.lines("SELECT count(), uniqExact(_sequence) FROM customers__changes");
    assert_eq!(once, [format!("{recorded}|{recorded}")], "every change once in the history");
    let engine = ch.lines("SELECT engine FROM system.tables WHERE name = 'customers'");
    assert_eq!(engine, ["ReplacingMergeTree"]);
    let (_, metrics) = server.get("/api/streams/m/metrics").await;
    assert_eq!(metrics["state"], "running", "{metrics}");
}

#[tokio::test]
async fn a_sync_upserts_into_clickhouse() {
    use crate::reverse_etl::{QUERY, first_events, push, second_events, source};
    let ch = ClickHouse::start();
    let dir = DataDir::new("retl-ch");
    let server = Server::start(&dir.0).await;
    let key = source(&server).await;
    push(&server, &key, first_events(), 3).await;
    let mut destination = destination(&ch);
    destination["table"] = json!("people");
    let (status, body) = server
        .create_sync(
            json!({"name": "ch", "query": QUERY, "mode": "upsert", "keys": ["id"], "destination": destination}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(server.run_sync("ch").await["status"], "succeeded");
    let read = || {
        ch.lines("SELECT id, ifNull(toString(amount), 'NULL'), name, toString(ts) FROM people FINAL WHERE _deleted = 0 ORDER BY id")
    };
    assert_eq!(
        read(),
        [
            "1|12.5000|héllo 😀|2024-01-01 08:00:00",
            "2|NULL|ñandú|2024-07-01 04:59:59",
            "3|123456789.1234|plain|2024-03-01 00:00:00"
        ]
    );
    push(&server, &key, second_events(), 6).await;
    let run = server.run_sync("ch").await;
    assert_eq!(
        (run["status"].as_str(), run["inserted"].as_i64(), run["updated"].as_i64()),
        (Some("succeeded"), Some(1), Some(1)),
        "{run}"
    );
    assert_eq!(
        read(),
        [
            "1|12.5000|héllo 😀|2024-01-01 08:00:00",
            "2|7.2500|ñandú|2024-07-01 04:59:59",
            "3|123456789.1234|plain|2024-03-01 00:00:00",
            "4|1.0000|new|2024-01-01 00:00:00"
        ]
    );
    assert!(body["config"]["destination"].get("password").is_none());
}

#[tokio::test]
async fn postgres_cdc_into_clickhouse_follows_the_source() {
    let pg = crate::postgres::Postgres::start();
    pg.sql(
        "CREATE TABLE accounts (id int PRIMARY KEY, owner text, balance numeric(12,2)); \
         INSERT INTO accounts SELECT g, 'o' || g, g * 1.5 FROM generate_series(1, 200) g;",
    );
    let ch = ClickHouse::start();
    let dir = DataDir::new("dest-ch-pg");
    let server = Server::start(&dir.0).await;
    let source = json!({"type": "postgres", "host": "127.0.0.1", "port": pg.port, "database": "etltest",
                        "user": "etl", "password": "etl", "tables": ["public.accounts"]});
    server
        .create_stream(json!({"name": "pg", "table": "[table]", "source": source, "destination": destination(&ch),
                              "flush": {"max_wait_ms": 100}}))
        .await;
    let current = || ch.try_count("SELECT count() FROM accounts FINAL WHERE _deleted = 0");
    wait_until("the snapshot", Duration::from_secs(60), || async { current() == Some(200) }).await;
    pg.sql(
        "UPDATE accounts SET balance = balance + 1000 WHERE id <= 50; DELETE FROM accounts WHERE id > 180; \
         INSERT INTO accounts VALUES (500, 'new', 1);",
    );
    let want = pg.lines("SELECT id || '|' || owner || '|' || balance FROM accounts ORDER BY id");
    wait_until("the changes", Duration::from_secs(60), || async {
        ch.try_lines(
            "SELECT concat(toString(id), '|', owner, '|', toString(balance)) FROM accounts FINAL WHERE _deleted = 0 ORDER BY id",
        ) == Some(want.clone())
    })
    .await;
    assert_eq!(ch.lines("SELECT engine FROM system.tables WHERE name = 'accounts'"), ["ReplacingMergeTree"]);
}
