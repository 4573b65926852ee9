//! Users and tokens, end to end: the real binary, real HTTP, real argon2 and JWTs.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{Value, json};

use crate::harness::{BIN, DataDir, Server, client, client_with_token, wait_until};

/// Every route but push and health (and the login routes, whose body is the credential).
const ROUTES: &[(&str, &str)] = &[
    ("GET", "/api/streams"),
    ("POST", "/api/streams"),
    ("GET", "/api/streams/s"),
    ("PATCH", "/api/streams/s"),
    ("DELETE", "/api/streams/s"),
    ("GET", "/api/streams/s/metrics"),
    ("GET", "/api/streams/s/metrics/history"),
    ("GET", "/api/streams/s/schema"),
    ("GET", "/api/activity?recent"),
    ("GET", "/api/lineage"),
    ("POST", "/api/streams/s/resnapshot"),
    ("POST", "/api/streams/s/replay"),
    ("POST", "/api/streams/s/pause"),
    ("POST", "/api/streams/s/resume"),
    ("POST", "/api/streams/s/compact"),
    ("POST", "/api/sources/test"),
    ("GET", "/api/schema/stream"),
    ("GET", "/api/connections"),
    ("POST", "/api/connections"),
    ("GET", "/api/connections/c"),
    ("PUT", "/api/connections/c"),
    ("DELETE", "/api/connections/c"),
    ("POST", "/api/connections/test"),
    ("POST", "/api/destinations/test"),
    ("GET", "/api/syncs"),
    ("POST", "/api/syncs"),
    ("GET", "/api/syncs/y"),
    ("PUT", "/api/syncs/y"),
    ("DELETE", "/api/syncs/y"),
    ("GET", "/api/syncs/y/runs"),
    ("POST", "/api/syncs/y/runs"),
    ("GET", "/api/syncs/y/preview"),
    ("POST", "/api/syncs/y/reset"),
    ("GET", "/api/runs/run_1"),
    ("POST", "/api/runs/run_1/approve"),
    ("POST", "/api/runs/run_1/reject"),
    ("GET", "/api/auth/me"),
    ("GET", "/api/users"),
    ("POST", "/api/users"),
    ("GET", "/api/users/admin"),
    ("PATCH", "/api/users/admin"),
    ("DELETE", "/api/users/admin"),
    ("GET", "/api/tokens"),
    ("POST", "/api/tokens"),
    ("DELETE", "/api/tokens/tok_1"),
    ("POST", "/api/sql"),
    ("GET", "/api/metrics"),
    ("GET", "/metrics"),
];

const PASSWORD: &str = "correct horse battery";

