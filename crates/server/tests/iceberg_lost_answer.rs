//! A lost answer from an Iceberg REST catalog: a proxy forwards a commit to lakana-server, which
//! commits it, and answers 502. The table must stay readable by pyiceberg (no file a committed
//! snapshot lists is removed), the writer must learn from the table that its commit landed (a
//! sync run's id, a stream's position), and the next run must go through.

use std::time::Duration;

use serde_json::json;

use crate::harness::{DataDir, Server, wait_until};
use crate::iceberg_rest::IcebergRest;
use crate::losing_proxy::{LosingProxy, iceberg_commit};

#[tokio::test(flavor = "multi_thread")]
async fn a_commit_whose_answer_is_lost_leaves_the_table_whole_and_the_next_run_goes_through() {
    let catalog = IcebergRest::start();
    let proxy = LosingProxy::start(&catalog.uri, iceberg_commit).await;
    let dir = DataDir::new("iceberg-lost-answer");
    let server = Server::start(&dir.0).await;
    let key = server
        .create_stream(json!({"name": "people", "table": "people", "metadata": {"position": true},
                              "flush": {"max_wait_ms": 20}}))
        .await;
    let first: Vec<_> = (0..20).map(|i| json!({"id": i, "name": format!("n{i}")})).collect();
    assert_eq!(server.push("people", &key, json!(first).to_string()).await.0, 202);
    let mut destination = catalog.destination();
    destination["endpoint"] = json!(proxy.endpoint);
    destination["table"] = json!("people_copy");
    let query = "SELECT id, arg_max(name, _position) AS name FROM people GROUP BY id";
    for mode in ["upsert", "mirror", "replace"] {
        destination["table"] = json!(format!("people_{mode}"));
        let mut sync = json!({"name": mode, "mode": mode, "destination": destination, "query": query});
        if mode != "replace" {
            sync["keys"] = json!(["id"]);
        }
        let (status, body) = server.create_sync(sync).await;
        assert_eq!(status, 201, "{body}");
        assert_eq!(server.run_sync(mode).await["status"], "succeeded");
    }
    // Changes that make position deletes (updates) and new rows, then each run's commit
    // answer is lost.
    let second: Vec<_> = (10..30).map(|i| json!({"id": i, "name": format!("m{i}")})).collect();
    assert_eq!(server.push("people", &key, json!(second).to_string()).await.0, 202);
    let expected: Vec<String> =
        (0..30).map(|i| format!("{i}|{}", if i < 10 { format!("n{i}") } else { format!("m{i}") })).collect();
    for mode in ["upsert", "mirror", "replace"] {
        let table = format!("people_{mode}");
        proxy.lose_next();
        let lost = proxy.lost();
        let run = server.run_sync(mode).await;
        assert_eq!(proxy.lost(), lost + 1, "{mode}: the commit went through the proxy: {run}");
        // The run reads its stamp back from the table: it landed, so the run succeeded.
        assert_eq!(run["status"], "succeeded", "{mode}: the table holds the run: {run}");
        let rows = catalog.read(&table, "SELECT id || '|' || name FROM t ORDER BY id");
        let rows = rows.unwrap_or_else(|| panic!("{mode}: the table no longer reads after a lost answer: {run}"));
        assert_eq!(rows, expected, "{mode}");
        // The next run goes through and leaves the query's rows.
        let run = server.run_sync(mode).await;
        assert_eq!(run["status"], "succeeded", "{mode}: {run}");
        wait_until("the table to read", Duration::from_secs(30), || async {
            catalog.read(&table, "SELECT id || '|' || name FROM t ORDER BY id") == Some(expected.clone())
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stream_whose_commit_answer_is_lost_stores_each_row_once_in_a_table_that_reads() {
    let catalog = IcebergRest::start();
    let proxy = LosingProxy::start(&catalog.uri, iceberg_commit).await;
    let dir = DataDir::new("iceberg-lost-answer-stream");
    let server = Server::start(&dir.0).await;
    let mut destination = catalog.destination();
    destination["endpoint"] = json!(proxy.endpoint);
    let key = server
        .create_stream(json!({"name": "s", "table": "events", "mode": "mirror", "keys": ["id"],
                              "destination": destination, "flush": {"max_wait_ms": 20}}))
        .await;
    let body = |from: i64, tag: &str| json!((from..from + 10).map(|i| json!({"id": i, "v": tag})).collect::<Vec<_>>());
    assert_eq!(server.push("s", &key, body(0, "a").to_string()).await.0, 202);
    // Updates (position deletes) and new rows, whose commit answer is lost: the stream learns
    // from the table that it landed, and the push is answered once it is durable.
    proxy.lose_next();
    let push = server.push("s", &key, body(5, "b").to_string());
    let (status, answer) =
        tokio::time::timeout(Duration::from_secs(60), push).await.expect("the push was never answered");
    assert_eq!(status, 202, "{answer}");
    assert_eq!(proxy.lost(), 1, "the commit went through the proxy");
    assert_eq!(server.push("s", &key, body(15, "c").to_string()).await.0, 202);
    let expected: Vec<String> = (0..25)
        .map(|i| {
            format!(
                "{i}|{}",
                if i < 5 {
                    "a"
                } else if i < 15 {
                    "b"
                } else {
                    "c"
                }
            )
        })
        .collect();
    wait_until("every row once, in a table that reads", Duration::from_secs(60), || async {
        catalog.read("events", "SELECT id || '|' || v FROM t ORDER BY id") == Some(expected.clone())
    })
    .await;
}
