//! Rows a destination refuses for good (a value too long for a Postgres `varchar(5)`, a NULL
//! where Snowflake's table says NOT NULL) are found by rolled-back tries, land in the stream's
//! dead-letter table in the destination with the destination's error, and in the workspace
//! ledger, while the rest of the unit is written once and the stream goes on.

use std::time::Duration;

use serde_json::{Value, json};

use crate::harness::{DataDir, Server, wait_slowly, wait_until};
use crate::postgres::Postgres;

/// Stream `o` of orders into `destination`'s `orders`, its dead letters into `orders_dead`; its
/// push key.
async fn orders_stream(server: &Server, destination: Value) -> String {
    server
        .create_stream(json!({
            "name": "o", "table": "orders", "dead_letter_table": "orders_dead",
            "destination": destination,
            "flush": {"max_wait_ms": 20},
        }))
        .await
}

fn pg_destination(pg: &Postgres) -> Value {
    json!({"kind": "postgres", "host": "127.0.0.1", "port": pg.port, "database": "etltest", "user": "etl",
           "password": "etl", "schema": "public"})
}

#[tokio::test(flavor = "multi_thread")]
async fn rows_postgres_refuses_go_to_the_dead_letter_table_and_the_stream_goes_on() {
    let pg = Postgres::start();
    pg.sql("CREATE TABLE orders (id bigint PRIMARY KEY, code varchar(5), amount double precision);");
    let dir = DataDir::new("dead-letters-pg");
    let server = Server::start(&dir.0).await;
    let key = orders_stream(&server, pg_destination(&pg)).await;
    // One push of 40 orders: #7 and #23 have codes Postgres refuses (too long); #30 has an
    // amount the decoder refuses (the table's column is a double).
    let events: Vec<Value> = (0..40)
        .map(|i| match i {
            7 | 23 => json!({"id": i, "code": format!("toolong{i}"), "amount": i}),
            30 => json!({"id": i, "code": "ok", "amount": "lots"}),
            _ => json!({"id": i, "code": format!("c{i}"), "amount": i}),
        })
        .collect();
    let (status, body) = server.push("o", &key, Value::Array(events).to_string()).await;
    assert_eq!(status, 202, "{body}");
    let rows = || pg.lines("SELECT count(*), count(amount), sum(id) FROM orders");
    // Every order but the two refused; #30 with its amount NULL (the decoder's misfit).
    let want = vec![format!("38|37|{}", (0..40).sum::<i64>() - 7 - 23)];
    wait_slowly("the orders Postgres takes", Duration::from_secs(60), || rows() == want).await;
    let dead = pg.lines(
        "SELECT \"table\", position IS NOT NULL, value::jsonb ->> 'id', reason LIKE '%refused%value too long%' \
         FROM orders_dead WHERE reason LIKE '%refused%' ORDER BY value::jsonb ->> 'id'",
    );
    assert_eq!(dead, ["orders|t|23|t", "orders|t|7|t"], "{:?}", pg.lines("SELECT * FROM orders_dead"));
    let misfit = pg.lines("SELECT \"column\", value FROM orders_dead WHERE reason NOT LIKE '%refused%'");
    assert_eq!(misfit, ["amount|\"lots\""]);
    // The workspace ledger has the same rows.
    let ledger = server.lines("SELECT count(*) FROM sluice.rejects WHERE stream = 'o'").await;
    assert_eq!(ledger, ["3"]);
    // The stream goes on: later orders land, and a later refusal is isolated again.
    let later: Vec<Value> = (40..50)
        .map(|i| json!({"id": i, "code": if i == 45 { "x".repeat(9) } else { format!("c{i}") }, "amount": i}))
        .collect();
    assert_eq!(server.push("o", &key, Value::Array(later).to_string()).await.0, 202);
    wait_slowly("the later orders", Duration::from_secs(60), || pg.lines("SELECT count(*) FROM orders") == ["47"])
        .await;
    assert_eq!(pg.lines("SELECT count(*) FROM orders_dead"), ["4"]);
    // A line that is not JSON, with a NUL in it (which Postgres text refuses): its dead letter
    // lands with the NUL replaced, and the stream goes on.
    let (status, _) = server.push("o", &key, "{\"id\": 50, \"code\": \"c50\"}\nnot json \u{0} here\n").await;
    assert_eq!(status, 202);
    wait_slowly("the line's dead letter", Duration::from_secs(60), || {
        pg.lines("SELECT count(*) FROM orders_dead WHERE value LIKE 'not json%here'") == ["1"]
    })
    .await;
    assert_eq!(pg.lines("SELECT count(*) FROM orders"), ["48"]);
    let (_, metrics) = server.get("/api/streams/o/metrics").await;
    assert_eq!(metrics["state"], "running", "{metrics}");
}

