//! Kafka hardening: secret librdkafka properties stay secret, and an unreachable broker does
//! not flood the log.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::broker::{Broker, produce};
use crate::harness::{DataDir, Server, assert_not_on_disk, wait_until};
use crate::kafka::{kafka_stream, wait_rows};

const KEY_PASSWORD: &str = "kp-Zq81-secret";
const CLIENT_SECRET: &str = "oc-Vx27-secret";

/// A client certificate whose private key is encrypted with `KEY_PASSWORD`: librdkafka cannot
/// even create the consumer without the password.
fn client_certificate(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let (cert, key) = (dir.join("client.pem"), dir.join("client.key"));
    let out = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "rsa:2048", "-days", "2", "-subj", "/CN=sluice"])
        .args(["-passout", &format!("pass:{KEY_PASSWORD}"), "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .unwrap();
    assert!(out.status.success(), "openssl: {}", String::from_utf8_lossy(&out.stderr));
    (cert, key)
}

async fn events(producer: &rdkafka::producer::FutureProducer, from: usize, to: usize) {
    produce(producer, "sec", &(from..to).map(|i| format!("{{\"id\": {i}}}")).collect::<Vec<_>>()).await;
}

#[tokio::test]
async fn secret_properties_are_not_shown_stored_or_logged_and_survive_patch_and_restart() {
    let broker = Broker::start_tls();
    broker.create_topic("sec", 1);
    let producer = broker.producer(&[]);
    events(&producer, 0, 10).await;

    let dir = DataDir::new("kafka-secret-props");
    let (data, log) = (dir.0.join("data"), dir.0.join("server.log"));
    let (cert, key) = client_certificate(&dir.0);
    let server = Server::start_logged(&data, &log).await;
    let mut s = kafka_stream("sec", "t", &broker, json!(["sec"]));
    s["source"]["tls"] = json!({"ca_file": broker.ca.as_ref().unwrap(), "cert_file": cert, "key_file": key});
    s["source"]["properties"]["ssl.key.password"] = json!(KEY_PASSWORD);
    // This librdkafka build has no OIDC, so it refuses the client secret: without quoting it.
    let mut refused = s.clone();
    refused["source"]["properties"]["sasl.oauthbearer.client.secret"] = json!(CLIENT_SECRET);
    let r = server.http.post(server.url("/api/streams")).json(&refused).send().await.unwrap();
    let text = r.text().await.unwrap();
    assert!(text.contains("sasl.oauthbearer.client.secret") && !text.contains(CLIENT_SECRET), "{text}");
    s["source"]["properties"]["sasl.oauthbearer.config"] = json!(format!("principal=sluice secret={CLIENT_SECRET}"));
    // The key password matters: with a wrong one the consumer cannot load its key.
    let mut wrong = s.clone();
    wrong["source"]["properties"]["ssl.key.password"] = json!("not-the-password");
    let r = server.http.post(server.url("/api/streams")).json(&wrong).send().await.unwrap();
    assert!(r.status().is_client_error(), "a wrong key password was accepted");
    server.create_stream(s).await;
    wait_rows(&server, "t", 10, Duration::from_secs(60)).await;

    // Shown as `***`, in the stream and in the list.
    let (_, got) = server.get("/api/streams/sec").await;
    assert_eq!(got["config"]["source"]["properties"]["ssl.key.password"], "***", "{got}");
    assert_eq!(got["config"]["source"]["properties"]["sasl.oauthbearer.config"], "***", "{got}");
    assert_eq!(got["config"]["source"]["properties"]["session.timeout.ms"], "6000", "others are shown");
    let (_, all) = server.get("/api/streams").await;
    for text in [got.to_string(), all.to_string()] {
        assert!(!text.contains(KEY_PASSWORD) && !text.contains(CLIENT_SECRET), "{text}");
    }

    // A PATCH that does not set them keeps them: the restarted consumer still loads its key.
    let r = server
        .http
        .patch(server.url("/api/streams/sec"))
        .json(&json!({"flush": {"max_wait_ms": 50}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    events(&producer, 10, 20).await;
    wait_rows(&server, "t", 20, Duration::from_secs(60)).await;
    for secret in [KEY_PASSWORD, CLIENT_SECRET] {
        assert_not_on_disk(&data, Some(&log), secret);
    }

    // After a restart they come back from secrets.json.
    server.stop();
    for secret in [KEY_PASSWORD, CLIENT_SECRET] {
        assert_not_on_disk(&data, Some(&log), secret);
    }
    let server = Server::start(&data).await;
    events(&producer, 20, 30).await;
    wait_rows(&server, "t", 30, Duration::from_secs(60)).await;
    let (_, got) = server.get("/api/streams/sec").await;
    assert!(!got.to_string().contains(KEY_PASSWORD), "{got}");

    // `***` with nothing stored behind it is refused, naming the field.
    let mut s = kafka_stream("other", "t2", &broker, json!(["sec"]));
    s["source"]["properties"]["ssl.key.password"] = json!("***");
    let r = server.http.post(server.url("/api/streams")).json(&s).send().await.unwrap();
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap().contains("source.properties.ssl.key.password"));
}

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
