//! One mirror plan, every destination: Debezium changes whose unchanged TOASTed column is
//! marked unavailable (the placeholder), pushed to mirror streams into the workspace, Postgres,
//! MariaDB, SQLite, DuckLake, Iceberg, Delta and Snowflake (row by row and staged). Each table keeps the value its key had, read
//! back by an independent reader (psql, the mariadb client, Python's sqlite3 and duckdb,
//! pyiceberg, deltalake). Before the plan moved to core, every destination set it to NULL.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::debezium_fidelity::pg;
use crate::destinations_delta::{Reader, read as delta_read};
use crate::harness::{DataDir, Server, wait_slowly};
use crate::iceberg_rest::IcebergRest;
use crate::mariadb::MariaDb;
use crate::postgres::Postgres;
use crate::snowflake::FakeSnow;

const ROWS: &str = "SELECT id, coalesce(length(body), -1), n FROM {t} ORDER BY id";

fn sqlite_rows(path: &Path) -> Option<Vec<String>> {
    let script = format!(
        "import os, sqlite3, sys\np = {:?}\nif not os.path.exists(p): sys.exit(3)\n\
         c = sqlite3.connect('file:' + p + '?mode=ro', uri=True, timeout=30)\n\
         if not c.execute(\"SELECT 1 FROM sqlite_master WHERE name = 'toast_items'\").fetchall(): sys.exit(3)\n\
         for r in c.execute({:?}):\n    print('|'.join(str(v) for v in r))\n",
        path.display().to_string(),
        ROWS.replace("{t}", "toast_items")
    );
    let out = std::process::Command::new("python3").args(["-c", &script]).output().unwrap();
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect())
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unavailable_toast_value_is_kept_by_the_workspace_and_every_destination() {
    let pg_dest = Postgres::start();
    let db = MariaDb::start();
    let catalog = IcebergRest::start();
    let snow = FakeSnow::start();
    let (dir, files) = (DataDir::new("mirror-unavailable"), DataDir::new("mirror-unavailable-files"));
    let server = Server::start(&dir.0).await;
    let (sqlite, lake, delta) = (files.0.join("t.sqlite"), files.0.join("lake"), files.0.join("delta"));
    std::fs::create_dir_all(&lake).unwrap();
    let destinations = [
        ("ws", Value::Null),
        (
            "pg",
            json!({"kind": "postgres", "host": "127.0.0.1", "port": pg_dest.port, "database": "etltest",
                      "user": "etl", "password": "etl", "schema": "public"}),
        ),
        (
            "my",
            json!({"kind": "mysql", "host": "127.0.0.1", "port": db.port, "database": "etltest", "user": "etl",
                      "password": "etl"}),
        ),
        ("lite", json!({"kind": "sqlite", "path": sqlite})),
        ("duck", crate::destinations_ducklake::lake_destination(&lake)),
        ("ice", catalog.destination()),
        ("delta", json!({"kind": "delta", "location": delta.display().to_string()})),
        ("snow", snow.destination()),
        ("snows", {
            let mut staged = snow.destination();
            staged["copy_rows"] = json!(1);
            staged
        }),
    ];
    let mut keys = Vec::new();
    for (name, destination) in &destinations {
        // History where the destination keeps it (Iceberg needs multi_table_commit, Delta has none).
        let history = !matches!(*name, "ice" | "delta" | "snow" | "snows");
        let table = if *name == "snows" { "toast_staged" } else { "toast_items" };
        let mut stream = json!({"name": name, "table": table, "mode": "mirror", "format": "debezium",
                                "keys": ["id"], "history": history, "flush": {"max_wait_ms": 20}});
        if !destination.is_null() {
            stream["destination"] = destination.clone();
        }
        keys.push(server.create_stream(stream).await);
    }
    let rows = |name: &str| -> Option<Vec<String>> {
        let sql = ROWS.replace("{t}", "toast_items");
        match name {
            "pg" => (pg_dest.lines_in("etltest", "SELECT to_regclass('public.toast_items') IS NOT NULL") == ["t"])
                .then(|| pg_dest.lines_in("etltest", &sql)),
            "my" => (db.lines("SELECT count(*) FROM information_schema.tables WHERE table_name = 'toast_items'")
                == ["1"])
            .then(|| db.lines(&sql)),
            "lite" => sqlite_rows(&sqlite),
            "duck" => crate::destinations_ducklake::read(&lake, &sql),
            "ice" => catalog.read("toast_items", &ROWS.replace("{t}", "t")),
            "delta" => delta_read(
                &delta.join("toast_items").display().to_string(),
                &ROWS.replace("{t}", "t"),
                Reader::Deltalake,
                None,
            ),
            "snow" | "snows" => {
                let table = if name == "snow" { "toast_items" } else { "toast_staged" };
                (snow.count(table) > 0).then(|| {
                    snow.lines(&format!(
                        "SELECT \"id\", coalesce(length(\"body\"), -1), \"n\" FROM \"{table}\" ORDER BY \"id\""
                    ))
                })
            }
            _ => unreachable!(),
        }
    };
    let body = "x".repeat(9_600);
    let ph = "__debezium_unavailable_value";
    // Each step its own unit (the next waits for every table to show it): the insert; an
    // update that carries the placeholder (the value is in the table); then, in one unit, a
    // new key updated with the placeholder (the unit's value) and a key that has only the
    // placeholder (NULL: nothing to keep).
    let steps: [(Value, Vec<&str>); 3] = [
        (pg("c", 10, json!({"id": 1, "body": body, "n": 1})), vec!["1|9600|1"]),
        (pg("u", 20, json!({"id": 1, "body": ph, "n": 2})), vec!["1|9600|2"]),
        (
            json!([
                pg("c", 30, json!({"id": 2, "body": "second", "n": 1})),
                pg("u", 40, json!({"id": 2, "body": ph, "n": 2})),
                pg("u", 50, json!({"id": 2, "body": ph, "n": 3})),
                pg("u", 60, json!({"id": 3, "body": ph, "n": 1})),
                pg("u", 70, json!({"id": 1, "body": ph, "n": 3})),
            ]),
            vec!["1|9600|3", "2|6|3", "3|-1|1"],
        ),
    ];
    for (events, want) in steps {
        for ((name, _), key) in destinations.iter().zip(&keys) {
            assert_eq!(server.push(name, key, events.to_string()).await.0, 202, "{name}");
        }
        let want: Vec<String> = want.into_iter().map(str::to_string).collect();
        for (name, _) in &destinations {
            if *name == "ws" {
                let sql = ROWS.replace("{t}", "toast_items");
                crate::harness::wait_until("the workspace", Duration::from_secs(30), || async {
                    server.lines(&sql).await == want
                })
                .await;
                continue;
            }
            wait_slowly(&format!("{name}: {want:?}"), Duration::from_secs(90), || rows(name).as_ref() == Some(&want))
                .await;
        }
    }
    // One history shape: the source position beside each change, in every destination that
    // keeps history.
    let positions = "SELECT count(*) FROM toast_items__changes WHERE _source_position LIKE '%lsn%'";
    assert_eq!(pg_dest.lines_in("etltest", positions), ["7"]);
    assert_eq!(db.lines(positions), ["7"]);
    assert_eq!(crate::destinations_ducklake::read(&lake, positions), Some(vec!["7".to_string()]));
}
