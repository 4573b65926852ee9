//! Mirror mode: JSON feeds kept latest per key, Debezium change events from every connector
//! (golden fixtures built from Debezium's documented formats), over HTTP push and Kafka, with
//! history, key changes, logical types, and kill -9.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use serde_json::{Value, json};

use crate::broker::{Broker, produce_keyed};
use crate::harness::{DataDir, Server, wait_until};
use crate::kafka::{rows, wait_rows};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/debezium");

/// (message key, event) lines of a fixture file.
fn fixture(name: &str) -> Vec<(Option<String>, Value)> {
    let text = std::fs::read_to_string(format!("{FIXTURES}/{name}.jsonl")).unwrap();
    text.lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            (v["key"].as_str().map(str::to_string), v["value"].clone())
        })
        .collect()
}

async fn wait_changes(server: &Server, table: &str, n: i64) {
    wait_until(&format!("{n} changes in {table}__changes"), Duration::from_secs(60), || async {
        rows(server, &format!("{table}__changes")).await >= n
    })
    .await;
}

#[tokio::test]
async fn a_json_feed_keeps_the_latest_row_per_key() {
    let dir = DataDir::new("mirror-json");
    let server = Server::start(&dir.0).await;
    let key = server
        .create_stream(json!({"name": "latest", "table": "devices", "mode": "mirror", "keys": ["id"], "history": true}))
        .await;
    // Out-of-order keys within one batch; the last event per key wins.
    let batch = json!([
        {"id": 1, "state": "on"}, {"id": 2, "state": "off"}, {"id": 1, "state": "off"},
        {"id": 3, "state": "on"}, {"id": 2, "state": "on", "battery": 0.5}
    ]);
    assert_eq!(server.push("latest", &key, batch.to_string()).await.0, 202);
    assert_eq!(server.push("latest", &key, json!({"id": 3, "state": "off"}).to_string()).await.0, 202);
    let stored = server.sql("SELECT id, state, battery FROM devices ORDER BY id").await;
    assert_eq!(
        stored,
        [
            json!({"id": 1, "state": "off", "battery": null}),
            json!({"id": 2, "state": "on", "battery": 0.5}),
            json!({"id": 3, "state": "off", "battery": null}),
        ]
    );
    let history = server.sql("SELECT id, state, _op FROM devices__changes ORDER BY _sequence").await;
    assert_eq!(history.len(), 6);
    assert!(history.iter().all(|h| h["_op"] == json!("upsert")));
    // An event without its key goes to the ledger; the stream keeps going.
    let (status, _) = server.push("latest", &key, json!({"state": "lost"}).to_string()).await;
    assert_eq!(status, 202);
    let rejects = server.sql("SELECT reason FROM sluice.rejects").await;
    assert!(rejects[0]["reason"].as_str().unwrap().contains("key column `id`"), "{rejects:?}");
    // Config errors name the field.
    for (bad, field) in [
        (json!({"name": "b1", "table": "b1", "mode": "mirror"}), "keys"),
        (json!({"name": "b2", "table": "b2", "format": "debezium"}), "mode"),
        (json!({"name": "b3", "table": "b3", "history": true}), "history"),
    ] {
        let r = server.http.post(server.url("/api/streams")).json(&bad).send().await.unwrap();
        assert_eq!(r.status(), 400);
        let body: Value = r.json().await.unwrap();
        assert!(body.to_string().contains(field), "{field}: {body}");
    }
}

/// The state every relational fixture leads to: 1 updated, 2 moved to 20, 3 deleted and
/// inserted again.
fn expect_relational(stored: &[Value], id: &str, name: &str, email: &str) {
    let got: Vec<(i64, String, String)> = stored
        .iter()
        .map(|r| (r[id].as_i64().unwrap(), r[name].as_str().unwrap().into(), r[email].as_str().unwrap().into()))
        .collect();
    let want = [
        (1, "Anne Marie", "anne@example.com"),
        (3, "Cleo", "cleo@new.example.com"),
        (20, "Bobby", "bobby@example.com"),
    ];
    let want: Vec<(i64, String, String)> = want.iter().map(|(i, n, e)| (*i, n.to_string(), e.to_string())).collect();
    assert_eq!(got, want);
}

