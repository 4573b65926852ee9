//! Debezium fidelity: truncates, unchanged-TOAST placeholders, MySQL durations, variable-scale
//! decimals and ledger rows under replay. Events have the shapes Debezium's documentation gives
//! for its Postgres and MySQL connectors (the real engine's own events are in debezium_real.rs).

use serde_json::{Value, json};

use crate::harness::{DataDir, Server};

/// A Postgres connector event for `public.items` at `lsn`.
pub(crate) fn pg(op: &str, lsn: u64, after: Value) -> Value {
    json!({
        "before": null, "after": after, "op": op, "ts_ms": 1_700_000_000_000u64 + lsn,
        "source": {"version": "3.6.3.Final", "connector": "postgresql", "name": "dbserver1",
                   "ts_ms": 1_700_000_000_000u64 + lsn, "snapshot": "false", "db": "inventory",
                   "schema": "public", "table": "items", "txId": 700 + lsn, "lsn": lsn},
    })
}

/// Debezium's documented truncate event: no images, the table in `source`.
fn pg_truncate(lsn: u64) -> Value {
    let mut e = pg("t", lsn, Value::Null);
    e.as_object_mut().unwrap().remove("before");
    e.as_object_mut().unwrap().remove("after");
    e
}

async fn stream(server: &Server, name: &str, history: bool) -> String {
    server
        .create_stream(json!({
            "name": name, "table": format!("{name}_[table]"), "mode": "mirror", "format": "debezium",
            "keys": ["id"], "history": history,
        }))
        .await
}

async fn ids(server: &Server, table: &str) -> Vec<i64> {
    server
        .sql(&format!("SELECT id FROM \"{table}\" ORDER BY id"))
        .await
        .iter()
        .map(|r| r["id"].as_i64().unwrap())
        .collect()
}

