//! What a careless or hostile client does to the push endpoint and the stream API: gzip members,
//! huge event counts, poison names, PATCHes under load, half-open connections, racing creates.

use std::io::Write;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::harness::{DataDir, Server, wait_until};

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(data).unwrap();
    enc.finish().unwrap()
}

async fn push_gzip(server: &Server, key: &str, body: Vec<u8>) -> (u16, Value) {
    let r = server
        .http
        .post(server.url("/api/streams/s/push"))
        .bearer_auth(key)
        .header("content-encoding", "gzip")
        .body(body)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

/// Peak resident memory of a process, in MiB.
fn peak_rss_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() / 1024
}

#[tokio::test]
async fn gzip_of_several_members_is_read_whole_and_trailing_garbage_is_refused() {
    let dir = DataDir::new("gzip-members");
    let server = Server::start(&dir.0).await;
    let key = server.create_stream(json!({"name": "s", "table": "g"})).await;
    // `cat a.gz b.gz`: one valid gzip body of two members.
    let mut body = gzip(b"{\"n\": 1}\n{\"n\": 2}\n");
    body.extend(gzip(b"{\"n\": 3}\n{\"n\": 4}\n{\"n\": 5}\n"));
    assert_eq!(push_gzip(&server, &key, body).await, (202, json!({"accepted": 5, "rejected": 0})));
    assert_eq!(server.count("g").await, 5);
    // Bytes after the last member that are not another member: refused, nothing stored.
    let mut body = gzip(b"{\"n\": 6}\n");
    body.extend_from_slice(b"this is not gzip");
    let (status, answer) = push_gzip(&server, &key, body).await;
    assert_eq!(status, 400, "{answer}");
    assert!(answer["error"].as_str().unwrap().contains("gzip"), "{answer}");
    assert_eq!(server.count("g").await, 5);
    // A body that decodes to far more than 16 times its size: room is taken again, up to the
    // limit, and it is stored; past the limit it is refused.
    let mut inflated = " ".repeat(4 << 20);
    inflated.push_str("{\"n\": 7}");
    assert_eq!(push_gzip(&server, &key, gzip(inflated.as_bytes())).await, (202, json!({"accepted": 1, "rejected": 0})));
    let (status, answer) = push_gzip(&server, &key, gzip(" ".repeat(17 << 20).as_bytes())).await;
    assert_eq!(status, 413, "{answer}");
    assert_eq!(server.count("g").await, 6);
}

