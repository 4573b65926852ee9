//! Reverse ETL to an HTTP API (the test server in `http_target.rs`): batches, idempotency keys,
//! retries on 500 and 429 with `Retry-After`, deletes, a failure in the middle of delivery,
//! secrets kept out of responses, logs and files, and kill -9 during a run.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{Value, json};

use crate::harness::{DataDir, Server, assert_not_on_disk, wait_until};
use crate::http_target::HttpTarget;
use crate::reverse_etl::{QUERY, first_events, push, second_events, source};

const TOKEN: &str = "Bearer s3cr3t-token-7Hq2";

fn ids(requests: &[crate::http_target::Received]) -> BTreeSet<i64> {
    requests.iter().flat_map(|r| r.rows()).map(|row| row["id"].as_i64().unwrap()).collect()
}

fn http_sync(name: &str, mode: &str, target: &HttpTarget) -> Value {
    json!({
        "name": name, "query": QUERY, "mode": mode, "keys": ["id"],
        "destination": {
            "kind": "http", "url": target.url("/rows"), "batch_size": 2, "backoff_ms": 100,
            "headers": {"Authorization": TOKEN},
            "deletes": {"url": target.url("/deletes"), "method": "DELETE"}
        }
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn batches_retries_idempotency_and_deletes() {
    let dir = DataDir::new("retl-http");
    let log = dir.0.join("server.log");
    let server = Server::start_logged(&dir.0.join("data"), &log).await;
    let key = source(&server).await;
    push(&server, &key, first_events(), 3).await;
    let target = HttpTarget::start().await;
    let (status, body) = server.create_sync(http_sync("api", "mirror", &target)).await;
    assert_eq!(status, 201, "{body}");
    assert!(!body.to_string().contains("s3cr3t"), "a header value came back: {body}");
    assert_eq!(body["header_names"], json!(["Authorization"]));

    // Batch 1 meets a 500, then a 429 asking for one second; batch 2 goes through.
    target.answer_next(500, None);
    target.answer_next(429, Some("1"));
    let run = server.run_sync("api").await;
    assert_eq!(run["status"], "succeeded", "{run}");
    assert_eq!((run["inserted"].as_i64(), run["rows_sent"].as_i64()), (Some(3), Some(3)));
    let got = target.received();
    assert_eq!(got.iter().map(|r| r.status).collect::<Vec<_>>(), [500, 429, 200, 200]);
    let keys: Vec<String> = got.iter().map(|r| r.header("idempotency-key")).collect();
    assert_eq!(keys[0], keys[1], "a retried batch keeps its key");
    assert_eq!(keys[1], keys[2]);
    assert_ne!(keys[2], keys[3], "each batch has its own key");
    assert_eq!(keys[0].len(), 32);
    assert!(got[2].at - got[1].at >= Duration::from_millis(950), "Retry-After: 1 was not honoured");
    assert!(got.iter().all(|r| r.header("authorization") == TOKEN && r.method == "POST"));
    assert_eq!(ids(&target.accepted()), BTreeSet::from([1, 2, 3]));
    let rows: Vec<Value> = target.accepted().iter().flat_map(|r| r.rows()).collect();
    let two = rows.iter().find(|r| r["id"] == 2).unwrap();
    assert_eq!(two["amount"], Value::Null, "a NULL is sent as null: {two}");
    assert_eq!(two["name"], "ñandú");

    // Changes: id 2 updated, id 4 new, id 3 gone and sent as a delete.
    push(&server, &key, second_events(), 6).await;
    target.clear();
    let run = server.run_sync("api").await;
    assert_eq!(
        (run["inserted"].as_i64(), run["updated"].as_i64(), run["deleted"].as_i64()),
        (Some(1), Some(1), Some(1))
    );
    let got = target.received();
    let deletes: Vec<_> = got.iter().filter(|r| r.path == "/deletes").collect();
    assert_eq!(deletes.len(), 1);
    assert_eq!(deletes[0].method, "DELETE");
    assert_eq!(deletes[0].body, json!([{"id": 3, "_deleted": true}]));
    assert_eq!(ids(&got.iter().filter(|r| r.path == "/rows").cloned().collect::<Vec<_>>()), BTreeSet::from([2, 4]));

    // Batch 2 of 2 keeps failing: the run fails, and the next run resends every row.
    let more = json!([
        {"id": 6, "version": 1, "amount": 6, "name": "six", "ts": "2024-01-01T00:00:00Z", "gone": false},
        {"id": 7, "version": 1, "amount": 7, "name": "seven", "ts": "2024-01-01T00:00:00Z", "gone": false},
        {"id": 8, "version": 1, "amount": 8, "name": "eight", "ts": "2024-01-01T00:00:00Z", "gone": false}
    ]);
    push(&server, &key, more, 9).await;
    target.clear();
    target.fail_after(1, Some(503));
    let run = server.run_sync("api").await;
    assert_eq!(run["status"], "failed", "{run}");
    let error = run["error"].as_str().unwrap();
    assert!(error.contains("batch 2") && error.contains("503") && error.contains("5 retries"), "{error}");
    assert_eq!(target.received().len(), 1 + 6, "one success, then the first try and five retries");
    target.fail_after(0, None);
    target.clear();
    let run = server.run_sync("api").await;
    assert_eq!(run["inserted"].as_i64(), Some(3), "{run}");
    assert_eq!(ids(&target.accepted()), BTreeSet::from([6, 7, 8]));

    // The header value is nowhere: not in the API, not in the logs, not in the files on disk.
    let (_, listed) = server.get("/api/syncs").await;
    assert!(!listed.to_string().contains("s3cr3t"));
    server.stop();
    let logs = std::fs::read_to_string(&log).unwrap();
    assert!(logs.contains("Sync run failed"), "the debug log was captured");
    assert!(!logs.contains("s3cr3t"), "the header value is in the logs");
    for file in ["secrets.json", "workspace.duckdb"] {
        let bytes = std::fs::read(dir.0.join("data").join(file)).unwrap();
        assert!(!bytes.windows(6).any(|w| w == b"s3cr3t"), "{file} holds the header value in clear");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn replace_and_append_send_the_whole_result() {
    let dir = DataDir::new("retl-http-all");
    let server = Server::start(&dir.0).await;
    let key = source(&server).await;
    push(&server, &key, first_events(), 3).await;
    let target = HttpTarget::start().await;
    for mode in ["replace", "append"] {
        let (status, body) = server.create_sync(http_sync(mode, mode, &target)).await;
        assert_eq!(status, 201, "{body}");
        for _ in 0..2 {
            target.clear();
            let run = server.run_sync(mode).await;
            assert_eq!(run["rows_sent"].as_i64(), Some(3), "{run}");
            assert_eq!(ids(&target.accepted()), BTreeSet::from([1, 2, 3]));
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn kill9_during_a_run_resends_it() {
    let dir = DataDir::new("retl-kill");
    let server = Server::start(&dir.0).await;
    let key = source(&server).await;
    push(&server, &key, first_events(), 3).await;
    let target = HttpTarget::start().await;
    let (status, body) = server.create_sync(http_sync("api", "upsert", &target)).await;
    assert_eq!(status, 201, "{body}");
    target.delay(Duration::from_secs(3));
    let r = server.http.post(server.url("/api/syncs/api/runs")).send().await.unwrap();
    assert_eq!(r.status(), 202);
    let run_id = r.json::<Value>().await.unwrap()["run_id"].as_str().unwrap().to_string();
    wait_until("a batch in flight", Duration::from_secs(30), || async { target.arrived() > 0 }).await;
    server.kill9();
    target.delay(Duration::ZERO);
    target.clear();
    let server = Server::start(&dir.0).await;
    let (_, run) = server.get(&format!("/api/runs/{run_id}")).await;
    assert_eq!(run["status"], "failed", "{run}");
    assert!(run["error"].as_str().unwrap().contains("interrupted"), "{run}");
    let run = server.run_sync("api").await;
    assert_eq!(run["inserted"].as_i64(), Some(3), "the interrupted run's rows are sent again: {run}");
    assert_eq!(ids(&target.accepted()), BTreeSet::from([1, 2, 3]));
}

const URL_PASSWORD: &str = "pw-Lk93-secret";

/// Basic authentication as reqwest sends it for `user:password@` in a URL.
fn basic(user: &str, password: &str) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes = format!("{user}:{password}").into_bytes();
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            out.push(if i <= chunk.len() { ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char } else { '=' });
        }
    }
    format!("Basic {out}")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_password_in_the_url_is_a_secret() {
    let dir = DataDir::new("retl-http-url");
    let (data, log) = (dir.0.join("data"), dir.0.join("server.log"));
    let server = Server::start_logged(&data, &log).await;
    let key = source(&server).await;
    push(&server, &key, first_events(), 3).await;
    let target = HttpTarget::start().await;
    let with_password = |path: &str| target.url(path).replacen("http://", &format!("http://etl:{URL_PASSWORD}@"), 1);
    let sync = json!({
        "name": "api", "query": QUERY, "mode": "upsert", "keys": ["id"],
        "destination": {"kind": "http", "url": with_password("/rows"), "max_retries": 1, "backoff_ms": 50,
                        "deletes": {"url": with_password("/deletes")}}
    });
    let (status, body) = server.create_sync(sync).await;
    assert_eq!(status, 201, "{body}");
    let (_, got) = server.get("/api/syncs/api").await;
    let shown = got["config"]["destination"]["url"].as_str().unwrap().to_string();
    assert_eq!(shown, with_password("/rows").replace(URL_PASSWORD, "***"), "{got}");
    assert_eq!(got["config"]["destination"]["deletes"]["url"], with_password("/deletes").replace(URL_PASSWORD, "***"));

    // A retried batch (a warning naming the URL), then a failed run (an error naming it).
    target.answer_next(500, None);
    let run = server.run_sync("api").await;
    assert_eq!(run["status"], "succeeded", "{run}");
    assert!(target.accepted().iter().all(|r| r.header("authorization") == basic("etl", URL_PASSWORD)));
    push(&server, &key, second_events(), 6).await;
    target.fail_after(0, Some(503));
    let run = server.run_sync("api").await;
    assert_eq!(run["status"], "failed", "{run}");
    assert!(run["error"].as_str().unwrap().contains("etl:***@"), "{run}");
    target.fail_after(0, None);

    // Sent back as shown (PUT with `***`), the stored password is kept.
    let r = server.http.put(server.url("/api/syncs/api")).json(&got["config"]).send().await.unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    for path in ["/api/syncs", "/api/syncs/api", "/api/syncs/api/runs"] {
        let (_, body) = server.get(path).await;
        assert!(!body.to_string().contains(URL_PASSWORD), "{path}: {body}");
    }
    assert_not_on_disk(&data, Some(&log), URL_PASSWORD);
    server.stop();
    assert_not_on_disk(&data, Some(&log), URL_PASSWORD);

    // After a restart the password comes back from secrets.json and is sent again.
    let server = Server::start(&data).await;
    target.clear();
    let run = server.run_sync("api").await;
    assert_eq!(run["status"], "succeeded", "{run}");
    let got = target.received();
    assert!(!got.is_empty() && got.iter().all(|r| r.header("authorization") == basic("etl", URL_PASSWORD)));
}