#[tokio::test(flavor = "multi_thread")]
async fn rows_snowflake_refuses_go_to_the_dead_letter_table() {
    let snow = crate::snowflake::FakeSnow::start();
    snow.lines("CREATE TABLE \"events\" (\"id\" BIGINT, \"name\" VARCHAR NOT NULL)");
    let dir = DataDir::new("dead-letters-snow");
    let server = Server::start(&dir.0).await;
    let key = server
        .create_stream(json!({"name": "e", "table": "events", "dead_letter_table": "events_dead",
                              "destination": snow.destination(), "flush": {"max_wait_ms": 20}}))
        .await;
    let events: Vec<Value> = (0..12)
        .map(|i| if i % 5 == 0 { json!({"id": i}) } else { json!({"id": i, "name": format!("n{i}")}) })
        .collect();
    assert_eq!(server.push("e", &key, Value::Array(events).to_string()).await.0, 202);
    wait_until("the events Snowflake takes", Duration::from_secs(60), || async { snow.count("events") == 9 }).await;
    // fakesnow answers a NOT NULL violation with a bare "Unhandled exception"; real Snowflake
    // names the column. Either way the reason says the destination refused the row.
    let dead = snow.lines("SELECT \"value\" FROM \"events_dead\" WHERE \"reason\" ILIKE '%destination refused%'");
    let mut ids: Vec<i64> = dead.iter().filter_map(|v| serde_json::from_str::<Value>(v).ok()?["id"].as_i64()).collect();
    ids.sort_unstable();
    assert_eq!(ids, [0, 5, 10], "{:?}", snow.lines("SELECT * FROM \"events_dead\""));
    assert_eq!(snow.lines("SELECT count(*) FROM \"events\" WHERE \"id\" % 5 = 0"), ["0"]);
    let (_, metrics) = server.get("/api/streams/e/metrics").await;
    assert_eq!(metrics["state"], "running", "{metrics}");
}

#[tokio::test]
async fn a_dead_letter_table_needs_a_destination_that_commits_it_with_the_rows() {
    let dir = DataDir::new("dead-letters-config");
    let server = Server::start(&dir.0).await;
    for (stream, needle) in [
        (json!({"name": "a", "table": "t", "dead_letter_table": "dead"}), "dead_letter_table"),
        (
            json!({"name": "b", "table": "t", "dead_letter_table": "dead",
                   "destination": {"kind": "delta", "location": "/tmp/x"}}),
            "dead_letter_table",
        ),
        (
            json!({"name": "c", "table": "t", "dead_letter_table": "a.b",
                   "destination": {"kind": "sqlite", "path": "/tmp/x.db"}}),
            "dead_letter_table",
        ),
    ] {
        let r = server.http.post(server.url("/api/streams")).json(&stream).send().await.unwrap();
        assert_eq!(r.status(), 400);
        let body: Value = r.json().await.unwrap();
        assert!(body["error"].as_str().unwrap_or_default().contains(needle), "{body}");
    }
}

/// ClickHouse cannot take an insert back, so what it would refuse is not isolated; what the
/// decoder refuses (text that is not a date, for the user's `Date` column) still lands in the
/// dead-letter table there, with the unit's rows.
#[tokio::test(flavor = "multi_thread")]
async fn values_that_do_not_fit_clickhouse_columns_go_to_its_dead_letter_table() {
    let ch = crate::clickhouse::ClickHouse::start();
    ch.lines(
        "CREATE TABLE default.events (id Nullable(Int64), day Nullable(Date), _sluice_unit UInt64 DEFAULT 0) \
         ENGINE = MergeTree ORDER BY tuple()",
    );
    let dir = DataDir::new("dead-letters-ch");
    let server = Server::start(&dir.0).await;
    let key = server
        .create_stream(json!({"name": "e", "table": "events", "dead_letter_table": "events_dead",
                              "destination": {"kind": "clickhouse", "url": ch.url()},
                              "flush": {"max_wait_ms": 20}}))
        .await;
    let events: Vec<Value> = (0..12)
        .map(|i| {
            let day = if i % 5 == 0 { format!("day {i}") } else { "2024-01-02".to_string() };
            json!({"id": i, "day": day})
        })
        .collect();
    assert_eq!(server.push("e", &key, Value::Array(events).to_string()).await.0, 202);
    wait_slowly("the dead letters in ClickHouse", Duration::from_secs(60), || {
        ch.try_count("SELECT count() FROM default.events_dead") == Some(3)
    })
    .await;
    let dead = ch.lines("SELECT column, value FROM default.events_dead ORDER BY value");
    assert_eq!(dead, ["day|\"day 0\"", "day|\"day 10\"", "day|\"day 5\""]);
    // The rows landed with the unit, the misfits' `day` NULL.
    assert_eq!(ch.lines("SELECT count(), count(day) FROM default.events"), ["12|9"]);
}

