//! Reverse ETL into real database tables: every mode on PostgreSQL, MariaDB and SQLite, with
//! type mapping, a key that disappears under mirror, and a failure in the middle of delivery
//! after which the next run resends.

use std::time::Duration;

use serde_json::{Value, json};

use crate::harness::{DataDir, Server, wait_until};
use crate::mariadb::MariaDb;
use crate::postgres::Postgres;

/// The latest version of each id, without the ones marked gone.
pub const QUERY: &str = "SELECT id, amount::DECIMAL(18,4) AS amount, name, ts FROM src \
    QUALIFY row_number() OVER (PARTITION BY id ORDER BY version DESC) = 1 AND NOT coalesce(gone, false)";

pub const MODES: [&str; 4] = ["replace", "append", "upsert", "mirror"];

/// A push stream `src` in the workspace; returns its key.
pub async fn source(server: &Server) -> String {
    server.create_stream(json!({"name": "src", "table": "src"})).await
}

/// Push events and wait until the table holds `total` rows.
pub async fn push(server: &Server, key: &str, events: Value, total: i64) {
    let (status, body) = server.push("src", key, events.to_string()).await;
    assert_eq!(status, 202, "{body}");
    wait_until("pushed rows", Duration::from_secs(30), || async { server.count("src").await == total }).await;
}

pub fn first_events() -> Value {
    json!([
        {"id": 1, "version": 1, "amount": 12.5, "name": "héllo 😀", "ts": "2024-01-01T10:00:00+02:00", "gone": false},
        {"id": 2, "version": 1, "amount": null, "name": "ñandú", "ts": "2024-06-30T23:59:59.123456-05:00", "gone": false},
        {"id": 3, "version": 1, "amount": 123456789.1234, "name": "plain", "ts": "2024-03-01T00:00:00Z", "gone": false}
    ])
}

/// Id 2 changes, id 3 disappears, id 4 is new.
pub fn second_events() -> Value {
    json!([
        {"id": 2, "version": 2, "amount": 7.25, "name": "ñandú", "ts": "2024-06-30T23:59:59.123456-05:00", "gone": false},
        {"id": 3, "version": 2, "amount": null, "name": "plain", "ts": "2024-03-01T00:00:00Z", "gone": true},
        {"id": 4, "version": 1, "amount": 1, "name": "new", "ts": "2024-01-01T00:00:00Z", "gone": false}
    ])
}

const ROW1: &str = "1|12.5000|héllo 😀|2024-01-01 08:00:00.000000";
const ROW2: &str = "2|NULL|ñandú|2024-07-01 04:59:59.123456";
const ROW2B: &str = "2|7.2500|ñandú|2024-07-01 04:59:59.123456";
const ROW3: &str = "3|123456789.1234|plain|2024-03-01 00:00:00.000000";
const ROW4: &str = "4|1.0000|new|2024-01-01 00:00:00.000000";

/// A database destination as the test sees it.
trait Db {
    fn destination(&self, table: &str) -> Value;
    /// Rows ordered by id, as `id|amount|name|ts` with ts in UTC and NULL spelled out.
    fn rows(&self, table: &str) -> Vec<String>;
    /// The declared types of amount and ts.
    fn types(&self, table: &str) -> Vec<String>;
    /// The name of row `id`, as hex of its UTF-8 bytes.
    fn name_hex(&self, table: &str, id: i64) -> String;
    /// Make every insert or update of a row named 'boom' fail.
    fn arm_failure(&self, table: &str);
    fn disarm(&self, table: &str);
}

