//! Custom SQL blocks into Postgres: Debezium parent/child events from one topic, applied by the
//! user's statements in dependency order (foreign keys in the destination prove a child never
//! lands before its parent, nor a parent is deleted before its child), exactly once across a
//! kill -9; a hostile value in a `{column}` bind stays a value.

use std::time::Duration;

use serde_json::{Value, json};

use crate::broker::{Broker, produce_keyed};
use crate::harness::{DataDir, Server, wait_until};
use crate::postgres::Postgres;

const TEMPLATE: &str = "\
-- Orders reference customers: their block runs after the customers' block.
-- @sql key=orders dependsOn=customers
WITH gone AS (DELETE FROM c_orders WHERE {debezium_cdc_op} = 'd' AND id = {id}::bigint)
INSERT INTO c_orders (id, customer_id, amount)
SELECT {id}::bigint, {customer_id}::bigint, {amount}::double precision WHERE {debezium_cdc_op} <> 'd'
ON CONFLICT (id) DO UPDATE SET customer_id = excluded.customer_id, amount = excluded.amount
-- @end
-- @sql key=customers
WITH gone AS (DELETE FROM c_customers WHERE {debezium_cdc_op} = 'd' AND id = {id}::bigint)
INSERT INTO c_customers (id, name, last_op)
SELECT {id}::bigint, {name}, {debezium_cdc_op} WHERE {debezium_cdc_op} <> 'd'
ON CONFLICT (id) DO UPDATE SET name = excluded.name, last_op = excluded.last_op
-- @end
";

/// A Postgres-connector change event of `table`, at LSN `n`.
fn event(n: u64, table: &str, op: &str, before: Value, after: Value) -> (Option<String>, Option<String>) {
    let id = if after.is_null() { &before["id"] } else { &after["id"] };
    let key = json!({"schema": null, "payload": {"id": id}}).to_string();
    let value = json!({"schema": null, "payload": {"op": op, "before": before, "after": after, "ts_ms": 1_700_000_000_000u64 + n,
        "source": {"connector": "postgresql", "db": "shop", "schema": "public", "table": table, "lsn": 1000 + n,
                   "txId": n, "ts_ms": 1_700_000_000_000u64 + n}}})
    .to_string();
    (Some(key), Some(value))
}

const HOSTILE: &str = "x'); DROP TABLE c_orders; -- {id} $1";

