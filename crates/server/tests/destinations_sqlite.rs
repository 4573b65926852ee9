//! Streams into a SQLite file: HTTP push appended exactly once across kill -9, with a field
//! that appears mid-stream (a column added), and Debezium changes mirrored (inserts, updates, a
//! delete, a key change) with their history. The file is read back with Python's own sqlite3
//! module, a reader independent of Sluice.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

use crate::harness::{DataDir, Server, wait_slowly, wait_until};

fn sqlite_destination(path: &Path) -> Value {
    json!({"kind": "sqlite", "path": path})
}

/// The rows of `sql` on the SQLite file as `|`-joined values (None as `-`), read by Python's
/// sqlite3 module, read-only; empty while the file or a table in `needs` does not exist.
fn lines(path: &Path, needs: &[&str], sql: &str) -> Vec<String> {
    let script = format!(
        "import os, sqlite3, sys\n\
         p = {path:?}\n\
         if not os.path.exists(p): sys.exit(0)\n\
         c = sqlite3.connect('file:' + p + '?mode=ro', uri=True, timeout=30)\n\
         have = {{r[0] for r in c.execute(\"SELECT name FROM sqlite_master WHERE type = 'table'\")}}\n\
         if not set({needs:?}) <= have: sys.exit(0)\n\
         for r in c.execute({sql:?}):\n    print('|'.join('-' if v is None else str(v) for v in r))\n",
        path = path.display().to_string(),
    );
    let out = std::process::Command::new("python3").args(["-c", &script]).output().expect("run python3");
    assert!(out.status.success(), "python3 failed: {}\n{script}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect()
}

/// Rows in `table`, 0 while it does not exist.
fn count(path: &Path, table: &str) -> i64 {
    lines(path, &[table], &format!("SELECT count(*) FROM \"{table}\"")).first().map_or(0, |n| n.parse().unwrap())
}

#[tokio::test]
async fn http_push_to_sqlite_exactly_once_across_kill_9_with_a_column_added_mid_stream() {
    let dir = DataDir::new("dest-sqlite");
    let target = DataDir::new("dest-sqlite-file");
    let db: PathBuf = target.0.join("app.db");
    let mut server = Server::start(&dir.0).await;
    let key = server
        .create_stream(json!({"name": "o", "table": "events", "destination": sqlite_destination(&db),
                              "flush": {"max_wait_ms": 50}}))
        .await;

    // 300 pushes of 10 events; from the 150th push on the events carry a `coupon`. Each push is
    // retried with its Idempotency-Key until accepted, across the restart (a new port).
    const PUSHES: usize = 300;
    const TOTAL: i64 = (PUSHES * 10) as i64;
    let base = Arc::new(Mutex::new(server.base.clone()));
    let pushing = crate::harness::push_orders(base.clone(), "o", key, PUSHES, 30);
    let threshold = 400 + (rand::random::<u64>() % 800) as i64;
    wait_slowly("events in the SQLite file", Duration::from_secs(60), || count(&db, "events") >= threshold).await;
    server.kill9();
    let seen = count(&db, "events");
    assert!(seen < TOTAL, "the kill came after the last event ({seen}): it tests nothing");
    server = Server::start(&dir.0).await;
    *base.lock().unwrap() = server.base.clone();
    pushing.await.unwrap();
    wait_slowly("every event in the SQLite file", Duration::from_secs(90), || count(&db, "events") >= TOTAL).await;

    let (_, metrics) = server.get("/api/streams/o/metrics").await;
    let check = lines(
        &db,
        &["events"],
        "SELECT count(*), count(DISTINCT id), count(coupon), min(id), max(id), \
         sum(coupon IS NOT (CASE WHEN id >= 1500 THEN 'c' || id END)), sum(amount IS NOT (id % 97) + 0.5) FROM events",
    );
    assert_eq!(check, ["3000|3000|1500|0|2999|0|0"], "each event once, coupons where sent: {metrics}");
    // The position is in the file, written with the rows.
    let positions = lines(&db, &["sluice_positions"], "SELECT owner, json_valid(checkpoint) FROM sluice_positions");
    assert_eq!(positions, ["o|1"]);
    // The workspace holds no copy of the rows.
    let (status, _) = server.sql_raw("SELECT count(*) FROM events").await;
    assert_ne!(status, 200, "the rows went to the SQLite file, not the workspace");
    assert_eq!(metrics["state"], "running", "{metrics}");
}

/// A Debezium Postgres connector event for `public.items` at `lsn`, as a pushed key/value pair.
fn change(op: &str, lsn: u64, id: i64, before: Value, after: Value) -> String {
    let value = json!({
        "before": before, "after": after, "op": op, "ts_ms": 1_700_000_000_000u64 + lsn,
        "source": {"version": "3.6.3.Final", "connector": "postgresql", "name": "dbserver1",
                   "ts_ms": 1_700_000_000_000u64 + lsn, "snapshot": if op == "r" { "true" } else { "false" },
                   "db": "inventory", "schema": "public", "table": "items", "txId": 700 + lsn, "lsn": lsn},
    });
    json!({"key": {"id": id}, "value": value}).to_string()
}

fn row(id: i64, name: &str, qty: i64) -> Value {
    json!({"id": id, "name": name, "qty": qty})
}

#[tokio::test]
async fn debezium_mirror_into_sqlite_ends_equal_with_every_change_in_the_history() {
    let dir = DataDir::new("dest-sqlite-mirror");
    let target = DataDir::new("dest-sqlite-mirror-file");
    let db = target.0.join("app.db");
    let server = Server::start(&dir.0).await;
    let key = server
        .create_stream(json!({
            "name": "m", "table": "[table]", "mode": "mirror", "format": "debezium", "keys": ["id"],
            "history": true, "destination": sqlite_destination(&db), "flush": {"max_wait_ms": 20},
        }))
        .await;
    let pushes: Vec<Vec<String>> = vec![
        // A snapshot of three rows, then two inserts: the table is created.
        vec![
            change("r", 10, 1, Value::Null, row(1, "a", 1)),
            change("r", 10, 2, Value::Null, row(2, "b", 2)),
            change("r", 10, 3, Value::Null, row(3, "c", 3)),
            change("c", 20, 4, Value::Null, row(4, "d", 4)),
            change("c", 30, 5, Value::Null, row(5, "e", 5)),
        ],
        // Updates into the existing table; two of one key in one write (the last wins).
        vec![
            change("u", 40, 2, row(2, "b", 2), row(2, "b2", 20)),
            change("u", 50, 1, row(1, "a", 1), row(1, "a2", 10)),
            change("u", 60, 1, row(1, "a2", 10), row(1, "a3", 11)),
        ],
        // A delete (and its tombstone), and a key change: Debezium's delete of the old key and
        // create of the new one.
        vec![
            change("d", 70, 3, json!({"id": 3}), Value::Null),
            json!({"key": {"id": 3}, "value": null}).to_string(),
            change("d", 80, 4, row(4, "d", 4), Value::Null),
            change("c", 80, 40, Value::Null, row(40, "d", 4)),
        ],
        // An insert and an update of the moved row, with a field that is new (a column added).
        vec![
            change("c", 90, 6, Value::Null, json!({"id": 6, "name": "f", "qty": 6, "note": "new"})),
            change("u", 100, 40, row(40, "d", 4), json!({"id": 40, "name": "d2", "qty": 41, "note": "moved"})),
        ],
    ];
    for (n, events) in pushes.iter().enumerate() {
        let (status, body) = server.push("m", &key, events.join("\n")).await;
        assert_eq!(status, 202, "{body}");
        assert_eq!(body["rejected"], 0, "push {n}: {body}");
        // One push per write, so the later ones meet an existing table.
        let changes = events.iter().filter(|e| !e.contains("\"value\":null")).count() as i64;
        let before: i64 =
            pushes[..n].iter().map(|p| p.iter().filter(|e| !e.contains("\"value\":null")).count() as i64).sum();
        wait_until(&format!("push {n} in the history"), Duration::from_secs(30), || async {
            count(&db, "items__changes") >= before + changes
        })
        .await;
    }

    let rows = lines(&db, &["items"], "SELECT id, name, qty, note FROM items ORDER BY id");
    assert_eq!(rows, ["1|a3|11|-", "2|b2|20|-", "5|e|5|-", "6|f|6|new", "40|d2|41|moved"]);
    let ops = lines(
        &db,
        &["items__changes"],
        "SELECT _op, count(*), count(DISTINCT _sequence) FROM items__changes GROUP BY 1 ORDER BY 1",
    );
    assert_eq!(ops, ["delete|2|2", "insert|4|4", "snapshot|3|3", "update|4|4"], "{ops:?}");
    let history = lines(&db, &["items__changes"], "SELECT _op, id, name, qty FROM items__changes ORDER BY _sequence");
    assert_eq!(
        history,
        [
            "snapshot|1|a|1",
            "snapshot|2|b|2",
            "snapshot|3|c|3",
            "insert|4|d|4",
            "insert|5|e|5",
            "update|2|b2|20",
            "update|1|a2|10",
            "update|1|a3|11",
            "delete|3|-|-",
            "delete|4|d|4",
            "insert|40|d|4",
            "insert|6|f|6",
            "update|40|d2|41",
        ],
    );
    let positions = lines(&db, &["sluice_positions"], "SELECT owner FROM sluice_positions");
    assert_eq!(positions, ["m"]);
    let (_, metrics) = server.get("/api/streams/m/metrics").await;
    assert_eq!(metrics["state"], "running", "{metrics}");
}

/// A JSON mirror into SQLite without `keys` takes the table's primary key (in key order), else
/// its narrowest plain unique index; a table with neither, or none, is refused with 422.
#[tokio::test]
async fn sqlite_mirror_keys_are_detected_from_the_table_or_refused() {
    let target = DataDir::new("dest-sqlite-keys-file");
    let db = target.0.join("app.db");
    let setup = format!(
        "import sqlite3\nc = sqlite3.connect({:?})\nc.executescript('''\n\
         CREATE TABLE people (id INTEGER, email TEXT NOT NULL, name TEXT);\n\
         CREATE UNIQUE INDEX people_email ON people (email);\n\
         CREATE UNIQUE INDEX people_wide ON people (email, name);\n\
         CREATE UNIQUE INDEX people_lower ON people (lower(name));\n\
         INSERT INTO people VALUES (1, 'a@x', 'Ann');\n\
         CREATE TABLE pairs (b TEXT, a TEXT, v INTEGER, PRIMARY KEY (a, b));\n\
         CREATE TABLE bare (id INTEGER, name TEXT);\n''')\nc.commit()\n",
        db.display().to_string()
    );
    let out = std::process::Command::new("python3").args(["-c", &setup]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let dir = DataDir::new("dest-sqlite-keys");
    let server = Server::start(&dir.0).await;
    let stream = |name: &str, table: &str| {
        json!({"name": name, "table": table, "mode": "mirror", "destination": sqlite_destination(&db),
               "flush": {"max_wait_ms": 20}})
    };
    for (table, why) in [("bare", "no primary key or unique index"), ("missing", "does not exist")] {
        let r = server.http.post(server.url("/api/streams")).json(&stream("s", table)).send().await.unwrap();
        let status = r.status().as_u16();
        let body: Value = r.json().await.unwrap_or(Value::Null);
        assert_eq!(status, 422, "{body}");
        assert!(body.to_string().contains(why), "{body}");
    }
    server.create_stream(stream("q", "pairs")).await;
    let (_, described) = server.get("/api/streams/q").await;
    assert_eq!(described["config"]["keys"], json!(["a", "b"]), "the primary key in key order: {described}");
    let key = server.create_stream(stream("p", "people")).await;
    let (_, described) = server.get("/api/streams/p").await;
    assert_eq!(described["config"]["keys"], json!(["email"]), "the narrowest plain unique index: {described}");
    let body = r#"[{"id": 1, "email": "a@x", "name": "Ann B"}, {"id": 2, "email": "b@x", "name": "Bo"}]"#;
    let (status, answer) = server.push("p", &key, body).await;
    assert_eq!(status, 202, "{answer}");
    wait_until("the upserts in the SQLite file", Duration::from_secs(60), || async {
        lines(&db, &["people"], "SELECT id, email, name FROM people ORDER BY id") == ["1|a@x|Ann B", "2|b@x|Bo"]
    })
    .await;
}
