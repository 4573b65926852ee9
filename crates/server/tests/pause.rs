//! Pause and resume: a paused stream reads nothing, refuses pushes with 503, stays paused
//! across a restart of the server, and resumes where it stopped.

use std::time::Duration;

use serde_json::{Value, json};

use crate::harness::{DataDir, Server, wait_until};

async fn post(server: &Server, path: &str) -> (u16, Value) {
    let r = server.http.post(server.url(path)).send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

async fn state(server: &Server) -> String {
    server.get("/api/streams/p/metrics").await.1["state"].as_str().unwrap_or_default().to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_paused_stream_refuses_pushes_stays_paused_across_a_restart_and_resumes() {
    let dir = DataDir::new("pause");
    let server = Server::start(&dir.0).await;
    let key = server.create_stream(json!({"name": "p", "table": "paused", "flush": {"max_wait_ms": 20}})).await;
    assert_eq!(server.push("p", &key, r#"{"n": 1}"#).await.0, 202);

    let (status, body) = post(&server, "/api/streams/p/pause").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["config"]["paused"], true, "{body}");
    assert_eq!(state(&server).await, "paused");
    let r =
        server.http.post(server.url("/api/streams/p/push")).bearer_auth(&key).body(r#"{"n": 2}"#).send().await.unwrap();
    assert_eq!(r.status(), 503);
    assert_eq!(r.headers()["retry-after"], "30");
    let message = r.json::<Value>().await.unwrap()["error"].as_str().unwrap_or_default().to_string();
    assert!(message.contains("paused") && message.contains("/api/streams/p/resume"), "{message}");
    // A viewer sees the state but may not change it.
    let viewer = server.client_of("viewer").await;
    assert_eq!(viewer.post(server.url("/api/streams/p/resume")).send().await.unwrap().status(), 403);
    let listed = viewer.get(server.url("/api/streams")).send().await.unwrap().json::<Value>().await.unwrap();
    assert_eq!(listed["streams"][0]["metrics"]["state"], "paused", "{listed}");
    // Pausing twice is no change.
    assert_eq!(post(&server, "/api/streams/p/pause").await.0, 200);

    server.stop();
    let server = Server::start(&dir.0).await;
    assert_eq!(state(&server).await, "paused", "the pause is stored with the stream");
    assert_eq!(server.push("p", &key, r#"{"n": 2}"#).await.0, 503);
    assert_eq!(server.count("paused").await, 1, "nothing was stored while paused");

    let (status, body) = post(&server, "/api/streams/p/resume").await;
    assert_eq!(status, 200, "{body}");
    assert!(body["config"].get("paused").is_none(), "{body}");
    assert_eq!(server.push("p", &key, r#"{"n": 3}"#).await.0, 202);
    wait_until("the pushed event after the resume", Duration::from_secs(20), || async {
        server.count("paused").await == 2
    })
    .await;
    assert_eq!(state(&server).await, "running");
    assert_eq!(post(&server, "/api/streams/nothing/pause").await.0, 404);
}

/// A stream declared in the config file and paused through the API stays paused when the
/// server starts again with the same file.
#[tokio::test(flavor = "multi_thread")]
async fn a_declared_stream_paused_through_the_api_stays_paused_across_a_restart() {
    let dir = DataDir::new("pause-declared");
    let file = dir.0.join("sluice.yaml");
    std::fs::write(&file, "streams:\n  - name: p\n    table: declared\n    push_key: a-push-key-of-sixteen-chars\n")
        .unwrap();
    let server = Server::start_with(&dir.0, &["--config", file.to_str().unwrap()]).await;
    assert_eq!(post(&server, "/api/streams/p/pause").await.0, 200);
    server.stop();
    let server = Server::start_with(&dir.0, &["--config", file.to_str().unwrap()]).await;
    assert_eq!(state(&server).await, "paused");
    assert_eq!(server.push("p", "a-push-key-of-sixteen-chars", r#"{"n": 1}"#).await.0, 503);
}
