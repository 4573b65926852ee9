//! Kinesis streams against kinesis-local: resharding in order, kill -9, malformed and KPL
//! records, a start at a timestamp, and config errors.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use md5::{Digest, Md5};
use serde_json::{Value, json};

use crate::harness::{DataDir, Server, wait_until};
use crate::kafka::{rows, wait_rows};
use crate::kinesis_local::{FaultProxy, KinesisLocal};

fn stream_config(name: &str, table: &str, kinesis: &KinesisLocal, stream: &str) -> Value {
    json!({
        "name": name,
        "table": table,
        "source": kinesis.source(stream),
        "metadata": {"position": true, "shard_id": true, "sequence_number": true, "partition_key": true, "arrival_time": true},
        "flush": {"max_wait_ms": 100},
    })
}

/// Records `{"id": i}` with partition key `k<i>`.
fn id_records(ids: std::ops::Range<i64>) -> Vec<(String, Vec<u8>)> {
    ids.map(|i| (format!("k{i}"), json!({"id": i}).to_string().into_bytes())).collect()
}

/// A stream read through a [`FaultProxy`] answering every `every`-th GetRecords with `code`,
/// once `n` records put through the emulator are all in `table`.
async fn through_faults(
    table: &str,
    shards: i32,
    code: &'static str,
    every: u64,
    max_records: i64,
    n: i64,
) -> (KinesisLocal, FaultProxy, DataDir, Server) {
    let kinesis = KinesisLocal::start().await;
    kinesis.create_stream(table, shards).await;
    let proxy = FaultProxy::start(&kinesis.endpoint, code, every).await;
    let dir = DataDir::new(&format!("kinesis-{table}"));
    let server = Server::start(&dir.0).await;
    let mut config = stream_config("f", table, &kinesis, table);
    config["source"]["endpoint"] = json!(proxy.endpoint);
    config["source"]["max_records"] = json!(max_records);
    server.create_stream(config).await;
    kinesis.put(table, &id_records(0..n)).await;
    wait_rows(&server, table, n, Duration::from_secs(120)).await;
    (kinesis, proxy, dir, server)
}

/// One round: one record per key, so a retried PutRecords entry cannot reorder a key.
fn round(n: usize, keys: usize) -> Vec<(String, Vec<u8>)> {
    (0..keys).map(|k| (format!("key-{k}"), json!({"key": k, "n": n}).to_string().into_bytes())).collect()
}