async fn ops(server: &Server, table: &str) -> Vec<String> {
    server
        .sql(&format!("SELECT _op FROM \"{table}__changes\" ORDER BY _sequence"))
        .await
        .iter()
        .map(|r| r["_op"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn a_truncate_empties_the_table_in_order_and_replays_do_not_clear_again() {
    let dir = DataDir::new("dbz-truncate");
    let server = Server::start(&dir.0).await;
    let events: Vec<Value> = vec![
        pg("c", 10, json!({"id": 1, "name": "a"})),
        pg("c", 20, json!({"id": 2, "name": "b"})),
        pg("c", 30, json!({"id": 3, "name": "c"})),
        pg_truncate(40),
        pg("c", 50, json!({"id": 4, "name": "d"})),
    ];
    // One event per write unit, and all of them in one unit.
    let single = stream(&server, "one", true).await;
    for e in &events {
        assert_eq!(server.push("one", &single, e.to_string()).await.0, 202);
    }
    let batched = stream(&server, "all", true).await;
    assert_eq!(server.push("all", &batched, Value::Array(events.clone()).to_string()).await.0, 202);
    for (name, key) in [("one", &single), ("all", &batched)] {
        let table = format!("{name}_items");
        assert_eq!(ids(&server, &table).await, [4], "{name}");
        assert_eq!(ops(&server, &table).await, ["insert", "insert", "insert", "truncate", "insert"], "{name}");
        // Replaying everything (one unit, then one by one) clears nothing written after it.
        assert_eq!(server.push(name, key, Value::Array(events.clone()).to_string()).await.0, 202);
        for e in &events {
            assert_eq!(server.push(name, key, e.to_string()).await.0, 202);
        }
        assert_eq!(ids(&server, &table).await, [4], "{name}: replayed");
        assert_eq!(ops(&server, &table).await.len(), 5, "{name}: no new history");
        // A later truncate still applies, and a change after it.
        let later = json!([pg_truncate(60), pg("c", 70, json!({"id": 5, "name": "e"}))]);
        assert_eq!(server.push(name, key, later.to_string()).await.0, 202);
        assert_eq!(ids(&server, &table).await, [5], "{name}: later truncate");
    }
    let rejects = server.sql("SELECT count(*) AS n FROM sluice.rejects").await;
    assert_eq!(rejects[0]["n"], json!(0), "a truncate is no reject");
}

#[tokio::test]
async fn an_unchanged_toast_placeholder_keeps_the_previous_value() {
    let dir = DataDir::new("dbz-toast");
    let server = Server::start(&dir.0).await;
    let key = stream(&server, "toast", true).await;
    let body = "x".repeat(9_600);
    let ph = "__debezium_unavailable_value";
    let insert = pg("c", 10, json!({"id": 1, "body": body, "tags": ["a", "b"], "n": 1}));
    assert_eq!(server.push("toast", &key, insert.to_string()).await.0, 202);
    // The text form and the text-array form, in their own unit.
    let update = pg("u", 20, json!({"id": 1, "body": ph, "tags": [ph], "n": 2}));
    assert_eq!(server.push("toast", &key, update.to_string()).await.0, 202);
    // In one unit: a new key, then an update of it with the placeholder; and a key that has
    // a placeholder from the start (no value to keep: NULL).
    let unit = json!([
        pg("c", 30, json!({"id": 2, "body": "second", "tags": ["c"], "n": 1})),
        pg("u", 40, json!({"id": 2, "body": ph, "tags": ["d"], "n": 2})),
        pg("u", 50, json!({"id": 2, "body": ph, "tags": [ph], "n": 3})),
        pg("u", 60, json!({"id": 3, "body": ph, "n": 1})),
    ]);
    assert_eq!(server.push("toast", &key, unit.to_string()).await.0, 202);
    let rows =
        server.sql("SELECT id, length(body) AS len, body, tags::VARCHAR AS tags, n FROM toast_items ORDER BY id").await;
    assert_eq!(rows[0]["len"], json!(9_600), "{:?}", rows[0]["body"].as_str().map(|b| &b[..40.min(b.len())]));
    assert_eq!((&rows[0]["tags"], &rows[0]["n"]), (&json!(r#"["a","b"]"#), &json!(2)));
    assert_eq!((&rows[1]["body"], &rows[1]["tags"], &rows[1]["n"]), (&json!("second"), &json!(r#"["d"]"#), &json!(3)));
    assert_eq!((&rows[2]["body"], &rows[2]["n"]), (&Value::Null, &json!(1)));
    // The history has the values the rows had, not the placeholder.
    let history = server.sql("SELECT count(*) AS n FROM toast_items__changes WHERE body LIKE '%unavailable%'").await;
    assert_eq!(history[0]["n"], json!(0));
    let kept = server.sql("SELECT length(body) AS len FROM toast_items__changes WHERE id = 1 ORDER BY _sequence").await;
    assert_eq!(kept, [json!({"len": 9_600}), json!({"len": 9_600})]);
}

/// A field of an envelope schema.
fn field(name: &str, ty: &str, logical: Option<&str>) -> Value {
    let mut f = json!({"field": name, "type": ty, "optional": true});
    if let Some(l) = logical {
        f["name"] = json!(l);
    }
    f
}

/// An event with its schema (`schemas.enable`), from `connector`.
fn wrapped(fields: Vec<Value>, op: &str, image: Value, source: Value) -> Value {
    let image_schema = |side: &str| json!({"type": "struct", "optional": true, "field": side, "fields": fields});
    let (before, after) = if op == "d" { (image, Value::Null) } else { (Value::Null, image) };
    json!({
        "schema": {"type": "struct", "name": "Envelope", "fields": [image_schema("before"), image_schema("after")]},
        "payload": {"before": before, "after": after, "source": source, "op": op, "ts_ms": 1_700_000_000_000u64},
    })
}

fn mysql_source(pos: u64) -> Value {
    json!({"version": "3.6.3.Final", "connector": "mysql", "name": "dbserver1", "ts_ms": 1_700_000_000_000u64,
           "snapshot": "false", "db": "inventory", "table": "clock", "server_id": 223344, "gtid": null,
           "file": "mysql-bin.000003", "pos": pos, "row": 0, "thread": 7, "query": null})
}

#[tokio::test]
async fn mysql_times_are_durations_and_a_value_that_cannot_convert_is_null_plus_a_ledger_row() {
    let dir = DataDir::new("dbz-time");
    let server = Server::start(&dir.0).await;
    let key = server
        .create_stream(json!({"name": "t", "table": "[table]", "mode": "mirror", "format": "debezium", "keys": ["id"]}))
        .await;
    let fields = || vec![field("id", "int32", None), field("c_time", "int64", Some("io.debezium.time.MicroTime"))];
    // MySQL TIME -01:30:00.5 and 838:59:59, then a delete of the negative one.
    let events = json!([
        wrapped(fields(), "c", json!({"id": 1, "c_time": -5_400_500_000i64}), mysql_source(100)),
        wrapped(fields(), "c", json!({"id": 2, "c_time": 3_020_399_000_000i64}), mysql_source(200)),
        wrapped(fields(), "c", json!({"id": 3, "c_time": 30_600_000_000i64}), mysql_source(300)),
        wrapped(fields(), "d", json!({"id": 3, "c_time": 30_600_000_000i64}), mysql_source(400)),
    ]);
    assert_eq!(server.push("t", &key, events.to_string()).await.0, 202);
    let ty = server
        .sql("SELECT data_type FROM information_schema.columns WHERE table_name = 'clock' AND column_name = 'c_time'")
        .await;
    assert_eq!(ty[0]["data_type"], json!("INTERVAL"));
    let rows = server.sql("SELECT id, c_time::VARCHAR AS t FROM clock ORDER BY id").await;
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert_eq!(rows[0]["t"], json!("-01:30:00.5"));
    assert_eq!(rows[1]["t"], json!("838:59:59"));
    let delete = wrapped(fields(), "d", json!({"id": 1, "c_time": -5_400_500_000i64}), mysql_source(500));
    assert_eq!(server.push("t", &key, delete.to_string()).await.0, 202);
    assert_eq!(server.sql("SELECT id FROM clock").await, [json!({"id": 2})]);

    // From Postgres a time is a time of day: 24:00:00.000001 does not fit TIME. The column is
    // NULL with a ledger row; the rest of the change lands.
    let pg_fields = vec![
        field("id", "int32", None),
        field("opens", "int64", Some("io.debezium.time.MicroTime")),
        field("name", "string", None),
    ];
    let source = json!({"connector": "postgresql", "db": "d", "schema": "public", "table": "shop", "lsn": 10});
    let event = wrapped(pg_fields, "c", json!({"id": 1, "opens": 86_400_000_001i64, "name": "Main"}), source);
    assert_eq!(server.push("t", &key, event.to_string()).await.0, 202);
    let shop = server.sql("SELECT id, opens, name FROM shop").await;
    assert_eq!(shop, [json!({"id": 1, "opens": null, "name": "Main"})]);
    let rejects = server.sql("SELECT \"table\", \"column\", expected_type, value, reason FROM sluice.rejects").await;
    assert_eq!(rejects.len(), 1, "{rejects:?}");
    assert_eq!(rejects[0]["column"], json!("opens"));
    assert_eq!(rejects[0]["expected_type"], json!("TIME"));
    assert_eq!(rejects[0]["value"], json!("86400000001"));
    assert!(rejects[0]["reason"].as_str().unwrap().contains("time of day out of range"), "{rejects:?}");
    // Replaying the change adds no second ledger row.
    let again = server.push("t", &key, event.to_string()).await;
    assert_eq!(again.0, 202);
    let n = server.sql("SELECT count(*) AS n FROM sluice.rejects").await;
    assert_eq!(n[0]["n"], json!(1), "the replay's ledger row is not added again");
}

#[tokio::test]
async fn variable_scale_decimals_are_kept_exactly_whatever_the_first_scale() {
    let dir = DataDir::new("dbz-vsd");
    let server = Server::start(&dir.0).await;
    let key = server
        .create_stream(json!({"name": "v", "table": "[table]", "mode": "mirror", "format": "debezium", "keys": ["id"]}))
        .await;
    let fields =
        || vec![field("id", "int32", None), field("amount", "struct", Some("io.debezium.data.VariableScaleDecimal"))];
    let source =
        |lsn: u64| json!({"connector": "postgresql", "db": "d", "schema": "public", "table": "ledger", "lsn": lsn});
    let values = [
        // 0.12345678901234567890: scale 20 first.
        (1, json!({"scale": 20, "value": "AKtUqYzrHwrS"}), "0.12345678901234567890"),
        (2, json!({"scale": 1, "value": "BrFOn4EvNmw5"}), "12345678901234567890.5"),
        (
            3,
            json!({"scale": 3, "value": "BYk25SetZ57DqpLvW3x08eLfeQ=="}),
            "123456789012345678901234567890123456789012.345",
        ),
        (4, json!({"scale": 0, "value": "+w=="}), "-5"),
    ];
    for (id, amount, _) in &values {
        let e = wrapped(fields(), "c", json!({"id": id, "amount": amount}), source(*id as u64 * 10));
        assert_eq!(server.push("v", &key, e.to_string()).await.0, 202);
    }
    let ty = server
        .sql("SELECT data_type FROM information_schema.columns WHERE table_name = 'ledger' AND column_name = 'amount'")
        .await;
    assert_eq!(ty[0]["data_type"], json!("VARCHAR"));
    let rows = server.sql("SELECT amount FROM ledger ORDER BY id").await;
    let want: Vec<Value> = values.iter().map(|(_, _, text)| json!({"amount": text})).collect();
    assert_eq!(rows, want);
    let n = server.sql("SELECT count(*) AS n FROM sluice.rejects").await;
    assert_eq!(n[0]["n"], json!(0));
}

#[tokio::test]
async fn replaying_changes_adds_no_second_ledger_row() {
    let dir = DataDir::new("dbz-ledger-replay");
    let server = Server::start(&dir.0).await;
    let key = stream(&server, "r", true).await;
    // `n` is BIGINT from the first change; the second's text does not fit: NULL plus a ledger
    // row, the change itself applied.
    let events =
        json!([pg("c", 10, json!({"id": 1, "n": 1})), pg("c", 20, json!({"id": 2, "n": "many", "name": "b"}))]);
    assert_eq!(server.push("r", &key, events.to_string()).await.0, 202);
    let ledger = || async { server.sql("SELECT \"column\", value FROM sluice.rejects").await };
    assert_eq!(ledger().await, [json!({"column": "n", "value": "\"many\""})]);
    // The same file again, whole and event by event: table, history and ledger stay.
    assert_eq!(server.push("r", &key, events.to_string()).await.0, 202);
    for e in events.as_array().unwrap() {
        assert_eq!(server.push("r", &key, e.to_string()).await.0, 202);
    }
    assert_eq!(ledger().await.len(), 1, "no second ledger row");
    assert_eq!(ops(&server, "r_items").await.len(), 2);
    assert_eq!(ids(&server, "r_items").await, [1, 2]);
    // A new change at a later position still gets its ledger row.
    let later = pg("u", 30, json!({"id": 2, "n": "more"}));
    assert_eq!(server.push("r", &key, later.to_string()).await.0, 202);
    assert_eq!(ledger().await.len(), 2);
}

#[tokio::test]
async fn a_kafka_replay_of_a_debezium_mirror_keeps_each_ledger_row_once() {
    use crate::broker::{Broker, produce_keyed};
    use crate::harness::wait_until;
    use crate::kafka::{kafka_stream, rows};
    use std::time::Duration;

    let broker = Broker::start();
    broker.create_topic("dbz.items", 1);
    let dir = DataDir::new("dbz-replay-kafka");
    let server = Server::start(&dir.0).await;
    let mut config = kafka_stream("k", "k_[table]", &broker, json!(["dbz.items"]));
    config["mode"] = json!("mirror");
    config["format"] = json!("debezium");
    config["keys"] = json!(["id"]);
    server.create_stream(config).await;
    let producer = broker.producer(&[]);
    // A value that does not fit (a ledger row for one column) and an event that is not JSON
    // (a ledger row for the whole event).
    let message = |id: i64, event: Value| (Some(json!({"id": id}).to_string()), Some(event.to_string()));
    let values = vec![
        message(1, pg("c", 10, json!({"id": 1, "n": 1}))),
        message(2, pg("c", 20, json!({"id": 2, "n": "many"}))),
        (Some(json!({"id": 9}).to_string()), Some("not json".to_string())),
    ];
    produce_keyed(&producer, "dbz.items", &values).await;
    let ledger = || async {
        let r = server
            .sql("SELECT coalesce(\"column\", '-') AS c, count(*) AS n FROM sluice.rejects GROUP BY 1 ORDER BY 1")
            .await;
        r.iter().map(|r| (r["c"].as_str().unwrap().to_string(), r["n"].as_i64().unwrap())).collect::<Vec<_>>()
    };
    let want = [("-".to_string(), 1), ("n".to_string(), 1)];
    wait_until("two ledger rows", Duration::from_secs(90), || async {
        let got = ledger().await;
        got == want
    })
    .await;
    let r = server
        .http
        .post(server.url("/api/streams/k/replay"))
        .json(&json!({"from": "offsets", "offsets": {"dbz.items": {"0": 0}}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // A later change shows the stream has read past the replayed range.
    produce_keyed(&producer, "dbz.items", &[message(3, pg("c", 30, json!({"id": 3, "n": 3})))]).await;
    wait_until("the later change", Duration::from_secs(90), || async { rows(&server, "k_items").await == 3 }).await;
    wait_until("the whole event ledgered again", Duration::from_secs(30), || async { ledger().await.len() == 2 }).await;
    assert_eq!(ledger().await, want, "each ledger row once after the replay");
}
