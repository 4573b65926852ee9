//! Kafka streams against a real broker (tansu 0.6.0), with rdkafka as the independent producer.

use std::time::Duration;

use serde_json::{Value, json};

use crate::broker::{Broker, produce};
use crate::harness::{DataDir, Server, wait_until};

/// Consumer settings from the broker notes: short sessions so group changes settle quickly.
pub fn test_properties() -> Value {
    json!({
        "session.timeout.ms": "6000",
        "heartbeat.interval.ms": "500",
        "max.poll.interval.ms": "10000",
        "topic.metadata.refresh.interval.ms": "1000",
    })
}

pub fn kafka_stream(name: &str, table: &str, broker: &Broker, topics: Value) -> Value {
    json!({
        "name": name,
        "table": table,
        "source": {"type": "kafka", "brokers": [broker.bootstrap()], "topics": topics, "properties": test_properties()},
        "flush": {"max_wait_ms": 100},
    })
}

/// Rows in `table`, 0 while it does not exist.
pub async fn rows(server: &Server, table: &str) -> i64 {
    let (status, body) = server.sql_raw(&format!("SELECT count(*) AS n FROM \"{table}\"")).await;
    if status == 200 { body["rows"][0]["n"].as_i64().unwrap_or(0) } else { 0 }
}

pub async fn wait_rows(server: &Server, table: &str, n: i64, within: Duration) {
    wait_until(&format!("{n} rows in {table}"), within, || async { rows(server, table).await >= n }).await;
}

fn events(from: usize, to: usize, extra: &str) -> Vec<String> {
    (from..to).map(|i| format!("{{\"id\": {i}, \"amount\": {i}{extra}}}")).collect()
}