/// Ten orders, the fourth with a code of nine characters.
fn ten_orders() -> String {
    let orders: Vec<Value> = (0..10)
        .map(|i| json!({"id": i, "code": if i == 3 { "ninechars".to_string() } else { format!("c{i}") }}))
        .collect();
    Value::Array(orders).to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn rows_mariadb_refuses_go_to_the_dead_letter_table() {
    let db = crate::mariadb::MariaDb::start();
    db.lines("CREATE TABLE orders (id BIGINT PRIMARY KEY, code VARCHAR(5))");
    let dir = DataDir::new("dead-letters-maria");
    let server = Server::start(&dir.0).await;
    let mysql = json!({"kind": "mysql", "host": "127.0.0.1", "port": db.port, "database": "etltest", "user": "etl",
                       "password": "etl"});
    let key = orders_stream(&server, mysql).await;
    assert_eq!(server.push("o", &key, ten_orders()).await.0, 202);
    wait_slowly("the orders MariaDB takes", Duration::from_secs(60), || {
        db.lines("SELECT count(*) FROM orders") == ["9"]
    })
    .await;
    let dead = db.lines("SELECT JSON_VALUE(value, '$.id'), reason LIKE '%refused%' FROM orders_dead");
    assert_eq!(dead, ["3|1"], "{:?}", db.lines("SELECT * FROM orders_dead"));
}

#[tokio::test(flavor = "multi_thread")]
async fn rows_sqlite_refuses_go_to_the_dead_letter_table() {
    let dir = DataDir::new("dead-letters-sqlite");
    let file = dir.0.join("shop.db");
    let made = std::process::Command::new("python3")
        .args([
            "-c",
            &format!(
                "import sqlite3\nc = sqlite3.connect({:?})\n\
                 c.execute('CREATE TABLE orders (id INTEGER PRIMARY KEY, code TEXT CHECK (length(code) <= 5))')\n\
                 c.commit()\n",
                file.display().to_string()
            ),
        ])
        .status()
        .unwrap();
    assert!(made.success());
    let server = Server::start(&dir.0).await;
    let key = orders_stream(&server, json!({"kind": "sqlite", "path": file})).await;
    assert_eq!(server.push("o", &key, ten_orders()).await.0, 202);
    let read = |sql: &str| {
        let out = std::process::Command::new("python3")
            .args([
                "-c",
                &format!(
                    "import sqlite3\nc = sqlite3.connect('file:' + {:?} + '?mode=ro', uri=True, timeout=30)\n\
                     for r in c.execute({sql:?}): print('|'.join(str(v) for v in r))\n",
                    file.display().to_string()
                ),
            ])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect::<Vec<_>>()
    };
    wait_slowly("the orders SQLite takes", Duration::from_secs(60), || read("SELECT count(*) FROM orders") == ["9"])
        .await;
    let dead = read("SELECT json_extract(value, '$.id'), reason LIKE '%CHECK constraint%' FROM orders_dead");
    assert_eq!(dead, ["3|1"]);
}

/// A dead-letter table of the user's that cannot take the ledger's rows (its columns are
/// others): the unit goes without its dead letters, which stay in the workspace ledger, and the
/// stream goes on.
#[tokio::test(flavor = "multi_thread")]
async fn a_dead_letter_table_the_destination_refuses_does_not_stop_the_stream() {
    let pg = Postgres::start();
    pg.sql(
        "CREATE TABLE orders (id bigint PRIMARY KEY, code varchar(5)); CREATE TABLE orders_dead (stream int NOT NULL);",
    );
    let dir = DataDir::new("dead-letters-refused");
    let server = Server::start(&dir.0).await;
    let key = orders_stream(&server, pg_destination(&pg)).await;
    assert_eq!(server.push("o", &key, ten_orders()).await.0, 202);
    wait_slowly("the orders Postgres takes", Duration::from_secs(60), || {
        pg.lines("SELECT count(*) FROM orders") == ["9"]
    })
    .await;
    assert_eq!(pg.lines("SELECT count(*) FROM orders_dead"), ["0"]);
    let ledger = server.lines("SELECT count(*) FROM sluice.rejects WHERE stream = 'o'").await;
    assert_eq!(ledger, ["1"]);
    assert_eq!(server.push("o", &key, r#"[{"id": 99, "code": "late"}]"#).await.0, 202);
    wait_slowly("a later order", Duration::from_secs(60), || pg.lines("SELECT count(*) FROM orders") == ["10"]).await;
    let (_, metrics) = server.get("/api/streams/o/metrics").await;
    assert_eq!(metrics["state"], "running", "{metrics}");
    assert!(metrics["destination"]["dead_letters_refused"].as_f64() >= Some(1.0), "{metrics}");
}