impl Db for Postgres {
    fn destination(&self, table: &str) -> Value {
        json!({"kind": "postgres", "host": "127.0.0.1", "port": self.port, "database": "etltest", "user": "etl",
               "password": "etl", "table": table})
    }
    fn rows(&self, table: &str) -> Vec<String> {
        self.lines(&format!(
            "SELECT id, coalesce(amount::text, 'NULL'), name, to_char(ts AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US') \
             FROM {table} ORDER BY id"
        ))
    }
    fn types(&self, table: &str) -> Vec<String> {
        self.lines(&format!(
            "SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = '{table}'::regclass \
             AND attname IN ('amount', 'ts', 'name') ORDER BY attname"
        ))
    }
    fn name_hex(&self, table: &str, id: i64) -> String {
        self.lines(&format!("SELECT encode(convert_to(name, 'UTF8'), 'hex') FROM {table} WHERE id = {id}")).concat()
    }
    fn arm_failure(&self, table: &str) {
        self.sql(&format!(
            "CREATE OR REPLACE FUNCTION boom() RETURNS trigger AS $$ BEGIN IF NEW.name = 'boom' THEN \
             RAISE EXCEPTION 'boom refused'; END IF; RETURN NEW; END $$ LANGUAGE plpgsql; \
             CREATE TRIGGER boom BEFORE INSERT OR UPDATE ON {table} FOR EACH ROW EXECUTE FUNCTION boom();"
        ));
    }
    fn disarm(&self, table: &str) {
        self.sql(&format!("DROP TRIGGER boom ON {table}"));
    }
}

impl Db for MariaDb {
    fn destination(&self, table: &str) -> Value {
        json!({"kind": "mysql", "host": "127.0.0.1", "port": self.port, "database": "etltest", "user": "etl",
               "password": "etl", "table": table})
    }
    fn rows(&self, table: &str) -> Vec<String> {
        self.lines(&format!(
            "SELECT id, coalesce(amount, 'NULL'), name, DATE_FORMAT(ts, '%Y-%m-%d %H:%i:%s.%f') FROM {table} ORDER BY id"
        ))
    }
    fn types(&self, table: &str) -> Vec<String> {
        self.lines(&format!(
            "SELECT column_type FROM information_schema.columns WHERE table_schema = 'etltest' AND table_name = '{table}' \
             AND column_name IN ('amount', 'ts', 'name') ORDER BY column_name"
        ))
    }
    fn name_hex(&self, table: &str, id: i64) -> String {
        self.lines(&format!("SELECT lower(hex(name)) FROM {table} WHERE id = {id}")).concat()
    }
    fn arm_failure(&self, table: &str) {
        for event in ["INSERT", "UPDATE"] {
            // The client splits on ';' unless told another delimiter.
            self.admin(&format!(
                "DELIMITER //\nCREATE TRIGGER etltest.boom_{e} BEFORE {event} ON etltest.{table} FOR EACH ROW \
                 IF NEW.name = 'boom' THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'boom refused'; END IF//",
                e = event.to_lowercase()
            ));
        }
    }
    fn disarm(&self, _table: &str) {
        self.admin("DROP TRIGGER etltest.boom_insert; DROP TRIGGER etltest.boom_update;");
    }
}

/// A SQLite file, read back with Python's own sqlite3 module.
struct Sqlite(std::path::PathBuf);

impl Sqlite {
    fn py(&self, code: &str) -> Vec<String> {
        let script =
            format!("import sqlite3\nc = sqlite3.connect({:?})\n{code}\nc.commit()\n", self.0.display().to_string());
        let out = std::process::Command::new("python3").args(["-c", &script]).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect()
    }
}

