//! Streams and syncs into Snowflake (fakesnow: the drivers' REST protocol over DuckDB), checked
//! with Snowflake's Python connector: seed 001's flow, Kinesis → Snowflake, the table appearing
//! on the first record and gaining columns, across two kill -9, every record once; Debezium over
//! Kafka mirrored, equal to the final state, also as a staged stream loading through PUT and
//! COPY INTO across a kill -9; a sync in upsert mode; key-pair login; nested JSON as VARIANT; a crash between a unit's
//! position row and its COMMIT, which leaves that transaction open on the server.

use std::collections::HashSet;
use std::time::Duration;

use serde_json::json;

use crate::broker::{Broker, produce_keyed};
use crate::harness::{DataDir, Server, wait_slowly};
use crate::kinesis_local::KinesisLocal;
use crate::snowflake::FakeSnow;

/// Two workers and a producer paced by the clock: each check starts Snowflake's Python
/// connector and blocks its worker for a second or more (on a slow machine), which must not
/// slow the producer down, and the producer must still be mid-stream at both kills.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kinesis_to_snowflake_every_record_once_across_two_kill_9() {
    let snow = FakeSnow::start();
    let kinesis = KinesisLocal::start().await;
    kinesis.create_stream("clicks", 2).await;
    let dir = DataDir::new("dest-snow");
    let mut server = Server::start(&dir.0).await;
    server
        .create_stream(json!({"name": "k", "table": "clicks", "source": kinesis.source("clicks"),
                              "flush": {"max_wait_ms": 100}, "destination": snow.destination()}))
        .await;
    const TOTAL: usize = 6_000;
    let producer = kinesis.producer();
    let producing = tokio::spawn(async move {
        for start in (0..TOTAL).step_by(250) {
            // From the middle on, records carry `campaign`: a column added mid-stream.
            let batch: Vec<(String, Vec<u8>)> = (start..start + 250)
                .map(|i| {
                    let event = if i >= TOTAL / 2 {
                        json!({"id": i, "page": format!("/p{}", i % 7), "campaign": format!("c{}", i % 3)})
                    } else {
                        json!({"id": i, "page": format!("/p{}", i % 7)})
                    };
                    (format!("k{}", i % 97), event.to_string().into_bytes())
                })
                .collect();
            producer.put("clicks", &batch).await;
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
    for round in 0..2 {
        let threshold = 1_000 * (round + 1) + (rand::random::<u64>() % 1_000) as i64;
        wait_slowly("records in Snowflake", Duration::from_secs(120), || snow.count("clicks") >= threshold).await;
        server.kill9();
        assert!(snow.count("clicks") < TOTAL as i64, "the kill came after the last record: it tests nothing");
        server = Server::start(&dir.0).await;
    }
    producing.await.unwrap();
    wait_slowly("every record in Snowflake", Duration::from_secs(180), || snow.count("clicks") >= TOTAL as i64).await;
    let ids: Vec<String> = snow.lines("SELECT \"id\" FROM \"clicks\"");
    let distinct: HashSet<&String> = ids.iter().collect();
    assert_eq!((ids.len(), distinct.len()), (TOTAL, TOTAL), "every record exactly once");
    let campaigns = snow.lines("SELECT count(\"campaign\") FROM \"clicks\"");
    assert_eq!(campaigns, [(TOTAL / 2).to_string()]);
    let (_, metrics) = server.get("/api/streams/k/metrics").await;
    assert_eq!(metrics["rejects"], 0, "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debezium_over_kafka_mirrored_into_snowflake_equals_the_final_state() {
    let snow = FakeSnow::start();
    let broker = Broker::start();
    broker.create_topic("cdc", 1);
    let dir = DataDir::new("dest-snow-mirror");
    let server = Server::start(&dir.0).await;
    let mut stream = crate::kafka::kafka_stream("m", "customers", &broker, json!(["cdc"]));
    stream["mode"] = json!("mirror");
    stream["format"] = json!("debezium");
    stream["flush"] = json!({"max_rows": 500, "max_wait_ms": 50});
    stream["destination"] = snow.destination();
    server.create_stream(stream).await;
    const TOTAL: u64 = 3_000;
    let (messages, want) = crate::destinations_mariadb::changes(TOTAL);
    let producer = broker.producer(&[]);
    for chunk in messages.chunks(300) {
        produce_keyed(&producer, "cdc", chunk).await;
    }
    let read = || mirrored(&snow);
    wait_slowly("the mirror equal to the final state", Duration::from_secs(240), || read() == want).await;
}

#[tokio::test]
async fn a_sync_upserts_into_snowflake() {
    use crate::reverse_etl::{QUERY, first_events, push, second_events, source};
    let snow = FakeSnow::start();
    let dir = DataDir::new("retl-snow");
    let server = Server::start(&dir.0).await;
    let key = source(&server).await;
    push(&server, &key, first_events(), 3).await;
    let mut destination = snow.destination();
    destination["table"] = json!("people");
    let (status, body) = server
        .create_sync(
            json!({"name": "sf", "query": QUERY, "mode": "upsert", "keys": ["id"], "destination": destination}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(server.run_sync("sf").await["status"], "succeeded");
    let read = || snow.lines("SELECT \"id\", \"amount\", \"name\" FROM \"people\" ORDER BY \"id\"");
    assert_eq!(read(), ["1|12.5000|héllo 😀", "2|-|ñandú", "3|123456789.1234|plain"]);
    push(&server, &key, second_events(), 6).await;
    let run = server.run_sync("sf").await;
    assert_eq!(run["status"], "succeeded", "{run}");
    assert_eq!(read(), ["1|12.5000|héllo 😀", "2|7.2500|ñandú", "3|123456789.1234|plain", "4|1.0000|new"]);
    assert!(body["config"]["destination"].get("password").is_none());
}

/// A staged stream (`stage`): units go to the local stage, and every 300 ms the pending ones
/// are loaded as one Parquet file per table, put into `SLUICE_STAGE` and loaded in one
/// transaction with the position: `COPY INTO` a landing table, then its keys deleted from the
/// table and its rows not marked deleted inserted. A kill -9 mid-stream; the mirror equals the
/// final state.
#[tokio::test(flavor = "multi_thread")]
async fn a_staged_debezium_mirror_loads_through_put_and_copy_across_a_kill_9() {
    let snow = FakeSnow::start();
    let broker = Broker::start();
    broker.create_topic("cdc", 1);
    let dir = DataDir::new("dest-snow-staged");
    let mut server = Server::start(&dir.0).await;
    let mut stream = crate::kafka::kafka_stream("m", "customers", &broker, json!(["cdc"]));
    stream["mode"] = json!("mirror");
    stream["format"] = json!("debezium");
    stream["flush"] = json!({"max_rows": 500, "max_wait_ms": 50});
    stream["stage"] = json!({"every_ms": 300});
    let mut destination = snow.destination();
    destination["copy_rows"] = json!(10);
    stream["destination"] = destination;
    server.create_stream(stream).await;
    const TOTAL: u64 = 3_000;
    let (messages, want) = crate::destinations_mariadb::changes(TOTAL);
    let producer = broker.producer(&[]);
    let (first, rest) = messages.split_at(messages.len() / 2);
    for chunk in first.chunks(300) {
        produce_keyed(&producer, "cdc", chunk).await;
    }
    wait_slowly("a first load", Duration::from_secs(120), || snow.count("customers") > 0).await;
    server.kill9();
    server = Server::start(&dir.0).await;
    for chunk in rest.chunks(300) {
        produce_keyed(&producer, "cdc", chunk).await;
    }
    let read = || mirrored(&snow);
    wait_slowly("the mirror equal to the final state", Duration::from_secs(240), || read() == want).await;
    // The loads went through the stage: fakesnow's load history lists a Parquet file loaded
    // by COPY INTO, and the landing table exists (only staged keyed loads make it).
    let loaded = snow.lines(
        "SELECT count(*) FROM _fs_information_schema._fs_load_history WHERE FILE_NAME LIKE '%SLUICE_STAGE%.parquet' \
         AND STATUS = 'LOADED'",
    );
    assert_ne!(loaded, ["0"], "no file loaded by COPY INTO");
    // A load of two deliveries for the table (a column added between them) has two.
    let landing =
        snow.lines("SELECT count(*) FROM information_schema.tables WHERE table_name LIKE 'customers__sluice_landing%'");
    assert_ne!(landing, ["0"]);
    let (_, metrics) = server.get("/api/streams/m/metrics").await;
    assert_eq!(metrics["state"], "running", "{metrics}");
}

/// The process dies inside a unit's transaction, after its position row and before COMMIT
/// (`SLUICE_CRASH_AT`, as only luck would land a kill -9 there). The dead session's
/// transaction stays open on the server (fakesnow keeps it for good; Snowflake until it aborts
/// it), so the restarted stream must not touch a row that transaction wrote or deleted: it
/// resumes, every record lands once, and the owner's older position rows are pruned. Through
/// array-bound INSERTs and through staged loads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unit_left_open_by_a_crash_before_commit_does_not_block_the_restarted_stream() {
    crash_before_commit(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_staged_load_left_open_by_a_crash_before_commit_does_not_block_the_restarted_stream() {
    crash_before_commit(true).await;
}

async fn crash_before_commit(staged: bool) {
    let snow = FakeSnow::start();
    let broker = Broker::start();
    broker.create_topic("ev", 1);
    let dir = DataDir::new("dest-snow-crash");
    let mut server = Server::start_env(&dir.0, &[], &[("SLUICE_CRASH_AT", "snowflake.commit:3")]).await;
    let mut stream = crate::kafka::kafka_stream("c", "events", &broker, json!(["ev"]));
    stream["flush"] = json!({"max_rows": 100, "max_wait_ms": 50});
    stream["destination"] = snow.destination();
    if staged {
        stream["destination"]["copy_rows"] = json!(1);
        stream["stage"] = json!({"every_ms": 200});
    }
    server.create_stream(stream).await;
    const TOTAL: u64 = 2_000;
    let producer = broker.producer(&[]);
    let messages: Vec<(Option<String>, Option<String>)> =
        (0..TOTAL).map(|i| (None, Some(json!({"id": i, "v": format!("v{i}")}).to_string()))).collect();
    // Produced in steps until the process is gone: the third commit comes after three units
    // (or loads), however the machine's speed groups the records.
    let mut sent = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let exit = loop {
        if let Some(exit) = server.child.try_wait().unwrap() {
            break exit;
        }
        assert!(std::time::Instant::now() < deadline, "the crash point was not reached");
        if sent < 1_000 {
            produce_keyed(&producer, "ev", &messages[sent..sent + 100]).await;
            sent += 100;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    assert!(!exit.success(), "{exit:?}");
    let before = snow.count("events");
    assert!(before > 0 && before < TOTAL as i64, "{before} rows before the restart: two units committed");
    server = Server::start(&dir.0).await;
    for chunk in messages[sent..].chunks(200) {
        produce_keyed(&producer, "ev", chunk).await;
    }
    wait_slowly("every record in Snowflake", Duration::from_secs(180), || snow.count("events") >= TOTAL as i64).await;
    let ids = snow.lines("SELECT \"id\" FROM \"events\"");
    let distinct: HashSet<&String> = ids.iter().collect();
    assert_eq!((ids.len(), distinct.len()), (TOTAL as usize, TOTAL as usize), "every record exactly once");
    // The restarted session's first commit pruned the rows before its own.
    let positions = snow.lines("SELECT count(*), min(\"seq\") FROM SLUICE_POSITIONS");
    let (count, oldest) = positions[0].split_once('|').unwrap();
    assert!(count.parse::<u64>().unwrap() <= 32 && oldest != "1", "{positions:?}");
    let (_, metrics) = server.get("/api/streams/c/metrics").await;
    assert_eq!(metrics["state"], "running", "{metrics}");
}

/// Key-pair login: the stream logs in with a JWT signed by its private key (stored encrypted,
/// never shown back). fakesnow takes any login, so this checks the request and the secret's
/// handling; the token's signature and fingerprint are checked by the connector's unit tests.
#[tokio::test]
async fn a_stream_logs_in_with_a_private_key() {
    let snow = FakeSnow::start();
    let dir = DataDir::new("dest-snow-keypair");
    let server = Server::start(&dir.0).await;
    let pem = include_str!("../../connectors/src/snowflake/testdata/test_only_rsa_key.pem");
    let mut destination = snow.destination();
    destination.as_object_mut().unwrap().remove("password");
    destination["private_key"] = json!(pem);
    let key = server
        .create_stream(
            json!({"name": "k", "table": "signed", "destination": destination, "flush": {"max_wait_ms": 20}}),
        )
        .await;
    assert_eq!(server.push("k", &key, r#"[{"id": 1}, {"id": 2}]"#).await.0, 202);
    wait_slowly("the rows", Duration::from_secs(120), || snow.count("signed") == 2).await;
    let (_, stream) = server.get("/api/streams/k").await;
    assert!(!stream.to_string().contains("PRIVATE KEY"), "the key is never shown: {stream}");
    // A line from the middle of the key is in no file of the data folder in clear.
    crate::harness::assert_not_on_disk(&dir.0, None, pem.lines().nth(5).unwrap());
}

/// Nested JSON (arrays, and objects below the flattening depth) lands as VARIANT, through
/// INSERTs (`PARSE_JSON` over the bound text) and through a staged load (the Parquet file's
/// text copied into a landing table, then `PARSE_JSON` into the table), so Snowflake's path
/// syntax reads inside it; a restarted stream keeps writing into the VARIANT columns.
#[tokio::test]
async fn nested_json_lands_as_variant_through_inserts_and_staged_loads() {
    let snow = FakeSnow::start();
    let dir = DataDir::new("dest-snow-variant");
    let mut server = Server::start(&dir.0).await;
    let flush = json!({"max_wait_ms": 20});
    let mut staged = snow.destination();
    staged["copy_rows"] = json!(1);
    let keys = [
        server
            .create_stream(json!({"name": "i", "table": "orders", "destination": snow.destination(), "flush": flush}))
            .await,
        server
            .create_stream(json!({"name": "s", "table": "staged_orders", "destination": staged, "flush": flush,
                                  "stage": {"every_ms": 200}}))
            .await,
    ];
    let first = r#"[{"id": 1, "items": [{"sku": "a", "qty": 2}, {"sku": "b", "qty": 1}], "meta": {"tags": ["x", "y"]}},
                    {"id": 2, "items": [], "meta": {"tags": []}},
                    {"id": 3}]"#;
    let second = r#"[{"id": 4, "items": [{"sku": "c", "qty": 5}], "meta": {"tags": ["z"]}}]"#;
    let streams = [("i", "orders"), ("s", "staged_orders")];
    for ((stream, table), key) in streams.iter().zip(&keys) {
        assert_eq!(server.push(stream, key, first).await.0, 202);
        wait_slowly("the first rows", Duration::from_secs(120), || snow.count(table) == 3).await;
    }
    server.kill9();
    server = Server::start(&dir.0).await;
    for ((stream, table), key) in streams.iter().zip(&keys) {
        assert_eq!(server.push(stream, key, second).await.0, 202);
        wait_slowly("the rows after a restart", Duration::from_secs(120), || snow.count(table) == 4).await;
        let types = snow.lines(&format!(
            "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = '{table}' \
             ORDER BY ordinal_position"
        ));
        assert_eq!(types, ["id|NUMBER", "items|VARIANT", "meta__tags|VARIANT"], "{table}");
        let rows = snow.lines(&format!(
            "SELECT \"id\", \"items\"[0]:sku::VARCHAR, \"items\"[0]:qty, array_size(\"items\"), \
             \"meta__tags\"[1]::VARCHAR FROM \"{table}\" ORDER BY \"id\""
        ));
        assert_eq!(rows, ["1|a|2|2|y", "2|-|-|0|-", "3|-|-|-|-", "4|c|5|1|-"], "{table}");
    }
    let loaded = snow.lines(
        "SELECT count(*) FROM _fs_information_schema._fs_load_history WHERE FILE_NAME LIKE '%SLUICE_STAGE%.parquet' \
         AND STATUS = 'LOADED'",
    );
    assert_ne!(loaded, ["0"], "the staged stream loaded no file by COPY INTO");
}

/// The mirrored customers as `id|name|balance|tier`, empty until the table has its `tier`
/// column (it comes mid-stream, and the query cannot run before).
fn mirrored(snow: &FakeSnow) -> Vec<String> {
    let tier =
        "SELECT count(*) FROM information_schema.columns WHERE table_name = 'customers' AND column_name = 'tier'";
    if snow.count("customers") == 0 || snow.lines(tier) != ["1"] {
        return Vec::new();
    }
    snow.lines("SELECT \"id\", \"name\", \"balance\", coalesce(\"tier\", 'NULL') FROM \"customers\" ORDER BY \"id\"")
        .into_iter()
        .map(|l| l.replace(".0|", "|"))
        .collect()
}
