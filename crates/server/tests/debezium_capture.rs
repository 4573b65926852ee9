//! Real Debezium captures, replayed through both transports: the Debezium engine (pydbzengine)
//! reads a real PostgreSQL and a real MariaDB (through the MySQL connector), snapshot then
//! streaming, with key changes, tables without a primary key (two identical rows, one of them
//! deleted), truncates, an unchanged TOAST value, MySQL TIME values below zero and past 24 h, and
//! Postgres `numeric` values of different scales. Every record it emits (key and value, as
//! Kafka Connect's JSON converter writes them) goes to a file; the file is then pushed over HTTP
//! as `{"key", "value"}` pairs to one mirror stream and produced with its key to a Kafka topic
//! read by another, and every mirrored table must equal the source.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::broker::{Broker, produce_keyed};
use crate::debezium_real::Feeder;
use crate::harness::{DataDir, Server, wait_until};
use crate::kafka::kafka_stream;
use crate::mariadb::MariaDb;
use crate::postgres::Postgres;

/// The captured records, `(key, value)` as JSON text; `None` for a null key (a table without a
/// primary key) or value (a tombstone).
type Records = Vec<(Option<String>, Option<String>)>;

fn read_capture(feed: &DataDir) -> Vec<Value> {
    let text = std::fs::read_to_string(feed.0.join("capture.jsonl")).unwrap_or_default();
    // A line still being written is not whole yet.
    text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}

/// `(op, table)` of a captured record's value.
fn op_and_table(record: &Value) -> Option<(String, String)> {
    let payload = &record["value"]["payload"];
    Some((payload["op"].as_str()?.to_string(), payload["source"]["table"].as_str()?.to_string()))
}

/// Run the feeder with `settings` until the capture holds `snapshot` snapshot rows, run
/// `changes` (which must end with an insert into `marker`), and return every record up to
/// that insert's.
async fn capture(settings: &[(&str, String)], snapshot: usize, changes: impl FnOnce()) -> Records {
    let feed = DataDir::new("dbz-capture");
    let mut settings = settings.to_vec();
    settings.push(("FEED_FILE", feed.0.join("capture.jsonl").display().to_string()));
    let _feeder = Feeder::spawn(&feed, &settings);
    let log = || std::fs::read_to_string(feed.0.join("debezium.log")).unwrap_or_default();
    let count = |op: &str, table: Option<&str>| {
        read_capture(&feed)
            .iter()
            .filter_map(op_and_table)
            .filter(|(o, t)| o == op && table.is_none_or(|table| table == t))
            .count()
    };
    let started = Instant::now();
    wait_until("the Debezium snapshot", Duration::from_secs(240), || async {
        let n = count("r", None);
        assert!(n <= snapshot, "more snapshot rows than the tables hold: {n}");
        assert!(started.elapsed() < Duration::from_secs(230), "no snapshot: {}", log());
        n == snapshot
    })
    .await;
    changes();
    wait_until("the changes in the capture", Duration::from_secs(120), || async { count("c", Some("marker")) == 1 })
        .await;
    read_capture(&feed)
        .into_iter()
        .map(|r| {
            let text = |v: &Value| (!v.is_null()).then(|| v.to_string());
            (text(&r["key"]), text(&r["value"]))
        })
        .collect()
}

/// Mirror streams `h` (HTTP push, tables `h_<table>`) and `k` (Kafka topic `dbz`, tables
/// `k_<table>`), both with history, fed `records`.
async fn replay(server: &Server, broker: &Broker, records: &Records) {
    let key = server
        .create_stream(json!({
            "name": "h", "table": "h_[table]", "mode": "mirror", "format": "debezium", "history": true,
        }))
        .await;
    // A few records per push: changes meet both inside a write and across writes.
    for chunk in records.chunks(7) {
        let lines: Vec<String> = chunk
            .iter()
            .map(|(k, v)| {
                format!(
                    "{{\"key\": {}, \"value\": {}}}",
                    k.as_deref().unwrap_or("null"),
                    v.as_deref().unwrap_or("null")
                )
            })
            .collect();
        let (status, body) = server.push("h", &key, lines.join("\n")).await;
        assert_eq!(status, 202, "{body}");
    }
    broker.create_topic("dbz", 1);
    let mut stream = kafka_stream("k", "k_[table]", broker, json!(["dbz"]));
    stream["mode"] = json!("mirror");
    stream["format"] = json!("debezium");
    stream["history"] = json!(true);
    server.create_stream(stream).await;
    produce_keyed(&broker.producer(&[("enable.idempotence", "true")]), "dbz", records).await;
}

