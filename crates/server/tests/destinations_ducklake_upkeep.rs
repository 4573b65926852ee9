//! DuckLake small-file upkeep against a real lake (SQLite catalog, local data folder): a push
//! stream leaves a file per micro-batch; a compaction on demand, while pushes go on, merges
//! them, expires old snapshots and removes the files nothing reads, and a scheduled one runs
//! by itself. Every pushed row is still there once, read by Python's duckdb.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::destinations_ducklake::{count, lake_destination};
use crate::harness::{DataDir, Server, wait_until};

/// Parquet files under the lake's data folder.
fn parquet_files(lake: &Path) -> usize {
    fn walk(dir: &Path, n: &mut usize) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, n);
            } else if path.extension().is_some_and(|e| e == "parquet") {
                *n += 1;
            }
        }
    }
    let mut n = 0;
    walk(&lake.join("data"), &mut n);
    n
}

#[tokio::test(flavor = "multi_thread")]
async fn small_files_are_compacted_on_demand_and_on_schedule_while_the_stream_goes_on() {
    let dir = DataDir::new("ducklake-upkeep");
    let lake = DataDir::new("ducklake-upkeep-lake");
    let server = Server::start(&dir.0).await;
    let mut destination = lake_destination(&lake.0);
    destination["compaction"] = json!({"every_s": 0, "keep_snapshots_s": 0});
    let key = server
        .create_stream(json!({"name": "l", "table": "clicks", "destination": destination,
                              "flush": {"max_wait_ms": 10}}))
        .await;
    let push = |from: usize| {
        let body: Vec<Value> = (from..from + 50).map(|i| json!({"id": i, "page": format!("/p{i}")})).collect();
        serde_json::to_string(&body).unwrap()
    };
    for round in 0..30 {
        assert_eq!(server.push("l", &key, push(round * 50)).await.0, 202);
    }
    let files_before = parquet_files(&lake.0);
    assert!(files_before >= 30, "a file per micro-batch: {files_before}");

    // Compact on demand while another client keeps pushing.
    let pushing = {
        let (http, url, key) = (server.http.clone(), server.url("/api/streams/l/push"), key.clone());
        tokio::spawn(async move {
            for round in 30..60 {
                let body: Vec<Value> = (round * 50..round * 50 + 50).map(|i| json!({"id": i, "page": "/q"})).collect();
                let r = http.post(&url).bearer_auth(&key).json(&body).send().await.unwrap();
                assert_eq!(r.status(), 202, "{}", r.text().await.unwrap());
            }
        })
    };
    let r = server.http.post(server.url("/api/streams/l/compact")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let report: Value = r.json().await.unwrap();
    let (before, after) = (report["before"]["files"].as_u64().unwrap(), report["after"]["files"].as_u64().unwrap());
    assert!(before >= 30 && after < before / 4, "{report}");
    pushing.await.unwrap();
    wait_until("every push written", Duration::from_secs(60), || async {
        server.get("/api/streams/l/metrics").await.1["rows_written"] == 3000
    })
    .await;
    assert_eq!(count(&lake.0, "clicks"), 3000, "each row once after the compaction");
    assert!(report["removed_files"].as_u64() > Some(0), "{report}");
    // Once the pushes stopped, a second compaction leaves on disk only the files the lake reads.
    let again: Value =
        server.http.post(server.url("/api/streams/l/compact")).send().await.unwrap().json().await.unwrap();
    let live = again["after"]["files"].as_u64().unwrap() + again["after"]["delete_files"].as_u64().unwrap();
    assert_eq!(parquet_files(&lake.0) as u64, live, "expired files are removed from the folder: {again}");
    assert!(live < files_before as u64 / 4, "{again}");
    let (_, metrics) = server.get("/api/streams/l/metrics").await;
    assert_eq!(metrics["destination"]["compactions"], 2.0, "{metrics}");
    assert_eq!(metrics["destination"]["files"].as_f64(), again["after"]["files"].as_f64(), "{metrics}");

    // A stream other than a DuckLake one has nothing to compact.
    server.create_stream(json!({"name": "w", "table": "w"})).await;
    assert_eq!(server.http.post(server.url("/api/streams/w/compact")).send().await.unwrap().status(), 409);

    // On a schedule: every second here.
    let r = server
        .http
        .patch(server.url("/api/streams/l"))
        .json(&json!({"destination": {"compaction": {"every_s": 1, "keep_snapshots_s": 0}}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    for round in 60..80 {
        assert_eq!(server.push("l", &key, push(round * 50)).await.0, 202);
    }
    wait_until("a scheduled compaction", Duration::from_secs(60), || async {
        let (_, m) = server.get("/api/streams/l/metrics").await;
        m["destination"]["compactions"].as_f64().unwrap_or(0.0) >= 1.0
            && m["destination"]["files"].as_f64() < Some(10.0)
    })
    .await;
    assert_eq!(count(&lake.0, "clicks"), 4000);
}
