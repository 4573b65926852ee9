//! TLS to PostgreSQL: each `sslmode` against a server that refuses plain TCP, for the CDC source
//! (SQL and replication sessions) and the reverse ETL destination.

use std::time::Duration;

use serde_json::{Value, json};

use crate::harness::{DataDir, Server, wait_until};
use crate::kafka::wait_rows;
use crate::postgres::Postgres;

#[tokio::test]
async fn every_sslmode_against_a_server_that_requires_tls() {
    let pg = Postgres::start();
    pg.sql("CREATE TABLE secure (id int PRIMARY KEY, v text); INSERT INTO secure VALUES (1, 'a'), (2, 'b');");
    let (ca, other_ca) = pg.enable_tls();
    let dir = DataDir::new("pg-tls");
    let server = Server::start(&dir.0).await;
    let source = |mode: &str, root: Option<&std::path::Path>| {
        // verify-full needs a name: the certificate names localhost as well as 127.0.0.1.
        let host = if mode == "verify-full" { "localhost" } else { "127.0.0.1" };
        let mut s = json!({"type": "postgres", "host": host, "port": pg.port, "database": "etltest",
                           "user": "etl", "password": "etl", "tables": ["public.secure"], "sslmode": mode});
        if let Some(root) = root {
            s["sslrootcert"] = json!(root);
        }
        s
    };
    let check = |source: Value| {
        let server = &server;
        async move {
            let r = server.http.post(server.url("/api/sources/test")).json(&json!({"name": "t", "source": source}));
            let body: Value = r.send().await.unwrap().json().await.unwrap();
            (body["ok"] == json!(true), body.to_string())
        }
    };
    let (ok, body) = check(source("disable", None)).await;
    assert!(!ok && body.contains("no encryption"), "plain TCP must be refused: {body}");
    let (ok, body) = check(source("verify-full", Some(&other_ca))).await;
    assert!(!ok && body.to_lowercase().contains("certificate"), "a foreign CA must fail: {body}");
    for mode in ["prefer", "require"] {
        let (ok, body) = check(source(mode, None)).await;
        assert!(ok, "{mode}: {body}");
    }
    let (ok, body) = check(source("verify-ca", Some(&ca))).await;
    assert!(ok, "{body}");
    let r = server
        .http
        .post(server.url("/api/streams"))
        .json(&json!({"name": "x", "table": "x",
        "source": source("verify-full", None)}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap().contains("source.sslrootcert"));
    let mut by_ip = source("verify-full", Some(&ca));
    by_ip["host"] = json!("127.0.0.1");
    let r = server.http.post(server.url("/api/streams")).json(&json!({"name": "x", "table": "x", "source": by_ip}));
    let r = r.send().await.unwrap();
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap().contains("source.host"));

    // The stream itself, verified: snapshot over TLS, then changes over a TLS replication session.
    server.create_stream(json!({"name": "s", "table": "secure", "source": source("verify-full", Some(&ca))})).await;
    wait_rows(&server, "secure", 2, Duration::from_secs(60)).await;
    pg.sql("INSERT INTO secure VALUES (3, 'c')");
    wait_rows(&server, "secure", 3, Duration::from_secs(60)).await;
    let encrypted = pg.admin(
        "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
         WHERE a.usename = 'etl' AND a.backend_type = 'walsender' AND s.ssl",
    );
    assert_eq!(encrypted.trim(), "1", "the replication session is encrypted");

    // Reverse ETL into the same server, verified.
    let (status, body) = server
        .create_sync(json!({"name": "back", "query": "SELECT id, v FROM secure", "destination": {
            "kind": "postgres", "host": "127.0.0.1", "port": pg.port, "database": "etltest", "user": "etl",
            "password": "etl", "table": "secure_copy", "sslmode": "verify-full", "sslrootcert": ca}}))
        .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(server.run_sync("back").await["status"], "succeeded");
    wait_until("the copy", Duration::from_secs(10), || async { pg.lines("SELECT count(*) FROM secure_copy") == ["3"] })
        .await;
}
