//! Streams that deliver to the user's own database: Kafka → PostgreSQL, exactly once across
//! kill -9 (the position is committed with the rows in the destination), with a column that
//! appears mid-stream; bad destination configs are refused with the field's name.

use std::time::Duration;

use serde_json::{Value, json};

use crate::broker::Broker;
use crate::harness::{DataDir, Server, wait_until};
use crate::postgres::Postgres;

fn postgres_destination(pg: &Postgres) -> Value {
    json!({"kind": "postgres", "host": "127.0.0.1", "port": pg.port, "database": "etltest", "user": "etl",
           "password": "etl", "schema": "public"})
}

/// Rows in `events` of the destination, 0 while it does not exist.
fn pg_count(pg: &Postgres) -> i64 {
    pg.count_in("etltest", "public.events")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_to_postgres_append_exactly_once_across_two_kill_9() {
    let pg = Postgres::start();
    let broker = Broker::start();
    broker.create_topic("orders", 3);
    let dir = DataDir::new("dest-pg");
    let mut server = Server::start(&dir.0).await;
    let mut stream = crate::kafka::kafka_stream("o", "events", &broker, json!(["orders"]));
    stream["destination"] = postgres_destination(&pg);
    // Small units, so that a backlog after a restart is written in many steps a kill can split.
    stream["flush"] = json!({"max_rows": 1000, "max_wait_ms": 50});
    server.create_stream(stream).await;

    // 30,000 orders, over about six seconds; from the 15,000th on they carry a `coupon`: a column added mid-stream.
    const TOTAL: usize = 30_000;
    let producer = broker.producer(&[]);
    let producing = crate::broker::produce_orders(producer, "orders", TOTAL, 500, 100);
    for round in 0..2 {
        let threshold = 4_000 * (round + 1) + (rand::random::<u64>() % 6_000) as i64;
        wait_until("rows in the destination", Duration::from_secs(120), || async { pg_count(&pg) >= threshold }).await;
        server.kill9();
        let seen = pg_count(&pg);
        assert!(seen < TOTAL as i64, "the kill came after the last row ({seen}): it tests nothing");
        server = Server::start(&dir.0).await;
    }
    producing.await.unwrap();
    wait_until("every order in the destination", Duration::from_secs(180), || async { pg_count(&pg) >= TOTAL as i64 })
        .await;
    let (_, metrics) = server.get("/api/streams/o/metrics").await;
    let check = pg.lines(
        "SELECT count(*), count(DISTINCT id), count(coupon), min(id), max(id), \
         count(*) FILTER (WHERE coupon IS DISTINCT FROM CASE WHEN id >= 15000 THEN 'c' || id END) FROM events",
    );
    assert_eq!(check, ["30000|30000|15000|0|29999|0"], "each order once, coupons where sent: {metrics}");
    let types = pg.lines(
        "SELECT column_name || ':' || data_type FROM information_schema.columns \
         WHERE table_name = 'events' AND column_name IN ('id', 'amount', 'coupon') ORDER BY column_name",
    );
    assert_eq!(types, ["amount:double precision", "coupon:text", "id:bigint"]);
    // The position is in the destination, next to the rows.
    let stamp = pg.lines("SELECT owner FROM sluice_positions");
    assert_eq!(stamp, ["o"]);
    // The workspace holds no copy of the rows.
    let (status, _) = server.sql_raw("SELECT count(*) FROM events").await;
    assert_ne!(status, 200, "the rows went to the destination, not the workspace");
}

#[tokio::test]
async fn destination_configs_are_checked_field_by_field() {
    let dir = DataDir::new("dest-config");
    let server = Server::start(&dir.0).await;
    let cases = [
        (json!({"destination": {"kind": "postgres", "host": "", "database": "d", "user": "u"}}), "destination.host"),
        (
            json!({"destination": {"kind": "postgres", "host": "h", "database": "d", "user": "u", "table": "x"}}),
            "destination.table",
        ),
        (json!({"destination": {"kind": "files", "location": "/tmp/x", "path": "{table}.{ext}"}}), "destination.path"),
        (json!({"destination": {"kind": "files", "location": "/tmp/x", "path": "../{seq}"}}), "destination.path"),
        (json!({"destination": {"kind": "files", "location": "/tmp/x", "name": "n"}}), "destination.name"),
        (
            json!({"destination": {"kind": "files", "location": "/tmp/x", "format": "csv", "compression": "snappy"}}),
            "destination.compression",
        ),
        (json!({"destination": {"kind": "files", "location": "az://c/p"}}), "destination.azure"),
        (json!({"destination": {"kind": "files", "location": "ftp://h/p"}}), "destination.location"),
        (json!({"destination": {"kind": "files", "location": "/tmp/x", "rotate": {"rows": 0}}}), "destination.rotate"),
        (
            json!({"destination": {"kind": "postgres", "host": "h", "database": "d", "user": "u", "schema": " "}}),
            "destination.schema",
        ),
    ];
    for (extra, field) in cases {
        let mut stream = json!({"name": "bad", "table": "events"});
        for (k, v) in extra.as_object().unwrap() {
            stream[k] = v.clone();
        }
        let r = server.http.post(server.url("/api/streams")).json(&stream).send().await.unwrap();
        let status = r.status().as_u16();
        let body: Value = r.json().await.unwrap_or(Value::Null);
        assert_eq!(status, 400, "{body}");
        assert!(body.to_string().contains(field), "{field}: {body}");
    }
}

/// The destination goes away for 20 s under a stream of pushes: the stream says it is
/// reconnecting, the pushes wait or are told to retry, and once it is back every event is in it
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_destination_down_for_20_s_loses_nothing() {
    let pg = Postgres::start();
    let dir = DataDir::new("dest-down");
    let server = Server::start(&dir.0).await;
    let key = server
        .create_stream(json!({"name": "p", "table": "events", "destination": postgres_destination(&pg),
                              "flush": {"max_wait_ms": 50}}))
        .await;
    let pushing = {
        let (url, key) = (server.url("/api/streams/p/push"), key.clone());
        tokio::spawn(async move {
            let http = crate::harness::client_builder().timeout(Duration::from_secs(120)).build().unwrap();
            for i in 0..200 {
                // Each push is retried until it is accepted: 503 and time-outs mean "again".
                loop {
                    let sent = http
                        .post(&url)
                        .bearer_auth(&key)
                        .header("Idempotency-Key", format!("push-{i}"))
                        .body(format!("{{\"id\": {i}}}"))
                        .send()
                        .await;
                    if sent.is_ok_and(|r| r.status().as_u16() == 202) {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    wait_until("some events in the destination", Duration::from_secs(60), || async { pg_count(&pg) >= 20 }).await;
    pg.ctl("stop");
    wait_until("the stream to report the destination down", Duration::from_secs(60), || async {
        let (_, m) = server.get("/api/streams/p/metrics").await;
        m["state"] == "reconnecting"
    })
    .await;
    // Twenty seconds of outage: the scenario itself, not a wait for something.
    tokio::time::sleep(Duration::from_secs(20)).await;
    pg.ctl("start");
    pushing.await.unwrap();
    wait_until("every event in the destination", Duration::from_secs(90), || async { pg_count(&pg) >= 200 }).await;
    assert_eq!(pg.lines("SELECT count(*), count(DISTINCT id), min(id), max(id) FROM events"), ["200|200|0|199"]);
    wait_until("the stream to run again", Duration::from_secs(30), || async {
        server.get("/api/streams/p/metrics").await.1["state"] == "running"
    })
    .await;
}

/// Postgres CDC into another database of the same kind: the snapshot, then changes (updates,
/// deletes, a key change, a truncate-free run of writes), with kill -9 during the snapshot and
/// during streaming; the target equals the source, and the history holds every change.
#[tokio::test]
async fn postgres_cdc_to_postgres_mirror_equals_the_source_across_kill_9() {
    let pg = Postgres::start();
    pg.admin("CREATE DATABASE mirror OWNER etl");
    pg.sql(
        "CREATE TABLE accounts (id int PRIMARY KEY, name text, amount numeric(12,2), at timestamptz, ok bool);
         INSERT INTO accounts SELECT g, 'n' || g, g * 1.25, timestamptz '2024-01-01 00:00:00+00' + g * interval '1 minute',
           g % 2 = 0 FROM generate_series(1, 60000) g;",
    );
    let dir = DataDir::new("dest-pg-cdc");
    let mut server = Server::start(&dir.0).await;
    let mut destination = postgres_destination(&pg);
    destination["database"] = json!("mirror");
    server
        .create_stream(json!({
            "name": "m", "table": "[table]", "history": true, "destination": destination,
            "source": {"type": "postgres", "host": "127.0.0.1", "port": pg.port, "database": "etltest",
                       "user": "etl", "password": "etl", "tables": ["public.accounts"], "snapshot_chunk_rows": 2000},
            "flush": {"max_wait_ms": 20},
        }))
        .await;
    let target_rows = || pg.count_in("mirror", "public.accounts");
    wait_until("part of the snapshot in the target", Duration::from_secs(120), || async { target_rows() >= 6000 })
        .await;
    server.kill9();
    let seen = target_rows();
    assert!(seen < 60_000, "the kill came after the snapshot ({seen} rows): it tests nothing");
    server = Server::start(&dir.0).await;
    wait_until("the whole snapshot in the target", Duration::from_secs(180), || async { target_rows() >= 60_000 })
        .await;

    // Changes, paced, with a kill -9 while they stream.
    let mut script = String::new();
    for i in 0..200 {
        script.push_str(&format!(
            "BEGIN; UPDATE accounts SET amount = amount + 1, name = 'u{i}' WHERE id = {};
             DELETE FROM accounts WHERE id = {}; INSERT INTO accounts VALUES ({}, NULL, 0.5, now(), NULL);
             UPDATE accounts SET id = {} WHERE id = {}; COMMIT; SELECT pg_sleep(0.02);\n",
            i + 1,
            i + 1000,
            100_000 + i,
            200_000 + i,
            i + 2000,
        ));
    }
    let mut writer = pg.run_script(&dir.0.join("changes.sql"), &script);
    wait_until("some changes in the target", Duration::from_secs(60), || async {
        pg.lines_in("mirror", "SELECT count(*) FROM accounts WHERE id >= 100000")[0].parse::<i64>().unwrap() >= 20
    })
    .await;
    server.kill9();
    let running = writer.try_wait().unwrap().is_none();
    server = Server::start(&dir.0).await;
    assert!(writer.wait().unwrap().success());
    assert!(running, "the changes ended before the kill: it tests nothing");
    const ROWS: &str = "SELECT id, coalesce(name, '-'), amount, extract(epoch FROM at)::bigint, coalesce(ok::text, '-') \
                        FROM accounts ORDER BY id";
    let want = pg.lines(ROWS);
    wait_until("the target to equal the source", Duration::from_secs(120), || async {
        pg.lines_in("mirror", ROWS) == want
    })
    .await;
    // The history: every snapshot row and every change once; a key change is a delete of the
    // old key (not recorded) and its new row.
    let ops = pg.lines_in(
        "mirror",
        "SELECT _op, count(*), count(DISTINCT _sequence) FROM accounts__changes GROUP BY 1 ORDER BY 1",
    );
    assert_eq!(ops, ["delete|200|200", "insert|200|200", "snapshot|60000|60000", "update|400|400"], "{ops:?}");
    let types = pg.lines_in(
        "mirror",
        "SELECT column_name || ':' || data_type FROM information_schema.columns WHERE table_name = 'accounts' \
         ORDER BY ordinal_position",
    );
    assert!(
        types.iter().any(|t| t == "amount:numeric") && types.iter().any(|t| t == "at:timestamp with time zone"),
        "{types:?}"
    );
    let (_, metrics) = server.get("/api/streams/m/metrics").await;
    assert_eq!(metrics["state"], "running", "{metrics}");
}

/// A JSON mirror into Postgres without `keys` takes the destination table's unique index; a
/// table with no key, or none at all, is refused with 422 saying what to do.
#[tokio::test]
async fn mirror_keys_are_detected_from_the_destination_table_or_refused() {
    let pg = Postgres::start();
    pg.sql(
        "CREATE TABLE people (id int, email text NOT NULL, name text); CREATE UNIQUE INDEX ON people (email);
         INSERT INTO people VALUES (1, 'a@x', 'Ann');
         CREATE TABLE bare (id int, name text);",
    );
    let dir = DataDir::new("dest-keys");
    let server = Server::start(&dir.0).await;
    let stream = |name: &str, table: &str| {
        json!({"name": name, "table": table, "mode": "mirror", "destination": postgres_destination(&pg),
               "flush": {"max_wait_ms": 20}})
    };
    for (table, why) in [("bare", "no primary key or unique index"), ("missing", "does not exist")] {
        let r = server.http.post(server.url("/api/streams")).json(&stream("s", table)).send().await.unwrap();
        let status = r.status().as_u16();
        let body: Value = r.json().await.unwrap_or(Value::Null);
        assert_eq!(status, 422, "{body}");
        let text = body.to_string();
        assert!(text.contains(why) && text.contains("keys"), "{text}");
    }
    let key = server.create_stream(stream("p", "people")).await;
    let (_, described) = server.get("/api/streams/p").await;
    assert_eq!(described["config"]["keys"], json!(["email"]), "{described}");
    let body = r#"[{"id": 1, "email": "a@x", "name": "Ann B"}, {"id": 2, "email": "b@x", "name": "Bo"}]"#;
    let (status, answer) = server.push("p", &key, body).await;
    assert_eq!(status, 202, "{answer}");
    wait_until("the upserts in the destination", Duration::from_secs(60), || async {
        pg.lines("SELECT id, email, name FROM people ORDER BY id") == ["1|a@x|Ann B", "2|b@x|Bo"]
    })
    .await;
}

/// A resnapshot of a stream with a destination starts over from the source: the destination
/// forgets its copy of the position too, so drift there (a row deleted by hand) is repaired by
/// the new copy; and a removed stream leaves no position behind for a new one of its name.
#[tokio::test]
async fn a_resnapshot_into_a_destination_copies_the_source_again() {
    let pg = Postgres::start();
    pg.admin("CREATE DATABASE mirror OWNER etl");
    pg.sql(
        "CREATE TABLE items (id int PRIMARY KEY, name text);
         INSERT INTO items SELECT g, 'n' || g FROM generate_series(1, 500) g;",
    );
    let dir = DataDir::new("dest-resnapshot");
    let server = Server::start(&dir.0).await;
    let mut destination = postgres_destination(&pg);
    destination["database"] = json!("mirror");
    let stream = json!({
        "name": "r", "table": "[table]", "destination": destination,
        "source": {"type": "postgres", "host": "127.0.0.1", "port": pg.port, "database": "etltest",
                   "user": "etl", "password": "etl", "tables": ["public.items"]},
        "flush": {"max_wait_ms": 20},
    });
    server.create_stream(stream.clone()).await;
    const ROWS: &str = "SELECT id, name FROM items ORDER BY id";
    let want = pg.lines(ROWS);
    let equal = || async {
        pg.lines_in("mirror", "SELECT to_regclass('public.items') IS NOT NULL")[0] == "t"
            && pg.lines_in("mirror", ROWS) == want
    };
    wait_until("the snapshot in the target", Duration::from_secs(120), equal).await;
    // The snapshot created the table with the source's primary key.
    let key = pg.lines_in(
        "mirror",
        "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) \
         WHERE i.indrelid = 'public.items'::regclass AND i.indisprimary",
    );
    assert_eq!(key, ["id"]);
    pg.lines_in("mirror", "DELETE FROM items WHERE id <= 10");
    let r = server.http.post(server.url("/api/streams/r/resnapshot")).send().await.unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    wait_until("the target equal to the source again", Duration::from_secs(120), equal).await;

    // Removed and created again: the new stream copies the table again (into a cleared target).
    let r = server.http.delete(server.url("/api/streams/r")).send().await.unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    pg.lines_in("mirror", "DELETE FROM items");
    server.create_stream(stream).await;
    wait_until("a fresh copy in the target", Duration::from_secs(120), equal).await;
}

/// A stream into an existing table starts from the table's own columns: a value that does not
/// fit one goes to the ledger with its reason and the row lands with that column NULL (the
/// stream goes on, as in the workspace), a fraction in a column of
/// integers widens it to double precision, and the stream keeps that across a restart.
#[tokio::test]
async fn values_are_fitted_to_the_destination_table_and_widen_it() {
    let pg = Postgres::start();
    pg.sql("CREATE TABLE people (id bigint, score integer, name text)");
    let dir = DataDir::new("dest-fit");
    let mut server = Server::start(&dir.0).await;
    let key = server
        .create_stream(json!({"name": "p", "table": "people", "destination": postgres_destination(&pg),
                              "flush": {"max_wait_ms": 20}}))
        .await;
    let body = r#"[{"id": 1, "score": 5, "name": "a"}, {"id": 2, "score": "lots", "name": "b"}]"#;
    let (status, answer) = server.push("p", &key, body).await;
    assert_eq!((status, answer["accepted"].clone(), answer["rejected"].clone()), (202, json!(2), json!(1)), "{answer}");
    let ledger = server.sql(r#"SELECT reason, "column" FROM sluice.rejects"#).await;
    assert_eq!(ledger.len(), 1, "{ledger:?}");
    assert_eq!(ledger[0]["column"], "score", "{ledger:?}");
    wait_until("the fitting row", Duration::from_secs(30), || async {
        pg.lines("SELECT id, score, name FROM people ORDER BY id") == ["1|5|a", "2||b"]
    })
    .await;
    // A restart: the stream starts from the table's columns again, so text first seen after it
    // is still refused by the integer column (a stream that guessed the column from this value
    // would make the whole write fail).
    server.kill9();
    server = Server::start(&dir.0).await;
    let (status, answer) = server.push("p", &key, r#"{"id": 4, "score": "x", "name": "d"}"#).await;
    assert_eq!((status, answer["rejected"].clone()), (202, json!(1)), "{answer}");
    let (status, answer) = server.push("p", &key, r#"{"id": 3, "score": 2.5, "name": "c"}"#).await;
    assert_eq!(status, 202, "{answer}");
    wait_until("the widened row", Duration::from_secs(30), || async {
        pg.lines("SELECT id, score, name FROM people ORDER BY id") == ["1|5|a", "2||b", "3|2.5|c", "4||d"]
    })
    .await;
    let types = pg.lines(
        "SELECT data_type FROM information_schema.columns WHERE table_name = 'people' AND column_name = 'score'",
    );
    assert_eq!(types, ["double precision"]);
    let (_, metrics) = server.get("/api/streams/p/metrics").await;
    assert_eq!(metrics["state"], "running", "{metrics}");
}

/// A stream's snapshot loads a new table without its key, as pg_dump does, and adds the key
/// when the copy completes, also when a kill -9 came in the middle of the copy; changes then
/// upsert on that key.
#[tokio::test]
async fn a_snapshot_copy_gets_its_key_when_complete_across_kill_9() {
    let pg = Postgres::start();
    pg.admin("CREATE DATABASE mirror OWNER etl");
    pg.sql(
        "CREATE TABLE parts (id int PRIMARY KEY, name text);
         INSERT INTO parts SELECT g, 'n' || g FROM generate_series(1, 40000) g;",
    );
    let dir = DataDir::new("dest-owed-key");
    let mut server = Server::start(&dir.0).await;
    let mut destination = postgres_destination(&pg);
    destination["database"] = json!("mirror");
    server
        .create_stream(json!({
            "name": "p", "table": "[table]", "destination": destination,
            "source": {"type": "postgres", "host": "127.0.0.1", "port": pg.port, "database": "etltest",
                       "user": "etl", "password": "etl", "tables": ["public.parts"], "snapshot_chunk_rows": 2000},
            "flush": {"max_wait_ms": 20},
        }))
        .await;
    let rows = || pg.count_in("mirror", "public.parts");
    const KEY: &str = "SELECT coalesce(string_agg(a.attname, ','), 'none') FROM pg_index i \
                       JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) \
                       WHERE i.indrelid = 'public.parts'::regclass AND i.indisprimary";
    wait_until("part of the copy in the target", Duration::from_secs(120), || async { rows() >= 4000 }).await;
    server.kill9();
    let seen = rows();
    assert!(seen < 40_000, "the kill came after the copy ({seen} rows): it tests nothing");
    assert_eq!(pg.lines_in("mirror", KEY), ["none"], "the key is built once the copy is complete");
    server = Server::start(&dir.0).await;
    wait_until("the whole copy in the target", Duration::from_secs(180), || async { rows() >= 40_000 }).await;
    // 40,000 rows are 20 full chunks: the copy is known complete only at the empty chunk read
    // after them, whose unit adds the key, a moment after the last rows are in.
    wait_until("the key after the copy", Duration::from_secs(60), || async { pg.lines_in("mirror", KEY) == ["id"] })
        .await;
    assert_eq!(pg.lines_in("mirror", "SELECT obj_description('public.parts'::regclass, 'pg_class') IS NULL"), ["t"]);
    assert_eq!(pg.lines_in("mirror", "SELECT count(DISTINCT id) FROM parts"), ["40000"]);
    pg.sql("UPDATE parts SET name = 'changed' WHERE id <= 100; DELETE FROM parts WHERE id > 39990;");
    const ROWS: &str = "SELECT count(*), count(*) FILTER (WHERE name = 'changed') FROM parts";
    let want = pg.lines(ROWS);
    wait_until("the changes in the target", Duration::from_secs(60), || async { pg.lines_in("mirror", ROWS) == want })
        .await;
    let (_, metrics) = server.get("/api/streams/p/metrics").await;
    assert_eq!(metrics["state"], "running", "{metrics}");
    // The copy's middle chunks loaded on two sessions, each while the one before committed.
    let beside = metrics["destination"]["writes_beside"].as_f64().unwrap_or(0.0);
    assert!(beside >= 1.0, "no chunk was loaded beside another: {metrics}");
}

/// A table without a primary key (REPLICA IDENTITY FULL), with repeated rows and NULLs, copied
/// into a destination: every row lands, none goes to the ledger, and the table gets no key (its
/// whole row is no key: adding one failed on the NULLs and sent the last chunk to the ledger).
/// A kill -9 in the middle of the copy starts it again from a cleared table. 30,001 rows, so the
/// chunk that completes the copy (where the key was added) holds rows.
#[tokio::test]
async fn a_keyless_table_is_copied_whole_without_a_key_across_kill_9() {
    let pg = Postgres::start();
    pg.admin("CREATE DATABASE mirror OWNER etl");
    pg.sql(
        "CREATE TABLE loose (id int, note text); ALTER TABLE loose REPLICA IDENTITY FULL;
         INSERT INTO loose SELECT g % 15000, CASE WHEN g % 3 = 0 THEN NULL ELSE 'n' || (g % 15000) END
         FROM generate_series(1, 30001) g;",
    );
    let dir = DataDir::new("dest-keyless");
    let mut server = Server::start(&dir.0).await;
    let mut destination = postgres_destination(&pg);
    destination["database"] = json!("mirror");
    server
        .create_stream(json!({
            "name": "l", "table": "[table]", "destination": destination,
            "source": {"type": "postgres", "host": "127.0.0.1", "port": pg.port, "database": "etltest",
                       "user": "etl", "password": "etl", "tables": ["public.loose"], "snapshot_chunk_rows": 2000},
            "flush": {"max_wait_ms": 20},
        }))
        .await;
    let rows = || pg.count_in("mirror", "public.loose");
    wait_until("part of the copy in the target", Duration::from_secs(120), || async { rows() >= 4000 }).await;
    server.kill9();
    assert!(rows() < 30_001, "the kill came after the copy: it tests nothing");
    server = Server::start(&dir.0).await;
    const ROWS: &str = "SELECT id, coalesce(note, '-'), count(*) FROM loose GROUP BY 1, 2 ORDER BY 1, 2";
    let want = pg.lines(ROWS);
    wait_until("the copy equal to the source", Duration::from_secs(180), || async {
        rows() == 30_001 && pg.lines_in("mirror", ROWS) == want
    })
    .await;
    wait_until("the stream to stream changes", Duration::from_secs(60), || async {
        server.get("/api/streams/l/metrics").await.1["state"] == "running"
    })
    .await;
    let (_, metrics) = server.get("/api/streams/l/metrics").await;
    assert_eq!(metrics["rejects"], 0, "{metrics}");
    let keys = pg.lines_in("mirror", "SELECT count(*) FROM pg_index WHERE indrelid = 'public.loose'::regclass");
    assert_eq!(keys, ["0"]);
}