impl Db for Sqlite {
    fn destination(&self, table: &str) -> Value {
        json!({"kind": "sqlite", "path": self.0, "table": table})
    }
    fn rows(&self, table: &str) -> Vec<String> {
        self.py(&format!(
            "for r in c.execute('SELECT id, coalesce(amount, \\'NULL\\'), name, substr(ts, 1, 26) FROM {table} ORDER BY id'):\n    print('|'.join(map(str, r)))"
        ))
    }
    fn types(&self, table: &str) -> Vec<String> {
        self.py(&format!(
            "for r in c.execute(\"SELECT type FROM pragma_table_info('{table}') WHERE name IN ('amount','ts','name') ORDER BY name\"):\n    print(r[0])"
        ))
    }
    fn name_hex(&self, table: &str, id: i64) -> String {
        self.py(&format!("print(c.execute('SELECT lower(hex(name)) FROM {table} WHERE id = {id}').fetchone()[0])"))
            .concat()
    }
    fn arm_failure(&self, table: &str) {
        self.py(&format!(
            "c.executescript(\"CREATE TRIGGER boom_i BEFORE INSERT ON {table} WHEN NEW.name = 'boom' BEGIN SELECT RAISE(ABORT, 'boom refused'); END; \
             CREATE TRIGGER boom_u BEFORE UPDATE ON {table} WHEN NEW.name = 'boom' BEGIN SELECT RAISE(ABORT, 'boom refused'); END;\")"
        ));
    }
    fn disarm(&self, _table: &str) {
        self.py("c.executescript('DROP TRIGGER boom_i; DROP TRIGGER boom_u;')");
    }
}

fn counts(run: &Value) -> (i64, i64, i64) {
    assert_eq!(run["status"], "succeeded", "{run}");
    (run["inserted"].as_i64().unwrap(), run["updated"].as_i64().unwrap(), run["deleted"].as_i64().unwrap())
}

