//! Starts the real `sluice` binary on a free port and talks to it over real HTTP.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

pub const BIN: &str = env!("CARGO_BIN_EXE_sluice");

/// A fresh data folder, removed on drop.
pub struct DataDir(pub PathBuf);

impl DataDir {
    pub fn new(name: &str) -> Self {
        let n: u64 = rand::random();
        let dir = std::env::temp_dir().join(format!("sluice-test-{name}-{n:x}"));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for DataDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub struct Server {
    pub child: Child,
    pub base: String,
    /// A client that sends the admin token (`admin.token`, written at the first start) with
    /// every request; a request's own `Authorization` (a push key) takes its place.
    pub http: reqwest::Client,
    /// The data dir's admin API token.
    pub token: String,
}

/// The address in the server's "  API:       http://…" line, or None if its stdout ends first.
/// A thread keeps reading the rest (push keys of declared streams) so the server never blocks
/// on a full pipe.
fn listening_address(stdout: std::process::ChildStdout) -> tokio::sync::oneshot::Receiver<String> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let mut tx = Some(tx);
        for line in std::io::BufRead::lines(std::io::BufReader::new(stdout)).map_while(Result::ok) {
            if let Some(address) = line.trim().strip_prefix("API:").and_then(|a| a.trim().strip_prefix("http://"))
                && let Some(tx) = tx.take()
            {
                let _ = tx.send(address.to_string());
            }
        }
    });
    rx
}

