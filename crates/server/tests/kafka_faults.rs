//! Kafka under faults: kill -9 of Sluice, a group with two Sluice processes that lose a member,
//! and a broker outage. Every test ends by checking each produced message is stored once.

use std::collections::HashSet;
use std::time::Duration;

use serde_json::json;

use crate::broker::{Broker, produce_bare};
use crate::harness::{DataDir, Server, wait_until};
use crate::kafka::{kafka_stream, rows, wait_rows};

/// Produce ids `0..total` in paced batches, so that consumers are mid-stream for a while.
fn paced_producer(broker: &Broker, topic: &str, total: usize, batch: usize) -> tokio::task::JoinHandle<()> {
    let producer = broker.producer(&[]);
    let topic = topic.to_string();
    tokio::spawn(async move {
        for start in (0..total).step_by(batch) {
            let values: Vec<String> = (start..(start + batch).min(total))
                .map(|i| format!("{{\"id\": {i}, \"pad\": \"{}\"}}", "x".repeat(60)))
                .collect();
            produce_bare(&producer, &topic, &values).await;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
}

async fn ids(server: &Server, table: &str) -> Vec<i64> {
    let (status, body) = server.sql_raw(&format!("SELECT id FROM \"{table}\"")).await;
    if status != 200 {
        return Vec::new();
    }
    body["rows"].as_array().unwrap().iter().map(|r| r["id"].as_i64().unwrap()).collect()
}

#[tokio::test]
async fn kill_9_mid_stream_then_every_message_exactly_once() {
    let broker = Broker::start();
    broker.create_topic("crash", 3);
    let dir = DataDir::new("kafka-crash");
    let mut server = Server::start(&dir.0).await;
    server.create_stream(kafka_stream("c", "t", &broker, json!(["crash"]))).await;
    const TOTAL: usize = 60_000;
    let producing = paced_producer(&broker, "crash", TOTAL, 500);
    for round in 0..2 {
        let threshold = 5_000 * (round + 1) + (rand::random::<u64>() % 10_000) as i64;
        wait_rows(&server, "t", threshold, Duration::from_secs(120)).await;
        server.kill9();
        server = Server::start(&dir.0).await;
    }
    producing.await.unwrap();
    wait_rows(&server, "t", TOTAL as i64, Duration::from_secs(120)).await;
    let stored = ids(&server, "t").await;
    let distinct: HashSet<i64> = stored.iter().copied().collect();
    assert_eq!(distinct.len(), TOTAL, "every message stored");
    assert_eq!(stored.len(), TOTAL, "no message stored twice after two kill -9");
}

/// Two Sluice processes, one group, each with its own data dir. One member leaves: by SIGTERM
/// (exactly once across the union) or by kill -9 (no loss; see the note in the test).
async fn two_members(kill9: bool) {
    let broker = Broker::start();
    let topic = if kill9 { "rb9" } else { "rb" };
    broker.create_topic(topic, 3);
    let (dir_a, dir_b) = (DataDir::new("kafka-a"), DataDir::new("kafka-b"));
    let mut a = Server::start(&dir_a.0).await;
    let b = Server::start(&dir_b.0).await;
    let mut stream = kafka_stream("r", "t", &broker, json!([topic]));
    stream["source"]["group"] = json!(format!("group-{topic}"));
    a.create_stream(stream.clone()).await;
    b.create_stream(stream.clone()).await;
    const TOTAL: usize = 40_000;
    let producing = paced_producer(&broker, topic, TOTAL, 250);
    // Both members hold partitions and have written something before one goes away.
    wait_until("both members to write", Duration::from_secs(120), || async {
        rows(&a, "t").await > 0 && rows(&b, "t").await > 0
    })
    .await;
    if kill9 {
        a.kill9();
    } else {
        a.stop();
    }
    let grown = rows(&b, "t").await + 2_000;
    wait_rows(&b, "t", grown, Duration::from_secs(120)).await;
    a = Server::start(&dir_a.0).await;
    producing.await.unwrap();
    wait_until("the union to hold every message", Duration::from_secs(300), || async {
        let union: HashSet<i64> = ids(&a, "t").await.into_iter().chain(ids(&b, "t").await).collect();
        union.len() == TOTAL
    })
    .await;
    let (ia, ib) = (ids(&a, "t").await, ids(&b, "t").await);
    let both = ia.len() + ib.len();
    let duplicates = both - TOTAL;
    if kill9 {
        // A member killed between its DuckDB commit and its group-offset commit (one broker
        // round trip) leaves the group behind its stored offsets; whoever takes the partition
        // over re-reads from the group's offset. That is at most one batch per partition.
        assert!(duplicates <= 3 * 2_000, "{duplicates} duplicates after kill -9");
        eprintln!("kill -9 of a group member: {duplicates} duplicate rows across the two workspaces");
    } else {
        assert_eq!(duplicates, 0, "a graceful leave hands partitions over with no duplicates");
    }
}

#[tokio::test]
async fn group_member_leaving_gracefully_is_exactly_once() {
    two_members(false).await;
}

#[tokio::test]
async fn group_member_killed_loses_nothing() {
    two_members(true).await;
}

#[tokio::test]
async fn broker_down_for_20_seconds_loses_nothing() {
    let mut broker = Broker::start();
    broker.create_topic("outage", 2);
    let dir = DataDir::new("kafka-outage");
    let server = Server::start(&dir.0).await;
    server.create_stream(kafka_stream("o", "t", &broker, json!(["outage"]))).await;
    let producer = broker.producer(&[]);
    let first: Vec<String> = (0..1000).map(|i| format!("{{\"id\": {i}}}")).collect();
    produce_bare(&producer, "outage", &first).await;
    wait_rows(&server, "t", 1000, Duration::from_secs(60)).await;

    broker.stop();
    wait_until("the stream to report the outage", Duration::from_secs(60), || async {
        let (_, m) = server.get("/api/streams/o/metrics").await;
        m["state"] == json!("reconnecting") && m["last_error"].is_string()
    })
    .await;
    // Messages sent while the broker is down wait in the producer and go out once it is back.
    let second: Vec<String> = (1000..2000).map(|i| format!("{{\"id\": {i}}}")).collect();
    let sending = tokio::spawn(async move { produce_bare(&producer, "outage", &second).await });
    // The outage itself is the scenario: the broker stays down for 20 s.
    tokio::time::sleep(Duration::from_secs(20)).await;
    broker.restart();
    sending.await.unwrap();
    wait_rows(&server, "t", 2000, Duration::from_secs(120)).await;
    let stored = ids(&server, "t").await;
    assert_eq!(stored.iter().copied().collect::<HashSet<_>>().len(), 2000);
    assert_eq!(stored.len(), 2000);
    wait_until("the stream to run again", Duration::from_secs(60), || async {
        server.get("/api/streams/o/metrics").await.1["state"] == json!("running")
    })
    .await;
}
