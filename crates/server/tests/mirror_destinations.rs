//! One mirror plan, every destination: the same Debezium changes pushed to mirror streams into
//! the workspace, Postgres, MariaDB, SQLite, DuckLake, Iceberg, Delta and Snowflake (row by row
//! and staged), each table read back by an independent reader (psql, the mariadb client,
//! Python's sqlite3 and duckdb, pyiceberg, deltalake, Snowflake's Python connector).
//! - A column marked unavailable (Debezium's unchanged-TOAST placeholder) keeps the value its
//!   key had. Before the plan moved to core, every destination set it to NULL.
//! - A table without a key, with identical rows, is mirrored as a multiset. Before, its events
//!   went to the ledger and no table was made.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};

use crate::debezium_fidelity::pg;
use crate::destinations_delta::{Reader, read as delta_read};
use crate::harness::{DataDir, Server, wait_slowly, wait_until};
use crate::iceberg_rest::IcebergRest;
use crate::mariadb::MariaDb;
use crate::postgres::Postgres;
use crate::snowflake::FakeSnow;

/// The destinations' servers and files, and a server with one mirror stream into each.
struct Targets {
    pg: Postgres,
    db: MariaDb,
    catalog: IcebergRest,
    snow: Option<FakeSnow>,
    sqlite: PathBuf,
    lake: PathBuf,
    delta: PathBuf,
    server: Server,
    /// `(stream, its table, its push key)`.
    streams: Vec<(&'static str, String, String)>,
    _dirs: (DataDir, DataDir),
}

impl Targets {
    /// Streams named `ws` (the workspace), `pg`, `my`, `lite`, `duck`, `ice`, `delta`, and with
    /// `snow`, `snow` and `snows` (staged), each with `stream` (its `name`, `table` and
    /// `destination` set here); `history` where the destination keeps it.
    async fn start(name: &str, stream: Value, snow: bool, history: bool) -> Self {
        let (dir, files) = (DataDir::new(name), DataDir::new(&format!("{name}-files")));
        let (pg, db, catalog) = (Postgres::start(), MariaDb::start(), IcebergRest::start());
        let snow = snow.then(FakeSnow::start);
        let server = Server::start(&dir.0).await;
        let (sqlite, lake, delta) = (files.0.join("t.sqlite"), files.0.join("lake"), files.0.join("delta"));
        std::fs::create_dir_all(&lake).unwrap();
        let mut destinations = vec![
            ("ws", Value::Null),
            (
                "pg",
                json!({"kind": "postgres", "host": "127.0.0.1", "port": pg.port, "database": "etltest",
                          "user": "etl", "password": "etl", "schema": "public"}),
            ),
            (
                "my",
                json!({"kind": "mysql", "host": "127.0.0.1", "port": db.port, "database": "etltest",
                          "user": "etl", "password": "etl"}),
            ),
            ("lite", json!({"kind": "sqlite", "path": sqlite})),
            ("duck", crate::destinations_ducklake::lake_destination(&lake)),
            ("ice", catalog.destination()),
            ("delta", json!({"kind": "delta", "location": delta.display().to_string()})),
        ];
        if let Some(snow) = &snow {
            let mut staged = snow.destination();
            staged["copy_rows"] = json!(1);
            destinations.extend([("snow", snow.destination()), ("snows", staged)]);
        }
        let mut streams = Vec::new();
        for (name, destination) in destinations {
            let table = if name == "snows" { "items_staged" } else { "items" }.to_string();
            let mut config = stream.clone();
            config["name"] = json!(name);
            config["table"] = json!(table);
            config["flush"] = json!({"max_wait_ms": 20});
            // History where the destination keeps it (Iceberg needs multi_table_commit; Delta
            // and Snowflake have none).
            config["history"] = json!(history && !matches!(name, "ice" | "delta" | "snow" | "snows"));
            if !destination.is_null() {
                config["destination"] = destination;
            }
            streams.push((name, table, server.create_stream(config).await));
        }
        Self { pg, db, catalog, snow, sqlite, lake, delta, server, streams, _dirs: (dir, files) }
    }

