//! Postgres CDC against a real PostgreSQL 15: test connection, snapshot then streaming, type
//! fidelity, TOAST, ADD COLUMN, deletes, kill -9, and removal dropping the slot.

use std::time::Duration;

use serde_json::{Value, json};

use crate::harness::{DataDir, Server, wait_until};
use crate::kafka::{rows, wait_rows};
use crate::postgres::Postgres;

fn source(pg: &Postgres, tables: &[&str]) -> Value {
    json!({"type": "postgres", "host": "127.0.0.1", "port": pg.port, "database": "etltest", "user": "etl",
           "password": "etl", "tables": tables})
}

#[tokio::test]
async fn test_connection_names_each_failure() {
    let pg = Postgres::start();
    let dir = DataDir::new("pg-checks");
    let server = Server::start(&dir.0).await;
    let test = |body: Value| {
        let server = &server;
        async move {
            let r = server.http.post(server.url("/api/sources/test")).json(&body).send().await.unwrap();
            assert_eq!(r.status(), 200);
            r.json::<Value>().await.unwrap()
        }
    };
    let failed = |checks: &Value, name: &str| -> Option<String> {
        checks["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == json!(name) && c["ok"] == json!(false))
            .map(|c| c["message"].as_str().unwrap().to_string())
    };
    pg.sql("CREATE TABLE keyed (id int PRIMARY KEY); CREATE TABLE loose (v int);");
    let ok = test(json!({"name": "s", "source": source(&pg, &["public.keyed"])})).await;
    assert_eq!(ok["ok"], json!(true), "{ok}");
    // Wrong password.
    let mut bad = source(&pg, &["public.keyed"]);
    bad["password"] = json!("nope");
    let r = test(json!({"source": bad})).await;
    assert!(failed(&r, "connect").unwrap().contains("password"), "{r}");
    // No REPLICATION attribute.
    let mut plain = source(&pg, &["public.keyed"]);
    plain["user"] = json!("plain");
    plain["password"] = json!("plain");
    let r = test(json!({"source": plain})).await;
    assert!(failed(&r, "replication_privilege").unwrap().contains("ALTER ROLE \"plain\" WITH REPLICATION"), "{r}");
    // A table with neither a primary key nor REPLICA IDENTITY FULL, and one that does not exist.
    let r = test(json!({"source": source(&pg, &["public.loose"])})).await;
    assert!(failed(&r, "tables").unwrap().contains("REPLICA IDENTITY FULL"), "{r}");
    let r = test(json!({"source": source(&pg, &["public.nope"])})).await;
    assert!(failed(&r, "tables").is_some(), "{r}");
    // Every replication slot taken.
    for i in 0..20 {
        pg.admin(&format!("SELECT pg_create_logical_replication_slot('filler_{i}', 'pgoutput')"));
    }
    let r = test(json!({"source": source(&pg, &["public.keyed"])})).await;
    assert!(failed(&r, "free_replication_slot").unwrap().contains("max_replication_slots"), "{r}");
    // Creating a stream runs the checks first and creates nothing.
    let r = server
        .http
        .post(server.url("/api/streams"))
        .json(&json!({"name": "blocked", "table": "t", "source": source(&pg, &["public.keyed"])}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 422);
    assert_eq!(server.get("/api/streams/blocked").await.0, 404);
    // A server without logical WAL or WAL senders.
    let replica = Postgres::start_with("wal_level = replica\nmax_wal_senders = 0\n");
    let r = test(json!({"source": source(&replica, &["public.keyed"])})).await;
    assert!(failed(&r, "wal_level").unwrap().contains("wal_level = logical"), "{r}");
    assert!(failed(&r, "free_wal_sender").unwrap().contains("max_wal_senders"), "{r}");
}

#[tokio::test]
async fn snapshot_then_streaming_with_types_toast_ddl_and_removal() {
    let pg = Postgres::start();
    pg.sql(
        "CREATE TYPE mood AS ENUM ('calm', 'busy');
         CREATE DOMAIN positive AS int CHECK (VALUE > 0);
         CREATE TABLE items (id int PRIMARY KEY, price numeric(38,10), at timestamptz, tags text[], doc jsonb,
           uid uuid, raw bytea, m mood, qty positive, note text, cost numeric(12,2), nums int[], moods mood[],
           grid int[][]);
         CREATE TABLE events (id bigint, v text);
         ALTER TABLE events REPLICA IDENTITY FULL;
         INSERT INTO items VALUES
           (1, 12345.6789012345, '2024-01-02 10:00:00+02', '{a,\"b c\",NULL}', '{\"k\": [1, 2]}',
            '9b2f5f6a-8d4e-4a53-9d5b-3f1c2a7e6b10', '\\x0102', 'calm', 3, repeat('x', 100000), 9.99, '{1,NULL,3}',
            '{calm,busy}', NULL),
           (2, -0.5, '2024-06-30 23:59:59.123456-05', '{}', 'null', NULL, NULL, 'busy', 7, 'short', NULL, NULL, NULL,
            '{{1,2},{3,4}}');
         INSERT INTO events VALUES (1, 'one'), (2, 'two');",
    );
    let dir = DataDir::new("pg-cdc");
    let server = Server::start(&dir.0).await;
    server
        .create_stream(json!({"name": "pg", "table": "[table]", "history": true,
                               "source": source(&pg, &["public.items", "public.events"]), "flush": {"max_wait_ms": 100}}))
        .await;
    wait_rows(&server, "items", 2, Duration::from_secs(60)).await;
    wait_rows(&server, "events", 2, Duration::from_secs(60)).await;
    let types = server
        .sql("SELECT column_name, data_type FROM information_schema.columns WHERE table_name = 'items' ORDER BY ordinal_position")
        .await;
    let ty = |c: &str| types.iter().find(|t| t["column_name"] == json!(c)).map(|t| t["data_type"].clone()).unwrap();
    assert_eq!(ty("price"), json!("DECIMAL(38,10)"));
    assert_eq!(ty("at"), json!("TIMESTAMP WITH TIME ZONE"));
    assert_eq!(ty("tags"), json!("VARCHAR[]"));
    assert_eq!(ty("nums"), json!("BIGINT[]"));
    assert_eq!(ty("moods"), json!("VARCHAR[]"));
    // Postgres declares int[][] as int[]: a two-dimensional value does not fit the list, so it is
    // NULL in the table and kept in the ledger with the reason.
    assert_eq!(ty("grid"), json!("BIGINT[]"));
    let ledger = server.sql(r#"SELECT value, reason FROM sluice.rejects WHERE "column" = 'grid'"#).await;
    assert_eq!(ledger.len(), 1, "{ledger:?}");
    assert_eq!(ledger[0]["value"], json!("\"[[1,2],[3,4]]\""), "the ledger keeps values as JSON");
    assert!(ledger[0]["reason"].as_str().unwrap().contains("array"), "{ledger:?}");
    assert_eq!(ty("doc"), json!("JSON"));
    assert_eq!(ty("uid"), json!("UUID"));
    assert_eq!(ty("m"), json!("VARCHAR"));
    assert_eq!(ty("raw"), json!("BLOB"));
    assert_eq!(ty("qty"), json!("BIGINT"));
    assert_eq!(ty("cost"), json!("DECIMAL(12,2)"), "numeric keeps its precision and scale");
    let row = &server
        .sql(r#"SELECT price::VARCHAR AS p, "at"::VARCHAR AS a, tags::VARCHAR AS t, doc->>'$.k[1]' AS k, hex(raw) AS raw, m, length(note) AS n, nums::VARCHAR AS nums, list_sum(nums) AS total, moods::VARCHAR AS moods FROM items WHERE id = 1"#)
        .await[0];
    assert_eq!(row["p"], json!("12345.6789012345"));
    assert_eq!(row["a"], json!("2024-01-02 08:00:00+00"));
    assert_eq!(row["t"], json!("[a, b c, NULL]"));
    assert_eq!(row["nums"], json!("[1, NULL, 3]"));
    assert_eq!(row["total"], json!(4));
    assert_eq!(row["moods"], json!("[calm, busy]"));
    assert_eq!(row["k"], json!("2"));
    assert_eq!(row["raw"], json!("0102"));
    assert_eq!(row["m"], json!("calm"));
    assert_eq!(row["n"], json!(100000));
    let other = &server.sql(r#"SELECT "at"::VARCHAR AS a FROM items WHERE id = 2"#).await[0];
    assert_eq!(other["a"], json!("2024-07-01 04:59:59.123456+00"), "a timestamptz from another zone");

    // Streaming: an update leaving the TOASTed note unchanged, a delete (default identity and
    // FULL), an insert, ADD COLUMN and a row using it.
    pg.sql(
        "UPDATE items SET qty = 4 WHERE id = 1;
         DELETE FROM items WHERE id = 2;
         DELETE FROM events WHERE id = 1;
         INSERT INTO items (id, price, m, qty, note, tags, nums) VALUES (3, 1, 'busy', 1, 'new', '{\"x y\",z}', '{5,6}');
         ALTER TABLE items ADD COLUMN color text;
         INSERT INTO items (id, price, qty, color) VALUES (4, 2, 2, 'red');",
    );
    wait_until("the changes", Duration::from_secs(60), || async {
        server
            .lines("SELECT id::VARCHAR AS id, qty::VARCHAR AS q, coalesce(color, '') AS c FROM items ORDER BY id")
            .await
            == pg.lines("SELECT id, qty, coalesce(color, '') FROM items ORDER BY id")
    })
    .await;
    assert_eq!(
        server.sql("SELECT length(note) AS n FROM items WHERE id = 1").await[0]["n"],
        json!(100000),
        "TOAST kept"
    );
    assert_eq!(rows(&server, "events").await, 1);
    let streamed = &server.sql("SELECT tags::VARCHAR AS t, list_sum(nums) AS s FROM items WHERE id = 3").await[0];
    assert_eq!((streamed["t"].clone(), streamed["s"].clone()), (json!("[x y, z]"), json!(11)), "lists from changes");
    let ops = server.sql("SELECT _op, count(*) AS n FROM items__changes GROUP BY _op ORDER BY _op").await;
    assert_eq!(
        ops,
        [
            json!({"_op": "delete", "n": 1}),
            json!({"_op": "insert", "n": 2}),
            json!({"_op": "snapshot", "n": 2}),
            json!({"_op": "update", "n": 1})
        ]
    );
    wait_until("slot lag in the metrics", Duration::from_secs(30), || async {
        let (_, m) = server.get("/api/streams/pg/metrics").await;
        m["source"]["slot_lag_bytes"].is_number() && m["source"]["snapshot_percent"] == json!(100.0)
    })
    .await;
    let prometheus = server.http.get(server.url("/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(prometheus.contains("sluice_stream_source_slot_lag_bytes{stream=\"pg\"}"), "{prometheus}");

    // Removing the stream drops its slot and publication.
    assert_eq!(pg.admin("SELECT count(*) FROM pg_replication_slots").trim(), "1");
    let r = server.http.delete(server.url("/api/streams/pg")).send().await.unwrap();
    assert!(r.status().is_success());
    assert_eq!(pg.admin("SELECT count(*) FROM pg_replication_slots").trim(), "0");
    assert_eq!(pg.sql("SELECT count(*) FROM pg_publication").trim(), "0");
}

#[tokio::test]
async fn kill_9_during_snapshot_and_streaming_loses_nothing_and_duplicates_nothing() {
    let pg = Postgres::start();
    pg.sql(
        "CREATE TABLE big (id int PRIMARY KEY, v int); INSERT INTO big SELECT g, g FROM generate_series(1, 30000) g;",
    );
    let dir = DataDir::new("pg-crash");
    let mut server = Server::start(&dir.0).await;
    let mut src = source(&pg, &["public.big"]);
    src["snapshot_chunk_rows"] = json!(500);
    server
        .create_stream(
            json!({"name": "b", "table": "big", "history": true, "source": src, "flush": {"max_wait_ms": 50}}),
        )
        .await;
    // Mid-snapshot.
    wait_rows(&server, "big", 3000, Duration::from_secs(60)).await;
    server.kill9();
    server = Server::start(&dir.0).await;
    wait_rows(&server, "big", 30000, Duration::from_secs(120)).await;
    // Mid-stream: updates in many small transactions while the server is killed.
    let pg_port = pg.port;
    let writer = std::thread::spawn(move || {
        for round in 0..40 {
            let sql = format!("UPDATE big SET v = v + 1 WHERE id % 40 = {round};");
            std::process::Command::new(format!("{}/psql", crate::postgres::BIN))
                .env("PGPASSWORD", "etl")
                .args(["-h", "127.0.0.1", "-p", &pg_port.to_string(), "-U", "etl", "-d", "etltest", "-qAt", "-c", &sql])
                .status()
                .unwrap();
        }
    });
    wait_rows(&server, "big__changes", 30000 + 3000, Duration::from_secs(60)).await;
    server.kill9();
    server = Server::start(&dir.0).await;
    writer.join().unwrap();
    wait_rows(&server, "big__changes", 30000 + 30000, Duration::from_secs(120)).await;
    let want = pg.sql("SELECT count(*), sum(v) FROM big");
    wait_until("the table to match", Duration::from_secs(60), || async {
        server.lines("SELECT count(*)::VARCHAR AS n, sum(v)::VARCHAR AS s FROM big").await.join("") == want.trim()
    })
    .await;
    let history = server.sql("SELECT count(*) AS n, count(DISTINCT (id, v)) AS d FROM big__changes").await;
    assert_eq!(history[0]["n"], json!(60000), "every change exactly once: {history:?}");
    assert_eq!(history[0]["d"], json!(60000));
}

#[tokio::test]
async fn the_heartbeat_keeps_wal_retention_bounded_on_an_idle_table() {
    let pg = Postgres::start();
    pg.sql("CREATE TABLE quiet (id int PRIMARY KEY); CREATE TABLE noise (id serial PRIMARY KEY, pad text);");
    let dir = DataDir::new("pg-heartbeat");
    let server = Server::start(&dir.0).await;
    let mut src = source(&pg, &["public.quiet"]);
    src["heartbeat_ms"] = json!(500);
    server.create_stream(json!({"name": "q", "table": "quiet", "source": src})).await;
    wait_until("streaming", Duration::from_secs(60), || async {
        server.get("/api/streams/q/metrics").await.1["source"]["slot_lag_bytes"].is_number()
    })
    .await;
    // About 30 MB of WAL from a table the stream does not read: no change of the stream's own
    // reaches the slot (PostgreSQL 15 skips empty transactions), only the heartbeats.
    pg.sql("INSERT INTO noise (pad) SELECT repeat('x', 1000) FROM generate_series(1, 30000)");
    let after_noise = pg.admin("SELECT pg_current_wal_lsn() - '0/0'").trim().parse::<f64>().unwrap();
    let confirmed =
        || pg.admin("SELECT confirmed_flush_lsn - '0/0' FROM pg_replication_slots").trim().parse::<f64>().unwrap();
    let retained = || after_noise - confirmed();
    wait_until("the slot to move past the noise", Duration::from_secs(30), || async { retained() <= 0.0 }).await;
}

#[tokio::test]
async fn an_invalidated_slot_is_reported_and_a_resnapshot_recovers() {
    let pg = Postgres::start_with(
        "wal_level = logical\nmax_replication_slots = 20\nmax_wal_senders = 20\nmax_slot_wal_keep_size = 1MB\n\
         wal_keep_size = 0\nmax_wal_size = 32MB\nmin_wal_size = 32MB\n",
    );
    pg.sql("CREATE TABLE kept (id int PRIMARY KEY, v text); INSERT INTO kept VALUES (1, 'a'), (2, 'b');");
    let dir = DataDir::new("pg-invalidated");
    let mut server = Server::start(&dir.0).await;
    server.create_stream(json!({"name": "k", "table": "kept", "source": source(&pg, &["public.kept"])})).await;
    wait_rows(&server, "kept", 2, Duration::from_secs(60)).await;
    // Sluice stops; meanwhile the server writes far more WAL than the slot may keep.
    server.stop();
    pg.sql("INSERT INTO kept VALUES (3, 'c'); CREATE TABLE noise (pad text);");
    for _ in 0..4 {
        pg.sql("INSERT INTO noise SELECT repeat('x', 1000) FROM generate_series(1, 20000)");
        pg.admin("CHECKPOINT");
    }
    wait_until("the slot to be invalidated", Duration::from_secs(30), || async {
        pg.admin("SELECT wal_status FROM pg_replication_slots").trim() == "lost"
    })
    .await;
    server = Server::start(&dir.0).await;
    wait_until("the invalidated slot reported", Duration::from_secs(30), || async {
        let (_, m) = server.get("/api/streams/k/metrics").await;
        m["last_error"].as_str().is_some_and(|e| e.contains("invalidated") && e.contains("resnapshot"))
    })
    .await;
    let r = server.http.post(server.url("/api/streams/k/resnapshot")).send().await.unwrap();
    assert!(r.status().is_success());
    wait_rows(&server, "kept", 3, Duration::from_secs(60)).await;
    assert_eq!(pg.admin("SELECT wal_status FROM pg_replication_slots").trim(), "reserved");
}

#[tokio::test]
async fn kill_9_during_a_plain_snapshot_copies_each_row_once() {
    // Without history, snapshot chunks are appended as they are (no merge by key): only the
    // progress stored in the same transaction keeps a restart from copying a chunk twice. The
    // key is a numeric with places: the restart resumes after the text of its binary form.
    let pg = Postgres::start();
    pg.sql(
        "CREATE TABLE plain (id numeric(12,3) PRIMARY KEY, v text, n numeric(10,3)); CREATE TABLE nothing (id int PRIMARY KEY);
         INSERT INTO plain SELECT g / 8.0, 'v' || g, g / 7.0 FROM generate_series(1, 200000) g;",
    );
    let dir = DataDir::new("pg-plain-crash");
    let mut server = Server::start(&dir.0).await;
    let mut src = source(&pg, &["public.plain", "public.nothing"]);
    src["snapshot_chunk_rows"] = json!(400);
    server.create_stream(json!({"name": "p", "table": "[table]", "source": src, "flush": {"max_wait_ms": 20}})).await;
    wait_rows(&server, "plain", 4000, Duration::from_secs(60)).await;
    let seen = server.lines("SELECT count(*)::VARCHAR FROM plain").await.join("").parse::<i64>().unwrap();
    server.kill9();
    assert!(seen < 200_000, "the kill came after the snapshot ({seen} rows): it tests nothing");
    server = Server::start(&dir.0).await;
    wait_until("the snapshot to finish", Duration::from_secs(120), || async {
        server.get("/api/streams/p/metrics").await.1["source"]["snapshot_percent"] == json!(100.0)
            && server.lines("SELECT count(*)::VARCHAR FROM plain").await.join("") == "200000"
    })
    .await;
    // A change after the snapshot proves streaming took over where the copy ended.
    pg.sql("INSERT INTO plain VALUES (200001, 'after', 1)");
    wait_rows(&server, "plain", 200_001, Duration::from_secs(60)).await;
    let want = pg.lines("SELECT count(*), count(DISTINCT id), sum(n)::text FROM plain");
    let got = server.lines("SELECT count(*)::VARCHAR, count(DISTINCT id)::VARCHAR, sum(n)::VARCHAR FROM plain").await;
    assert_eq!(got, want, "every row exactly once");
    assert_eq!(server.lines("SELECT count(*)::VARCHAR FROM nothing").await, ["0"], "an empty table is created too");
}

#[tokio::test]
async fn progress_of_a_never_analyzed_table_and_json_null_on_both_paths() {
    let pg = Postgres::start();
    pg.sql(
        "CREATE TABLE bulk (id int PRIMARY KEY, v text) WITH (autovacuum_enabled = false);
         INSERT INTO bulk SELECT g, 'v' || g FROM generate_series(1, 100000) g;
         CREATE TABLE j (id int PRIMARY KEY, doc jsonb);
         INSERT INTO j VALUES (1, 'null'), (2, NULL), (3, '{\"a\": null}');",
    );
    // Right after a bulk load PostgreSQL has no estimate (reltuples = -1).
    assert_eq!(pg.lines("SELECT reltuples::int FROM pg_class WHERE relname = 'bulk'"), ["-1"]);
    let dir = DataDir::new("pg-progress");
    let server = Server::start(&dir.0).await;
    let mut src = source(&pg, &["public.bulk", "public.j"]);
    src["snapshot_chunk_rows"] = json!(500);
    server.create_stream(json!({"name": "p", "table": "[table]", "source": src, "flush": {"max_wait_ms": 20}})).await;
    let samples = std::sync::Mutex::new(Vec::new());
    wait_until("the snapshot to finish", Duration::from_secs(120), || async {
        // The rows first, then the percent: it is set before a chunk is written, so read after
        // the count it never trails it (read before, a chunk could land in between).
        let copied = rows(&server, "bulk").await;
        let percent = server.get("/api/streams/p/metrics").await.1["source"]["snapshot_percent"].as_f64();
        if (1..100_000).contains(&copied) {
            samples.lock().unwrap().push((copied, percent));
        }
        copied == 100_000 && percent == Some(100.0)
    })
    .await;
    let samples = samples.into_inner().unwrap();
    // The reader runs a few chunks ahead of the writes, so the percent leads the rows a little;
    // it used to say 100 after the first chunk.
    assert!(samples.iter().any(|(copied, _)| *copied < 50_000), "no early sample: {samples:?}");
    for (copied, percent) in samples.iter().filter(|(copied, _)| *copied < 50_000) {
        let percent = percent.unwrap_or(0.0);
        assert!(percent < 100.0, "{percent}% with {copied} of 100000 rows copied: {samples:?}");
        assert!(percent + 0.01 >= *copied as f64 / 1000.0, "{percent}% is behind {copied} rows: {samples:?}");
    }
    // JSON null stays JSON null whether it came in the snapshot or streamed later.
    pg.sql("INSERT INTO j VALUES (4, 'null'), (5, NULL)");
    wait_rows(&server, "j", 5, Duration::from_secs(60)).await;
    let got = server.lines("SELECT id::VARCHAR, coalesce(doc::VARCHAR, 'SQL NULL') FROM j ORDER BY id").await;
    assert_eq!(got, ["1|null", "2|SQL NULL", "3|{\"a\":null}", "4|null", "5|SQL NULL"]);
}

#[tokio::test]
async fn a_keyless_table_with_jsonb_is_matched_on_its_whole_row() {
    let pg = Postgres::start();
    pg.sql(
        "CREATE TABLE kj (id int, doc jsonb, f float8); ALTER TABLE kj REPLICA IDENTITY FULL;
         INSERT INTO kj VALUES (1, '{\"a\": 1, \"b\": [1, 2]}', 1.5), (2, '{\"c\": \"x\"}', 0.1), (4, '{\"c\": \"y\"}', 0.1);",
    );
    let dir = DataDir::new("pg-keyless-json");
    let server = Server::start(&dir.0).await;
    server.create_stream(json!({"name": "k", "table": "[table]", "source": source(&pg, &["public.kj"])})).await;
    wait_rows(&server, "kj", 3, Duration::from_secs(60)).await;
    // Changes to snapshot rows find them by their whole image, jsonb included (PostgreSQL prints
    // jsonb with spaces, a change's image comes parsed).
    pg.sql(
        "UPDATE kj SET id = 10 WHERE id = 1;
         DELETE FROM kj WHERE id = 2;
         INSERT INTO kj VALUES (3, '{\"d\": [true]}', 2.25);",
    );
    let want = pg.lines("SELECT id, (doc->>'a')::text, f FROM kj ORDER BY id");
    wait_until("the mirror to match", Duration::from_secs(60), || async {
        server.lines("SELECT id::VARCHAR, coalesce(doc->>'a', ''), f::VARCHAR FROM kj ORDER BY id").await == want
    })
    .await;
}

#[tokio::test]
async fn a_keyless_table_follows_rows_with_nulls_and_an_added_column() {
    let pg = Postgres::start();
    pg.sql(
        "CREATE TABLE kn (id int, v text, d date); ALTER TABLE kn REPLICA IDENTITY FULL;
         INSERT INTO kn VALUES (1, 'a', NULL), (2, 'b', '2024-01-01');
         CREATE TABLE kp (id int PRIMARY KEY, v text);
         INSERT INTO kp VALUES (1, 'keyed');",
    );
    let dir = DataDir::new("pg-keyless-null");
    let server = Server::start(&dir.0).await;
    let src = source(&pg, &["public.kn", "public.kp"]);
    server.create_stream(json!({"name": "k", "table": "[table]", "source": src})).await;
    wait_rows(&server, "kn", 2, Duration::from_secs(60)).await;
    // Rows with a NULL are found again (matched NULL-safe on the whole image); a column added at
    // the source widens the image, old rows included.
    pg.sql(
        "INSERT INTO kn VALUES (3, 'c', NULL);
         UPDATE kn SET v = 'cc' WHERE id = 3;
         UPDATE kn SET v = 'aa' WHERE id = 1;
         ALTER TABLE kn ADD COLUMN extra int;
         UPDATE kn SET v = 'bb', extra = 7 WHERE id = 2;
         DELETE FROM kn WHERE id = 1;
         INSERT INTO kn VALUES (4, NULL, NULL, NULL);
         UPDATE kp SET v = 'still keyed' WHERE id = 1;",
    );
    let want =
        pg.lines("SELECT id, coalesce(v, '-'), coalesce(d::text, '-'), coalesce(extra::text, '-') FROM kn ORDER BY id");
    wait_until("the keyless mirror to match", Duration::from_secs(60), || async {
        server
            .lines(
                "SELECT id::VARCHAR, coalesce(v, '-'), coalesce(d::VARCHAR, '-'), coalesce(extra::VARCHAR, '-') \
                 FROM kn ORDER BY id",
            )
            .await
            == want
            && server.lines("SELECT v FROM kp").await == ["still keyed"]
    })
    .await;
    let (_, stream) = server.get("/api/streams/k").await;
    assert_eq!(stream["metrics"]["state"], "running", "{stream}");
    assert_eq!(server.sql("SELECT count(*) AS n FROM sluice.rejects").await[0]["n"], 0);
}

#[tokio::test]
async fn a_keyless_snapshot_with_arrays_and_nulls_resumes_after_kill_9() {
    let pg = Postgres::start();
    pg.sql(
        "CREATE TABLE fa (id int, tags text[], d date); ALTER TABLE fa REPLICA IDENTITY FULL;
         INSERT INTO fa SELECT g % 50000, ARRAY['x', 'y' || (g % 3)], CASE WHEN g % 2 = 0 THEN NULL ELSE DATE '2024-01-01' + g % 365 END
           FROM generate_series(1, 100000) g;
         CREATE TABLE fk (id int PRIMARY KEY, v text);
         INSERT INTO fk SELECT g, 'v' || g FROM generate_series(1, 3000) g;",
    );
    let dir = DataDir::new("pg-keyless-snapshot");
    let mut server = Server::start(&dir.0).await;
    let mut src = source(&pg, &["public.fa", "public.fk"]);
    src["snapshot_chunk_rows"] = json!(400);
    server.create_stream(json!({"name": "k", "table": "[table]", "source": src, "flush": {"max_wait_ms": 20}})).await;
    // Chunks of a table with duplicates, arrays and NULLs, past the first one.
    wait_rows(&server, "fa", 2000, Duration::from_secs(60)).await;
    let seen = rows(&server, "fa").await;
    server.kill9();
    assert!(seen < 100_000, "the kill came after the snapshot ({seen} rows): it tests nothing");
    server = Server::start(&dir.0).await;
    let want = pg.lines("SELECT count(*), count(DISTINCT id), count(d), sum(array_length(tags, 1)) FROM fa");
    wait_until("the keyless copy to finish again", Duration::from_secs(120), || async {
        server
            .lines("SELECT count(*)::VARCHAR, count(DISTINCT id)::VARCHAR, count(d)::VARCHAR, sum(len(tags))::VARCHAR FROM fa")
            .await
            == want
    })
    .await;
    wait_rows(&server, "fk", 3000, Duration::from_secs(60)).await;
    let (_, stream) = server.get("/api/streams/k").await;
    assert_eq!(stream["metrics"]["state"], "running", "{stream}");
}

/// The snapshot reads binary `COPY` and the changes come as text: the same values, copied and
/// streamed, land the same, misfits included. The table is paged by a key of a timestamptz with
/// microseconds and a text, so each chunk's next page starts from the binary key's text.
#[tokio::test]
async fn copied_and_streamed_values_of_each_binary_type_land_the_same() {
    let pg = Postgres::start();
    let values = |n: &str| {
        format!(
            "INSERT INTO vals SELECT timestamptz '2024-01-01 00:00:00+00' + g * interval '1.000001 second', '{n}',
               (g % 30000)::smallint, g * 3, g * 1000000007::bigint, (g / 3.0)::real, g / 7.0, g % 2 = 0,
               timestamp '1999-12-31 23:59:00' + g * interval '1 minute', date '1999-12-01' + g,
               decode(md5(g::text), 'hex'),
               CASE g % 100 WHEN 0 THEN 'infinity' WHEN 1 THEN '12000-01-01 00:00:00+00'
                 WHEN 2 THEN '0044-03-15 00:00:00+00 BC' ELSE '2024-01-01 00:00:00.5+00'::timestamptz + g * interval '1 ms' END,
               CASE g % 100 WHEN 0 THEN '-infinity'::date ELSE date '2024-01-01' END,
               CASE g % 100 WHEN 3 THEN 'NaN'::numeric ELSE (g - 2500) * 1.37 END, g::numeric / 7,
               CASE g % 3 WHEN 0 THEN -(g * 10::numeric ^ 30 + g::numeric / 3) WHEN 1 THEN g::numeric / 100000 ELSE 0 END
             FROM generate_series(1, 5000) g"
        )
    };
    pg.sql(&format!(
        "CREATE TABLE vals (k timestamptz, n text, s smallint, i int, l bigint, r real, f float8, b bool,
           ts timestamp, d date, raw bytea, far timestamptz, fd date, m numeric(12,2), u numeric, w numeric(50,5),
           PRIMARY KEY (k, n));
         {};",
        values("copied")
    ));
    let dir = DataDir::new("pg-binary");
    let server = Server::start(&dir.0).await;
    let mut src = source(&pg, &["public.vals"]);
    src["snapshot_chunk_rows"] = json!(700);
    server.create_stream(json!({"name": "v", "table": "[table]", "source": src, "flush": {"max_wait_ms": 50}})).await;
    wait_rows(&server, "vals", 5000, Duration::from_secs(60)).await;
    pg.sql(&format!("{};", values("streamed")));
    wait_rows(&server, "vals", 10_000, Duration::from_secs(60)).await;
    let columns = "k, s, i, l, r, f, b, ts, d, raw, far, fd, m, u, w";
    let differ = |a: &str, b: &str| {
        format!(
            "SELECT count(*) AS n FROM (SELECT {columns} FROM vals WHERE n = '{a}' EXCEPT SELECT {columns} FROM vals WHERE n = '{b}')"
        )
    };
    assert_eq!(server.sql(&differ("copied", "streamed")).await[0]["n"], 0);
    assert_eq!(server.sql(&differ("streamed", "copied")).await[0]["n"], 0);
    assert_eq!(server.sql("SELECT count(DISTINCT k) AS n FROM vals").await[0]["n"], 5000, "each page once");
    let row = &server
        .sql("SELECT k::VARCHAR AS k, r, f, ts::VARCHAR AS ts, d::VARCHAR AS d, hex(raw) AS raw FROM vals WHERE n = 'copied' AND s = 3")
        .await[0];
    assert_eq!(row["k"], json!("2024-01-01 00:00:03.000003+00"));
    assert_eq!((row["r"].clone(), row["f"].clone()), (json!(1.0), json!(3.0 / 7.0)));
    assert_eq!((row["ts"].clone(), row["d"].clone()), (json!("2000-01-01 00:02:00"), json!("1999-12-04")));
    assert_eq!(row["raw"], json!("ECCBC87E4B5CE2FE28308FD9F2A7BAF3"), "md5('3')");
    // numeric(12,2) is a DECIMAL; numeric(50,5), wider than any DECIMAL, the text PostgreSQL
    // prints (compared exactly above, copied against streamed).
    let row = &server.sql("SELECT m::VARCHAR AS m, w FROM vals WHERE n = 'copied' AND s IN (10, 12) ORDER BY s").await;
    assert_eq!(row[0], json!({"m": "-3411.30", "w": "0.00010"}));
    assert_eq!(row[1], json!({"m": "-3408.56", "w": "-12000000000000000000000000000004.00000"}));
    // Infinity, a year past 9999 and one BC fit no TIMESTAMPTZ here, copied or streamed: NULL,
    // and a ledger row each, with the same text.
    let ledger =
        server.sql(r#"SELECT "column", value, count(*) AS n FROM sluice.rejects GROUP BY ALL ORDER BY ALL"#).await;
    assert_eq!(
        ledger,
        [
            json!({"column": "far", "value": "\"0044-03-15 00:00:00+00 BC\"", "n": 100}),
            json!({"column": "far", "value": "\"12000-01-01 00:00:00+00\"", "n": 100}),
            json!({"column": "far", "value": "\"infinity\"", "n": 100}),
            json!({"column": "fd", "value": "\"-infinity\"", "n": 100}),
            json!({"column": "m", "value": "\"NaN\"", "n": 100}),
        ]
    );
}

/// A snapshot chunk ends at 64 MiB of rows whatever `snapshot_chunk_rows` says: 80 rows of
/// 1 MiB each come as a chunk of 64 rows and one of 16, not as one of 80 (a table of wide rows
/// would otherwise be held in memory a whole chunk of rows at a time).
#[tokio::test]
async fn a_snapshot_chunk_of_wide_rows_ends_at_64_mib() {
    let pg = Postgres::start();
    pg.sql(
        "CREATE TABLE wide (id int PRIMARY KEY, body text);
         INSERT INTO wide SELECT g, repeat(chr(97 + g % 26), 1048576) FROM generate_series(1, 80) g;",
    );
    let dir = DataDir::new("pg-wide-chunks");
    let log = dir.0.join("server.log");
    let server = Server::start_logged(&dir.0, &log).await;
    let mut src = source(&pg, &["public.wide"]);
    src["snapshot_chunk_rows"] = json!(1000);
    server.create_stream(json!({"name": "w", "table": "[table]", "source": src})).await;
    wait_rows(&server, "wide", 80, Duration::from_secs(120)).await;
    let got = server
        .lines("SELECT count(*)::VARCHAR, min(length(body))::VARCHAR, max(length(body))::VARCHAR FROM wide")
        .await;
    assert_eq!(got, ["80|1048576|1048576"]);
    let chunks: Vec<u64> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|e| e["fields"]["message"] == "Copied a chunk." && e["fields"]["table"] == "public.wide")
        .filter_map(|e| e["fields"]["rows"].as_u64())
        .collect();
    assert_eq!(chunks, [64, 16], "rows per chunk");
}
