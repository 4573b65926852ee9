//! Transforms in flight, end to end: masks that hold for the workspace, the ledger, the live
//! feed and the files on disk; a rename, a filter and computed columns on a Kafka stream into
//! Postgres across a kill -9; events routed by a field to three tables; validation rules with
//! their names in the ledger; bad expressions refused when the stream is saved.

use std::time::Duration;

use serde_json::{Value, json};
use sha2::Digest;

use crate::broker::Broker;
use crate::harness::{DataDir, Server, assert_not_on_disk, wait_until};
use crate::page_api::Feed;
use crate::postgres::Postgres;

fn sha256(text: &str) -> String {
    hex::encode(sha2::Sha256::digest(text.as_bytes()))
}

#[tokio::test]
async fn masked_fields_never_reach_the_workspace_the_ledger_the_feed_or_the_disk() {
    let dir = DataDir::new("transform-mask");
    let log = dir.0.join("server.log");
    let server = Server::start_logged(&dir.0, &log).await;
    let transform = json!({
        "fields": [
            {"field": "email", "mask": "hash"},
            {"field": "ssn", "mask": "redact"},
            {"field": "card", "mask": "truncate", "keep": 4},
            {"field": "user.password", "drop": true},
        ],
        "validate": [{"name": "adult", "sql": "age >= 18"}],
    });
    let key = server.create_stream(json!({"name": "people", "table": "people", "transform": transform})).await;
    let mut feed = Feed::open(&server.http, &server, "/api/streams/people/feed").await;

    let good = r#"{"email": "ann@example.org", "ssn": "123-45-6789", "card": "4111222233334444",
                  "user": {"name": "ann", "password": "hunter2-secret"}, "age": 30}"#;
    let young = r#"{"email": "kid@example.org", "ssn": "987-65-4321", "card": "5500666677778888", "age": 9}"#;
    // A duplicated masked field and a misfit value go to the ledger, masked; the misfit leaves
    // `age` NULL, which the rule does not take either (a rule must be true).
    let odd = r#"{"email": "dup1@example.org", "email": "dup2@example.org", "ssn": "555-55-5555", "age": "old"}"#;
    // Another spelling of a masked field lands in the same column, masked too.
    let shouting = r#"{"EMAIL": "shout@example.org", "age": 40}"#;
    for body in [good, young, odd, shouting] {
        assert_eq!(server.push("people", &key, body).await.0, 202, "{body}");
    }
    let events = feed
        .until(Duration::from_secs(30), |e| {
            let rejects: u64 =
                e.iter().filter(|(k, _)| k == "rejects").map(|(_, v)| v["count"].as_u64().unwrap_or(0)).sum();
            e.iter().any(|(k, _)| k == "rows") && rejects >= 4
        })
        .await;

    let rows = server.sql("SELECT email, ssn, card, user__name, age FROM people ORDER BY age").await;
    assert_eq!(rows.len(), 2, "only the adults are stored: {rows:?}");
    assert_eq!(rows[1]["email"], sha256("shout@example.org"));
    assert_eq!(rows[0]["email"], sha256("ann@example.org"));
    assert_eq!((rows[0]["ssn"].as_str(), rows[0]["card"].as_str()), (Some("[redacted]"), Some("4111")));
    assert_eq!(rows[0]["user__name"], "ann");
    let columns = server.lines("SELECT column_name FROM information_schema.columns WHERE table_name = 'people'").await;
    assert!(!columns.iter().any(|c| c.contains("password")), "dropped: {columns:?}");

    let ledger = server.sql("SELECT \"column\", value, reason FROM sluice.rejects ORDER BY reason").await;
    assert_eq!(ledger.len(), 4, "{ledger:?}");
    let text = serde_json::to_string(&ledger).unwrap();
    let refused = ledger.iter().filter(|r| r["reason"] == "validate: rule `adult` failed").count();
    assert_eq!(refused, 2, "{text}");
    for email in ["kid@example.org", "dup1@example.org", "dup2@example.org"] {
        assert!(text.contains(&sha256(email)), "{email} is in the ledger, hashed: {text}");
    }

    let fed = serde_json::to_string(&events).unwrap();
    assert!(fed.contains(&sha256("ann@example.org")), "the feed shows the rows: {fed}");
    server.stop();
    for secret in [
        "ann@example.org",
        "kid@example.org",
        "dup1@example.org",
        "dup2@example.org",
        "shout@example.org",
        "123-45-6789",
        "987-65-4321",
        "555-55-5555",
        "4111222233334444",
        "5500666677778888",
        "hunter2-secret",
    ] {
        for (what, seen) in [("ledger", &text), ("feed", &fed)] {
            assert!(!seen.contains(secret), "{secret} is in the {what}");
        }
        assert_not_on_disk(&dir.0, Some(&log), secret);
    }
}

