//! What the page reads, end to end over real HTTP: a stream's live feed (server-sent events of
//! committed rows, schema changes and rejects; a slow client skips and is told), the activity
//! feed, the schema history, the metrics history, lineage, the page's files, and the roles.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::harness::{DataDir, Server, wait_until};

/// A live feed read by a test: events as (kind, data).
pub struct Feed {
    response: reqwest::Response,
    buffer: String,
    /// The `open` event's data.
    pub opening: Value,
}

impl Feed {
    /// Open `path` (a feed route) with `http`, and wait for its `open` event.
    pub async fn open(http: &reqwest::Client, server: &Server, path: &str) -> Self {
        let response = http.get(server.url(path)).send().await.unwrap();
        assert_eq!(response.status(), 200, "{path}");
        assert_eq!(response.headers()["content-type"], "text/event-stream");
        let mut feed = Self { response, buffer: String::new(), opening: Value::Null };
        let (kind, opening) = feed.next(Duration::from_secs(10)).await.expect("the open event");
        assert_eq!(kind, "open");
        feed.opening = opening;
        feed
    }

    /// The next event, or `None` after `timeout`.
    pub async fn next(&mut self, timeout: Duration) -> Option<(String, Value)> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let mut kind = "message".to_string();
                let mut data = String::new();
                for line in block.lines() {
                    if let Some(k) = line.strip_prefix("event:") {
                        kind = k.trim().to_string();
                    } else if let Some(d) = line.strip_prefix("data:") {
                        data.push_str(d.trim_start());
                    }
                }
                if data.is_empty() {
                    continue; // A keep-alive comment.
                }
                return Some((kind, serde_json::from_str(&data).unwrap_or(Value::String(data))));
            }
            let chunk = tokio::time::timeout_at(deadline, self.response.chunk()).await.ok()?.ok()??;
            self.buffer.push_str(&String::from_utf8_lossy(&chunk));
        }
    }

    /// Events until `done` says the wanted ones came; panics after `timeout`.
    pub async fn until(
        &mut self,
        timeout: Duration,
        mut done: impl FnMut(&[(String, Value)]) -> bool,
    ) -> Vec<(String, Value)> {
        let deadline = Instant::now() + timeout;
        let mut seen = Vec::new();
        while !done(&seen) {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.next(left).await {
                Some(event) => seen.push(event),
                None => panic!("timed out; events so far: {seen:?}"),
            }
        }
        seen
    }
}

fn has(events: &[(String, Value)], kind: &str, check: impl Fn(&Value) -> bool) -> bool {
    events.iter().any(|(k, v)| k == kind && check(v))
}