#[tokio::test]
async fn topics_fan_out_with_evolution_metadata_and_rejects() {
    let broker = Broker::start();
    broker.create_topic("orders", 3);
    broker.create_topic("payments", 1);
    let dir = DataDir::new("kafka-fanout");
    let server = Server::start(&dir.0).await;
    let mut stream = kafka_stream("k", "kafka_*", &broker, json!(["orders", "payments"]));
    stream["metadata"] =
        json!({"key": true, "topic": true, "partition": true, "offset": true, "event_time": true, "headers": true});
    server.create_stream(stream).await;

    let producer = broker.producer(&[]);
    let mut orders = events(0, 50, "");
    orders.extend(events(50, 100, ", \"coupon\": \"C\""));
    orders.extend(["not json".to_string(), "42".to_string(), r#"[{"id": 1000}, {"id": 1001}]"#.to_string()]);
    produce(&producer, "orders", &orders).await;
    produce(&producer, "payments", &events(0, 10, "")).await;

    wait_rows(&server, "kafka_orders", 102, Duration::from_secs(60)).await;
    wait_rows(&server, "kafka_payments", 10, Duration::from_secs(60)).await;
    let r = server
        .sql(r#"SELECT count(*) AS n, count(DISTINCT id) AS ids, count(coupon) AS coupons, count(DISTINCT _partition) AS parts,
                  min(_headers->>'source') AS header, count(_key) AS keys, count(_event_time) AS times,
                  min(_topic) AS topic FROM kafka_orders"#)
        .await;
    assert_eq!(
        r[0],
        json!({"n": 102, "ids": 102, "coupons": 50, "parts": 3, "header": "test", "keys": 102, "times": 102, "topic": "orders"})
    );
    let dup_offsets = server
        .sql("SELECT _partition, _offset FROM kafka_orders GROUP BY ALL HAVING count(*) > 1 AND min(id) < 1000")
        .await;
    assert!(dup_offsets.is_empty(), "one row per message: {dup_offsets:?}");
    let rejects = server
        .sql(r#"SELECT value, source->>'topic' AS topic, (source->>'partition') IS NOT NULL AS has_partition, (source->>'offset') IS NOT NULL AS has_offset
                FROM sluice.rejects ORDER BY value"#)
        .await;
    assert_eq!(
        rejects,
        vec![
            json!({"value": "42", "topic": "orders", "has_partition": true, "has_offset": true}),
            json!({"value": "not json", "topic": "orders", "has_partition": true, "has_offset": true}),
        ]
    );

    // Lag: caught up on every partition, visible per partition in JSON and Prometheus.
    wait_until("lag measured on all 4 partitions", Duration::from_secs(30), || async {
        let (_, m) = server.get("/api/streams/k/metrics").await;
        m["lag"].as_object().is_some_and(|l| l.len() == 4) && m["lag_messages"] == json!(0)
    })
    .await;
    let text = server.http.get(server.url("/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(text.contains("sluice_stream_lag_messages{stream=\"k\",partition=\"orders/2\"} 0"), "{text}");
    assert!(text.contains("sluice_stream_lag_seconds{stream=\"k\",partition=\"payments/0\"}"));
    let (status, _) = server.push("k", "sk_any_key_at_all_0000", "{}").await;
    assert_eq!(status, 401, "a kafka stream has no push key");
}

#[tokio::test]
async fn topic_regex_and_start_oldest_or_newest() {
    let broker = Broker::start();
    broker.create_topic("logs.a", 1);
    broker.create_topic("logs.b", 2);
    broker.create_topic("other", 1);
    let producer = broker.producer(&[]);
    produce(&producer, "logs.a", &events(0, 5, "")).await;
    produce(&producer, "logs.b", &events(5, 10, "")).await;
    produce(&producer, "other", &events(10, 15, "")).await;

    let dir = DataDir::new("kafka-regex");
    let server = Server::start(&dir.0).await;
    let mut oldest = kafka_stream("oldest", "logs", &broker, json!([]));
    oldest["source"].as_object_mut().unwrap().remove("topics");
    oldest["source"]["topic_regex"] = json!("logs\\..*");
    server.create_stream(oldest).await;
    let mut newest = kafka_stream("newest", "new_only", &broker, json!(["logs.a"]));
    newest["source"]["start"] = json!("newest");
    server.create_stream(newest).await;

    wait_rows(&server, "logs", 10, Duration::from_secs(60)).await;
    // `newest` is assigned once it has joined its group; then only later messages arrive.
    wait_until("the newest stream to be assigned", Duration::from_secs(60), || async {
        let (_, m) = server.get("/api/streams/newest/metrics").await;
        m["lag"].as_object().is_some_and(|l| !l.is_empty())
    })
    .await;
    produce(&producer, "logs.a", &events(100, 103, "")).await;
    wait_rows(&server, "new_only", 3, Duration::from_secs(60)).await;
    let ids: Vec<i64> =
        server.sql("SELECT id FROM new_only ORDER BY id").await.iter().map(|r| r["id"].as_i64().unwrap()).collect();
    assert_eq!(ids, [100, 101, 102]);
    wait_rows(&server, "logs", 13, Duration::from_secs(60)).await;
    let r = server.sql("SELECT count(*) AS n, min(id) AS lo, max(id) AS hi FROM logs").await;
    assert_eq!(r[0], json!({"n": 13, "lo": 0, "hi": 102}), "the regex reads logs.a and logs.b, not other");
}

#[tokio::test]
async fn scram_auth_and_a_wrong_password() {
    let broker = Broker::start_scram(&[("scram512", "alice", "alice-secret"), ("scram256", "bob", "bob-secret")]);
    // Topics and producing go through SASL too.
    let sasl = [
        ("security.protocol", "sasl_plaintext"),
        ("sasl.mechanism", "SCRAM-SHA-512"),
        ("sasl.username", "alice"),
        ("sasl.password", "alice-secret"),
    ];
    let producer = broker.producer(&sasl);
    let admin: rdkafka::admin::AdminClient<_> = {
        let mut c = rdkafka::ClientConfig::new();
        c.set("bootstrap.servers", broker.bootstrap());
        for (k, v) in sasl {
            c.set(k, v);
        }
        c.create().unwrap()
    };
    admin
        .create_topics(
            [&rdkafka::admin::NewTopic::new("secure", 1, rdkafka::admin::TopicReplication::Fixed(1))],
            &Default::default(),
        )
        .await
        .unwrap();
    produce(&producer, "secure", &events(0, 20, "")).await;

    let dir = DataDir::new("kafka-scram");
    let server = Server::start(&dir.0).await;
    for (name, mechanism, user, password) in [
        ("s512", "scram-sha-512", "alice", "alice-secret"),
        ("s256", "scram-sha-256", "bob", "bob-secret"),
        ("bad", "scram-sha-512", "alice", "wrong"),
    ] {
        let mut s = kafka_stream(name, &format!("t_{name}"), &broker, json!(["secure"]));
        s["source"]["sasl"] = json!({"mechanism": mechanism, "username": user, "password": password});
        server.create_stream(s).await;
    }
    wait_rows(&server, "t_s512", 20, Duration::from_secs(60)).await;
    wait_rows(&server, "t_s256", 20, Duration::from_secs(60)).await;
    wait_until("the wrong password to be reported", Duration::from_secs(60), || async {
        let (_, m) = server.get("/api/streams/bad/metrics").await;
        m["state"] == json!("reconnecting")
            && m["last_error"].as_str().is_some_and(|e| e.to_lowercase().contains("authentication"))
    })
    .await;
    assert_eq!(rows(&server, "t_bad").await, 0);
    let (_, s) = server.get("/api/streams/s512").await;
    assert!(s["config"]["source"]["sasl"].get("password").is_none() && !s.to_string().contains("alice-secret"), "{s}");
    let secrets = std::fs::metadata(dir.0.join("secrets.json")).unwrap();
    assert_eq!(std::os::unix::fs::PermissionsExt::mode(&secrets.permissions()) & 0o777, 0o600);

    // The password survives a restart, kept apart from the config: the restarted stream
    // authenticates again (lag is measured only over an authenticated connection).
    server.stop();
    // The registry is internal (hidden from /api/sql): the offline CLI reads the file itself.
    let out = std::process::Command::new(crate::harness::BIN)
        .args(["sql", "--server", "127.0.0.1:1", "--data-dir", dir.0.to_str().unwrap(), "--json"])
        .arg("SELECT config::VARCHAR AS c FROM sluice.streams")
        .output()
        .unwrap();
    let stored = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && stored.contains("s512"), "{stored}");
    assert!(!stored.contains("alice-secret"), "the stored config has no password");
    let server = Server::start(&dir.0).await;
    wait_until("the restarted stream to authenticate", Duration::from_secs(60), || async {
        let (_, m) = server.get("/api/streams/s512/metrics").await;
        m["lag"].as_object().is_some_and(|l| l.contains_key("secure/0"))
    })
    .await;
    let (_, m) = server.get("/api/streams/bad/metrics").await;
    assert!(m["lag"].as_object().is_some_and(|l| l.is_empty()), "the wrong password still gets nowhere: {m}");
}

#[tokio::test]
async fn tls_through_a_terminating_front_end() {
    let broker = Broker::start_tls();
    let producer = broker.producer(&[]);
    let admin: rdkafka::admin::AdminClient<_> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", broker.bootstrap())
        .set("security.protocol", "ssl")
        .set("ssl.ca.location", broker.ca.as_ref().unwrap().display().to_string())
        .create()
        .unwrap();
    admin
        .create_topics(
            [&rdkafka::admin::NewTopic::new("tls", 2, rdkafka::admin::TopicReplication::Fixed(1))],
            &Default::default(),
        )
        .await
        .unwrap();
    produce(&producer, "tls", &events(0, 30, "")).await;
    let dir = DataDir::new("kafka-tls");
    let server = Server::start(&dir.0).await;
    let mut s = kafka_stream("tls", "over_tls", &broker, json!(["tls"]));
    s["source"]["tls"] = json!({"ca_file": broker.ca.as_ref().unwrap()});
    server.create_stream(s).await;
    wait_rows(&server, "over_tls", 30, Duration::from_secs(60)).await;

    // Without TLS the same broker port does not work: the stream reports it and stores nothing.
    let s = kafka_stream("plain", "over_plain", &broker, json!(["tls"]));
    server.create_stream(s).await;
    wait_until("a TLS port refusing plaintext to be reported", Duration::from_secs(60), || async {
        let (_, m) = server.get("/api/streams/plain/metrics").await;
        m["state"] == json!("reconnecting")
    })
    .await;
    assert_eq!(rows(&server, "over_plain").await, 0);
}

#[tokio::test]
async fn config_errors_name_the_field_including_sasl_plain() {
    let dir = DataDir::new("kafka-config");
    let server = Server::start(&dir.0).await;
    let base =
        json!({"name": "c", "table": "t", "source": {"type": "kafka", "brokers": ["127.0.0.1:9"], "topics": ["x"]}});
    let cases = [
        (json!({"brokers": []}), "source.brokers"),
        (json!({"brokers": ["nohost"]}), "source.brokers"),
        (json!({"topics": []}), "source.topics"),
        (json!({"topic_regex": "x.*"}), "source.topic_regex"),
        (json!({"sasl": {"mechanism": "plain", "username": "$ConnectionString"}}), "source.sasl.password"),
        (json!({"sasl": {"mechanism": "gssapi", "username": "u", "password": "p"}}), "gssapi"),
        (json!({"properties": {"enable.auto.commit": "true"}}), "source.properties.enable.auto.commit"),
        (json!({"tls": {"cert_file": "/tmp/c.pem"}}), "source.tls"),
        (json!({"tls": {"ca_file": "/nonexistent/ca.pem"}}), "source.tls.ca_file"),
    ];
    for (patch, field) in cases {
        let mut body = base.clone();
        for (k, v) in patch.as_object().unwrap() {
            body["source"][k] = v.clone();
        }
        let r = server.http.post(server.url("/api/streams")).json(&body).send().await.unwrap();
        let status = r.status();
        let text = r.text().await.unwrap();
        assert!(status.is_client_error(), "{patch}: {status} {text}");
        assert!(text.contains(field), "{field} not named: {text}");
    }
    // SASL PLAIN over TLS (Azure Event Hubs' Kafka endpoint) is a valid config; tansu cannot
    // serve PLAIN, so only validation is tested here.
    let mut body = base.clone();
    body["source"]["sasl"] = json!({"mechanism": "plain", "username": "$ConnectionString", "password": "Endpoint=sb://x/;SharedAccessKey=y"});
    let r = server.http.post(server.url("/api/streams")).json(&body).send().await.unwrap();
    assert_eq!(r.status(), 201);
}