/// Send `method path` (with an empty JSON object for writes); (status, body text).
async fn call(http: &reqwest::Client, server: &Server, method: &str, path: &str) -> (u16, String) {
    let method = Method::from_bytes(method.as_bytes()).unwrap();
    let mut request = http.request(method.clone(), server.url(path));
    if method != Method::GET {
        request = request.json(&json!({}));
    }
    let r = request.send().await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

async fn post(http: &reqwest::Client, url: String, body: Value) -> (u16, Value) {
    let r = http.post(url).json(&body).send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

/// Create a user (as admin) and log in as them: their session.
async fn user(server: &Server, name: &str, role: &str) -> Value {
    let (status, body) =
        post(&server.http, server.url("/api/users"), json!({"name": name, "role": role, "password": PASSWORD})).await;
    assert_eq!(status, 201, "{body}");
    login(server, name, PASSWORD).await
}

async fn login(server: &Server, name: &str, password: &str) -> Value {
    let (status, body) =
        post(&client(), server.url("/api/auth/login"), json!({"user": name, "password": password})).await;
    assert_eq!(status, 200, "{body}");
    body
}

/// A new API token with `role`, made by the admin.
async fn api_token(server: &Server, role: &str) -> (String, String) {
    let (status, body) =
        post(&server.http, server.url("/api/tokens"), json!({"name": format!("{role} bot"), "role": role})).await;
    assert_eq!(status, 201, "{body}");
    (body["id"].as_str().unwrap().to_string(), body["token"].as_str().unwrap().to_string())
}

#[tokio::test]
async fn every_api_route_but_push_and_health_needs_a_token() {
    let dir = DataDir::new("auth-401");
    let server = Server::start(&dir.0).await;
    let key = server.create_stream(json!({"name": "s", "table": "t"})).await;
    let anonymous = client();
    for (method, path) in ROUTES {
        let (status, text) = call(&anonymous, &server, method, path).await;
        assert_eq!(status, 401, "{method} {path}: {text}");
        assert!(text.contains("/api/auth/login") && text.contains("Bearer"), "a 401 says how: {text}");
        let wrong = client_with_token("sluice_at_0000000000000000000000000000000000000000000000000000000000000000");
        assert_eq!(call(&wrong, &server, method, path).await.0, 401, "{method} {path} with an unknown token");
        let forged =
            client_with_token("eyJhbGciOiJub25lIn0.eyJzdWIiOiJhZG1pbiIsInJvbGUiOiJhZG1pbiIsImV4cCI6OTk5OTk5OTk5OX0.");
        assert_eq!(call(&forged, &server, method, path).await.0, 401, "{method} {path} with an unsigned JWT");
    }
    assert_eq!(call(&anonymous, &server, "GET", "/health").await.0, 200);
    // The push route keeps its own keys: a push key is enough, an API token is not one.
    let r =
        anonymous.post(server.url("/api/streams/s/push")).bearer_auth(&key).body(r#"{"id": 1}"#).send().await.unwrap();
    assert_eq!(r.status(), 202);
    assert_eq!(server.push("s", &server.token, r#"{"id": 2}"#).await.0, 401);
    assert_eq!(server.count("t").await, 1);

    // /metrics opens only when asked to.
    let open_dir = DataDir::new("auth-open-metrics");
    let open = Server::start_with(&open_dir.0, &["--open-metrics"]).await;
    assert_eq!(call(&anonymous, &open, "GET", "/metrics").await.0, 200);
    assert_eq!(call(&anonymous, &open, "GET", "/api/metrics").await.0, 401);
}

#[tokio::test]
async fn viewers_read_editors_write_admins_manage_users() {
    let dir = DataDir::new("auth-roles");
    let server = Server::start(&dir.0).await;
    server.create_stream(json!({"name": "s", "table": "t"})).await;
    let viewer = user(&server, "vera", "viewer").await;
    let viewer = client_with_token(viewer["access_token"].as_str().unwrap());
    let (_, viewer_token) = api_token(&server, "viewer").await;
    for http in [viewer, client_with_token(&viewer_token)] {
        for (method, path) in ROUTES {
            let (status, text) = call(&http, &server, method, path).await;
            let admin_only = path.starts_with("/api/users") || path.starts_with("/api/tokens");
            if *method == "GET" && !admin_only {
                assert!(status != 401 && status != 403, "{method} {path}: {status} {text}");
            } else {
                assert_eq!(status, 403, "{method} {path}: {text}");
                let needs = if admin_only { "the admin role" } else { "editor" };
                assert!(text.contains(needs) && text.contains("viewer"), "a 403 names the role: {text}");
            }
        }
    }
    assert_eq!(server.get("/api/streams/s").await.0, 200, "the viewer changed nothing");

    let editor = user(&server, "ed", "editor").await;
    let editor = client_with_token(editor["access_token"].as_str().unwrap());
    let (status, body) = post(&editor, server.url("/api/streams"), json!({"name": "e", "table": "e"})).await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = post(&editor, server.url("/api/sql"), json!({"sql": "SELECT 1 AS n"})).await;
    assert_eq!((status, &body["rows"]), (200, &json!([{"n": 1}])));
    assert_eq!(editor.delete(server.url("/api/streams/e")).send().await.unwrap().status(), 204);
    for (method, path) in
        [("GET", "/api/users"), ("POST", "/api/users"), ("GET", "/api/tokens"), ("POST", "/api/tokens")]
    {
        let (status, text) = call(&editor, &server, method, path).await;
        assert_eq!(status, 403, "{method} {path}: {text}");
        assert!(text.contains("admin"), "{text}");
    }
    let (status, body) =
        post(&editor, server.url("/api/users"), json!({"name": "eve", "role": "admin", "password": PASSWORD})).await;
    assert_eq!(status, 403, "an editor cannot make an admin: {body}");

    // A role change applies to the next request, also to access tokens issued before.
    let r = server.http.patch(server.url("/api/users/ed")).json(&json!({"role": "viewer"})).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let (status, _) = post(&editor, server.url("/api/sql"), json!({"sql": "SELECT 1"})).await;
    assert_eq!(status, 403);
    // The last admin stays one.
    let r = server.http.delete(server.url("/api/users/admin")).send().await.unwrap();
    assert_eq!(r.status(), 409);
    let r = server.http.patch(server.url("/api/users/admin")).json(&json!({"role": "editor"})).send().await.unwrap();
    assert_eq!(r.status(), 409);
}

#[tokio::test]
async fn access_tokens_expire_and_refresh_tokens_rotate() {
    let dir = DataDir::new("auth-expiry");
    let server = Server::start_with(&dir.0, &["--access-token-seconds", "1"]).await;
    let session = user(&server, "ada", "viewer").await;
    assert_eq!((session["expires_in"].as_u64(), session["token_type"].as_str()), (Some(1), Some("Bearer")));
    let http = client_with_token(session["access_token"].as_str().unwrap());
    assert_eq!(call(&http, &server, "GET", "/api/streams").await.0, 200);
    wait_until("the access token to expire", Duration::from_secs(15), || async {
        call(&http, &server, "GET", "/api/streams").await.0 == 401
    })
    .await;

    let anonymous = client();
    let refresh = |token: &str| post(&anonymous, server.url("/api/auth/refresh"), json!({"refresh_token": token}));
    let old = session["refresh_token"].as_str().unwrap().to_string();
    let (status, renewed) = refresh(&old).await;
    assert_eq!(status, 200, "{renewed}");
    let new = renewed["refresh_token"].as_str().unwrap().to_string();
    assert_ne!(new, old, "a refresh gives a new refresh token");
    let fresh = client_with_token(renewed["access_token"].as_str().unwrap());
    let (status, me) = get_with(&fresh, server.url("/api/auth/me")).await;
    assert_eq!((status, &me["name"], &me["role"]), (200, &json!("ada"), &json!("viewer")));
    assert_eq!(refresh(&old).await.0, 401, "the old refresh token is used up");

    let (status, _) = post(&client(), server.url("/api/auth/logout"), json!({"refresh_token": new})).await;
    assert_eq!(status, 204);
    assert_eq!(refresh(&new).await.0, 401, "logged out");
    assert_eq!(refresh("sluice_rt_nonsense").await.0, 401);
}

async fn get_with(http: &reqwest::Client, url: String) -> (u16, Value) {
    let r = http.get(url).send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn a_revoked_api_token_is_refused_at_once() {
    let dir = DataDir::new("auth-revoke");
    let server = Server::start(&dir.0).await;
    let (id, token) = api_token(&server, "editor").await;
    let bot = client_with_token(&token);
    assert_eq!(call(&bot, &server, "GET", "/api/streams").await.0, 200);
    let (_, list) = server.get("/api/tokens").await;
    let listed = list["tokens"].as_array().unwrap();
    assert!(listed.iter().any(|t| t["id"] == id.as_str() && t["role"] == "editor"), "{list}");
    assert!(listed.iter().all(|t| t.get("token").is_none() && t.get("token_hash").is_none()), "{list}");
    assert!(!list.to_string().contains(&token), "a token is shown only when created");

    assert_eq!(server.http.delete(server.url(&format!("/api/tokens/{id}"))).send().await.unwrap().status(), 204);
    assert_eq!(call(&bot, &server, "GET", "/api/streams").await.0, 401);
    assert_eq!(server.http.delete(server.url(&format!("/api/tokens/{id}"))).send().await.unwrap().status(), 404);
    // Still refused after a restart: revocation is stored.
    server.stop();
    let server = Server::start(&dir.0).await;
    assert_eq!(call(&bot, &server, "GET", "/api/streams").await.0, 401);
    assert_eq!(call(&server.http, &server, "GET", "/api/streams").await.0, 200);
}

#[tokio::test]
async fn the_cli_uses_the_data_dirs_token_file() {
    let dir = DataDir::new("auth-cli");
    let server = Server::start(&dir.0).await;
    let file = dir.0.join("admin.token");
    assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
    assert!(server.token.starts_with("sluice_at_"), "{}", server.token);
    let port = server.base.rsplit(':').next().unwrap().to_string();
    let sluice = |args: &[&str]| {
        let mut cmd = Command::new(BIN);
        cmd.args(args).args(["--server", &format!("127.0.0.1:{port}")]).env_remove("SLUICE_TOKEN");
        cmd
    };
    let data = dir.0.to_str().unwrap();
    let out = sluice(&["sql", "--data-dir", data, "SELECT 42 AS answer"]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("42"), "{out:?}");
    let out = sluice(&["sync", "list", "--data-dir", data]).output().unwrap();
    assert!(out.status.success(), "{out:?}");

    // Without a token the CLI says where to find one.
    let elsewhere = DataDir::new("auth-cli-none");
    let out = sluice(&["sql", "--data-dir", elsewhere.0.to_str().unwrap(), "SELECT 1"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("SLUICE_TOKEN"), "{out:?}");
    // SLUICE_TOKEN is used when set: a viewer's cannot run SQL.
    let (_, viewer) = api_token(&server, "viewer").await;
    let out = sluice(&["sql", "--data-dir", data, "SELECT 1"]).env("SLUICE_TOKEN", &viewer).output().unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("editor"), "{out:?}");
    let out = sluice(&["sync", "list"]).env("SLUICE_TOKEN", &viewer).output().unwrap();
    assert!(out.status.success(), "{out:?}");
}

#[tokio::test]
async fn no_password_or_hash_leaves_the_server() {
    let dir = DataDir::new("auth-leaks");
    let log = dir.0.join("server.log");
    let admin_password = "first start secret 42";
    let server = Server::start_logged_env(&dir.0, &log, &[("SLUICE_ADMIN_PASSWORD", admin_password)]).await;
    let mut answers = Vec::new();
    let admin = login(&server, "admin", admin_password).await;
    answers.push(admin.to_string());
    let (status, body) =
        post(&client(), server.url("/api/auth/login"), json!({"user": "admin", "password": "nope nope"})).await;
    assert_eq!(status, 401);
    answers.push(body.to_string());
    let ada = user(&server, "ada", "editor").await;
    answers.push(ada.to_string());
    let (_, token) = api_token(&server, "agent").await;
    let (_, refreshed) =
        post(&client(), server.url("/api/auth/refresh"), json!({"refresh_token": ada["refresh_token"]})).await;
    answers.push(refreshed.to_string());
    for path in ["/api/users", "/api/users/ada", "/api/tokens", "/api/auth/me", "/api/streams", "/api/metrics"] {
        answers.push(call(&server.http, &server, "GET", path).await.1);
    }
    for table in ["users", "api_tokens", "refresh_tokens"] {
        let (status, body) = server.sql_raw(&format!("SELECT * FROM sluice.{table}")).await;
        assert_eq!(status, 403, "{table}: {body}");
        answers.push(body.to_string());
    }
    let (status, body) = server.sql_raw("SELECT * FROM sluice.sync_runs").await;
    assert_eq!(status, 200, "{body}");
    server.stop();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("admin API token (shown once)"), "the first start prints the token");

    // The stored hashes, read by the operator from the file itself.
    let out = Command::new(BIN)
        .args(["sql", "--server", "127.0.0.1:1", "--data-dir", dir.0.to_str().unwrap(), "--json"])
        .arg(
            "SELECT password_hash AS h FROM sluice.users UNION ALL SELECT token_hash FROM sluice.api_tokens \
              UNION ALL SELECT token_hash FROM sluice.refresh_tokens",
        )
        .env_remove("SLUICE_TOKEN")
        .output()
        .unwrap();
    let rows: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("{out:?}"));
    let hashes: Vec<String> =
        rows.as_array().unwrap().iter().filter_map(|r| r["h"].as_str().map(String::from)).collect();
    assert!(hashes.iter().filter(|h| h.starts_with("$argon2id$")).count() == 2, "{hashes:?}");
    assert!(hashes.iter().filter(|h| h.starts_with("hmac-sha256:")).count() >= 3, "{hashes:?}");
    assert!(!hashes.iter().any(|h| h.contains(&token[10..])), "tokens are stored hashed");
    for secret in hashes.iter().map(String::as_str).chain([admin_password, PASSWORD, "$argon2"]) {
        for answer in &answers {
            assert!(!answer.contains(secret), "an answer holds {secret}: {answer}");
        }
        assert!(!text.contains(secret), "the log holds {secret}");
    }
    crate::harness::assert_not_on_disk(&dir.0, None, admin_password);
    crate::harness::assert_not_on_disk(&dir.0, None, &token);
}

#[tokio::test]
async fn failed_logins_slow_down_and_lock_the_name() {
    let dir = DataDir::new("auth-brute");
    let server = Server::start(&dir.0).await;
    user(&server, "ada", "viewer").await;
    let anonymous = client();
    let attempt = |password: &'static str| {
        let (anonymous, url) = (anonymous.clone(), server.url("/api/auth/login"));
        async move {
            let r = anonymous.post(url).json(&json!({"user": "ada", "password": password})).send().await.unwrap();
            (r.status().as_u16(), r.headers().get("retry-after").map(|v| v.to_str().unwrap().to_string()))
        }
    };
    for _ in 0..5 {
        let started = Instant::now();
        assert_eq!(attempt("guess guess").await.0, 401);
        assert!(started.elapsed() >= Duration::from_millis(400), "a failure waits: {:?}", started.elapsed());
    }
    let (status, retry) = attempt(PASSWORD).await;
    assert_eq!(status, 429, "locked, even with the right password");
    assert!(retry.is_some_and(|s| s.parse::<u64>().unwrap() >= 1));
    // Other names are not locked; the lock ends.
    user(&server, "bob", "viewer").await;
    wait_until("the lock to end", Duration::from_secs(10), || async { attempt(PASSWORD).await.0 == 200 }).await;
}

/// Python's sqlite3: the rows of `table` in the file `db`, or nothing when it has no such table.
fn sqlite_rows(db: &std::path::Path, table: &str) -> Vec<String> {
    let script = format!(
        "import sqlite3\nc = sqlite3.connect({:?})\ntry:\n    rows = c.execute('SELECT * FROM {table} ORDER BY 1').fetchall()\nexcept sqlite3.OperationalError:\n    rows = []\nfor r in rows:\n    print(r)\n",
        db.display().to_string()
    );
    let out = Command::new("python3").args(["-c", &script]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect()
}

#[tokio::test]
async fn an_agents_run_waits_for_an_editors_approval() {
    let dir = DataDir::new("auth-agent");
    let server = Server::start(&dir.0).await;
    let db = dir.0.join("out.db");
    let sync = json!({"name": "y", "query": "SELECT 1 AS id UNION ALL SELECT 2",
                      "destination": {"kind": "sqlite", "path": db, "table": "t"}});
    assert_eq!(server.create_sync(sync).await.0, 201);
    let (_, agent) = api_token(&server, "agent").await;
    let agent = client_with_token(&agent);
    let (_, viewer) = api_token(&server, "viewer").await;
    let viewer = client_with_token(&viewer);
    assert_eq!(post(&viewer, server.url("/api/syncs/y/runs"), json!({})).await.0, 403);

    let (status, asked) = post(&agent, server.url("/api/syncs/y/runs?wait_seconds=5"), json!({})).await;
    assert_eq!((status, &asked["status"]), (202, &json!("awaiting_approval")), "{asked}");
    let run = asked["run_id"].as_str().unwrap().to_string();
    let (_, record) = get_with(&agent, server.url(&format!("/api/runs/{run}"))).await;
    assert_eq!((&record["status"], &record["trigger"]), (&json!("awaiting_approval"), &json!("agent")), "{record}");
    assert!(sqlite_rows(&db, "t").is_empty(), "nothing is sent before the approval");
    let approve = server.url(&format!("/api/runs/{run}/approve?wait_seconds=60"));
    assert_eq!(post(&agent, approve.clone(), json!({})).await.0, 403, "an agent cannot approve");
    assert_eq!(post(&viewer, approve.clone(), json!({})).await.0, 403);

    let (status, done) = post(&server.http, approve.clone(), json!({})).await;
    assert_eq!((status, &done["status"], &done["id"]), (200, &json!("succeeded"), &json!(run)), "{done}");
    assert_eq!(sqlite_rows(&db, "t"), vec!["(1,)", "(2,)"]);
    assert_eq!(post(&server.http, approve, json!({})).await.0, 409, "approved once");

    // A rejected request never runs.
    let (_, asked) = post(&agent, server.url("/api/syncs/y/runs"), json!({})).await;
    let run = asked["run_id"].as_str().unwrap().to_string();
    let (status, rejected) = post(&server.http, server.url(&format!("/api/runs/{run}/reject")), json!({})).await;
    assert_eq!((status, &rejected["status"]), (200, &json!("rejected")), "{rejected}");
    let approve = server.url(&format!("/api/runs/{run}/approve"));
    assert_eq!(post(&server.http, approve, json!({})).await.0, 409);
    let (_, runs) = server.get("/api/syncs/y/runs").await;
    let statuses: Vec<&str> = runs["runs"].as_array().unwrap().iter().map(|r| r["status"].as_str().unwrap()).collect();
    assert_eq!(statuses.iter().filter(|s| **s == "succeeded").count(), 1, "{runs}");
}