#[tokio::test]
async fn refused_events_and_other_spellings_keep_masks_and_drops_everywhere() {
    let dir = DataDir::new("transform-route-mask");
    let log = dir.0.join("server.log");
    let server = Server::start_logged(&dir.0, &log).await;
    let transform = json!({
        "fields": [{"field": "email", "mask": "hash"}, {"field": "user.password", "drop": true},
                   {"field": "user.name", "rename": "username"}],
        "route": "rt_{kind}",
    });
    let key = server.create_stream(json!({"name": "rt", "table": "unused", "transform": transform})).await;
    let mut feed = Feed::open(&server.http, &server, "/api/streams/rt/feed").await;
    // Four events whose `kind` names no table (the route refuses them), and one that lands,
    // carrying the dropped field in its flattened spellings.
    let events = json!([
        {"kind": "../x", "email": "dots@example.org", "user": {"password": "nested-secret"}},
        {"kind": "a'b", "EMAIL": "quote@example.org"},
        {"kind": ["click"], "email": "array@example.org"},
        {"email": "missing@example.org", "user__password": "flat-refused-secret"},
        {"kind": "click", "email": "ok@example.org", "user__password": "flat-secret",
         "USER__PASSWORD": "shout-secret", "User": {"PassWord": "nested-shout-secret"}, "user__name": "ann"},
    ]);
    assert_eq!(server.push("rt", &key, events.to_string()).await, (202, json!({"accepted": 1, "rejected": 4})));
    // The same field named twice, dropped: no ledger row keeps it.
    let twice =
        r#"{"kind": "click", "email": "twice@example.org", "user__password": "dup-1", "user__password": "dup-2"}"#;
    assert_eq!(server.push("rt", &key, twice).await, (202, json!({"accepted": 1, "rejected": 0})));
    let fed = feed.until(Duration::from_secs(30), |e| e.iter().filter(|(k, _)| k == "rows").count() >= 2).await;

    let ledger = server.sql("SELECT value, reason FROM sluice.rejects ORDER BY position").await;
    let text = serde_json::to_string(&ledger).unwrap();
    assert_eq!(ledger.len(), 4, "{text}");
    assert!(ledger.iter().all(|r| r["reason"].as_str().unwrap().starts_with("route:")), "{text}");
    for email in ["dots@example.org", "quote@example.org", "array@example.org", "missing@example.org"] {
        assert!(text.contains(&sha256(email)), "{email} is in the ledger, hashed: {text}");
    }
    let (status, api) = server.get("/api/streams/rt/rejects").await;
    assert_eq!(status, 200);
    let api = api.to_string();
    let columns =
        server.lines("SELECT column_name FROM information_schema.columns WHERE table_name = 'rt_click'").await;
    assert!(!columns.iter().any(|c| c.to_lowercase().contains("password")), "{columns:?}");
    assert!(columns.contains(&"username".to_string()), "the flattened spelling is renamed too: {columns:?}");
    let emails = server.lines("SELECT email FROM rt_click ORDER BY email").await;
    let mut expected = [sha256("ok@example.org"), sha256("twice@example.org")];
    expected.sort();
    assert_eq!(emails, expected);
    let fed = serde_json::to_string(&fed).unwrap();
    server.stop();
    for secret in [
        "dots@example.org",
        "quote@example.org",
        "array@example.org",
        "missing@example.org",
        "ok@example.org",
        "twice@example.org",
        "nested-secret",
        "flat-refused-secret",
        "flat-secret",
        "shout-secret",
        "nested-shout-secret",
        "dup-1",
        "dup-2",
    ] {
        for (what, seen) in [("ledger", &text), ("rejects API", &api), ("feed", &fed)] {
            assert!(!seen.contains(secret), "{secret} is in the {what}");
        }
        assert_not_on_disk(&dir.0, Some(&log), secret);
    }
}

