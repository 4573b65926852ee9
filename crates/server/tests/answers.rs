//! Answers that say what happened: a push's counts, the schema history's events, the number
//! rule, and save-time errors, each as README states them.

use serde_json::json;

use crate::harness::{DataDir, Server};

#[tokio::test]
async fn a_push_counts_filtered_events_apart_from_stored_ones() {
    let dir = DataDir::new("answer-filtered");
    let server = Server::start(&dir.0).await;
    let key = server.create_stream(json!({"name": "s", "table": "t", "transform": {"filter": "kind <> 'test'"}})).await;
    let body: Vec<_> = (0..10).map(|i| json!({"n": i, "kind": if i < 7 { "test" } else { "sale" }})).collect();
    let (status, answer) = server.push("s", &key, json!(body).to_string()).await;
    assert_eq!((status, answer), (202, json!({"accepted": 3, "rejected": 0, "filtered": 7})));
    // All filtered: nothing stored, and `?details=true` says the same.
    let body: Vec<_> = (0..4).map(|i| json!({"n": i, "kind": "test"})).collect();
    let url = server.url("/api/streams/s/push?details=true");
    let r = server.http.post(url).bearer_auth(&key).body(json!(body).to_string()).send().await.unwrap();
    assert_eq!(r.status(), 202);
    let answer: serde_json::Value = r.json().await.unwrap();
    assert_eq!((answer["accepted"].clone(), answer["filtered"].clone()), (json!(0), json!(4)), "{answer}");
    assert_eq!(server.count("t").await, 3);
    // A retry with the push's Idempotency-Key gets the same answer, stored nothing again.
    let body: Vec<_> = (0..5).map(|i| json!({"n": i, "kind": if i < 2 { "test" } else { "sale" }})).collect();
    for replayed in [false, true] {
        let r = server
            .http
            .post(server.url("/api/streams/s/push"))
            .bearer_auth(&key)
            .header("idempotency-key", "order-7")
            .body(json!(body).to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(r.headers().contains_key("idempotent-replayed"), replayed);
        assert_eq!(r.json::<serde_json::Value>().await.unwrap(), json!({"accepted": 3, "rejected": 0, "filtered": 2}));
    }
    assert_eq!(server.count("t").await, 6);
    // A script's WHERE is a filter too.
    let script = json!({"script": "SELECT * FROM event WHERE n > 1"});
    let key = server.create_stream(json!({"name": "sc", "table": "sc", "transform": script})).await;
    let (status, answer) = server.push("sc", &key, r#"[{"n": 1}, {"n": 2}, {"n": 3}]"#).await;
    assert_eq!((status, answer), (202, json!({"accepted": 2, "rejected": 0, "filtered": 1})));
}

#[tokio::test]
async fn the_schema_history_names_the_event_that_brought_each_column() {
    let dir = DataDir::new("answer-history");
    let server = Server::start(&dir.0).await;
    let key = server.create_stream(json!({"name": "s", "table": "t"})).await;
    // Event 1 creates the table; events 2-4 come in one push, and only event 2 brings `b`,
    // event 3 widens `a` and event 4 brings `c`.
    assert_eq!(server.push("s", &key, r#"{"a": 1}"#).await.0, 202);
    let (status, _) = server.push("s", &key, r#"[{"a": 2, "b": "x"}, {"a": 2.5}, {"a": 3, "c": true}]"#).await;
    assert_eq!(status, 202);
    let (status, history) = server.get("/api/streams/s/schema").await;
    assert_eq!(status, 200, "{history}");
    let history = history["history"].as_array().cloned().unwrap_or_default();
    let at = |change: &str, column: &str| {
        history
            .iter()
            .find(|e| e["change"] == change && e["column"] == column)
            .map(|e| e["sequence"].clone())
            .unwrap_or_else(|| panic!("no {change} of {column}: {history:?}"))
    };
    assert_eq!(at("create", "a"), json!(1));
    assert_eq!(at("add", "b"), json!(2));
    assert_eq!(at("widen", "a"), json!(3));
    assert_eq!(at("add", "c"), json!(4));
}

#[tokio::test]
async fn integers_past_bigint_widen_whatever_the_path() {
    let dir = DataDir::new("answer-numbers");
    let server = Server::start(&dir.0).await;
    // README: any integer beyond ±2^63 widens a BIGINT column to DOUBLE, with no ledger row;
    // 2^64 - 1 and 2^64 alike, in a push decoded at the edge, in the stream, and with a transform.
    let streams = [
        json!({"name": "plain", "table": "plain"}),
        json!({"name": "masked", "table": "masked", "transform": {"fields": [{"field": "m", "mask": "hash"}]}}),
        json!({"name": "computed", "table": "computed", "transform": {"fields": [{"field": "d", "sql": "n * 2"}]}}),
    ];
    for stream in streams {
        let name = stream["name"].as_str().unwrap().to_string();
        let key = server.create_stream(stream).await;
        assert_eq!(server.push(&name, &key, r#"{"id": 1, "n": 5}"#).await.0, 202);
        for (id, n) in [(2, "18446744073709551615"), (3, "18446744073709551616"), (4, "-9223372036854775809")] {
            let (status, answer) = server.push(&name, &key, format!(r#"{{"id": {id}, "n": {n}}}"#)).await;
            assert_eq!((status, answer), (202, json!({"accepted": 1, "rejected": 0})), "{name}: {n}");
        }
        let types = server
            .lines(&format!("SELECT data_type FROM duckdb_columns() WHERE table_name = '{name}' AND column_name = 'n'"))
            .await;
        assert_eq!(types, ["DOUBLE"], "{name}");
        let values = server.lines(&format!("SELECT n::VARCHAR FROM \"{name}\" ORDER BY id")).await;
        assert_eq!(values, ["5.0", "1.8446744073709552e+19", "1.8446744073709552e+19", "-9.223372036854776e+18"]);
    }
    let ledger = server.lines("SELECT count(*) FROM sluice.rejects").await;
    assert_eq!(ledger, ["0"]);
}
