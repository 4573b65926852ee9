//! A stream into an HTTP API: pushed events posted as JSON batches, at least once, each request
//! with an idempotency key; a server that fails for a while gets every row once it heals.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::json;

use crate::harness::{DataDir, Server, wait_until};
use crate::http_target::HttpTarget;

#[tokio::test(flavor = "multi_thread")]
async fn pushed_events_reach_an_http_api_in_batches_and_survive_its_outage() {
    let api = HttpTarget::start().await;
    let dir = DataDir::new("dest-http");
    let server = Server::start(&dir.0).await;
    let destination = json!({"kind": "http", "url": api.url("/contacts"), "batch_size": 40, "backoff_ms": 50,
                             "max_retries": 2, "headers": {"Authorization": "Bearer t0ken"}});
    let key = server
        .create_stream(
            json!({"name": "h", "table": "contacts", "destination": destination, "flush": {"max_wait_ms": 20}}),
        )
        .await;
    let (_, shown) = server.get("/api/streams/h").await;
    assert!(!shown.to_string().contains("t0ken"), "{shown}");
    let push = |from: usize| {
        let body: Vec<String> =
            (from..from + 100).map(|i| json!({"id": i, "email": format!("u{i}@x.io")}).to_string()).collect();
        body.join("\n")
    };
    let ids = || -> BTreeSet<i64> {
        api.accepted().iter().flat_map(|r| r.rows()).map(|row| row["id"].as_i64().unwrap()).collect()
    };
    for from in [0, 100] {
        let (status, body) = server.push("h", &key, push(from)).await;
        assert_eq!(status, 202, "{body}");
    }
    wait_until("200 rows at the API", Duration::from_secs(30), || async { ids().len() == 200 }).await;
    let requests = api.accepted();
    assert!(requests.iter().all(|r| r.rows().len() <= 40), "batches of at most 40 rows");
    assert!(requests.iter().all(|r| r.header("authorization") == "Bearer t0ken"));
    let keys: BTreeSet<String> = requests.iter().map(|r| r.header("idempotency-key")).collect();
    assert_eq!(keys.len(), requests.len(), "one idempotency key per request");
    assert!(!keys.contains(""));

    // The API fails every request for a while: the stream retries, and nothing is lost.
    api.fail_after(0, Some(503));
    let pushing = {
        let (url, key) = (server.url("/api/streams/h/push"), key.clone());
        let body = push(200);
        tokio::spawn(async move {
            let http = crate::harness::client();
            loop {
                let r =
                    http.post(&url).bearer_auth(&key).header("Idempotency-Key", "late").body(body.clone()).send().await;
                if r.is_ok_and(|r| r.status().as_u16() == 202) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    wait_until("requests refused while the API is down", Duration::from_secs(30), || async {
        api.received().iter().filter(|r| r.status == 503).count() >= 3
    })
    .await;
    wait_until("the stream waiting for the API", Duration::from_secs(30), || async {
        server.get("/api/streams/h/metrics").await.1["state"] == "reconnecting"
    })
    .await;
    api.fail_after(0, None);
    pushing.await.unwrap();
    wait_until("all 300 rows at the API", Duration::from_secs(60), || async { ids().len() == 300 }).await;
    assert_eq!(ids(), (0..300).collect::<BTreeSet<i64>>());
}
