//! Replay: a stream read again from Kafka offsets, or its ledger decoded again, into the same
//! tables, with every event once.

use std::time::Duration;

use serde_json::{Value, json};

use crate::broker::{Broker, produce};
use crate::harness::{DataDir, Server, wait_until};
use crate::kafka::{kafka_stream, rows, wait_rows};

async fn replay(server: &Server, stream: &str, body: Value) -> (u16, Value) {
    let r = server.http.post(server.url(&format!("/api/streams/{stream}/replay"))).json(&body).send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn kafka_offsets_are_read_again_into_the_same_table_once() {
    let broker = Broker::start();
    broker.create_topic("replayed", 2);
    let dir = DataDir::new("replay-kafka");
    let server = Server::start(&dir.0).await;
    let mut stream = kafka_stream("k", "replayed", &broker, json!(["replayed"]));
    stream["metadata"] = json!({"topic": true, "partition": true, "offset": true});
    server.create_stream(stream).await;
    let producer = broker.producer(&[]);
    let mut values: Vec<String> = (0..200).map(|i| format!("{{\"id\": {i}}}")).collect();
    values.push("not json".into());
    produce(&producer, "replayed", &values).await;
    wait_rows(&server, "replayed", 200, Duration::from_secs(90)).await;
    wait_until("the ledger row", Duration::from_secs(30), || async {
        server.sql("SELECT count(*) AS n FROM sluice.rejects").await[0]["n"] == 1
    })
    .await;
    let before = server.sql("SELECT _partition AS p, count(*) AS n FROM replayed GROUP BY 1 ORDER BY 1").await;
    // Read partition 0 again from offset 10, and all of partition 1.
    let (status, answer) =
        replay(&server, "k", json!({"from": "offsets", "offsets": {"replayed": {"0": 10, "1": 0}}})).await;
    assert_eq!(status, 200, "{answer}");
    let p0 = before[0]["n"].as_i64().unwrap();
    let p1 = before[1]["n"].as_i64().unwrap();
    let ledger_on_p1 = server.sql("SELECT count(*) AS n FROM sluice.rejects").await[0]["n"].as_i64().unwrap();
    assert!(answer["rows_deleted"].as_i64().unwrap() >= p0 - 10 + p1 - 1, "{answer} {before:?}");
    wait_rows(&server, "replayed", 200, Duration::from_secs(90)).await;
    wait_until("the ledger row again", Duration::from_secs(30), || async {
        server.sql("SELECT count(*) AS n FROM sluice.rejects").await[0]["n"] == 1
    })
    .await;
    let after = server
        .sql("SELECT count(*) AS n, count(DISTINCT id) AS d, count(DISTINCT (_partition, _offset)) AS o FROM replayed")
        .await;
    assert_eq!(after[0], json!({"n": 200, "d": 200, "o": 200}), "every event once after the replay");
    assert!(ledger_on_p1 <= 1);
    assert_eq!(rows(&server, "replayed").await, 200);
    // A table without the offset columns cannot tell its rows apart: 422, nothing changed.
    let dir2 = DataDir::new("replay-kafka-bare");
    let bare = Server::start(&dir2.0).await;
    bare.create_stream(kafka_stream("b", "bare", &broker, json!(["replayed"]))).await;
    wait_rows(&bare, "bare", 200, Duration::from_secs(90)).await;
    let (status, answer) = replay(&bare, "b", json!({"from": "offsets", "offsets": {"replayed": {"0": 0}}})).await;
    assert_eq!(status, 422, "{answer}");
    assert!(answer["error"].as_str().unwrap().contains("_topic"), "{answer}");
    assert_eq!(rows(&bare, "bare").await, 200);
}

#[tokio::test]
async fn the_ledger_is_decoded_again_once() {
    let dir = DataDir::new("replay-ledger");
    let server = Server::start(&dir.0).await;
    let key = server.create_stream(json!({"name": "s", "table": "lr"})).await;
    // Nothing to store yet: the table has no column, so the event is a ledger row.
    assert_eq!(server.push("s", &key, r#"{"x": null}"#).await.0, 202);
    assert_eq!(server.push("s", &key, "not json\n{\"x\": 1}\n").await.0, 202);
    assert_eq!(server.count("lr").await, 1);
    let ledger = server.sql("SELECT count(*) AS n FROM sluice.rejects WHERE replayed_at IS NULL").await;
    assert_eq!(ledger[0]["n"], 2);
    let (status, answer) = replay(&server, "s", json!({"from": "ledger"})).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer, json!({"from": "ledger", "events": 2, "rows": 1, "rejected_again": 1}));
    assert_eq!(server.count("lr").await, 2, "the event without values is a row now");
    // The replayed ledger rows are marked; the line that is still not JSON is a new ledger row.
    let open = server.sql("SELECT value FROM sluice.rejects WHERE replayed_at IS NULL").await;
    assert_eq!(open, vec![json!({"value": "not json"})]);
    // Replaying again changes nothing but that one row, which is refused again.
    let (_, answer) = replay(&server, "s", json!({"from": "ledger", "reason_contains": "not JSON"})).await;
    assert_eq!(answer["rows"], 0);
    assert_eq!(server.count("lr").await, 2);
    // Pushes go on after a replay.
    wait_until("the stream to run", Duration::from_secs(30), || async {
        server.get("/api/streams/s").await.1["metrics"]["state"] == "running"
    })
    .await;
    assert_eq!(server.push("s", &key, r#"{"x": 2}"#).await.0, 202);
    assert_eq!(server.count("lr").await, 3);
    // Bad requests name what is wrong.
    let (status, answer) = replay(&server, "s", json!({"from": "offsets", "offsets": {"t": {"0": 1}}})).await;
    assert_eq!(status, 422, "{answer}");
    let (status, _) = replay(&server, "s", json!({"from": "ledger", "since": "yesterday"})).await;
    assert_eq!(status, 400);
    let (status, _) = replay(&server, "nope", json!({"from": "ledger"})).await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn a_kinesis_stream_is_read_again_from_a_timestamp_once() {
    use crate::kinesis_local::KinesisLocal;
    let kinesis = KinesisLocal::start().await;
    kinesis.create_stream("replayk", 2).await;
    let dir = DataDir::new("replay-kinesis");
    let server = Server::start(&dir.0).await;
    server
        .create_stream(json!({
            "name": "k",
            "table": "replayk",
            "source": kinesis.source("replayk"),
            "metadata": {"arrival_time": true, "shard_id": true, "sequence_number": true},
            "flush": {"max_wait_ms": 100},
        }))
        .await;
    let batch = |ids: std::ops::Range<i64>| -> Vec<(String, Vec<u8>)> {
        ids.map(|i| (format!("k{i}"), json!({"id": i}).to_string().into_bytes())).collect()
    };
    kinesis.put("replayk", &batch(0..100)).await;
    wait_rows(&server, "replayk", 100, Duration::from_secs(90)).await;
    // A clear gap in arrival times, then more records.
    let first_max =
        server.sql("SELECT max(_arrival_time)::VARCHAR AS t FROM replayk").await[0]["t"].as_str().unwrap().to_string();
    wait_until("a second to pass", Duration::from_secs(10), || async {
        let now =
            server.sql("SELECT (now() - INTERVAL 1 SECOND)::VARCHAR AS t").await[0]["t"].as_str().unwrap().to_string();
        now > first_max
    })
    .await;
    let cut = server.sql("SELECT strftime(now()::TIMESTAMPTZ AT TIME ZONE 'UTC', '%Y-%m-%dT%H:%M:%S.%fZ') AS t").await
        [0]["t"]
        .as_str()
        .unwrap()
        .to_string();
    wait_until("a second after the cut", Duration::from_secs(10), || async {
        let now = server.sql("SELECT strftime((now() - INTERVAL 1 SECOND)::TIMESTAMPTZ AT TIME ZONE 'UTC', '%Y-%m-%dT%H:%M:%S.%fZ') AS t").await[0]["t"]
            .as_str()
            .unwrap()
            .to_string();
        now > cut
    })
    .await;
    kinesis.put("replayk", &batch(100..150)).await;
    wait_rows(&server, "replayk", 150, Duration::from_secs(90)).await;
    let (status, answer) = replay(&server, "k", json!({"from": "timestamp", "timestamp": cut})).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["rows_deleted"], 50, "{answer}");
    wait_rows(&server, "replayk", 150, Duration::from_secs(90)).await;
    let after = server.sql("SELECT count(*) AS n, count(DISTINCT id) AS d FROM replayk").await;
    assert_eq!(after[0], json!({"n": 150, "d": 150}));
    let (_, stream) = server.get("/api/streams/k").await;
    assert_eq!(stream["config"]["source"]["start"], json!({"at_timestamp": cut}), "{stream}");
}