/// Group `k`: an order and its customer created (the order first in the topic), both updated,
/// and for every tenth, both deleted (the customer first in the topic).
fn group(k: u64, lsn: &mut u64) -> Vec<(Option<String>, Option<String>)> {
    let mut next = || {
        *lsn += 1;
        *lsn
    };
    let name = if k == 7 { HOSTILE.to_string() } else { format!("c{k}") };
    let customer = json!({"id": k, "name": name});
    let customer2 = json!({"id": k, "name": format!("{name}-v2")});
    let order = json!({"id": k, "customer_id": k, "amount": k as f64});
    let order2 = json!({"id": k, "customer_id": k, "amount": (2 * k) as f64});
    let mut out = vec![
        event(next(), "orders", "c", Value::Null, order.clone()),
        event(next(), "customers", "c", Value::Null, customer.clone()),
        event(next(), "customers", "u", customer, customer2.clone()),
        event(next(), "orders", "u", order, order2.clone()),
    ];
    if k.is_multiple_of(10) {
        out.push(event(next(), "customers", "d", customer2, Value::Null));
        out.push(event(next(), "orders", "d", order2, Value::Null));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debezium_parents_and_children_go_through_custom_sql_in_dependency_order_across_kill_9() {
    let pg = Postgres::start();
    pg.sql(
        "CREATE TABLE c_customers (id bigint PRIMARY KEY, name text NOT NULL, last_op text NOT NULL); \
         CREATE TABLE c_orders (id bigint PRIMARY KEY, customer_id bigint NOT NULL REFERENCES c_customers (id), \
                                amount double precision NOT NULL)",
    );
    let broker = Broker::start();
    broker.create_topic("shop", 1);
    let dir = DataDir::new("custom-sql");
    let mut server = Server::start(&dir.0).await;
    let mut stream = crate::kafka::kafka_stream("cs", "[table]", &broker, json!(["shop"]));
    stream["mode"] = json!("mirror");
    stream["format"] = json!("debezium");
    // A group's events arrive together and its unit closes after 60 ms without data, so the
    // order created before its customer is in the customer's unit: only the blocks' order
    // keeps the foreign key.
    stream["flush"] = json!({"max_wait_ms": 2000, "linger_ms": 60});
    stream["destination"] = json!({"kind": "postgres", "host": "127.0.0.1", "port": pg.port, "database": "etltest",
                                   "user": "etl", "password": "etl", "custom_sql": TEMPLATE});
    server.create_stream(stream).await;

    const GROUPS: u64 = 120;
    let producer = broker.producer(&[("linger.ms", "20")]);
    let producing = tokio::spawn(async move {
        let mut lsn = 0;
        for k in 0..GROUPS {
            produce_keyed(&producer, "shop", &group(k, &mut lsn)).await;
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
    });
    let customers = |pg: &Postgres| pg.lines("SELECT count(*) FROM c_customers")[0].parse::<i64>().unwrap();
    let threshold = 20 + (rand::random::<u64>() % 40) as i64;
    wait_until("customers in Postgres", Duration::from_secs(120), || async { customers(&pg) >= threshold }).await;
    server.kill9();
    server = Server::start(&dir.0).await;
    producing.await.unwrap();
    let last = (GROUPS - 1) as i64;
    wait_until("the last order updated", Duration::from_secs(120), || async {
        pg.lines(&format!("SELECT count(*) FROM c_orders WHERE id = {last} AND amount = {}", 2 * last))[0] == "1"
    })
    .await;

    let kept = GROUPS - GROUPS / 10;
    let check = pg.lines(
        "SELECT (SELECT count(*) FROM c_customers) || '|' || (SELECT count(*) FROM c_orders) || '|' || \
         (SELECT count(*) FROM c_customers WHERE id % 10 = 0) || '|' || \
         (SELECT count(*) FROM c_customers WHERE id <> 7 AND name <> 'c' || id || '-v2') || '|' || \
         (SELECT count(*) FROM c_customers WHERE last_op <> 'u') || '|' || \
         (SELECT count(*) FROM c_orders WHERE customer_id <> id OR amount <> 2 * id)",
    );
    assert_eq!(check, [format!("{kept}|{kept}|0|0|0|0")], "every change applied once, in order");
    let hostile = pg.lines("SELECT name FROM c_customers WHERE id = 7");
    assert_eq!(hostile, [format!("{HOSTILE}-v2")], "the bind kept the value as a value");
    let (_, metrics) = server.get("/api/streams/cs/metrics").await;
    assert_eq!(metrics["rejects"], 0, "{metrics}");
}

#[tokio::test]
async fn custom_sql_with_a_cycle_or_a_quoted_token_is_refused_at_save() {
    let dir = DataDir::new("custom-sql-refused");
    let server = Server::start(&dir.0).await;
    let destination = |sql: &str| {
        json!({"name": "c", "table": "[table]", "mode": "mirror", "format": "debezium",
               "destination": {"kind": "postgres", "host": "127.0.0.1", "database": "d", "user": "u", "custom_sql": sql}})
    };
    for (sql, words) in [
        ("-- @sql key=a dependsOn=b\nSELECT 1\n-- @end\n-- @sql key=b dependsOn=a\nSELECT 1\n-- @end", "cycle"),
        ("-- @sql key=a dependsOn=nope\nSELECT 1\n-- @end", "`nope`, which has no block"),
        ("-- @sql key=a\nINSERT INTO t VALUES ('{name}')\n-- @end", "inside quotes"),
    ] {
        let response = server.http.post(server.url("/api/streams")).json(&destination(sql)).send().await.unwrap();
        assert_eq!(response.status().as_u16(), 400);
        let error = response.text().await.unwrap();
        assert!(error.contains("destination.custom_sql") && error.contains(words), "{error}");
    }
}

#[tokio::test]
async fn routed_push_events_go_through_custom_sql_into_mariadb_parents_first() {
    let db = crate::mariadb::MariaDb::start();
    db.admin(
        "CREATE TABLE etltest.m_customers (id BIGINT PRIMARY KEY, name TEXT NOT NULL) ENGINE=InnoDB; \
         CREATE TABLE etltest.m_orders (id BIGINT PRIMARY KEY, customer_id BIGINT NOT NULL, \
           FOREIGN KEY (customer_id) REFERENCES etltest.m_customers (id)) ENGINE=InnoDB",
    );
    let dir = DataDir::new("custom-sql-mariadb");
    let server = Server::start(&dir.0).await;
    let sql = "-- @sql key=m_orders dependsOn=m_customers\n\
               INSERT INTO m_orders (id, customer_id) VALUES ({id}, {customer_id})\n\
               ON DUPLICATE KEY UPDATE customer_id = VALUES(customer_id)\n\
               -- @end\n\
               -- @sql key=m_customers\n\
               INSERT INTO m_customers (id, name) VALUES ({id}, {name}) ON DUPLICATE KEY UPDATE name = VALUES(name)\n\
               -- @end\n";
    let key = server
        .create_stream(json!({"name": "m", "table": "unused", "transform": {"route": "{kind}"},
            "destination": {"kind": "mysql", "host": "127.0.0.1", "port": db.port, "database": "etltest",
                            "user": "etl", "password": "etl", "custom_sql": sql}}))
        .await;
    // Each order comes before its customer in the push.
    let mut events = Vec::new();
    for k in 0..50 {
        let name = if k == 7 { HOSTILE.to_string() } else { format!("c{k}") };
        events.push(json!({"kind": "m_orders", "id": k, "customer_id": k}));
        events.push(json!({"kind": "m_customers", "id": k, "name": name}));
    }
    assert_eq!(server.push("m", &key, Value::Array(events).to_string()).await.0, 202);
    let counts = db.lines("SELECT (SELECT count(*) FROM m_customers), (SELECT count(*) FROM m_orders)");
    assert_eq!(counts, ["50|50"], "the push is answered after the commit");
    assert_eq!(db.lines("SELECT name FROM m_customers WHERE id = 7"), [HOSTILE]);
}

#[tokio::test]
async fn push_events_go_through_custom_sql_into_sqlite() {
    let dir = DataDir::new("custom-sql-sqlite");
    let target = DataDir::new("custom-sql-sqlite-file");
    let file = target.0.join("totals.db");
    let create = format!(
        "import sqlite3\nc = sqlite3.connect({:?})\nc.execute('CREATE TABLE totals (user TEXT PRIMARY KEY, n INTEGER NOT NULL, amount REAL NOT NULL)')\nc.commit()\n",
        file.display().to_string()
    );
    let out = std::process::Command::new("python3").args(["-c", &create]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let server = Server::start(&dir.0).await;
    let sql = "-- @sql key=events\n\
               INSERT INTO totals (user, n, amount) VALUES ({user}, 1, {amount})\n\
               ON CONFLICT (user) DO UPDATE SET n = n + 1, amount = amount + excluded.amount\n\
               -- @end\n";
    let key = server
        .create_stream(json!({"name": "t", "table": "events",
            "destination": {"kind": "sqlite", "path": file, "custom_sql": sql}}))
        .await;
    let users = ["ann", "bob", HOSTILE];
    let events: Vec<Value> = (0..30).map(|i| json!({"user": users[i % 3], "amount": 1.5})).collect();
    assert_eq!(server.push("t", &key, Value::Array(events).to_string()).await.0, 202);
    let read = format!(
        "import sqlite3\nc = sqlite3.connect({:?})\nfor r in c.execute('SELECT user, n, amount FROM totals ORDER BY user'): print(f'{{r[0]}}|{{r[1]}}|{{r[2]}}')\n",
        file.display().to_string()
    );
    let out = std::process::Command::new("python3").args(["-c", &read]).output().unwrap();
    let rows: Vec<String> = String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect();
    assert_eq!(rows, ["ann|10|15.0", "bob|10|15.0", &format!("{HOSTILE}|10|15.0")]);
}

#[tokio::test]
async fn changes_run_in_source_order_and_a_table_without_a_block_stops_the_stream() {
    let dir = DataDir::new("custom-sql-order");
    let target = DataDir::new("custom-sql-order-file");
    let file = target.0.join("t.db");
    let create = format!(
        "import sqlite3\nc = sqlite3.connect({:?})\nc.execute('CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT)')\nc.commit()\n",
        file.display().to_string()
    );
    assert!(std::process::Command::new("python3").args(["-c", &create]).status().unwrap().success());
    let server = Server::start(&dir.0).await;
    let sql = "-- @sql key=items\n\
               INSERT INTO items (id, name) SELECT {id}, {name} WHERE {debezium_cdc_op} <> 'd' ON CONFLICT (id) DO UPDATE SET name = excluded.name\n\
               -- @end\n";
    let key = server
        .create_stream(json!({"name": "o", "table": "items", "mode": "mirror", "keys": ["id"],
            "destination": {"kind": "sqlite", "path": file, "custom_sql": sql}}))
        .await;
    // A keyed JSON mirror has upserts only; the order check is about runs in source order.
    let events = json!([{"id": 1, "name": "a"}, {"id": 1, "name": "b"}, {"id": 2, "name": "c"}]);
    assert_eq!(server.push("o", &key, events.to_string()).await.0, 202);
    let read = format!(
        "import sqlite3\nc = sqlite3.connect({:?})\nfor r in c.execute('SELECT id, name FROM items ORDER BY id'): print(f'{{r[0]}}|{{r[1]}}')\n",
        file.display().to_string()
    );
    let out = std::process::Command::new("python3").args(["-c", &read]).output().unwrap();
    let rows: Vec<String> = String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect();
    assert_eq!(rows, ["1|b", "2|c"], "changes of one key run in source order");

    let routed = server
        .create_stream(json!({"name": "r", "table": "unused", "transform": {"route": "{kind}"},
            "destination": {"kind": "sqlite", "path": target.0.join("r.db"), "custom_sql": sql}}))
        .await;
    let (status, body) = server.push("r", &routed, json!([{"kind": "other", "id": 1}]).to_string()).await;
    assert_ne!(status, 202, "{body}");
    wait_until("the stream reports the missing block", Duration::from_secs(30), || async {
        let (_, metrics) = server.get("/api/streams/r/metrics").await;
        metrics["last_error"].as_str().is_some_and(|e| e.contains("no block for table `other`"))
    })
    .await;
}