fn pg_count(pg: &Postgres) -> i64 {
    pg.count_in("etltest", "public.orders")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_rename_filter_and_computed_columns_reach_postgres_exactly_once_across_kill_9() {
    let pg = Postgres::start();
    let broker = Broker::start();
    broker.create_topic("shop", 2);
    let dir = DataDir::new("transform-kafka");
    let mut server = Server::start(&dir.0).await;
    let mut stream = crate::kafka::kafka_stream("k", "orders", &broker, json!(["shop"]));
    stream["destination"] = json!({"kind": "postgres", "host": "127.0.0.1", "port": pg.port, "database": "etltest",
                                   "user": "etl", "password": "etl", "schema": "public"});
    stream["flush"] = json!({"max_rows": 500, "max_wait_ms": 50});
    stream["transform"] = json!({
        "fields": [
            {"field": "amount", "rename": "amount_usd"},
            {"field": "total", "sql": "amount_usd * 2"},
            {"field": "big", "sql": "id >= 1000"},
            {"field": "tag", "sql": "'o-' || id"},
        ],
        "filter": "id % 10 <> 0",
    });
    server.create_stream(stream).await;

    const TOTAL: usize = 6_000;
    // About five seconds of orders, so the kill lands mid-stream.
    let producing = crate::broker::produce_orders(broker.producer(&[]), "shop", TOTAL, 100, 80);
    let threshold = 800 + (rand::random::<u64>() % 1_500) as i64;
    wait_until("rows in Postgres", Duration::from_secs(120), || async { pg_count(&pg) >= threshold }).await;
    server.kill9();
    assert!(pg_count(&pg) < (TOTAL * 9 / 10) as i64, "the kill came after the last row: it tests nothing");
    server = Server::start(&dir.0).await;
    producing.await.unwrap();
    let kept = (TOTAL * 9 / 10) as i64;
    wait_until("every kept order in Postgres", Duration::from_secs(180), || async { pg_count(&pg) >= kept }).await;

    let check = pg.lines(
        "SELECT count(*), count(DISTINCT id), count(*) FILTER (WHERE id % 10 = 0), \
         count(*) FILTER (WHERE total IS DISTINCT FROM amount_usd * 2), \
         count(*) FILTER (WHERE big IS DISTINCT FROM (id >= 1000)), \
         count(*) FILTER (WHERE tag IS DISTINCT FROM 'o-' || id), count(coupon) FROM orders",
    );
    assert_eq!(check, [format!("{kept}|{kept}|0|0|0|0|{}", kept / 2)], "each kept order once, computed right");
    let types = pg.lines(
        "SELECT column_name || ':' || data_type FROM information_schema.columns \
         WHERE table_name = 'orders' AND column_name NOT LIKE '\\_%' ORDER BY column_name",
    );
    assert_eq!(
        types,
        [
            "amount_usd:double precision",
            "big:boolean",
            "coupon:text",
            "id:bigint",
            "tag:text",
            "total:double precision"
        ]
    );
    let (_, metrics) = server.get("/api/streams/k/metrics").await;
    assert_eq!(metrics["filtered"], json!(TOTAL / 10), "every skipped order counted once: {metrics}");
}

#[tokio::test]
async fn events_are_routed_by_a_field_to_tables_and_unroutable_ones_go_to_the_ledger() {
    let dir = DataDir::new("transform-route");
    let server = Server::start(&dir.0).await;
    let key = server.create_stream(json!({"name": "r", "table": "unused", "transform": {"route": "ev_{kind}"}})).await;
    let mut events: Vec<Value> = Vec::new();
    for i in 0..90 {
        let kind = ["click", "view", "buy"][i % 3];
        events.push(json!({"kind": kind, "n": i}));
    }
    events.push(json!({"kind": "x\"; DROP TABLE ev_click; --", "n": 100}));
    events.push(json!({"n": 101}));
    assert_eq!(server.push("r", &key, Value::Array(events).to_string()).await.0, 202);
    for table in ["ev_click", "ev_view", "ev_buy"] {
        wait_until(table, Duration::from_secs(30), || async { crate::kafka::rows(&server, table).await == 30 }).await;
    }
    let sums = server
        .lines("SELECT (SELECT sum(n) FROM ev_click) || '|' || (SELECT sum(n) FROM ev_view) || '|' || (SELECT sum(n) FROM ev_buy)")
        .await;
    assert_eq!(sums, ["1305|1335|1365"]);
    let reasons = server.lines("SELECT reason FROM sluice.rejects ORDER BY position").await;
    assert_eq!(reasons.len(), 2, "{reasons:?}");
    assert!(reasons[0].contains("cannot name a table") && reasons[1].contains("`kind` is missing"), "{reasons:?}");
    // After a restart the routed tables are known: a new field becomes a column of the right one.
    server.stop();
    let server = Server::start(&dir.0).await;
    let late = json!([{"kind": "click", "n": 200, "extra": "x"}]);
    assert_eq!(server.push("r", &key, late.to_string()).await.0, 202);
    assert_eq!(server.lines("SELECT count(*) || '|' || count(extra) FROM ev_click").await, ["31|1"]);
    assert_eq!(server.lines("SELECT count(*) FROM sluice.rejects").await, ["2"], "nothing more refused");
}

#[tokio::test]
async fn a_script_modifies_and_skips_events_and_its_columns_evolve_the_table() {
    let dir = DataDir::new("transform-script");
    let server = Server::start(&dir.0).await;
    let transform = json!({
        "script": "SELECT * EXCLUDE (code) REPLACE (lower(email) AS email), CAST(code AS INTEGER) AS code_n, \
                   qty * price AS total FROM event WHERE coalesce(kind, '') <> 'test'",
        "fields": [{"field": "big", "sql": "total > 100"}],
    });
    let key = server.create_stream(json!({"name": "s", "table": "sales", "transform": transform})).await;
    let first = json!([
        {"email": "A@X.IO", "code": "7", "qty": 2, "price": 10.5, "kind": "sale"},
        {"email": "T@X.IO", "code": "1", "qty": 1, "price": 1.0, "kind": "test"},
        {"email": "C@X.IO", "code": "x7", "qty": 1, "price": 1.0, "kind": "sale"},
        {"email": "B@Y.IO", "code": "9", "qty": 1, "price": 500.0, "kind": "sale"},
    ]);
    assert_eq!(server.push("s", &key, first.to_string()).await.0, 202);
    // A field that appears later becomes a column through the script's `*`.
    let second = json!([{"email": "D@Z.IO", "code": "3", "qty": 3, "price": 1.5, "kind": "sale", "note": "late"}]);
    assert_eq!(server.push("s", &key, second.to_string()).await.0, 202);
    wait_until("the script's rows", Duration::from_secs(30), || async {
        crate::kafka::rows(&server, "sales").await == 3
    })
    .await;
    let rows = server.lines("SELECT email || '|' || code_n || '|' || total || '|' || big || '|' || coalesce(note, '-') FROM sales ORDER BY email").await;
    assert_eq!(rows, ["a@x.io|7|21.0|false|-", "b@y.io|9|500.0|true|-", "d@z.io|3|4.5|false|late"]);
    let columns = server.lines("SELECT column_name FROM information_schema.columns WHERE table_name = 'sales'").await;
    assert!(!columns.contains(&"code".to_string()), "{columns:?}");
    let ledger = server.lines("SELECT reason FROM sluice.rejects").await;
    assert_eq!(ledger.len(), 1, "{ledger:?}");
    assert!(ledger[0].starts_with("script: Conversion Error"), "{ledger:?}");
    let (_, metrics) = server.get("/api/streams/s/metrics").await;
    assert_eq!(metrics["filtered"], 1, "the test event: {metrics}");
}

#[tokio::test]
async fn postgres_cdc_rows_are_masked_renamed_and_dropped_in_the_snapshot_and_the_changes() {
    let pg = Postgres::start();
    pg.sql(
        "CREATE TABLE members (id int PRIMARY KEY, email text, pin text, tier text); \
         INSERT INTO members VALUES (1, 'one@example.org', '1111', 'gold'), (2, 'two@example.org', '2222', 'free');",
    );
    let dir = DataDir::new("transform-pg");
    let server = Server::start(&dir.0).await;
    let source = json!({"type": "postgres", "host": "127.0.0.1", "port": pg.port, "database": "etltest",
                        "user": "etl", "password": "etl", "tables": ["public.members"]});
    let transform = json!({"fields": [
        {"field": "email", "mask": "hash"},
        {"field": "pin", "drop": true},
        {"field": "tier", "rename": "plan"},
    ]});
    server
        .create_stream(json!({"name": "pg", "table": "[table]", "source": source, "transform": transform,
                              "flush": {"max_wait_ms": 100}}))
        .await;
    crate::kafka::wait_rows(&server, "members", 2, Duration::from_secs(60)).await;
    pg.sql(
        "INSERT INTO members VALUES (3, 'three@example.org', '3333', 'free'); \
         UPDATE members SET email = 'uno@example.org', tier = 'platinum' WHERE id = 1; DELETE FROM members WHERE id = 2;",
    );
    wait_until("the changes", Duration::from_secs(60), || async {
        server.lines("SELECT count(*) FILTER (WHERE plan = 'platinum') || '|' || count(*) FROM members").await
            == ["1|2"]
    })
    .await;
    let rows = server.lines("SELECT id || '|' || email || '|' || plan FROM members ORDER BY id").await;
    assert_eq!(
        rows,
        [format!("1|{}|platinum", sha256("uno@example.org")), format!("3|{}|free", sha256("three@example.org"))]
    );
    let columns = server.lines("SELECT column_name FROM information_schema.columns WHERE table_name = 'members'").await;
    assert!(!columns.iter().any(|c| c == "pin" || c == "tier"), "{columns:?}");
}

#[tokio::test]
async fn bad_transforms_are_refused_when_the_stream_is_saved() {
    let dir = DataDir::new("transform-refused");
    let server = Server::start(&dir.0).await;
    let cases = [
        (json!({"filter": "kind = = 'x'"}), "transform.filter", "at character"),
        (json!({"validate": [{"name": "r", "sql": "no_such_fn(a)"}]}), "transform.validate[0].sql", "no_such_fn"),
        (json!({"fields": [{"field": "x", "sql": "(SELECT 42)"}]}), "transform.fields[0].sql", "subquery"),
        (json!({"fields": [{"field": "a", "drop": true, "rename": "b"}]}), "transform.fields[0].drop", "no other rule"),
        (json!({"route": "plain"}), "transform.route", "names no"),
        (json!({"script": "SELECT * FROM read_text('/etc/passwd')"}), "transform.script", "table function"),
        (json!({"fields": [{"field": "a", "mask": "scramble"}]}), "scramble", "unknown variant"),
    ];
    for (transform, field, words) in cases {
        let response = server
            .http
            .post(server.url("/api/streams"))
            .json(&json!({"name": "t", "table": "t", "transform": transform}))
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        let body: Value = response.json().await.unwrap();
        let error = body["error"].as_str().unwrap_or_default().to_string();
        assert_eq!(status, 400, "{transform}: {body}");
        assert!(error.contains(field) && error.contains(words), "{transform}: {error}");
    }
    let mirror =
        json!({"name": "m", "table": "m", "mode": "mirror", "keys": ["id"], "transform": {"filter": "id > 0"}});
    let response = server.http.post(server.url("/api/streams")).json(&mirror).send().await.unwrap();
    assert_eq!(response.status().as_u16(), 400);
    assert!(response.text().await.unwrap().contains("field rules only"));
}