#[tokio::test]
async fn debezium_events_of_every_relational_connector_over_http_push() {
    let dir = DataDir::new("mirror-dbz-push");
    let server = Server::start(&dir.0).await;
    for (connector, id, name, email) in [
        ("postgres", "id", "first_name", "email"),
        ("mysql", "id", "first_name", "email"),
        ("sqlserver", "id", "first_name", "email"),
        ("oracle", "ID", "FIRST_NAME", "EMAIL"),
    ] {
        let stream = json!({
            "name": connector, "table": format!("{connector}_[db]_[table]"), "mode": "mirror", "format": "debezium",
            "keys": [id], "history": true,
        });
        let key = server.create_stream(stream).await;
        // One event per request, as a webhook would send them, tombstone included.
        for (_, event) in fixture(connector) {
            let (status, body) = server.push(connector, &key, event.to_string()).await;
            assert_eq!(status, 202, "{connector}: {body}");
        }
        let table = server
            .sql(&format!(
                "SELECT table_name FROM information_schema.tables WHERE table_name LIKE '{connector}\\_%' ESCAPE '\\' \
             AND table_name NOT LIKE '%\\_\\_changes' ESCAPE '\\'"
            ))
            .await;
        let table = table[0]["table_name"].as_str().unwrap().to_string();
        let want_table = match connector {
            "postgres" => "postgres_inventory_customers",
            "mysql" => "mysql_inventory_customers",
            "sqlserver" => "sqlserver_testDB_customers",
            _ => "oracle_ORCLPDB1_CUSTOMERS",
        };
        assert_eq!(table, want_table);
        let stored = server.sql(&format!("SELECT * FROM \"{table}\" ORDER BY \"{id}\"")).await;
        expect_relational(&stored, id, name, email);
        let history = server
            .sql(&format!("SELECT _op, _change_time, _source_position FROM \"{table}__changes\" ORDER BY _sequence"))
            .await;
        let ops: Vec<&str> = history.iter().map(|h| h["_op"].as_str().unwrap()).collect();
        assert_eq!(
            ops,
            ["snapshot", "insert", "update", "update", "insert", "delete", "update", "insert"],
            "{connector}"
        );
        assert!(history[0]["_change_time"].as_str().unwrap().starts_with("2023-11-14"), "{history:?}");
        let position: Value = serde_json::from_str(history[1]["_source_position"].as_str().unwrap()).unwrap();
        assert!(position["connector"].is_string(), "{position}");
        // Replaying every change, and then the first (a snapshot read of row 1) on its own,
        // changes nothing: each change carries its source position, and one at or below a
        // key's is skipped.
        let (_, first) = fixture(connector).swap_remove(0);
        for (_, event) in fixture(connector).into_iter().chain([(None, first)]) {
            assert_eq!(server.push(connector, &key, event.to_string()).await.0, 202);
        }
        let again = server.sql(&format!("SELECT * FROM \"{table}\" ORDER BY \"{id}\"")).await;
        assert_eq!(again, stored, "{connector}: a replay leaves the same table");
        assert_eq!(rows(&server, &format!("{table}__changes")).await, 8, "{connector}: and no new history");
    }
}

#[tokio::test]
async fn debezium_over_kafka_takes_keys_from_the_message_key_and_routes_tables() {
    let broker = Broker::start();
    broker.create_topic("dbserver1.inventory.customers", 1);
    broker.create_topic("mongo.inventory.customers", 1);
    let dir = DataDir::new("mirror-dbz-kafka");
    let server = Server::start(&dir.0).await;
    for (name, topic_regex, table) in
        [("pg", "dbserver1\\..*", "pg_[schema]_[table]"), ("mongo", "mongo\\..*", "m_[table]")]
    {
        let stream = json!({
            "name": name, "table": table, "mode": "mirror", "format": "debezium", "history": true,
            "source": {"type": "kafka", "brokers": [broker.bootstrap()], "topic_regex": topic_regex,
                       "properties": {"topic.metadata.refresh.interval.ms": "1000"}},
            "flush": {"max_wait_ms": 100},
        });
        server.create_stream(stream).await;
    }
    let producer = broker.producer(&[("enable.idempotence", "true")]);
    let messages = |name: &str| -> Vec<(Option<String>, Option<String>)> {
        fixture(name).into_iter().map(|(k, v)| (k, (!v.is_null()).then(|| v.to_string()))).collect()
    };
    produce_keyed(&producer, "dbserver1.inventory.customers", &messages("postgres")).await;
    produce_keyed(&producer, "mongo.inventory.customers", &messages("mongodb")).await;
    wait_changes(&server, "pg_public_customers", 8).await;
    let stored = server.sql("SELECT * FROM pg_public_customers ORDER BY id").await;
    expect_relational(&stored, "id", "first_name", "email");

    wait_changes(&server, "m_customers", 5).await;
    let docs = server.sql("SELECT _id, first_name, visits, seen FROM m_customers ORDER BY _id").await;
    assert_eq!(
        docs,
        [
            json!({"_id": "65a0f0c0d1e2f3a4b5c6d701", "first_name": "Anne Marie", "visits": 11, "seen": "2023-11-14T22:13:20.001Z"}),
            json!({"_id": "65a0f0c0d1e2f3a4b5c6d702", "first_name": "Bob", "visits": 12, "seen": "2023-11-14T22:13:20.002Z"}),
        ]
    );
}