/// Wait until `check` holds, polling; panics with `what` after `timeout`.
pub async fn wait_until<F, Fut>(what: &str, timeout: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Wait until `check` holds, polling twice a second: for checks that start a process each
/// (Python reading a lake), too heavy for [`wait_until`]'s 20 ms polls on a loaded machine.
pub async fn wait_slowly(what: &str, timeout: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

impl Server {
    pub async fn start(dir: &Path) -> Self {
        Self::start_with(dir, &[]).await
    }

    pub async fn start_with(dir: &Path, extra: &[&str]) -> Self {
        Self::start_env(dir, extra, &[]).await
    }

    /// Start with extra arguments and environment variables.
    pub async fn start_env(dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> Self {
        Self::spawn(dir, extra, env, Stdio::inherit()).await
    }

    /// Start with debug logs written to `log`, so a test can search them.
    pub async fn start_logged(dir: &Path, log: &Path) -> Self {
        Self::start_logged_env(dir, log, &[]).await
    }

    /// [`Self::start_logged`] with extra environment variables.
    pub async fn start_logged_env(dir: &Path, log: &Path, env: &[(&str, &str)]) -> Self {
        let file = std::fs::OpenOptions::new().create(true).append(true).open(log).unwrap();
        let mut env = env.to_vec();
        env.push(("SLUICE_TEST_LOG", "debug"));
        Self::spawn(dir, &["--log-format", "json"], &env, Stdio::from(file)).await
    }

    /// Start on port 0 and take the address the server prints once it listens: a port picked
    /// beforehand can be taken by another test's process before the server binds it, and then
    /// the health check may be answered by that process instead.
    async fn spawn(dir: &Path, extra: &[&str], env: &[(&str, &str)], stderr: Stdio) -> Self {
        let mut child = Command::new(BIN)
            .args(["serve", "--data-dir", dir.to_str().unwrap(), "--listen", "127.0.0.1:0"])
            .args(extra)
            .envs(env.iter().copied())
            .env(
                "RUST_LOG",
                env.iter()
                    .find(|(k, _)| *k == "SLUICE_TEST_LOG")
                    .map(|(_, v)| v.to_string())
                    .or_else(|| std::env::var("SLUICE_TEST_LOG").ok())
                    .unwrap_or_else(|| "warn".into()),
            )
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("spawn sluice");
        let listening = listening_address(child.stdout.take().expect("the server's stdout"));
        let listen = tokio::time::timeout(Duration::from_secs(60), listening)
            .await
            .expect("timed out waiting for the server to listen")
            .unwrap_or_else(|_| panic!("the server exited before it listened: {:?}", child.try_wait()));
        let base = format!("http://{listen}");
        let http = client();
        let health = format!("{base}/health");
        wait_until("the server to answer", Duration::from_secs(30), || {
            let http = http.clone();
            let health = health.clone();
            async move { http.get(&health).send().await.is_ok_and(|r| r.status().is_success()) }
        })
        .await;
        // The first start writes the token before the server listens.
        let token = std::fs::read_to_string(dir.join("admin.token")).unwrap_or_default().trim().to_string();
        Self { child, base, http: client_with_token(&token), token }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Create a stream; returns the push key (empty for streams that read by themselves).
    pub async fn create_stream(&self, config: Value) -> String {
        let r = self.http.post(self.url("/api/streams")).json(&config).send().await.unwrap();
        let status = r.status();
        let body: Value = r.json().await.unwrap();
        assert_eq!(status, 201, "{body}");
        body["push_key"].as_str().unwrap_or_default().to_string()
    }

    pub async fn push(&self, stream: &str, key: &str, body: impl Into<reqwest::Body>) -> (u16, Value) {
        let r = self
            .http
            .post(self.url(&format!("/api/streams/{stream}/push")))
            .bearer_auth(key)
            .body(body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// Rows of a read-only query; panics on an error status.
    pub async fn sql(&self, sql: &str) -> Vec<Value> {
        let (status, body) = self.sql_raw(sql).await;
        assert_eq!(status, 200, "{sql}: {body}");
        body["rows"].as_array().unwrap().clone()
    }

    pub async fn sql_raw(&self, sql: &str) -> (u16, Value) {
        let r =
            self.http.post(self.url("/api/sql")).json(&json!({ "sql": sql, "limit": 1_000_000 })).send().await.unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap())
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        let r = self.http.get(self.url(path)).send().await.unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// Rows of a query as `|`-joined values, NULL as empty as psql shows it (empty while it
    /// fails), to compare with [`crate::postgres::Postgres::lines`].
    pub async fn lines(&self, sql: &str) -> Vec<String> {
        let (status, body) = self.sql_raw(sql).await;
        if status != 200 {
            return Vec::new();
        }
        body["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                r.as_object()
                    .unwrap()
                    .values()
                    .map(|v| match v {
                        Value::Null => String::new(),
                        Value::String(s) => s.clone(),
                        v => v.to_string(),
                    })
                    .collect::<Vec<_>>()
                    .join("|")
            })
            .collect()
    }

    /// Create a sync; (status, body).
    pub async fn create_sync(&self, config: Value) -> (u16, Value) {
        let r = self.http.post(self.url("/api/syncs")).json(&config).send().await.unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    /// Run a sync and wait for its record.
    pub async fn run_sync(&self, name: &str) -> Value {
        let r = self.http.post(self.url(&format!("/api/syncs/{name}/runs?wait_seconds=300"))).send().await.unwrap();
        assert_eq!(r.status(), 200);
        let record: Value = r.json().await.unwrap();
        assert_ne!(record["status"], "running", "{record}");
        record
    }

    /// A client with a new API token of `role`, made by the admin.
    pub async fn client_of(&self, role: &str) -> reqwest::Client {
        let r = self
            .http
            .post(self.url("/api/tokens"))
            .json(&json!({"name": format!("{role} client"), "role": role}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 201);
        client_with_token(r.json::<Value>().await.unwrap()["token"].as_str().unwrap())
    }

    pub async fn count(&self, table: &str) -> i64 {
        let rows = self.sql(&format!("SELECT count(*) AS n FROM \"{table}\"")).await;
        rows[0]["n"].as_i64().unwrap()
    }

    /// SIGKILL: no chance to flush anything.
    pub fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM and wait for a clean exit.
    pub fn stop(mut self) {
        let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Panics when `secret` is in clear in a workspace file of `data` (the DuckDB file, its WAL,
/// `secrets.json`) or in `log`.
pub fn assert_not_on_disk(data: &Path, log: Option<&Path>, secret: &str) {
    let files = ["workspace.duckdb", "workspace.duckdb.wal", "secrets.json"].map(|f| data.join(f));
    for file in files.iter().map(PathBuf::as_path).chain(log) {
        let Ok(bytes) = std::fs::read(file) else { continue };
        assert!(
            !bytes.windows(secret.len()).any(|w| w == secret.as_bytes()),
            "{} holds the secret in clear",
            file.display()
        );
    }
}

/// An HTTP client that drops a pooled connection after 5 s idle, before the server closes it
/// at its 10 s header timeout: a request sent on a connection the server is closing at that
/// instant fails with `IncompleteMessage`, which is the client's race, not the server's fault.
pub fn client() -> reqwest::Client {
    client_builder().build().unwrap()
}

pub fn client_builder() -> reqwest::ClientBuilder {
    reqwest::Client::builder().pool_idle_timeout(Duration::from_secs(5))
}

/// [`client`] that sends `token` as a bearer token with every request (none when empty).
pub fn client_with_token(token: &str) -> reqwest::Client {
    token_builder(token).build().unwrap()
}

/// [`client_builder`] that sends `token` as a bearer token with every request.
pub fn token_builder(token: &str) -> reqwest::ClientBuilder {
    let mut headers = reqwest::header::HeaderMap::new();
    if !token.is_empty() {
        let mut value = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}")).unwrap();
        value.set_sensitive(true);
        headers.insert(reqwest::header::AUTHORIZATION, value);
    }
    client_builder().default_headers(headers)
}

/// Push `pushes` bodies of 10 orders (`id`, `amount`; a `coupon` from the half on: a column
/// added mid-stream) to stream `name`, `pause_ms` apart, each retried with its
/// Idempotency-Key until accepted, at the server `base` points to (it changes across a
/// restart).
pub fn push_orders(
    base: std::sync::Arc<std::sync::Mutex<String>>,
    name: &'static str,
    key: String,
    pushes: usize,
    pause_ms: u64,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let http = client_builder().timeout(Duration::from_secs(30)).build().unwrap();
        for p in 0..pushes {
            let body: Vec<String> = (p * 10..p * 10 + 10)
                .map(|i| {
                    if p >= pushes / 2 {
                        format!("{{\"id\": {i}, \"amount\": {}.5, \"coupon\": \"c{i}\"}}", i % 97)
                    } else {
                        format!("{{\"id\": {i}, \"amount\": {}.5}}", i % 97)
                    }
                })
                .collect();
            let body = body.join("\n");
            // Long enough for a restart on a loaded machine; a server that never comes back
            // fails the test instead of hanging it.
            let deadline = Instant::now() + Duration::from_secs(180);
            loop {
                assert!(Instant::now() < deadline, "push {p} to {name} was not accepted within 180 s");
                let url = format!("{}/api/streams/{name}/push", base.lock().unwrap());
                let sent = http
                    .post(&url)
                    .bearer_auth(&key)
                    .header("Idempotency-Key", format!("push-{p}"))
                    .body(body.clone())
                    .send()
                    .await;
                if sent.is_ok_and(|r| r.status().as_u16() == 202) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            tokio::time::sleep(Duration::from_millis(pause_ms)).await;
        }
    })
}
