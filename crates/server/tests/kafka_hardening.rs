//! Kafka streams that misbehave politely: an unreachable broker does not flood the log.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::harness::{DataDir, Server, wait_until};

/// Lines at WARN or ERROR in a JSON log, with their messages.
fn loud_lines(log: &std::path::Path) -> Vec<String> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|l| matches!(l["level"].as_str(), Some("WARN" | "ERROR")))
        .map(|l| l["fields"].to_string())
        .collect()
}

#[tokio::test]
async fn an_unreachable_broker_logs_a_bounded_number_of_lines() {
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let dir = DataDir::new("kafka-flood");
    let log = dir.0.join("server.log");
    let server = Server::start_logged(&dir.0.join("data"), &log).await;
    let stream = json!({
        "name": "down", "table": "t",
        "source": {"type": "kafka", "brokers": [format!("127.0.0.1:{port}")], "topics": ["x"],
                   "properties": crate::kafka::test_properties()},
    });
    server.create_stream(stream).await;
    let started = Instant::now();
    wait_until("the stream to report the unreachable broker", Duration::from_secs(30), || async {
        let (_, m) = server.get("/api/streams/down/metrics").await;
        m["state"] == json!("reconnecting")
            && m["last_error"]
                .as_str()
                .is_some_and(|e| e.contains("brokers are down") && e.contains("Connection refused"))
    })
    .await;
    // Ten seconds of failing to connect (librdkafka retries every 100 ms to 10 s): the scenario
    // itself, not a wait for something.
    tokio::time::sleep(Duration::from_secs(10).saturating_sub(started.elapsed())).await;
    let (_, m) = server.get("/api/streams/down/metrics").await;
    assert_eq!(m["state"], "reconnecting", "{m}");
    server.stop();
    let loud = loud_lines(&log);
    assert!(!loud.is_empty(), "the first failure is logged");
    eprintln!("{} WARN/ERROR lines:\n{}", loud.len(), loud.join("\n"));
    assert!(loud.len() <= 10, "{} WARN/ERROR lines in 10 s:\n{}", loud.len(), loud.join("\n"));
}