    /// The rows of `sql` (over `{t}`) in stream `name`'s table; `None` while it does not exist.
    async fn rows(&self, name: &str, table: &str, sql: &str) -> Option<Vec<String>> {
        let on = sql.replace("{t}", table);
        match name {
            "ws" => Some(self.server.lines(&on).await),
            "pg" => (self.pg.lines_in("etltest", &format!("SELECT to_regclass('public.{table}') IS NOT NULL"))
                == ["t"])
            .then(|| self.pg.lines_in("etltest", &on)),
            "my" => {
                (self.db.lines(&format!("SELECT count(*) FROM information_schema.tables WHERE table_name = '{table}'"))
                    == ["1"])
                .then(|| self.db.lines(&on.replace('"', "`")))
            }
            "lite" => sqlite_rows(&self.sqlite, table, &on),
            "duck" => crate::destinations_ducklake::read(&self.lake, &on),
            "ice" => self.catalog.read(table, &sql.replace("{t}", "t")),
            "delta" => delta_read(
                &self.delta.join(table).display().to_string(),
                &sql.replace("{t}", "t"),
                Reader::Deltalake,
                None,
            ),
            "snow" | "snows" => {
                let snow = self.snow.as_ref().expect("snowflake started");
                // Snowflake's names as Sluice writes them: quoted, as given.
                let quoted = sql.replace("{t}", &format!("\"{table}\""));
                (snow.count(table) > 0).then(|| snow.lines(&quoted))
            }
            _ => unreachable!(),
        }
    }