#[tokio::test]
async fn debezium_logical_types_become_proper_columns() {
    let dir = DataDir::new("mirror-types");
    let server = Server::start(&dir.0).await;
    let key = server
        .create_stream(
            json!({"name": "typed", "table": "typed", "mode": "mirror", "format": "debezium", "keys": ["id"]}),
        )
        .await;
    let field = |name: &str, ty: &str, logical: Option<&str>, params: Value| {
        let mut f = json!({"field": name, "type": ty, "optional": true});
        if let Some(l) = logical {
            f["name"] = json!(l);
        }
        if !params.is_null() {
            f["parameters"] = params;
        }
        f
    };
    let image = json!({"type": "struct", "optional": true, "fields": [
        field("id", "int32", None, Value::Null),
        field("price", "bytes", Some("org.apache.kafka.connect.data.Decimal"), json!({"scale": "10", "connect.decimal.precision": "38"})),
        field("amount", "struct", Some("io.debezium.data.VariableScaleDecimal"), Value::Null),
        field("born", "int32", Some("io.debezium.time.Date"), Value::Null),
        field("seen", "int64", Some("io.debezium.time.MicroTimestamp"), Value::Null),
        field("zoned", "string", Some("io.debezium.time.ZonedTimestamp"), Value::Null),
        field("doc", "string", Some("io.debezium.data.Json"), Value::Null),
        field("uid", "string", Some("io.debezium.data.Uuid"), Value::Null),
        field("opens", "int64", Some("io.debezium.time.MicroTime"), Value::Null),
    ]});
    let mut after_schema = image.clone();
    after_schema["field"] = json!("after");
    let mut before_schema = image;
    before_schema["field"] = json!("before");
    // 12345.6789012345 at scale 10 is 123456789012345 unscaled: 0x7048_860D_DF79 in 6 bytes.
    let event = json!({
        "schema": {"type": "struct", "name": "dbserver1.public.typed.Envelope", "fields": [before_schema, after_schema]},
        "payload": {
            "before": null,
            "after": {
                "id": 1, "price": "cEiGDd95", "amount": {"scale": 2, "value": "/4U="},
                "born": 19675, "seen": 1_700_000_000_123_456i64, "zoned": "2023-11-14T22:13:20.5+02:00",
                "doc": "{\"a\": [1, 2], \"b\": {\"c\": true}}", "uid": "9b2f5f6a-8d4e-4a53-9d5b-3f1c2a7e6b10",
                "opens": 30_600_000_250i64
            },
            "source": {"connector": "postgresql", "db": "d", "schema": "public", "table": "typed", "ts_ms": 1700000000000i64, "lsn": 1},
            "op": "c", "ts_ms": 1700000000001i64
        }
    });
    assert_eq!(server.push("typed", &key, event.to_string()).await.0, 202);
    let types = server
        .sql("SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 'typed' ORDER BY ordinal_position")
        .await;
    let types: BTreeMap<String, String> = types
        .iter()
        .map(|t| (t["column_name"].as_str().unwrap().into(), t["data_type"].as_str().unwrap().into()))
        .collect();
    assert_eq!(types["price"], "DECIMAL(38,10)");
    assert_eq!(types["amount"], "VARCHAR");
    assert_eq!(types["born"], "DATE");
    assert_eq!(types["seen"], "TIMESTAMP");
    assert_eq!(types["zoned"], "TIMESTAMP WITH TIME ZONE");
    assert_eq!(types["doc"], "JSON");
    assert_eq!(types["uid"], "UUID");
    assert_eq!(types["opens"], "TIME");
    let row = &server
        .sql("SELECT price::VARCHAR AS price, amount::VARCHAR AS amount, born::VARCHAR AS born, seen::VARCHAR AS seen, zoned::VARCHAR AS zoned, doc->>'$.b.c' AS c, uid::VARCHAR AS uid, opens::VARCHAR AS opens FROM typed")
        .await[0];
    assert_eq!(row["price"], json!("12345.6789012345"));
    assert_eq!(row["amount"], json!("-1.23"));
    assert_eq!(row["born"], json!("2023-11-14"));
    assert_eq!(row["seen"], json!("2023-11-14 22:13:20.123456"));
    assert_eq!(row["uid"], json!("9b2f5f6a-8d4e-4a53-9d5b-3f1c2a7e6b10"));
    assert_eq!(row["opens"], json!("08:30:00.00025"));
    assert_eq!(row["zoned"], json!("2023-11-14 20:13:20.5+00"));
    assert_eq!(row["c"], json!("true"));
}