#[tokio::test]
async fn the_live_feed_shows_committed_rows_schema_changes_and_rejects() {
    let dir = DataDir::new("page-feed");
    let server = Server::start_with(&dir.0, &["--history-sample-ms", "200"]).await;
    let key = server.create_stream(json!({"name": "clicks", "table": "clicks"})).await;
    let mut feed = Feed::open(&server.http, &server, "/api/streams/clicks/feed").await;
    let mut activity = Feed::open(&server.http, &server, "/api/activity").await;

    assert_eq!(server.push("clicks", &key, r#"{"user": 7, "path": "/a"}"#).await.0, 202);
    assert_eq!(server.push("clicks", &key, r#"{"user": "seven", "amount": 2.5}"#).await.0, 202);
    let events = feed
        .until(Duration::from_secs(20), |e| {
            has(e, "rows", |v| v["rows"][0]["amount"] == 2.5) && has(e, "rejects", |_| true)
        })
        .await;
    assert!(has(&events, "rows", |v| v["table"] == "clicks" && v["rows"] == json!([{"user": 7, "path": "/a"}])));
    assert!(has(&events, "schema", |v| v["changes"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c["change"] == "create" && c["column"] == "user" && c["type"] == "BIGINT")));
    assert!(has(&events, "schema", |v| v["changes"]
        == json!([{"change": "add", "column": "amount", "type": "DOUBLE", "sequence": 2}])));
    assert!(has(&events, "rejects", |v| v["count"] == 1 && v["sample"][0]["column"] == "user"));

    // The activity feed saw the stream created, its schema change and its rejects, live and
    // in the recent list.
    let live = activity
        .until(Duration::from_secs(20), |e| {
            has(e, "schema_changed", |v| v["message"].as_str().unwrap().contains("add amount DOUBLE"))
                && has(e, "rejects", |_| true)
        })
        .await;
    assert!(
        has(&live, "rejects", |v| v["subject"] == "clicks" && v["message"].as_str().unwrap().contains("not a number"))
    );
    let (status, recent) = server.get("/api/activity?recent").await;
    assert_eq!(status, 200);
    let kinds: Vec<&str> = recent["events"].as_array().unwrap().iter().map(|e| e["kind"].as_str().unwrap()).collect();
    assert!(kinds.starts_with(&["stream_created"]) && kinds.contains(&"schema_changed"), "{kinds:?}");

    // Schema now and how it evolved, kept in the workspace.
    let (_, schema) = server.get("/api/streams/clicks/schema").await;
    let columns: Vec<&str> =
        schema["tables"]["clicks"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(columns, ["user", "path", "amount"]);
    let history: Vec<(String, String)> = schema["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["change"].as_str().unwrap().into(), e["column"].as_str().unwrap().into()))
        .collect();
    let expected =
        [("create", "user"), ("create", "path"), ("add", "amount")].map(|(a, b)| (a.to_string(), b.to_string()));
    assert_eq!(history, expected);
    assert_eq!(schema["history"][2]["sequence"], 2);

    // Widening is history too; and it survives a restart.
    assert_eq!(server.push("clicks", &key, r#"{"user": 1.5}"#).await.0, 202);
    server.stop();
    let server = Server::start_with(&dir.0, &["--history-sample-ms", "200"]).await;
    let (_, schema) = server.get("/api/streams/clicks/schema").await;
    let last = &schema["history"][3];
    assert_eq!(
        (last["change"].as_str(), last["column"].as_str(), last["type"].as_str()),
        (Some("widen"), Some("user"), Some("DOUBLE"))
    );

    // Metrics history fills in at the sampling interval.
    wait_until("two metrics samples", Duration::from_secs(10), || async {
        let (_, h) = server.get("/api/streams/clicks/metrics/history").await;
        h["every_ms"] == 200 && h["samples"].as_array().is_some_and(|s| s.len() >= 2)
    })
    .await;
    let (_, h) = server.get("/api/streams/clicks/metrics/history").await;
    let sample = &h["samples"][0];
    for field in ["at_ms", "messages_per_sec", "lag_messages", "lag_seconds", "latency_p50_ms", "latency_p99_ms"] {
        assert!(sample[field].is_number(), "{field}: {sample}");
    }
    assert_eq!(server.get("/api/streams/nope/metrics/history").await.0, 404);
    assert_eq!(server.get("/api/streams/nope/feed").await.0, 404);
}

#[tokio::test]
async fn a_client_that_cannot_keep_up_skips_and_is_told() {
    let dir = DataDir::new("page-skip");
    // A client gets 5 events a second here (50 by default), so that the pushes below outrun it
    // however slow the machine is: at 50, 200 pushes on a loaded 2-core machine took longer
    // than 4 s, and nothing was skipped.
    let server = Server::start_with(&dir.0, &["--feed-max-events-per-sec", "5"]).await;
    let key = server.create_stream(json!({"name": "fast", "table": "fast"})).await;
    let mut feed = Feed::open(&server.http, &server, "/api/streams/fast/feed").await;
    assert_eq!(feed.opening["max_events_per_sec"], 5, "{}", feed.opening);
    // Each push is answered once committed, so each is one unit and one `rows` event.
    for i in 0..100 {
        assert_eq!(server.push("fast", &key, format!("{{\"i\": {i}}}")).await.0, 202);
    }
    let events = feed.until(Duration::from_secs(20), |e| has(e, "skipped", |v| v["skipped"].as_u64() > Some(0))).await;
    let rows = events.iter().filter(|(k, _)| k == "rows").count();
    assert!(rows < 100, "a client over the rate must not get every event ({rows})");
    assert_eq!(server.count("fast").await, 100);
}

#[tokio::test]
async fn lineage_follows_sources_streams_tables_syncs_and_destinations() {
    let dir = DataDir::new("page-lineage");
    let server = Server::start(&dir.0).await;
    let key = server.create_stream(json!({"name": "orders", "table": "orders"})).await;
    assert_eq!(server.push("orders", &key, r#"{"id": 1, "amount": 3}"#).await.0, 202);
    let db = dir.0.join("app.db");
    let (status, body) = server
        .create_sync(json!({"name": "to_app", "query": "SELECT id, amount FROM \"orders\"", "mode": "replace",
            "destination": {"kind": "sqlite", "path": db, "table": "orders_copy"}}))
        .await;
    assert_eq!(status, 201, "{body}");
    let record = server.run_sync("to_app").await;
    assert_eq!(record["status"], "succeeded", "{record}");

    let (status, lineage) = server.get("/api/lineage").await;
    assert_eq!(status, 200);
    let edges: Vec<(String, String)> = lineage["edges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["from"].as_str().unwrap().into(), e["to"].as_str().unwrap().into()))
        .collect();
    let sqlite = format!("destination:sqlite:{}:orders_copy", db.display());
    for (from, to) in [
        ("push:orders", "stream:orders"),
        ("stream:orders", "table:workspace/orders"),
        ("table:workspace/orders", "sync:to_app"),
        ("sync:to_app", sqlite.as_str()),
    ] {
        assert!(edges.contains(&(from.to_string(), to.to_string())), "{from} → {to} in {edges:?}");
    }
    let kinds: Vec<&str> = lineage["nodes"].as_array().unwrap().iter().map(|n| n["kind"].as_str().unwrap()).collect();
    for kind in ["source", "stream", "table", "sync", "destination"] {
        assert!(kinds.contains(&kind), "{kind} in {kinds:?}");
    }

    // The sync's runs are in the activity.
    let (_, recent) = server.get("/api/activity?recent").await;
    let events = recent["events"].as_array().unwrap();
    assert!(events.iter().any(|e| e["kind"] == "run_started" && e["subject"] == "to_app"));
    assert!(events.iter().any(|e| e["kind"] == "run_finished" && e["details"]["status"] == "succeeded"));
}

#[tokio::test]
async fn the_page_is_served_and_viewers_read_but_do_not_write() {
    let dir = DataDir::new("page-roles");
    let server = Server::start(&dir.0).await;
    let key = server.create_stream(json!({"name": "seen", "table": "seen", "flush": {"max_wait_ms": 20}})).await;
    let (status, _) = server.push("seen", &key, r#"[{"n": 1}, {"n": "one"}, 7]"#).await;
    assert_eq!(status, 202);
    let open = crate::harness::client();
    let page = open.get(server.url("/")).send().await.unwrap();
    assert_eq!(page.status(), 200);
    assert!(page.headers()["content-type"].to_str().unwrap().starts_with("text/html"));
    assert!(page.text().await.unwrap().contains("/ui/app.js"));
    for asset in [
        "app.js",
        "api.js",
        "pipelines.js",
        "stream.js",
        "create.js",
        "sql.js",
        "syncs.js",
        "lineage.js",
        "users.js",
        "form.js",
        "connections.js",
        "style.css",
    ] {
        let r = open.get(server.url(&format!("/ui/{asset}"))).send().await.unwrap();
        assert_eq!(r.status(), 200, "{asset}");
        assert!(!r.text().await.unwrap().is_empty(), "{asset}");
    }
    assert_eq!(open.get(server.url("/ui/../admin.token")).send().await.unwrap().status(), 404);
    assert_eq!(open.get(server.url("/ui/nothing.js")).send().await.unwrap().status(), 404);
    // The data behind the page needs a token.
    for path in [
        "/api/streams/seen/feed",
        "/api/activity",
        "/api/streams/seen/schema",
        "/api/lineage",
        "/api/streams/seen/metrics/history",
        "/api/streams/seen/rejects",
    ] {
        assert_eq!(open.get(server.url(path)).send().await.unwrap().status(), 401, "{path}");
    }

    let viewer = server.client_of("viewer").await;
    for path in
        ["/api/activity?recent", "/api/streams/seen/schema", "/api/lineage", "/api/streams/seen/metrics/history"]
    {
        assert_eq!(viewer.get(server.url(path)).send().await.unwrap().status(), 200, "{path}");
    }
    Feed::open(&viewer, &server, "/api/streams/seen/feed").await;
    // A viewer reads the ledger through the stream's rejects, not through SQL (an editor's).
    let read = || async {
        viewer.get(server.url("/api/streams/seen/rejects")).send().await.unwrap().json::<Value>().await.unwrap()
    };
    wait_until("both rejects", Duration::from_secs(30), || async {
        read().await["rows"].as_array().is_some_and(|rows| rows.len() == 2)
    })
    .await;
    let rejects = read().await;
    let reasons: Vec<&str> = rejects["rows"].as_array().unwrap().iter().filter_map(|r| r["reason"].as_str()).collect();
    assert!(reasons.iter().all(|r| !r.is_empty()), "{rejects}");
    assert!(rejects["rows"].as_array().unwrap().iter().any(|r| r["column"] == "n"), "{rejects}");
    let sql = viewer.post(server.url("/api/sql")).json(&json!({"sql": "SELECT 1"})).send().await.unwrap();
    assert_eq!(sql.status(), 403);
    assert_eq!(viewer.get(server.url("/api/streams/nope/rejects")).send().await.unwrap().status(), 404);
    let created =
        viewer.post(server.url("/api/streams")).json(&json!({"name": "x", "table": "x"})).send().await.unwrap();
    assert_eq!(created.status(), 403);
    assert_eq!(viewer.delete(server.url("/api/streams/seen")).send().await.unwrap().status(), 403);
    assert_eq!(server.get("/api/streams/seen").await.0, 200);
}

#[tokio::test]
async fn the_stream_metrics_api_counts_records_since_its_last_call() {
    let dir = DataDir::new("page-metrics-check");
    let server = Server::start(&dir.0).await;
    let key = server.create_stream(json!({"name": "m", "table": "m"})).await;
    let time = |v: &Value| chrono::DateTime::parse_from_rfc3339(v.as_str().expect("a time")).expect("RFC 3339");
    // Each push is answered once committed.
    assert_eq!(server.push("m", &key, "{\"i\": 1}\n{\"i\": 2}\n{\"i\": 3}\n").await.0, 202);

    let (status, first) = server.get("/api/streams/m/metrics").await;
    assert_eq!(status, 200);
    assert_eq!((first["events_in"].as_u64(), first["records_since_start"].as_u64()), (Some(3), Some(3)), "{first}");
    assert_eq!(first["records_since_last_check"], 3, "since start before the first check: {first}");
    assert_eq!(first["last_check"], Value::Null);
    let latency = &first["latency_ms"];
    assert!(latency["now"].as_f64().is_some_and(|ms| ms > 0.0), "{latency}");
    assert!(latency["now"].as_f64() <= latency["max"].as_f64(), "{latency}");
    time(&latency["max_at"]);

    assert_eq!(server.push("m", &key, "{\"i\": 4}\n{\"i\": 5}\n").await.0, 202);
    // Other readers of metrics do not count as checks.
    assert_eq!(server.get("/api/metrics").await.1["streams"]["m"]["records_since_last_check"], 2);
    assert_eq!(server.http.get(server.url("/metrics")).send().await.unwrap().status(), 200);
    assert_eq!(server.get("/api/streams/m").await.0, 200);
    let (_, second) = server.get("/api/streams/m/metrics").await;
    assert_eq!(
        (second["records_since_start"].as_u64(), second["records_since_last_check"].as_u64()),
        (Some(5), Some(2))
    );
    let checked = time(&second["last_check"]);
    assert!(time(&second["latency_ms"]["max_at"]) >= time(&latency["max_at"]), "{second}");

    let (_, third) = server.get("/api/streams/m/metrics").await;
    assert_eq!(third["records_since_last_check"], 0, "{third}");
    assert!(time(&third["last_check"]) > checked, "the time of the second call: {third}");

    // Totals come back after a restart; the counts since start and since the last check begin
    // anew.
    server.stop();
    let server = Server::start(&dir.0).await;
    let (_, after) = server.get("/api/streams/m/metrics").await;
    assert_eq!(after["events_in"], 5, "{after}");
    assert_eq!((after["records_since_start"].as_u64(), after["records_since_last_check"].as_u64()), (Some(0), Some(0)));
    assert_eq!(after["last_check"], Value::Null);
    assert_eq!(after["latency_ms"]["max_at"], Value::Null);
}