/// Wait until every `(table, source rows, Sluice query)` matches in both streams' tables (at
/// most two minutes in all); rows are compared as sorted text lines. Returns the tables that did
/// not match, with both sides, so the other checks still run before the test fails.
async fn wait_equal(server: &Server, tables: &[(&str, Vec<String>, &str)]) -> Vec<String> {
    let mut mismatches = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    for prefix in ["h", "k"] {
        for (table, want, query) in tables {
            let mut want = want.clone();
            want.sort();
            let query = query.replace("{t}", &format!("{prefix}_{table}"));
            let got = loop {
                let mut got = server.lines(&query).await;
                got.sort();
                if got == want || Instant::now() > deadline {
                    break got;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            };
            if got != want {
                mismatches.push(format!("{prefix}_{table}: got {got:?}, want {want:?}"));
            }
        }
    }
    mismatches
}

/// The ledger as `table|column|reason` lines.
async fn ledger(server: &Server) -> Vec<String> {
    server.lines("SELECT \"table\", \"column\", reason FROM sluice.rejects ORDER BY 1, 2, 3").await
}

#[tokio::test]
async fn real_debezium_captures_of_postgres_mirror_equal_over_http_and_kafka() {
    let pg = Postgres::start();
    pg.sql(
        "CREATE TABLE accounts (id int PRIMARY KEY, name text, amount numeric);
         INSERT INTO accounts VALUES (1, 'Anne', 1), (2, 'Bob', 2.50), (3, NULL, -0.001),
           (6, 'Fay', 12345678901234567890.123456789);
         CREATE TABLE docs (id int PRIMARY KEY, body text, n int);
         INSERT INTO docs SELECT 1, string_agg(md5(i::text), ''), 1 FROM generate_series(1, 300) i;
         INSERT INTO docs VALUES (2, 'two', 1);
         CREATE TABLE notes (a int, b text);
         ALTER TABLE notes REPLICA IDENTITY FULL;
         INSERT INTO notes VALUES (1, 'x'), (1, 'x'), (2, NULL);
         CREATE TABLE gone (id int PRIMARY KEY, v text);
         INSERT INTO gone VALUES (1, 'a'), (2, 'b');
         CREATE TABLE marker (id int PRIMARY KEY);",
    );
    let settings = [
        ("DBZ_CONNECTOR", "postgres".to_string()),
        ("DB_PORT", pg.port.to_string()),
        ("DB_USER", "etl".into()),
        ("DB_PASSWORD", "etl".into()),
        ("DB_DATABASE", "etltest".into()),
        ("DB_TABLES", "public.accounts,public.docs,public.notes,public.gone,public.marker".into()),
    ];
    let records = capture(&settings, 11, || {
        pg.sql(
            "UPDATE accounts SET id = 10, name = 'Anne moved' WHERE id = 1;
             UPDATE accounts SET amount = 0.000001 WHERE id = 2;
             INSERT INTO accounts VALUES (4, 'Dee', 98765432109876543210.0123456789), (5, 'Eve', -5);
             DELETE FROM accounts WHERE id = 3;
             UPDATE docs SET n = 2 WHERE id = 1;
             DELETE FROM notes WHERE ctid = (SELECT ctid FROM notes WHERE a = 1 LIMIT 1);
             UPDATE notes SET a = 3 WHERE a = 2;
             INSERT INTO notes VALUES (4, NULL), (4, NULL);
             TRUNCATE gone;
             INSERT INTO gone VALUES (9, 'after');
             INSERT INTO marker VALUES (1);",
        );
    })
    .await;
    let placeholders = records
        .iter()
        .filter(|(_, v)| v.as_deref().is_some_and(|v| v.contains("__debezium_unavailable_value")))
        .count();
    assert_eq!(placeholders, 1, "the docs update carries the unchanged-TOAST placeholder");

    let broker = Broker::start();
    let dir = DataDir::new("dbz-capture-pg");
    let server = Server::start(&dir.0).await;
    replay(&server, &broker, &records).await;
    let tables = [
        ("accounts", pg.lines("SELECT id, name, amount::text FROM accounts"), "SELECT id, name, amount FROM {t}"),
        (
            "docs",
            pg.lines("SELECT id, md5(body), length(body), n FROM docs"),
            "SELECT id, md5(body), length(body), n FROM {t}",
        ),
        ("notes", pg.lines("SELECT a, b FROM notes"), "SELECT a, b FROM {t}"),
        ("gone", pg.lines("SELECT id, v FROM gone"), "SELECT id, v FROM {t}"),
        ("marker", pg.lines("SELECT id FROM marker"), "SELECT id FROM {t}"),
    ];
    assert!(tables[1].1.iter().any(|l| l.ends_with("|9600|2")), "{:?}", tables[1].1);
    let mismatches = wait_equal(&server, &tables).await;
    assert_histories_and_ledger(&server, mismatches).await;
}

#[tokio::test]
async fn real_debezium_captures_of_mariadb_mirror_equal_over_http_and_kafka() {
    let db = MariaDb::start_binlog();
    db.lines(
        "CREATE TABLE accounts (id int PRIMARY KEY, name varchar(40), amount decimal(30,10), t time(6));
         INSERT INTO accounts VALUES (1, 'Anne', 1.5, '-838:59:59'), (2, 'Bob', -2.25, '838:59:59'),
           (3, NULL, 0, '25:00:00.5'), (6, 'Fay', 12345678901234567890.0123456789, NULL);
         CREATE TABLE notes (a int, b varchar(10));
         INSERT INTO notes VALUES (1, 'x'), (1, 'x'), (2, NULL);
         CREATE TABLE gone (id int PRIMARY KEY, v varchar(10));
         INSERT INTO gone VALUES (1, 'a'), (2, 'b');
         CREATE TABLE marker (id int PRIMARY KEY);",
    );
    let settings = [
        ("DBZ_CONNECTOR", "mysql".to_string()),
        ("DB_PORT", db.port.to_string()),
        ("DB_USER", "etl".into()),
        ("DB_PASSWORD", "etl".into()),
        ("DB_DATABASE", "etltest".into()),
        ("DB_TABLES", "etltest.accounts,etltest.notes,etltest.gone,etltest.marker".into()),
    ];
    let records = capture(&settings, 9, || {
        db.lines(
            "UPDATE accounts SET id = 10, name = 'Anne moved' WHERE id = 1;
             UPDATE accounts SET t = '-00:00:01', amount = 0.0000000001 WHERE id = 2;
             INSERT INTO accounts VALUES (4, 'Dee', -99999999999999999999.9999999999, '100:00:00.000001'),
               (5, 'Eve', 5, '12:34:56');
             DELETE FROM accounts WHERE id = 3;
             DELETE FROM notes WHERE a = 1 LIMIT 1;
             UPDATE notes SET a = 3 WHERE a = 2;
             INSERT INTO notes VALUES (4, NULL), (4, NULL);
             TRUNCATE gone;
             INSERT INTO gone VALUES (9, 'after');
             INSERT INTO marker VALUES (1);",
        );
    })
    .await;

    let broker = Broker::start();
    let dir = DataDir::new("dbz-capture-my");
    let server = Server::start(&dir.0).await;
    replay(&server, &broker, &records).await;
    // MariaDB's client prints NULL as `NULL`; Sluice's lines leave it empty.
    let source = |sql: &str| -> Vec<String> {
        db.lines(sql)
            .iter()
            .map(|l| l.split('|').map(|v| if v == "NULL" { "" } else { v }).collect::<Vec<_>>().join("|"))
            .collect()
    };
    let tables = [
        (
            "accounts",
            // TIME as microseconds on both sides: a MySQL TIME is a duration, an INTERVAL here.
            source("SELECT id, name, amount, CAST(TIME_TO_SEC(t) * 1000000 AS SIGNED) FROM accounts"),
            "SELECT id, name, amount::VARCHAR, CAST(round(epoch(t) * 1000000) AS BIGINT) FROM {t}",
        ),
        ("notes", source("SELECT a, b FROM notes"), "SELECT a, b FROM {t}"),
        ("gone", source("SELECT id, v FROM gone"), "SELECT id, v FROM {t}"),
        ("marker", source("SELECT id FROM marker"), "SELECT id FROM {t}"),
    ];
    let mismatches = wait_equal(&server, &tables).await;
    assert_histories_and_ledger(&server, mismatches).await;
}

/// What both captures end with, over both transports (`h_`: HTTP push, `k_`: Kafka): the key
/// change and the truncate in the histories, an empty ledger, and no table unlike its source.
async fn assert_histories_and_ledger(server: &Server, mismatches: Vec<String>) {
    for prefix in ["h", "k"] {
        // Debezium sends a key change as a delete of the old key and a create of the new one.
        let moved = server
            .lines(&format!("SELECT _op FROM {prefix}_accounts__changes WHERE id IN (1, 10) ORDER BY _sequence"))
            .await;
        assert_eq!(moved, ["snapshot", "delete", "insert"], "{prefix}: the key change in the history");
        let truncates = server.lines(&format!("SELECT _op FROM {prefix}_gone__changes WHERE _op = 'truncate'")).await;
        assert_eq!(truncates, ["truncate"]);
    }
    assert_eq!(ledger(server).await, Vec::<String>::new());
    assert_eq!(mismatches, Vec::<String>::new(), "every mirrored table equals the source");
}
