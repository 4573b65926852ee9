//! Body shapes, gzip, and every error status of the push endpoint.

use std::io::Write;

use serde_json::json;

use crate::harness::{DataDir, Server};

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(data).unwrap();
    enc.finish().unwrap()
}

#[tokio::test]
async fn every_body_shape_and_gzip() {
    let dir = DataDir::new("shapes");
    let server = Server::start(&dir.0).await;
    let key = server.create_stream(json!({"name": "s", "table": "shapes"})).await;

    let cases: Vec<(&str, Vec<u8>, serde_json::Value)> = vec![
        ("object", br#"{"n": 1}"#.to_vec(), json!({"accepted": 1, "rejected": 0})),
        ("pretty object", b"{\n  \"n\": 2\n}\n".to_vec(), json!({"accepted": 1, "rejected": 0})),
        ("array", br#"[{"n": 3}, {"n": 4}]"#.to_vec(), json!({"accepted": 2, "rejected": 0})),
        ("ndjson", b"{\"n\": 5}\n{\"n\": 6}\r\n\n{\"n\": 7}".to_vec(), json!({"accepted": 3, "rejected": 0})),
    ];
    for (what, body, expected) in cases {
        let (status, answer) = server.push("s", &key, body).await;
        assert_eq!((status, answer), (202, expected), "{what}");
    }
    let ndjson: String = (8..=107).map(|n| format!("{{\"n\": {n}}}\n")).collect();
    let r = server
        .http
        .post(server.url("/api/streams/s/push"))
        .bearer_auth(&key)
        .header("content-encoding", "gzip")
        .body(gzip(ndjson.as_bytes()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    assert_eq!(r.json::<serde_json::Value>().await.unwrap(), json!({"accepted": 100, "rejected": 0}));
    let rows = server.sql("SELECT count(*) AS c, count(DISTINCT n) AS d, min(n) AS lo, max(n) AS hi FROM shapes").await;
    assert_eq!(rows[0], json!({"c": 107, "d": 107, "lo": 1, "hi": 107}));
}

#[tokio::test]
async fn ndjson_lines_that_are_not_objects_go_to_the_ledger() {
    let dir = DataDir::new("ndjson-bad");
    let server = Server::start(&dir.0).await;
    let key = server.create_stream(json!({"name": "s", "table": "t"})).await;
    let body = "{\"ok\": 1}\nthis is not json\n[1, 2]\n42\n{\"ok\": 2}\n";
    let (status, answer) = server.push("s", &key, body).await;
    assert_eq!((status, answer), (202, json!({"accepted": 2, "rejected": 3})));
    assert_eq!(server.count("t").await, 2);
    let ledger = server.sql(r#"SELECT value, reason, "column" FROM sluice.rejects ORDER BY position"#).await;
    let values: Vec<&str> = ledger.iter().map(|r| r["value"].as_str().unwrap()).collect();
    assert_eq!(values, ["this is not json", "[1,2]", "42"]);
    assert!(ledger[0]["reason"].as_str().unwrap().contains("line 2"), "{ledger:?}");
    assert!(ledger[1]["reason"].as_str().unwrap().contains("expected a JSON object"));
    // An array body: elements that are not objects are rejected the same way.
    let (status, answer) = server.push("s", &key, r#"[{"ok": 3}, "str", null]"#).await;
    assert_eq!((status, answer), (202, json!({"accepted": 1, "rejected": 2})));
}

#[tokio::test]
async fn error_statuses_say_what_to_fix() {
    let dir = DataDir::new("errors");
    let server = Server::start(&dir.0).await;
    let key = server
        .create_stream(json!({"name": "s", "table": "t", "source": {"type": "http_push", "max_body_bytes": 1000}}))
        .await;
    let push_url = server.url("/api/streams/s/push");

    let r = crate::harness::client().post(&push_url).body("{}").send().await.unwrap();
    assert_eq!(r.status(), 401);
    assert!(r.json::<serde_json::Value>().await.unwrap()["error"].as_str().unwrap().contains("Authorization"));
    let (status, wrong) = server.push("s", "sk_wrong", "{}").await;
    assert_eq!(status, 401, "{wrong}");
    // A stream that does not exist answers as a wrong key does, so names cannot be probed
    // without a key: with another stream's key, with a made-up one, and with none.
    for key in [key.as_str(), "sk_wrong"] {
        assert_eq!(server.push("nope", key, "{}").await, (401, wrong.clone()));
    }
    let r = crate::harness::client().post(server.url("/api/streams/nope/push")).body("{}").send().await.unwrap();
    assert_eq!(r.status(), 401);
    assert!(r.json::<serde_json::Value>().await.unwrap()["error"].as_str().unwrap().contains("Authorization"));

    let big = format!("{{\"pad\": \"{}\"}}", "x".repeat(2000));
    let (status, body) = server.push("s", &key, big.clone()).await;
    assert_eq!(status, 413, "{body}");
    assert_eq!(body["limit_bytes"], json!(1000));
    // A small gzip body that inflates past the limit is refused too.
    let r = server
        .http
        .post(&push_url)
        .bearer_auth(&key)
        .header("content-encoding", "gzip")
        .body(gzip(big.as_bytes()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    let r = server
        .http
        .post(&push_url)
        .bearer_auth(&key)
        .header("content-encoding", "gzip")
        .body("not gzip")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);

    let (status, body) = server.push("s", &key, "\n\nthis is { not json").await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["line"], json!(3));
    assert_eq!(body["byte"], json!(3), "the parser stops at the h of \"this\"");
    assert!(body["error"].as_str().unwrap().contains("line 3"), "{body}");
    let (status, body) = server.push("s", &key, r#"[{"a": 1}, {"b": "#).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["line"], json!(1));
    // Nothing of the refused bodies was stored.
    let (status, _) = server.sql_raw("SELECT count(*) FROM t").await;
    assert_eq!(status, 400, "the table was never created");
}

#[tokio::test]
async fn the_answer_counts_every_event_that_went_to_the_ledger_and_can_say_why() {
    let dir = DataDir::new("push-details");
    let server = Server::start(&dir.0).await;
    let key = server.create_stream(json!({"name": "s", "table": "d"})).await;
    assert_eq!(server.push("s", &key, r#"{"n": 1, "flag": true}"#).await.0, 202);
    // A misfit value (stored as NULL, ledgered), a line that is not JSON, and a good event.
    let body = "{\"n\": \"x\", \"flag\": false}\nnot json\n{\"n\": 2}\n";
    let r = server
        .http
        .post(server.url("/api/streams/s/push?details=true"))
        .bearer_auth(&key)
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    let answer: serde_json::Value = r.json().await.unwrap();
    assert_eq!((answer["accepted"].clone(), answer["rejected"].clone()), (json!(2), json!(2)), "{answer}");
    let rejects = answer["rejects"].as_array().unwrap();
    assert_eq!(rejects.len(), 2, "{answer}");
    assert_eq!((rejects[0]["event"].clone(), rejects[0]["column"].clone()), (json!(0), json!("n")));
    assert_eq!((rejects[1]["event"].clone(), rejects[1]["column"].clone()), (json!(1), json!(null)));
    assert!(rejects[1]["reason"].as_str().unwrap().contains("not JSON"), "{answer}");
    // A Debezium mirror stream refuses a change without a key: the client is told.
    let key = server.create_stream(json!({"name": "m", "table": "mm", "mode": "mirror", "format": "debezium"})).await;
    let (status, answer) = server.push("m", &key, r#"{"op": "c", "after": {"a": 1}}"#).await;
    assert_eq!((status, answer), (202, json!({"accepted": 0, "rejected": 1})));
}