#[tokio::test]
async fn kill_9_mid_stream_applies_every_change_once() {
    let broker = Broker::start();
    broker.create_topic("changes", 1);
    let dir = DataDir::new("mirror-crash");
    let mut server = Server::start(&dir.0).await;
    let stream = json!({
        "name": "m", "table": "accounts", "mode": "mirror", "keys": ["id"], "history": true,
        // Short sessions: a killed member's partitions move on in seconds, not librdkafka's 45 s.
        "source": {"type": "kafka", "brokers": [broker.bootstrap()], "topics": ["changes"],
                   "properties": crate::kafka::test_properties()},
        "flush": {"max_wait_ms": 100},
    });
    server.create_stream(stream).await;
    const TOTAL: usize = 30_000;
    const KEYS: usize = 1_000;
    let producer = broker.producer(&[("enable.idempotence", "true")]);
    let mut expected: BTreeMap<usize, usize> = BTreeMap::new();
    let messages: Vec<(Option<String>, Option<String>)> = (0..TOTAL)
        .map(|i| {
            let id = (i * 7919) % KEYS;
            expected.insert(id, i);
            (Some(id.to_string()), Some(json!({"id": id, "version": i}).to_string()))
        })
        .collect();
    let producing = tokio::spawn(async move {
        for chunk in messages.chunks(500) {
            produce_keyed(&producer, "changes", chunk).await;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    for round in 0..2 {
        let threshold = 4_000 * (round + 1) + (rand::random::<u64>() % 4_000) as i64;
        wait_rows(&server, "accounts__changes", threshold, Duration::from_secs(120)).await;
        server.kill9();
        server = Server::start(&dir.0).await;
    }
    producing.await.unwrap();
    wait_rows(&server, "accounts__changes", TOTAL as i64, Duration::from_secs(120)).await;
    let history = server.sql("SELECT version FROM accounts__changes").await;
    let versions: HashSet<i64> = history.iter().map(|r| r["version"].as_i64().unwrap()).collect();
    assert_eq!((history.len(), versions.len()), (TOTAL, TOTAL), "every change applied exactly once");
    let stored = server.sql("SELECT id, version FROM accounts ORDER BY id").await;
    let got: BTreeMap<usize, usize> =
        stored.iter().map(|r| (r["id"].as_u64().unwrap() as usize, r["version"].as_u64().unwrap() as usize)).collect();
    assert_eq!(got, expected, "each key holds its last version");
}

/// Debezium events pushed over HTTP with their message keys, with no `keys` configured: as
/// Kafka Connect's JSON converter writes the pair (`{"key", "value"}` per line), and as one event
/// with a `Message-Key` header. The key change of row 2 (to 20) is followed from the keys.
#[tokio::test]
async fn debezium_over_http_push_takes_keys_from_key_value_pairs_and_the_header() {
    let dir = DataDir::new("mirror-dbz-pairs");
    let server = Server::start(&dir.0).await;
    let stream = json!({"name": "pairs", "table": "pairs", "mode": "mirror", "format": "debezium"});
    let key = server.create_stream(stream).await;
    let text = std::fs::read_to_string(format!("{FIXTURES}/mysql.jsonl")).unwrap();
    let (status, body) = server.push("pairs", &key, text.clone()).await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["rejected"], 0, "{body}");
    let stored = server.sql("SELECT * FROM pairs ORDER BY id").await;
    expect_relational(&stored, "id", "first_name", "email");
    // One event with its key in a header, into another stream.
    let key2 =
        server.create_stream(json!({"name": "one", "table": "one", "mode": "mirror", "format": "debezium"})).await;
    for (message_key, event) in fixture("mysql") {
        let mut request =
            server.http.post(server.url("/api/streams/one/push")).bearer_auth(&key2).body(event.to_string());
        if let Some(k) = message_key {
            request = request.header("message-key", k);
        }
        let r = request.send().await.unwrap();
        assert_eq!(r.status(), 202);
    }
    let stored = server.sql("SELECT * FROM one ORDER BY id").await;
    expect_relational(&stored, "id", "first_name", "email");
    // Without a key the same change is refused, and the answer says so.
    let key3 =
        server.create_stream(json!({"name": "nokey", "table": "nokey", "mode": "mirror", "format": "debezium"})).await;
    let (_, event) = fixture("mysql").swap_remove(1);
    let (status, body) = server.push("nokey", &key3, event.to_string()).await;
    assert_eq!((status, body["rejected"].clone()), (202, json!(1)), "{body}");
}