/// Every mode into `db`, through three rounds of changes and one failed delivery.
async fn every_mode(db: &dyn Db, prefix: &str, types: &[&str]) {
    let dir = DataDir::new(&format!("retl-{prefix}"));
    let server = Server::start(&dir.0).await;
    let key = source(&server).await;
    push(&server, &key, first_events(), 3).await;
    for mode in MODES {
        let table = format!("{prefix}_{mode}");
        let (status, body) = server
            .create_sync(json!({"name": table, "query": QUERY, "mode": mode, "keys": ["id"],
                                "destination": db.destination(&table)}))
            .await;
        assert_eq!(status, 201, "{body}");
        assert_eq!(counts(&server.run_sync(&table).await), (3, 0, 0), "{mode}: first run");
        assert_eq!(db.rows(&table), [ROW1, ROW2, ROW3], "{mode}: first run");
        assert_eq!(db.types(&table), types, "{mode}: column types");
        assert!(body["config"]["destination"].get("password").is_none(), "the password came back: {body}");
    }

    push(&server, &key, second_events(), 6).await;
    let after_second = [
        ("replace", vec![ROW1, ROW2B, ROW4], (3, 0, 0)),
        ("append", vec![ROW1, ROW1, ROW2, ROW2B, ROW3, ROW4], (3, 0, 0)),
        ("upsert", vec![ROW1, ROW2B, ROW3, ROW4], (1, 1, 0)),
        ("mirror", vec![ROW1, ROW2B, ROW4], (1, 1, 1)),
    ];
    for (mode, rows, expected) in &after_second {
        let table = format!("{prefix}_{mode}");
        assert_eq!(counts(&server.run_sync(&table).await), *expected, "{mode}: second run");
        assert_eq!(db.rows(&table), *rows, "{mode}: second run");
    }
    // Nothing changed: keyed modes send nothing.
    for mode in ["upsert", "mirror"] {
        assert_eq!(counts(&server.run_sync(&format!("{prefix}_{mode}")).await), (0, 0, 0), "{mode}: idle run");
    }

    // A delivery that fails in the middle leaves the table as it was, and the next run resends.
    push(
        &server,
        &key,
        json!([
            {"id": 1, "version": 2, "amount": 99, "name": "héllo 😀", "ts": "2024-01-01T10:00:00+02:00", "gone": false},
            {"id": 5, "version": 1, "amount": 5, "name": "boom", "ts": "2024-01-01T00:00:00Z", "gone": false}
        ]),
        8,
    )
    .await;
    for mode in MODES {
        let table = format!("{prefix}_{mode}");
        let before = db.rows(&table);
        db.arm_failure(&table);
        let run = server.run_sync(&table).await;
        assert_eq!(run["status"], "failed", "{mode}: {run}");
        assert!(run["error"].as_str().unwrap().contains("boom refused"), "{mode}: {run}");
        assert_eq!(db.rows(&table), before, "{mode}: a failed run changes nothing");
        db.disarm(&table);
    }
    let resent = [("replace", (4, 0, 0)), ("append", (4, 0, 0)), ("upsert", (1, 1, 0)), ("mirror", (1, 1, 0))];
    for (mode, expected) in resent {
        let table = format!("{prefix}_{mode}");
        assert_eq!(counts(&server.run_sync(&table).await), expected, "{mode}: resend after failure");
        let rows = db.rows(&table);
        assert!(rows.contains(&"1|99.0000|héllo 😀|2024-01-01 08:00:00.000000".to_string()), "{mode}: {rows:?}");
        assert!(rows.iter().any(|r| r.starts_with("5|5.0000|boom|")), "{mode}: {rows:?}");
    }
    // Characters that text formats and SQL literals must escape arrive unchanged.
    let tricky = "tab\there\nnew line\\back\rslash 'single' \"double\" `tick` %s ? 😀";
    push(
        &server,
        &key,
        json!([{"id": 9, "version": 1, "amount": 0, "name": tricky, "ts": "2024-01-01T00:00:00Z", "gone": false}]),
        9,
    )
    .await;
    for mode in ["replace", "upsert"] {
        let table = format!("{prefix}_{mode}");
        assert_eq!(server.run_sync(&table).await["status"], "succeeded");
        let want: String = tricky.bytes().map(|b| format!("{b:02x}")).collect();
        assert_eq!(db.name_hex(&table, 9), want, "{mode}");
    }
    let (status, runs) = server.get(&format!("/api/syncs/{prefix}_mirror/runs")).await;
    assert_eq!(status, 200);
    let statuses: Vec<&str> = runs["runs"].as_array().unwrap().iter().map(|r| r["status"].as_str().unwrap()).collect();
    assert_eq!(statuses, ["succeeded", "failed", "succeeded", "succeeded", "succeeded"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_every_mode() {
    let pg = Postgres::start();
    every_mode(&pg, "pg", &["numeric(18,4)", "text", "timestamp with time zone"]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn mariadb_every_mode() {
    let db = MariaDb::start();
    every_mode(&db, "my", &["decimal(18,4)", "longtext", "datetime(6)"]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sqlite_every_mode() {
    let dir = DataDir::new("sqlite-target");
    let db = Sqlite(dir.0.join("out.db"));
    every_mode(&db, "lite", &["TEXT", "TEXT", "TEXT"]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn read_only_destinations_are_refused() {
    let pg = Postgres::start();
    pg.admin("ALTER ROLE plain SET default_transaction_read_only = on");
    pg.admin("GRANT ALL ON SCHEMA public TO plain");
    let dir = DataDir::new("retl-ro");
    let server = Server::start(&dir.0).await;
    source(&server).await;
    let mut destination = pg.destination("t");
    destination["user"] = json!("plain");
    destination["password"] = json!("plain");
    destination["database"] = json!("postgres");
    let (status, body) =
        server.create_sync(json!({"name": "ro", "query": "SELECT 1 AS x", "destination": destination})).await;
    assert_eq!(status, 422, "{body}");
    assert!(body["error"].as_str().unwrap().contains("read-only"), "{body}");
    let mut flagged = pg.destination("t");
    flagged["read_only"] = json!(true);
    let (status, body) =
        server.create_sync(json!({"name": "ro", "query": "SELECT 1 AS x", "destination": flagged})).await;
    assert_eq!(status, 400, "{body}");
    assert!(body["error"].as_str().unwrap().contains("destination.read_only"), "{body}");
}
