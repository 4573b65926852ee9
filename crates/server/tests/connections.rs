//! Named connections against a real PostgreSQL: a Postgres source, a stream's destination and
//! a sync's destination name one connection; changing it (a rotated password, another
//! database) reaches all of them, also after a restart; it cannot be removed while named;
//! Test connection logs in with it.

use std::time::Duration;

use serde_json::{Value, json};

use crate::harness::{DataDir, Server, assert_not_on_disk, wait_until};
use crate::postgres::Postgres;

async fn call(server: &Server, method: reqwest::Method, path: &str, body: Value) -> (u16, Value) {
    let r = server.http.request(method, server.url(path)).json(&body).send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

fn count(pg: &Postgres, database: &str, table: &str) -> i64 {
    pg.count_in(database, &format!("public.{table}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn one_connection_serves_a_source_a_stream_and_a_sync_and_a_change_reaches_them() {
    let pg = Postgres::start();
    // The connection logs in as `app`, whose password rotates (the harness's `etl` keeps its).
    pg.admin("CREATE ROLE app LOGIN REPLICATION PASSWORD 'first-secret'; GRANT app TO etl");
    pg.admin("CREATE DATABASE moved OWNER app");
    pg.admin("GRANT ALL ON DATABASE etltest TO app");
    pg.sql("GRANT CREATE ON SCHEMA public TO app");
    pg.sql("CREATE TABLE src (id int PRIMARY KEY, note text); INSERT INTO src SELECT g, 'n' || g FROM generate_series(1, 50) g");
    let dir = DataDir::new("connections");
    let server = Server::start(&dir.0).await;
    use reqwest::Method;

    let connection = json!({"kind": "postgres", "name": "pg", "host": "127.0.0.1", "port": pg.port,
                            "database": "etltest", "user": "app", "password": "first-secret"});
    let (status, body) = call(&server, Method::POST, "/api/connections", connection.clone()).await;
    assert_eq!(status, 201, "{body}");
    assert!(body["config"].get("password").is_none(), "a secret is never shown: {body}");
    assert_eq!(call(&server, Method::POST, "/api/connections", connection).await.0, 409);
    let cdc = json!({"kind": "postgres", "name": "pg-cdc", "host": "127.0.0.1", "port": pg.port,
                     "database": "etltest", "user": "etl", "password": "etl"});
    assert_eq!(call(&server, Method::POST, "/api/connections", cdc).await.0, 201);

    // A name that is no connection, or one of the wrong kind, is refused naming the field.
    let (status, body) = server
        .http
        .post(server.url("/api/streams"))
        .json(&json!({"name": "x", "table": "x", "destination": {"kind": "postgres", "connection": "nope"}}))
        .send()
        .await
        .map(|r| (r.status().as_u16(), r))
        .unwrap();
    let text = body.text().await.unwrap();
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("destination.connection") && text.contains("nope"), "{text}");
    let (status, body) = call(
        &server,
        Method::POST,
        "/api/streams",
        json!({"name": "x", "table": "x", "destination": {"kind": "mysql", "connection": "pg"}}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(body["error"].as_str().unwrap().contains("postgres connection"), "{body}");
    // A field the connection gives is the connection's: another value is refused, naming it.
    let (status, body) = call(
        &server,
        Method::POST,
        "/api/streams",
        json!({"name": "x", "table": "x", "destination": {"kind": "postgres", "connection": "pg", "database": "other"}}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(body["error"].as_str().unwrap().starts_with("destination.database:"), "{body}");

    // A push stream into a table of the connection's database and a sync that writes there;
    // a Postgres source read through another connection.
    let key = server
        .create_stream(json!({"name": "web", "table": "events", "flush": {"max_wait_ms": 20},
                              "destination": {"kind": "postgres", "connection": "pg"}}))
        .await;
    server
        .create_stream(json!({"name": "cdc", "table": "src_copy", "flush": {"max_wait_ms": 20},
                              "source": {"type": "postgres", "connection": "pg-cdc", "tables": ["public.src"]}}))
        .await;
    assert_eq!(server.push("web", &key, r#"[{"n": 1}, {"n": 2}]"#).await.0, 202);
    wait_until("the pushed rows in etltest", Duration::from_secs(30), || async {
        count(&pg, "etltest", "events") == 2
    })
    .await;
    wait_until("the source's rows in the workspace", Duration::from_secs(60), || async {
        server.sql_raw("SELECT count(*) AS n FROM src_copy").await.1["rows"][0]["n"] == 50
    })
    .await;
    let (status, body) = call(
        &server,
        Method::POST,
        "/api/syncs",
        json!({"name": "back", "query": "SELECT id, note FROM src_copy", "mode": "upsert", "keys": ["id"],
               "destination": {"kind": "postgres", "connection": "pg", "table": "copied"}}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let (_, listed) = server.get("/api/connections").await;
    assert_eq!(listed["connections"][0]["used_by"], json!({"streams": ["web"], "syncs": ["back"]}), "{listed}");
    assert_eq!(listed["connections"][1]["used_by"], json!({"streams": ["cdc"], "syncs": []}), "{listed}");
    let (status, body) = call(&server, Method::DELETE, "/api/connections/pg", Value::Null).await;
    assert_eq!(status, 409, "{body}");
    assert!(body["error"].as_str().unwrap().contains("web"), "{body}");

    // Test connection: the stored password is used when left out; a wrong one fails and says so.
    let probe = json!({"kind": "postgres", "name": "pg", "host": "127.0.0.1", "port": pg.port, "user": "app",
                       "database": "etltest"});
    let (_, tested) = call(&server, Method::POST, "/api/connections/test", probe.clone()).await;
    assert_eq!(tested["ok"], true, "{tested}");
    let mut wrong = probe.clone();
    wrong["name"] = json!("other");
    wrong["password"] = json!("wrong");
    let (_, tested) = call(&server, Method::POST, "/api/connections/test", wrong).await;
    assert_eq!(tested["ok"], false, "{tested}");
    assert!(tested["checks"][0]["message"].as_str().unwrap().contains("password"), "{tested}");

    // A change a user cannot take is refused whole (the sync and the push stream need a
    // database), and a connection keeps its kind.
    let (status, body) = call(
        &server,
        Method::PUT,
        "/api/connections/pg",
        json!({"kind": "postgres", "host": "127.0.0.1", "port": pg.port, "user": "app"}),
    )
    .await;
    assert_eq!(status, 422, "{body}");
    assert!(body["error"].as_str().unwrap().contains("sync 'back'"), "{body}");
    assert_eq!(server.get("/api/connections/pg").await.1["config"]["database"], "etltest", "nothing changed");
    let (status, _) =
        call(&server, Method::PUT, "/api/connections/pg", json!({"kind": "mysql", "host": "h", "user": "u"})).await;
    assert_eq!(status, 409);
    // The stored password is not lent to a host the request chose.
    let elsewhere = json!({"kind": "postgres", "name": "pg", "host": "127.0.0.2", "port": pg.port, "user": "app",
                           "database": "etltest"});
    let (_, tested) = call(&server, Method::POST, "/api/connections/test", elsewhere).await;
    assert_eq!(tested["ok"], false, "{tested}");

    // The password rotates and the rows move to another database: one change to the connection.
    pg.admin("ALTER USER app PASSWORD 'rotated-secret'");
    let (status, body) = call(
        &server,
        Method::PUT,
        "/api/connections/pg",
        json!({"kind": "postgres", "host": "127.0.0.1", "port": pg.port, "database": "moved", "user": "app",
               "password": "rotated-secret"}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(body.get("not_applied").is_none(), "{body}");
    assert_eq!(server.push("web", &key, r#"{"n": 3}"#).await.0, 202);
    wait_until("the pushed row in the moved database", Duration::from_secs(30), || async {
        count(&pg, "moved", "events") == 1
    })
    .await;
    let run = server.run_sync("back").await;
    assert_eq!(run["status"], "succeeded", "{run}");
    assert_eq!(count(&pg, "moved", "copied"), 50);

    // After a restart the streams and the sync are filled from the connection again: what the
    // connection gave was not stored with them.
    server.stop();
    let server = Server::start(&dir.0).await;
    assert_eq!(server.push("web", &key, r#"{"n": 4}"#).await.0, 202);
    wait_until("the row pushed after the restart", Duration::from_secs(30), || async {
        count(&pg, "moved", "events") == 2
    })
    .await;
    pg.sql("INSERT INTO src VALUES (51, 'late')");
    wait_until("a change read through the other connection", Duration::from_secs(60), || async {
        server.sql_raw("SELECT count(*) AS n FROM src_copy").await.1["rows"][0]["n"] == 51
    })
    .await;
    let run = server.run_sync("back").await;
    assert_eq!(run["status"], "succeeded", "{run}");
    assert_eq!(count(&pg, "moved", "copied"), 51);
    assert_eq!(count(&pg, "etltest", "events"), 2, "nothing more went to the old database");
    assert_not_on_disk(&dir.0, None, "rotated-secret");

    // Unused, it can be removed.
    for stream in ["web", "cdc"] {
        assert_eq!(call(&server, Method::DELETE, &format!("/api/streams/{stream}"), Value::Null).await.0, 204);
    }
    assert_eq!(call(&server, Method::DELETE, "/api/syncs/back", Value::Null).await.0, 204);
    for connection in ["pg", "pg-cdc"] {
        assert_eq!(call(&server, Method::DELETE, &format!("/api/connections/{connection}"), Value::Null).await.0, 204);
    }
    assert_eq!(server.get("/api/connections/pg").await.0, 404);
}

/// Test source, Test destination and Test connection answer for real Kafka (tansu), Kinesis
/// (kinesis-local) and PostgreSQL, saying what is wrong when something is.
#[tokio::test(flavor = "multi_thread")]
async fn the_test_buttons_answer_for_kafka_kinesis_and_postgres() {
    use reqwest::Method;
    let pg = Postgres::start();
    let broker = crate::broker::Broker::start();
    broker.create_topic("present", 1);
    let kinesis = crate::kinesis_local::KinesisLocal::start().await;
    kinesis.create_stream("clicks", 1).await;
    let dir = DataDir::new("test-buttons");
    let server = Server::start(&dir.0).await;
    let test = |path: &'static str, body: Value| {
        let server = &server;
        async move {
            let (status, answer) = call(server, Method::POST, path, body).await;
            assert_eq!(status, 200, "{answer}");
            (answer["ok"].as_bool().unwrap(), answer["checks"][0]["message"].as_str().unwrap_or_default().to_string())
        }
    };

    let kafka = json!({"type": "kafka", "brokers": [broker.bootstrap()], "topics": ["present"]});
    let (ok, message) = test("/api/sources/test", json!({"source": kafka})).await;
    assert!(ok && message.contains("broker"), "{message}");
    let absent = json!({"type": "kafka", "brokers": [broker.bootstrap()], "topics": ["absent"]});
    let (ok, message) = test("/api/sources/test", json!({"source": absent})).await;
    assert!(!ok && message.contains("absent"), "{message}");
    let (ok, message) = test("/api/sources/test", json!({"source": kinesis.source("clicks")})).await;
    assert!(ok && message.contains("1 open shard"), "{message}");
    let (ok, message) = test("/api/sources/test", json!({"source": kinesis.source("nothing")})).await;
    assert!(!ok && message.contains("DescribeStreamSummary"), "{message}");

    let destination = json!({"kind": "postgres", "host": "127.0.0.1", "port": pg.port, "database": "etltest",
                             "user": "etl", "password": "etl", "table": "t"});
    let (ok, message) = test("/api/destinations/test", json!({"destination": destination})).await;
    assert!(ok, "{message}");
    let mut wrong = destination.clone();
    wrong["password"] = json!("wrong");
    let (ok, message) = test("/api/destinations/test", json!({"destination": wrong})).await;
    assert!(!ok && message.contains("password"), "{message}");

    let cluster = json!({"kind": "kafka", "name": "cluster", "brokers": [broker.bootstrap()]});
    let (ok, message) = test("/api/connections/test", cluster).await;
    assert!(ok && message.contains("topic"), "{message}");
    let account = json!({"kind": "aws", "name": "acct", "region": "us-east-1", "endpoint": kinesis.endpoint,
                         "access_key_id": "test", "secret_access_key": "test"});
    let (ok, message) = test("/api/connections/test", account).await;
    assert!(ok && message.contains("Kinesis stream"), "{message}");
}