    /// Push `events` to every stream, then wait until each table's rows of `sql` are `want`
    /// (in any order).
    async fn step(&self, events: &Value, sql: &str, want: &[&str]) {
        for (name, _, key) in &self.streams {
            let (status, body) = self.server.push(name, key, events.to_string()).await;
            assert_eq!(status, 202, "{name}: {body}");
        }
        let mut want: Vec<String> = want.iter().map(|s| s.to_string()).collect();
        want.sort();
        for (name, table, _) in &self.streams {
            let sorted = |rows: Option<Vec<String>>| {
                rows.map(|mut r| {
                    r.sort();
                    r
                })
            };
            if *name == "ws" {
                wait_until("the workspace", Duration::from_secs(30), || async {
                    sorted(self.rows(name, table, sql).await).as_ref() == Some(&want)
                })
                .await;
                continue;
            }
            let runtime = tokio::runtime::Handle::current();
            wait_slowly(&format!("{name}: {want:?}"), Duration::from_secs(90), || {
                let got = tokio::task::block_in_place(|| runtime.block_on(self.rows(name, table, sql)));
                sorted(got).as_ref() == Some(&want)
            })
            .await;
        }
    }
}

fn sqlite_rows(path: &std::path::Path, table: &str, sql: &str) -> Option<Vec<String>> {
    let script = format!(
        "import os, sqlite3, sys\np = {:?}\nif not os.path.exists(p): sys.exit(3)\n\
         c = sqlite3.connect('file:' + p + '?mode=ro', uri=True, timeout=30)\n\
         if not c.execute(\"SELECT 1 FROM sqlite_master WHERE name = '{table}'\").fetchall(): sys.exit(3)\n\
         for r in c.execute({sql:?}):\n    print('|'.join(str(v) for v in r))\n",
        path.display().to_string(),
    );
    let out = std::process::Command::new("python3").args(["-c", &script]).output().unwrap();
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect())
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unavailable_toast_value_is_kept_by_the_workspace_and_every_destination() {
    let stream = json!({"mode": "mirror", "format": "debezium", "keys": ["id"]});
    let targets = Targets::start("mirror-unavailable", stream, true, true).await;
    let rows = "SELECT \"id\", coalesce(length(\"body\"), -1), \"n\" FROM {t}";
    let body = "x".repeat(9_600);
    let ph = "__debezium_unavailable_value";
    // Each step its own unit (the next waits for every table to show it): the insert; an
    // update that carries the placeholder (the value is in the table); then, in one unit, a
    // new key updated with the placeholder (the unit's value), a key that has only the
    // placeholder (NULL: nothing to keep) and the first key again.
    targets.step(&pg("c", 10, json!({"id": 1, "body": body, "n": 1})), rows, &["1|9600|1"]).await;
    targets.step(&pg("u", 20, json!({"id": 1, "body": ph, "n": 2})), rows, &["1|9600|2"]).await;
    let unit = json!([
        pg("c", 30, json!({"id": 2, "body": "second", "n": 1})),
        pg("u", 40, json!({"id": 2, "body": ph, "n": 2})),
        pg("u", 50, json!({"id": 2, "body": ph, "n": 3})),
        pg("u", 60, json!({"id": 3, "body": ph, "n": 1})),
        pg("u", 70, json!({"id": 1, "body": ph, "n": 3})),
    ]);
    targets.step(&unit, rows, &["1|9600|3", "2|6|3", "3|-1|1"]).await;
    // One history shape: the source position beside each change, in every destination that
    // keeps history.
    let positions = "SELECT count(*) FROM items__changes WHERE _source_position LIKE '%lsn%'";
    assert_eq!(targets.pg.lines_in("etltest", positions), ["7"]);
    assert_eq!(targets.db.lines(positions), ["7"]);
    assert_eq!(crate::destinations_ducklake::read(&targets.lake, positions), Some(vec!["7".to_string()]));
}

/// A Debezium event of a table without a key (REPLICA IDENTITY FULL: deletes and updates carry
/// the whole old row), as Kafka Connect's JSON converter writes it with its null key.
fn keyless(op: &str, lsn: u64, before: Value, after: Value) -> Value {
    let mut event = pg(op, lsn, after);
    event["before"] = before;
    event["source"]["table"] = json!("notes");
    json!({"key": null, "value": event})
}

#[tokio::test(flavor = "multi_thread")]
async fn a_table_without_a_key_is_mirrored_as_a_multiset_by_the_workspace_and_every_destination() {
    let stream = json!({"mode": "mirror", "format": "debezium"});
    let targets = Targets::start("mirror-keyless", stream, false, true).await;
    let rows = "SELECT \"a\", coalesce(\"b\", '-') FROM {t}";
    let (x, null) = (json!({"a": 1, "b": "x"}), json!({"a": 2, "b": null}));
    // Two identical rows and one with a NULL.
    let first = json!([
        keyless("c", 10, Value::Null, x.clone()),
        keyless("c", 20, Value::Null, x.clone()),
        keyless("c", 30, Value::Null, null.clone()),
    ]);
    targets.step(&first, rows, &["1|x", "1|x", "2|-"]).await;
    // One of the identical rows deleted; the NULL row updated; two identical rows added, one
    // of them deleted again in the same unit.
    let four = json!({"a": 4, "b": null});
    let second = json!([
        keyless("d", 40, x.clone(), Value::Null),
        keyless("u", 50, null, json!({"a": 3, "b": null})),
        keyless("c", 60, Value::Null, four.clone()),
        keyless("c", 70, Value::Null, four.clone()),
        keyless("c", 80, Value::Null, four.clone()),
        keyless("d", 90, four, Value::Null),
    ]);
    targets.step(&second, rows, &["1|x", "3|-", "4|-", "4|-"]).await;
    // An UPDATE that changed nothing moves a copy onto itself; then a new row, so that the
    // wait ends only after the unit of the update.
    let third =
        json!([keyless("u", 100, x.clone(), x.clone()), keyless("c", 110, Value::Null, json!({"a": 5, "b": null}))]);
    targets.step(&third, rows, &["1|x", "3|-", "4|-", "4|-", "5|-"]).await;
    // Every change in the history, the delete's included.
    let history = "SELECT count(*) FROM items__changes";
    assert_eq!(targets.pg.lines_in("etltest", history), ["11"]);
    assert_eq!(targets.db.lines(history), ["11"]);
    assert_eq!(crate::destinations_ducklake::read(&targets.lake, history), Some(vec!["11".to_string()]));
    let (_, rejects) = targets.server.get("/api/streams/pg/rejects").await;
    assert_eq!(rejects["rows"].as_array().map(Vec::len), Some(0), "{rejects}");
}