#[tokio::test]
async fn a_16_mib_push_of_any_shape_keeps_the_server_under_512_mib() {
    let dir = DataDir::new("push-memory");
    let server = Server::start(&dir.0).await;
    let key = server.create_stream(json!({"name": "s", "table": "m"})).await;
    assert_eq!(server.push("s", &key, r#"{"a": 0, "b": 0}"#).await.0, 202);
    let pid = server.child.id();

    // 8M array elements that are not objects: refused whole before they reach the ledger.
    let mut ones = String::with_capacity(16 << 20);
    ones.push('[');
    for i in 0..8_000_000 {
        ones.push_str(if i == 0 { "1" } else { ",1" });
    }
    ones.push(']');
    let (status, answer) = server.push("s", &key, ones).await;
    assert_eq!(status, 422, "{answer}");
    assert_eq!(answer["invalid"], 8_000_000, "{answer}");
    assert!(answer["error"].as_str().unwrap().contains("max_invalid_events"), "{answer}");
    eprintln!("peak RSS after 8M non-objects: {} MiB", peak_rss_mib(pid));

    // About 1.7M tiny NDJSON events in one body: all stored.
    let mut tiny = String::with_capacity(16 << 20);
    let mut n = 0u64;
    while tiny.len() < (16 << 20) - 64 {
        n += 1;
        tiny.push_str(&format!("{{\"a\":{n}}}\n"));
    }
    let (status, answer) = server.push("s", &key, tiny).await;
    assert_eq!((status, answer), (202, json!({"accepted": n, "rejected": 0})));
    eprintln!("peak RSS after {n} tiny events: {} MiB", peak_rss_mib(pid));

    // 16 MiB of values that do not fit their column: each a ledger row.
    let mut misfits = String::with_capacity(16 << 20);
    let mut m = 0u64;
    while misfits.len() < (16 << 20) - 64 {
        m += 1;
        misfits.push_str("{\"b\":\"x\"}\n");
    }
    let (status, _) = server.push("s", &key, misfits).await;
    assert_eq!(status, 202);
    assert_eq!(server.count("m").await as u64, 1 + n + m);
    let ledger = server.sql("SELECT count(*) AS n FROM sluice.rejects").await;
    assert_eq!(ledger[0]["n"], m);
    let peak = peak_rss_mib(pid);
    eprintln!("peak RSS after 16 MiB pushes: {peak} MiB");
    assert!(peak < 512, "peak RSS {peak} MiB");
}

#[tokio::test]
async fn a_nul_or_huge_field_name_goes_to_the_ledger_and_everyone_else_is_stored() {
    let dir = DataDir::new("poison-names");
    let server = Server::start(&dir.0).await;
    let key = server.create_stream(json!({"name": "s", "table": "p"})).await;
    let huge = "k".repeat(1 << 20);
    let mut pushes = Vec::new();
    for i in 0..30 {
        let body = match i {
            7 => json!({"a\u{0}b": 1, "n": i}).to_string(),
            11 => format!("{{\"{huge}\": 1, \"n\": {i}}}"),
            _ => json!({ "n": i }).to_string(),
        };
        let (http, url, key) = (server.http.clone(), server.url("/api/streams/s/push"), key.clone());
        pushes.push(async move {
            let r = http.post(&url).bearer_auth(&key).body(body).send().await.unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap_or(Value::Null))
        });
    }
    for (status, answer) in futures_join(pushes).await {
        assert_eq!(status, 202, "{answer}");
    }
    assert_eq!(server.count("p").await, 30);
    let ledger = server.sql(r#"SELECT "column", reason FROM sluice.rejects ORDER BY reason"#).await;
    assert_eq!(ledger.len(), 2, "{ledger:?}");
    assert!(ledger[0]["reason"].as_str().unwrap().contains("NUL"), "{ledger:?}");
    assert!(ledger[1]["reason"].as_str().unwrap().contains("at most 255"), "{ledger:?}");
    let columns = server.sql("SELECT max(length(column_name)) AS l FROM duckdb_columns() WHERE table_name = 'p'").await;
    assert!(columns[0]["l"].as_i64().unwrap() < 255);
    // Later pushes are as fast as ever (a 1 MiB name used to slow every write 9-18x).
    let started = Instant::now();
    for i in 0..20 {
        assert_eq!(server.push("s", &key, json!({ "n": 100 + i }).to_string()).await.0, 202);
    }
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
}

/// Run futures concurrently, each on its own task; results in the order given.
async fn futures_join<F>(futures: Vec<F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let tasks: Vec<_> = futures.into_iter().map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(tasks.len());
    for task in tasks {
        out.push(task.await.unwrap());
    }
    out
}

#[tokio::test]
async fn a_wide_table_takes_a_push_in_well_under_a_second() {
    let dir = DataDir::new("wide");
    let server = Server::start(&dir.0).await;
    let key = server.create_stream(json!({"name": "s", "table": "w"})).await;
    let wide: serde_json::Map<String, Value> = (0..2000).map(|i| (format!("c{i}"), Value::from(i))).collect();
    assert_eq!(server.push("s", &key, Value::Object(wide).to_string()).await.0, 202);
    let mut times = Vec::new();
    for i in 0..5 {
        let started = Instant::now();
        assert_eq!(server.push("s", &key, json!({ "c1": i }).to_string()).await.0, 202);
        times.push(started.elapsed());
    }
    times.sort();
    eprintln!("pushes to a 2,000-column table: {times:?}");
    // Before: 2.6-4.5 s each on an idle machine (the appender's cost grew with the square of
    // the width).
    assert!(times[2] < Duration::from_millis(1500), "{times:?}");
    assert_eq!(server.count("w").await, 6);
}

/// A write that needs more of DuckDB's memory than the limit allows says nothing of its rows:
/// it is retried, with the stream `retrying` and a message naming the limit, and nothing goes to
/// the ledger (before, the rows were taken for refused ones and every one was ledgered). With
/// the default limit, after a restart, the same push lands once.
#[tokio::test]
async fn a_write_out_of_duckdb_memory_is_retried_and_never_ledgered() {
    let dir = DataDir::new("out-of-memory");
    let server = Server::start_env(&dir.0, &[], &[("SLUICE_DUCKDB_MEMORY", "64MB")]).await;
    let key = server.create_stream(json!({"name": "s", "table": "w"})).await;
    let wide: serde_json::Map<String, Value> = (0..2000).map(|i| (format!("c{i}"), Value::from(i))).collect();
    let body = Value::Object(wide).to_string();
    // The push waits for a commit that cannot come while the limit stands.
    let (http, url, k, b) = (server.http.clone(), server.url("/api/streams/s/push"), key.clone(), body.clone());
    let waiting = tokio::spawn(async move { http.post(url).bearer_auth(k).body(b).send().await.map(|r| r.status()) });
    let deadline = Instant::now() + Duration::from_secs(60);
    let metrics = loop {
        let (_, metrics) = server.get("/api/streams/s/metrics").await;
        if metrics["state"] == "retrying" {
            break metrics;
        }
        assert!(Instant::now() < deadline, "the write was not retried: {metrics}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let error = metrics["last_error"].as_str().unwrap_or_default();
    assert!(error.contains("SLUICE_DUCKDB_MEMORY"), "{metrics}");
    assert!(!waiting.is_finished(), "the push was answered before its rows were committed");
    assert_eq!(server.sql("SELECT count(*) AS n FROM sluice.rejects").await[0]["n"], 0);
    server.kill9();
    waiting.abort();
    let server = Server::start(&dir.0).await;
    let pushed = tokio::time::timeout(Duration::from_secs(60), server.push("s", &key, body)).await;
    assert_eq!(pushed.expect("the push with the default limit was answered").0, 202);
    assert_eq!(server.count("w").await, 1);
    assert_eq!(server.sql("SELECT count(*) AS n FROM sluice.rejects").await[0]["n"], 0);
}

#[tokio::test]
async fn patches_under_load_answer_pushes_202_or_503_never_404() {
    let dir = DataDir::new("patch-load");
    let server = Server::start(&dir.0).await;
    let key = server.create_stream(json!({"name": "s", "table": "pl"})).await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut pushers = Vec::new();
    for p in 0..4 {
        let (http, url, key, stop) =
            (server.http.clone(), server.url("/api/streams/s/push"), key.clone(), stop.clone());
        pushers.push(tokio::spawn(async move {
            let (mut accepted, mut statuses) = (0i64, std::collections::BTreeMap::<u16, u32>::new());
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                i += 1;
                let r = http.post(&url).bearer_auth(&key).body(json!({"p": p, "i": i}).to_string()).send().await;
                let status = r.map(|r| r.status().as_u16()).unwrap_or(0);
                *statuses.entry(status).or_default() += 1;
                if status == 202 {
                    accepted += 1;
                }
            }
            (accepted, statuses)
        }));
    }
    for i in 0..12 {
        let r = server
            .http
            .patch(server.url("/api/streams/s"))
            .json(&json!({"flush": {"max_wait_ms": 100 + i}}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut accepted = 0;
    let mut all = std::collections::BTreeMap::<u16, u32>::new();
    for p in pushers {
        let (a, statuses) = p.await.unwrap();
        accepted += a;
        for (s, n) in statuses {
            *all.entry(s).or_default() += n;
        }
    }
    eprintln!("push answers during 12 PATCHes: {all:?}");
    assert!(all.keys().all(|s| *s == 202 || *s == 503), "{all:?}");
    assert!(all.get(&202).copied().unwrap_or(0) > 0, "{all:?}");
    assert_eq!(server.count("pl").await, accepted);
}

#[tokio::test]
async fn half_open_connections_are_cut_and_never_stop_the_server() {
    let dir = DataDir::new("half-open");
    let server = Server::start(&dir.0).await;
    let addr = server.base.trim_start_matches("http://").to_string();
    let mut idle = Vec::new();
    for i in 0..1100 {
        let mut conn = tokio::net::TcpStream::connect(&addr).await.unwrap();
        if i % 2 == 0 {
            // Headers begun, never finished.
            conn.write_all(b"POST /api/streams/s/push HTTP/1.1\r\nHost: x\r\n").await.unwrap();
        }
        idle.push(conn);
    }
    let started = Instant::now();
    let (status, _) = server.get("/api/streams").await;
    assert_eq!(status, 200);
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    // Each of them is closed by the server once the header timeout passes.
    let deadline = Instant::now() + Duration::from_secs(60);
    for conn in &mut idle {
        let mut buf = [0u8; 512];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "a half-open connection is still open after 60 s");
            match tokio::time::timeout(left, conn.read(&mut buf)).await {
                Ok(Ok(0) | Err(_)) => break,
                // A 408 answer may come first; the close follows.
                Ok(Ok(_)) => continue,
                Err(_) => panic!("a half-open connection is still open after 60 s"),
            }
        }
    }
}

#[tokio::test]
async fn racing_creates_make_one_stream_and_one_writer_per_table() {
    let dir = DataDir::new("create-race");
    let server = Server::start(&dir.0).await;
    let create = |config: Value| {
        let (http, url) = (server.http.clone(), server.url("/api/streams"));
        async move { http.post(&url).json(&config).send().await.unwrap().status().as_u16() }
    };
    let same_name: Vec<_> = (0..8).map(|_| create(json!({"name": "dup", "table": "t1"}))).collect();
    let mut statuses = futures_join(same_name).await;
    statuses.sort();
    assert_eq!(statuses, [201, 409, 409, 409, 409, 409, 409, 409]);
    let same_table: Vec<_> = (0..8).map(|i| create(json!({"name": format!("s{i}"), "table": "t2"}))).collect();
    let mut statuses = futures_join(same_table).await;
    statuses.sort();
    assert_eq!(statuses, [201, 409, 409, 409, 409, 409, 409, 409]);
    let (_, list) = server.get("/api/streams").await;
    assert_eq!(list["streams"].as_array().unwrap().len(), 2, "{list}");
    wait_until("the streams to run", Duration::from_secs(30), || async {
        let (_, list) = server.get("/api/streams").await;
        list["streams"].as_array().unwrap().iter().all(|s| s["metrics"]["state"] == "running")
    })
    .await;
}

#[tokio::test]
async fn duplicate_fields_and_odd_numbers_follow_one_documented_rule() {
    let dir = DataDir::new("numbers");
    let server = Server::start(&dir.0).await;
    let key = server.create_stream(json!({"name": "s", "table": "nums"})).await;
    assert_eq!(server.push("s", &key, r#"{"id": 1, "n": 5, "d": "first"}"#).await.0, 202);
    // A field named twice: the later value is stored, the earlier one is in the ledger.
    assert_eq!(server.push("s", &key, r#"{"id": 2, "n": -0, "d": "early", "d": "late"}"#).await.0, 202);
    assert_eq!(server.push("s", &key, r#"{"id": 3, "n": 1.0}"#).await.0, 202);
    let rows = server.sql("SELECT id, n, d FROM nums ORDER BY id").await;
    assert_eq!(rows[1]["d"], "late");
    assert_eq!((rows[1]["n"].clone(), rows[2]["n"].clone()), (json!(0), json!(1)), "whole numbers stay BIGINT");
    let ledger = server.sql(r#"SELECT "column", value, reason FROM sluice.rejects"#).await;
    assert_eq!(ledger.len(), 1, "{ledger:?}");
    assert_eq!((ledger[0]["column"].clone(), ledger[0]["value"].clone()), (json!("d"), json!("\"early\"")));
    // Integers beyond BIGINT, u64's maximum included, widen the column like any other
    // non-BIGINT number; nothing goes to the ledger for them.
    assert_eq!(server.push("s", &key, r#"{"id": 4, "n": 18446744073709551615}"#).await.0, 202);
    assert_eq!(server.push("s", &key, r#"{"id": 5, "n": 18446744073709551616}"#).await.0, 202);
    let types =
        server.sql("SELECT data_type FROM duckdb_columns() WHERE table_name = 'nums' AND column_name = 'n'").await;
    assert_eq!(types[0]["data_type"], "DOUBLE");
    assert_eq!(server.count("nums").await, 5);
    let ledger = server.sql("SELECT count(*) AS n FROM sluice.rejects").await;
    assert_eq!(ledger[0]["n"], 1);
}

async fn push_with_key(server: &Server, key: &str, idempotency: &str, body: &str) -> (u16, bool, Value) {
    let r = server
        .http
        .post(server.url("/api/streams/s/push"))
        .bearer_auth(key)
        .header("idempotency-key", idempotency)
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let replayed = r.headers().get("idempotent-replayed").is_some();
    (r.status().as_u16(), replayed, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn an_idempotency_key_stores_a_push_once_across_retries_and_kill_9() {
    let dir = DataDir::new("idempotency");
    let server = Server::start(&dir.0).await;
    let key = server.create_stream(json!({"name": "s", "table": "idem"})).await;
    let body = "{\"n\": 1}\n{\"n\": 2}\nnot json\n";
    let first = push_with_key(&server, &key, "order-1", body).await;
    assert_eq!(first, (202, false, json!({"accepted": 2, "rejected": 1})));
    // The client timed out and retries: the same answer, nothing stored twice.
    assert_eq!(push_with_key(&server, &key, "order-1", body).await, (202, true, json!({"accepted": 2, "rejected": 1})));
    assert_eq!(server.count("idem").await, 2);
    // Racing retries of a new key: one is stored, the others wait or get the stored answer.
    let racing: Vec<_> = (0..6)
        .map(|_| {
            let (http, url, key) = (server.http.clone(), server.url("/api/streams/s/push"), key.clone());
            async move {
                let r = http
                    .post(&url)
                    .bearer_auth(&key)
                    .header("idempotency-key", "order-2")
                    .body("{\"n\": 3}")
                    .send()
                    .await
                    .unwrap();
                r.status().as_u16()
            }
        })
        .collect();
    let statuses = futures_join(racing).await;
    assert!(statuses.iter().all(|s| *s == 202 || *s == 409), "{statuses:?}");
    assert_eq!(server.count("idem").await, 3);
    // Bad keys are refused before anything is stored.
    let (status, _, answer) = push_with_key(&server, &key, "has space", "{\"n\": 9}").await;
    assert_eq!(status, 400, "{answer}");
    // The keys are committed with the rows: a kill -9 forgets nothing.
    server.kill9();
    let server = Server::start(&dir.0).await;
    wait_until("the stream to run", Duration::from_secs(30), || async {
        server.get("/api/streams/s").await.1["metrics"]["state"] == "running"
    })
    .await;
    assert_eq!(push_with_key(&server, &key, "order-1", body).await, (202, true, json!({"accepted": 2, "rejected": 1})));
    assert!(push_with_key(&server, &key, "order-2", "{\"n\": 3}").await.1);
    assert_eq!(push_with_key(&server, &key, "order-3", "{\"n\": 4}").await.0, 202);
    assert_eq!(server.count("idem").await, 4);
    let ledger = server.sql("SELECT count(*) AS n FROM sluice.rejects").await;
    assert_eq!(ledger[0]["n"], 1);
}
