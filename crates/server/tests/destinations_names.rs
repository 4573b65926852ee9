//! Destination names from templates: a Postgres CDC stream whose destination schema is
//! `copy_[schema]` lands each source schema's tables in a schema of its own, created when
//! missing, with snapshot and changes, across a kill -9.

use std::time::Duration;

use serde_json::json;

use crate::harness::{DataDir, Server, wait_until};
use crate::postgres::Postgres;

#[tokio::test]
async fn a_templated_schema_puts_each_source_schema_in_its_own() {
    let pg = Postgres::start();
    pg.admin("CREATE DATABASE mirror OWNER etl");
    pg.sql(
        "CREATE SCHEMA sales; CREATE SCHEMA hr;
         CREATE TABLE sales.orders (id int PRIMARY KEY, amount numeric(10,2));
         CREATE TABLE hr.people (id int PRIMARY KEY, name text);
         INSERT INTO sales.orders SELECT g, g * 1.5 FROM generate_series(1, 3000) g;
         INSERT INTO hr.people SELECT g, 'p' || g FROM generate_series(1, 50) g;",
    );
    let dir = DataDir::new("dest-names");
    let mut server = Server::start(&dir.0).await;
    let destination = json!({"kind": "postgres", "host": "127.0.0.1", "port": pg.port, "database": "mirror",
                             "user": "etl", "password": "etl", "schema": "copy_[schema]"});
    server
        .create_stream(json!({
            "name": "n", "table": "[table]", "destination": destination,
            "source": {"type": "postgres", "host": "127.0.0.1", "port": pg.port, "database": "etltest",
                       "user": "etl", "password": "etl", "tables": ["sales.orders", "hr.people"],
                       "snapshot_chunk_rows": 500},
            "flush": {"max_wait_ms": 20},
        }))
        .await;
    let count = |table: &str| pg.count_in("mirror", table);
    wait_until("part of the snapshot", Duration::from_secs(120), || async { count("copy_sales.orders") >= 1000 }).await;
    server.kill9();
    server = Server::start(&dir.0).await;
    wait_until("both tables copied", Duration::from_secs(120), || async {
        count("copy_sales.orders") == 3000 && count("copy_hr.people") == 50
    })
    .await;
    pg.sql("UPDATE sales.orders SET amount = 0 WHERE id <= 10; DELETE FROM hr.people WHERE id > 40;");
    for (source, target) in [("sales.orders", "copy_sales.orders"), ("hr.people", "copy_hr.people")] {
        let rows = |table: &str| format!("SELECT string_agg(t::text, ';' ORDER BY t.id) FROM {table} t");
        let want = pg.lines(&rows(source));
        wait_until(&format!("{target} equal to {source}"), Duration::from_secs(60), || async {
            pg.lines_in("mirror", &rows(target)) == want
        })
        .await;
    }
    // Only the two schemas the template named were made; the positions are in `sluice`.
    let schemas = pg.lines_in("mirror", "SELECT nspname FROM pg_namespace WHERE nspname LIKE 'copy_%' ORDER BY 1");
    assert_eq!(schemas, ["copy_hr", "copy_sales"]);
    assert_eq!(pg.lines_in("mirror", "SELECT count(*) FROM sluice.sluice_positions WHERE owner = 'n'"), ["1"]);
    let (_, metrics) = server.get("/api/streams/n/metrics").await;
    assert_eq!(metrics["state"], "running", "{metrics}");

    // A sync cannot take a template for its schema: it names one table.
    let (status, body) = server
        .create_sync(json!({"name": "s", "query": "SELECT 1 AS id", "mode": "replace",
                   "destination": {"kind": "postgres", "host": "127.0.0.1", "port": pg.port, "database": "mirror",
                               "user": "etl", "password": "etl", "schema": "[schema]", "table": "t"}}))
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(body.to_string().contains("destination.schema"), "{body}");
}