#[tokio::test]
async fn every_shard_through_split_merge_and_update_shard_count_in_order() {
    let kinesis = KinesisLocal::start().await;
    kinesis.create_stream("orders", 2).await;
    const KEYS: usize = 20;
    let mut n = 0;
    let mut put_rounds = |count: usize| {
        let rounds: Vec<_> = (n..n + count).collect();
        n += count;
        rounds
    };
    // A backlog across a split before Sluice starts, so parents and children are both
    // readable at once: only lineage keeps each key in order.
    for r in put_rounds(50) {
        kinesis.put("orders", &round(r, KEYS)).await;
    }
    kinesis.split("orders").await;
    for r in put_rounds(50) {
        kinesis.put("orders", &round(r, KEYS)).await;
    }
    let dir = DataDir::new("kinesis-reshard");
    let server = Server::start(&dir.0).await;
    let mut config = stream_config("k", "orders", &kinesis, "orders");
    // Small reads, so a parent takes many calls and would interleave with a child read early.
    config["source"]["max_records"] = json!(25);
    server.create_stream(config).await;
    // Then a merge and UpdateShardCount while streaming.
    wait_rows(&server, "orders", 20, Duration::from_secs(60)).await;
    kinesis.merge("orders").await;
    for r in put_rounds(50) {
        kinesis.put("orders", &round(r, KEYS)).await;
    }
    kinesis.update_shard_count("orders", 4).await;
    for r in put_rounds(50) {
        kinesis.put("orders", &round(r, KEYS)).await;
    }
    let total = (200 * KEYS) as i64;
    wait_rows(&server, "orders", total, Duration::from_secs(120)).await;

    let stored = server.sql(r#"SELECT "key", n, _shard_id, _sequence_number FROM orders ORDER BY _position"#).await;
    assert_eq!(stored.len() as i64, total, "no duplicates");
    let mut per_key: BTreeMap<i64, Vec<i64>> = BTreeMap::new();
    for r in &stored {
        per_key.entry(r["key"].as_i64().unwrap()).or_default().push(r["n"].as_i64().unwrap());
    }
    for (key, ns) in &per_key {
        assert_eq!(ns, &(0..200).collect::<Vec<i64>>(), "key {key}: every record, in order");
    }
    let shards: HashSet<&str> = stored.iter().map(|r| r["_shard_id"].as_str().unwrap()).collect();
    assert!(shards.len() >= 5, "records came from parents and children: {shards:?}");
    assert!(stored.iter().all(|r| r["_sequence_number"].as_str().is_some_and(|s| s.len() > 20)));

    let (_, m) = server.get("/api/streams/k/metrics").await;
    assert!(m["source"]["closed_shards"].as_f64().unwrap() >= 3.0, "{m}");
    assert_eq!(m["source"]["open_shards"].as_f64().unwrap(), 4.0, "{m}");
    assert!(m["lag"].as_object().unwrap().values().all(|l| l["age_seconds"].is_number()), "{m}");
    let prometheus = server.http.get(server.url("/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(prometheus.contains("sluice_stream_source_open_shards{stream=\"k\"} 4"), "{prometheus}");
    assert!(prometheus.contains("sluice_stream_lag_seconds{stream=\"k\",partition=\"shardId-"), "{prometheus}");
}

#[tokio::test]
async fn kill_9_mid_stream_then_every_record_exactly_once() {
    let kinesis = KinesisLocal::start().await;
    kinesis.create_stream("crash", 2).await;
    let dir = DataDir::new("kinesis-crash");
    let mut server = Server::start(&dir.0).await;
    server.create_stream(stream_config("c", "t", &kinesis, "crash")).await;
    const TOTAL: usize = 20_000;
    let producer = kinesis.producer();
    let producing = tokio::spawn(async move {
        for start in (0..TOTAL).step_by(500) {
            let batch: Vec<(String, Vec<u8>)> = (start..start + 500)
                .map(|i| {
                    (format!("k{}", i % 97), format!("{{\"id\": {i}, \"pad\": \"{}\"}}", "x".repeat(60)).into_bytes())
                })
                .collect();
            producer.put("crash", &batch).await;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    for round in 0..2 {
        let threshold = 3_000 * (round + 1) + (rand::random::<u64>() % 3_000) as i64;
        wait_rows(&server, "t", threshold, Duration::from_secs(120)).await;
        server.kill9();
        server = Server::start(&dir.0).await;
    }
    producing.await.unwrap();
    wait_rows(&server, "t", TOTAL as i64, Duration::from_secs(120)).await;
    let stored = server.sql("SELECT id FROM t").await;
    let ids: HashSet<i64> = stored.iter().map(|r| r["id"].as_i64().unwrap()).collect();
    assert_eq!(ids.len(), TOTAL, "every record stored");
    assert_eq!(stored.len(), TOTAL, "no record stored twice after two kill -9");
}

/// A KPL aggregate, encoded here by hand from the KPL's documented format (magic, protobuf
/// `AggregatedRecord`, MD5), independently of the decoder under test.
fn kpl_aggregate(records: &[(u64, &[u8])], keys: &[&str]) -> Vec<u8> {
    fn varint(out: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }
    fn field(out: &mut Vec<u8>, tag: u64, bytes: &[u8]) {
        varint(out, (tag << 3) | 2);
        varint(out, bytes.len() as u64);
        out.extend_from_slice(bytes);
    }
    let mut message = Vec::new();
    for k in keys {
        field(&mut message, 1, k.as_bytes());
    }
    for (key_index, data) in records {
        let mut record = Vec::new();
        varint(&mut record, 1 << 3);
        varint(&mut record, *key_index);
        field(&mut record, 3, data);
        field(&mut message, 3, &record);
    }
    let mut out = vec![0xF3, 0x89, 0x9A, 0xC2];
    out.extend_from_slice(&message);
    out.extend_from_slice(&Md5::digest(&message));
    out
}

#[tokio::test]
async fn malformed_records_go_to_the_ledger_and_kpl_aggregates_are_split() {
    let kinesis = KinesisLocal::start().await;
    kinesis.create_stream("mixed", 1).await;
    let dir = DataDir::new("kinesis-mixed");
    // No key pair and no region in the config: the default provider chain finds them.
    let env = [("AWS_ACCESS_KEY_ID", "from-env"), ("AWS_SECRET_ACCESS_KEY", "from-env"), ("AWS_REGION", "us-east-1")];
    let server = Server::start_env(&dir.0, &[], &env).await;
    let mut config = stream_config("m", "mixed", &kinesis, "mixed");
    let source = config["source"].as_object_mut().unwrap();
    source.remove("credentials");
    source.remove("region");
    server.create_stream(config).await;
    let aggregate =
        kpl_aggregate(&[(0, br#"{"id": 10}"#), (1, br#"{"id": 11}"#), (0, br#"{"id": 12}"#)], &["agg-a", "agg-b"]);
    let records = vec![
        ("p".to_string(), br#"{"id": 1}"#.to_vec()),
        ("p".to_string(), b"not json".to_vec()),
        ("p".to_string(), b"42".to_vec()),
        ("p".to_string(), br#"[{"id": 2}, {"id": 3}]"#.to_vec()),
        ("outer".to_string(), aggregate),
        ("p".to_string(), br#"{"id": 4}"#.to_vec()),
    ];
    // A second Kinesis stream read by a second Sluice stream in the same process.
    kinesis.create_stream("other", 3).await;
    server.create_stream(stream_config("o", "other", &kinesis, "other")).await;
    kinesis.put("mixed", &records).await;
    let others: Vec<(String, Vec<u8>)> =
        (0..300).map(|i| (format!("o{i}"), json!({"other": i}).to_string().into_bytes())).collect();
    kinesis.put("other", &others).await;
    wait_rows(&server, "mixed", 7, Duration::from_secs(60)).await;
    wait_rows(&server, "other", 300, Duration::from_secs(60)).await;
    let stored = server.sql(r#"SELECT id, _partition_key FROM mixed ORDER BY _position"#).await;
    let got: Vec<(i64, &str)> =
        stored.iter().map(|r| (r["id"].as_i64().unwrap(), r["_partition_key"].as_str().unwrap())).collect();
    assert_eq!(got, [(1, "p"), (2, "p"), (3, "p"), (10, "agg-a"), (11, "agg-b"), (12, "agg-a"), (4, "p")]);
    wait_until("two rejects", Duration::from_secs(30), || async {
        server.sql("SELECT count(*) AS n FROM sluice.rejects").await[0]["n"] == json!(2)
    })
    .await;
    let rejects = server.sql("SELECT value, reason, source FROM sluice.rejects ORDER BY value").await;
    assert_eq!(rejects[0]["value"], json!("42"));
    assert_eq!(rejects[1]["value"], json!("not json"));
    for r in &rejects {
        let source: Value = serde_json::from_str(r["source"].as_str().unwrap()).unwrap();
        assert_eq!(source["shard"], json!("shardId-000000000000"), "{source}");
        assert!(source["sequence_number"].as_str().is_some_and(|s| !s.is_empty()), "{source}");
    }
}

#[tokio::test]
async fn start_at_a_timestamp_and_config_errors() {
    let kinesis = KinesisLocal::start().await;
    kinesis.create_stream("timed", 2).await;
    let before = id_records(0..10);
    kinesis.put("timed", &before).await;
    // Arrival times have millisecond precision; step clear of the first batch's.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let at = chrono::Utc::now();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let after = id_records(10..20);
    kinesis.put("timed", &after).await;

    let dir = DataDir::new("kinesis-timed");
    let server = Server::start(&dir.0).await;
    let mut config = stream_config("t", "timed", &kinesis, "timed");
    config["source"]["start"] = json!({"at_timestamp": at.to_rfc3339()});
    server.create_stream(config).await;
    wait_rows(&server, "timed", 10, Duration::from_secs(60)).await;
    // Later records still arrive, and none from before the timestamp ever does.
    kinesis.put("timed", &[("z".to_string(), br#"{"id": 99}"#.to_vec())]).await;
    wait_rows(&server, "timed", 11, Duration::from_secs(60)).await;
    let ids: Vec<i64> =
        server.sql("SELECT id FROM timed ORDER BY id").await.iter().map(|r| r["id"].as_i64().unwrap()).collect();
    assert_eq!(ids, (10..20).chain([99]).collect::<Vec<_>>());
    assert_eq!(rows(&server, "timed").await, 11);

    // The secret key is never shown back.
    let (_, described) = server.get("/api/streams/t").await;
    assert!(!described.to_string().contains("secret_access_key"), "{described}");

    for (patch, field) in [
        (json!({"stream": "bad name!"}), "source.stream"),
        (json!({"start": {"at_timestamp": "yesterday"}}), "source.start.at_timestamp"),
        (json!({"endpoint": "localhost:4567"}), "source.endpoint"),
        (json!({"max_records": 20000}), "source.max_records"),
        (json!({"credentials": {"access_key_id": "x"}}), "source.credentials.secret_access_key"),
    ] {
        let mut bad = stream_config("bad", "bad", &kinesis, "timed");
        for (k, v) in patch.as_object().unwrap() {
            bad["source"][k] = v.clone();
        }
        let r = server.http.post(server.url("/api/streams")).json(&bad).send().await.unwrap();
        assert_eq!(r.status(), 400);
        let body: Value = r.json().await.unwrap();
        assert!(body.to_string().contains(field), "{field}: {body}");
    }
    // A stream that does not exist is reported on the stream's state.
    server.create_stream(stream_config("missing", "missing", &kinesis, "no-such-stream")).await;
    wait_until("the missing stream reported", Duration::from_secs(30), || async {
        let (_, m) = server.get("/api/streams/missing/metrics").await;
        m["last_error"].as_str().is_some_and(|e| e.contains("not found"))
    })
    .await;
}

#[tokio::test]
async fn throttling_backs_off_is_counted_and_loses_nothing() {
    let (_kinesis, proxy, _dir, server) =
        through_faults("busy", 2, "ProvisionedThroughputExceededException", 2, 50, 1000).await;
    let ids: HashSet<i64> = server.sql("SELECT id FROM busy").await.iter().map(|r| r["id"].as_i64().unwrap()).collect();
    assert_eq!((ids.len(), rows(&server, "busy").await), (1000, 1000));
    assert!(proxy.injected.load(std::sync::atomic::Ordering::Relaxed) > 0);
    wait_until("the throttling to be counted", Duration::from_secs(30), || async {
        let (_, m) = server.get("/api/streams/f/metrics").await;
        m["source"]["throttled"].as_f64().is_some_and(|t| t > 0.0)
    })
    .await;
}

#[tokio::test]
async fn an_expired_iterator_is_renewed_from_the_last_record_read() {
    let (_kinesis, proxy, _dir, server) = through_faults("aging", 1, "ExpiredIteratorException", 4, 40, 800).await;
    let ids: Vec<i64> =
        server.sql("SELECT id FROM aging ORDER BY _position").await.iter().map(|r| r["id"].as_i64().unwrap()).collect();
    assert_eq!(ids, (0..800).collect::<Vec<_>>(), "every record once, in order, across renewed iterators");
    assert!(proxy.injected.load(std::sync::atomic::Ordering::Relaxed) > 0);
    wait_until("the renewals to be counted", Duration::from_secs(30), || async {
        let (_, m) = server.get("/api/streams/f/metrics").await;
        m["source"]["expired_iterators"].as_f64().is_some_and(|n| n > 0.0)
    })
    .await;
}
