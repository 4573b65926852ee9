//! `sluice bench`: push generated events through the real endpoint of a real server process,
//! and load the same events with DuckDB's own `read_json_auto` as the limit to compare with.

mod events;
pub mod kafka;
pub mod kinesis;
pub mod mirror;
mod report;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use clap::Args;
use serde_json::{Value, json};

use report::Report;

/// Bench options.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Events in the throughput run.
    #[arg(long, default_value_t = 1_000_000)]
    pub events: usize,
    /// Events per push request.
    #[arg(long, default_value_t = 1000)]
    pub batch: usize,
    /// Concurrent clients in the throughput run.
    #[arg(long, default_value_t = 4)]
    pub clients: usize,
    /// Offered rate of the latency run, events per second.
    #[arg(long, default_value_t = 50_000)]
    pub rate: usize,
    /// Length of the latency run, seconds.
    #[arg(long, default_value_t = 10)]
    pub seconds: u64,
    /// Events per push request in the latency run.
    #[arg(long, default_value_t = 500)]
    pub latency_batch: usize,
    /// Scratch folder (removed afterwards).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// A stream destination (JSON, as in a stream's config): the pushed rows go there instead
    /// of the workspace (scripts/bench-destination.sh passes a throwaway PostgreSQL).
    #[arg(long)]
    pub destination: Option<String>,
    /// The stream's `stage` (JSON), with `--destination`: a staged bulk load.
    #[arg(long)]
    pub stage: Option<String>,
    /// The stream's `flush` (JSON, as in a stream's config), to compare batching rules.
    #[arg(long)]
    pub flush: Option<String>,
    /// Clients watching the stream's live feed (`/api/streams/bench/feed`) during both runs,
    /// to measure what watching costs the pipeline (compare with a run without).
    #[arg(long, default_value_t = 0)]
    pub feed_clients: usize,
    /// The stream's `transform` (JSON, as in a stream's config); rows its filter skips count
    /// as stored. `--transform default` is the bench's own: five field rules, a mask, a
    /// computed column and a filter that skips 1% of the events.
    #[arg(long)]
    pub transform: Option<String>,
}

/// `--transform default`: a mapping of five fields, a mask, a computed column and a filter.
const BENCH_TRANSFORM: &str = r#"{"fields": [
    {"field": "kind", "rename": "event_kind"},
    {"field": "session", "drop": true},
    {"field": "page.referrer", "drop": true},
    {"field": "device.browser", "rename": "browser"},
    {"field": "user.country", "mask": "hash"},
    {"field": "amount_x2", "sql": "amount * 2"}
  ], "filter": "event_id % 100 <> 0"}"#;

/// Run the benchmark and print the report.
pub async fn run(args: BenchArgs) -> Result<(), String> {
    let dir =
        args.dir.clone().unwrap_or_else(|| std::env::temp_dir().join(format!("sluice-bench-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let result = bench(&args, &dir).await;
    let _ = std::fs::remove_dir_all(&dir);
    let report = result?;
    println!("{report}");
    Ok(())
}

async fn bench(args: &BenchArgs, dir: &Path) -> Result<Report, String> {
    eprintln!("generating {} events", args.events);
    let (lines, misfits) = events::generate(args.events);
    let bytes: usize = lines.iter().map(|l| l.len() + 1).sum();
    let json_path = dir.join("events.ndjson");
    std::fs::write(&json_path, lines.join("\n")).map_err(|e| e.to_string())?;

    eprintln!("DuckDB read_json_auto load (the limit)");
    let baseline = dir.join("duckdb-baseline");
    let t = Instant::now();
    let default_load = sluice_connectors::workspace::load_json_file(&baseline, &json_path, "")
        .map(|_| t.elapsed().as_secs_f64())
        .map_err(|e| e.to_string().lines().next().unwrap_or_default().to_string());
    let t = Instant::now();
    let loaded = sluice_connectors::workspace::load_json_file(&baseline, &json_path, "sample_size = -1")
        .map_err(|e| format!("DuckDB baseline: {e}"))?;
    let duckdb_secs = t.elapsed().as_secs_f64();
    drop(std::fs::remove_file(&json_path));

    let server = ServerProcess::start(&dir.join("sluice-data")).await?;
    let http = server.client()?;
    let destination = args
        .destination
        .as_deref()
        .map(serde_json::from_str::<Value>)
        .transpose()
        .map_err(|e| format!("--destination: {e}"))?;
    let transform = match args.transform.as_deref() {
        None => None,
        Some("default") => Some(BENCH_TRANSFORM),
        Some(other) => Some(other),
    }
    .map(serde_json::from_str::<Value>)
    .transpose()
    .map_err(|e| format!("--transform: {e}"))?;
    let key = {
        let mut config = json!({"name": "bench", "table": "bench"});
        if let Some(d) = &destination {
            config["destination"] = d.clone();
        }
        if let Some(stage) = &args.stage {
            config["stage"] = serde_json::from_str(stage).map_err(|e| format!("--stage: {e}"))?;
        }
        if let Some(t) = &transform {
            config["transform"] = t.clone();
        }
        if let Some(flush) = &args.flush {
            config["flush"] = serde_json::from_str(flush).map_err(|e| format!("--flush: {e}"))?;
        }
        let body = server.create(&http, config).await?;
        body["push_key"].as_str().map(str::to_string).ok_or_else(|| format!("create failed: {body}"))?
    };
    // Rows in the table: the workspace's count, or what the stream says it wrote to the
    // destination (a push is answered only after its rows are committed there).
    // Events a transform's filter skipped count as stored.
    let stored_rows = async |server: &ServerProcess| -> Result<i64, String> {
        let rows = if destination.is_some() {
            server.written(&http, "bench").await
        } else {
            server.count(&http, "bench").await
        };
        Ok(rows? + if transform.is_some() { server.filtered(&http, "bench").await? } else { 0 })
    };
    let bodies: Arc<Vec<String>> = Arc::new(lines.chunks(args.batch).map(|c| c.join("\n")).collect());
    drop(lines);
    let watchers = watch_feed(&server, &http, args.feed_clients).await?;

    eprintln!("throughput: {} events in pushes of {} from {} clients", args.events, args.batch, args.clients);
    let next = Arc::new(AtomicUsize::new(0));
    let t = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..args.clients {
        let (http, url, key, bodies, next) =
            (http.clone(), server.push_url("bench"), key.clone(), bodies.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(body) = bodies.get(i) else { return Ok::<_, String>(latencies) };
                let sent = Instant::now();
                let r = http.post(&url).bearer_auth(&key).body(body.clone()).send().await.map_err(|e| e.to_string())?;
                if r.status() != 202 {
                    return Err(format!("push answered {}", r.status()));
                }
                latencies.push(sent.elapsed());
            }
        }));
    }
    let mut push_latencies = Vec::new();
    for task in tasks {
        push_latencies.extend(task.await.map_err(|e| e.to_string())??);
    }
    // A staged destination answers once rows are in its stage: the run ends when they are
    // loaded. Every other destination and the workspace answer after the commit.
    let sluice_secs = match (&destination, &args.stage) {
        (Some(_), Some(_)) => server.wait_written(&http, "bench", args.events, t).await?,
        _ => t.elapsed().as_secs_f64(),
    };
    let stored = stored_rows(&server).await?;
    if stored != args.events as i64 {
        return Err(format!("stored {stored} rows, pushed {}", args.events));
    }
    // Each misfit value (text where the column holds numbers) is a ledger row, its event stored.
    if transform.is_none() {
        let ledger = server.ledger_rows(&http, "bench").await?;
        if ledger != misfits as i64 {
            return Err(format!("the ledger holds {ledger} rows, the events carried {misfits} misfit values"));
        }
        eprintln!("ledger: {ledger} rows, one per misfit value");
    }

    eprintln!("latency: {} events/s for {} s in pushes of {}", args.rate, args.seconds, args.latency_batch);
    let latency = latency_run(args, &server, &http, &key).await?;
    let stored_after = stored_rows(&server).await?;
    let peak_rss_kib = server.peak_rss_kib();
    for (i, (reader, counts)) in watchers.into_iter().enumerate() {
        reader.abort();
        let (rows, skipped) = counts.lock().map(|c| *c).unwrap_or_default();
        eprintln!("feed client {i}: {rows} rows events, {skipped} skipped events");
    }
    server.stop();

    Ok(Report {
        events: args.events,
        bytes,
        misfits,
        duckdb_rows: loaded,
        duckdb_default: default_load,
        duckdb_secs,
        sluice_secs,
        throughput_push_latencies: push_latencies,
        latency_rate: args.rate,
        latency_events: (stored_after - stored) as usize,
        latency,
        peak_rss_kib,
        clients: args.clients,
        batch: args.batch,
    })
}

/// A client reading the bench stream's live feed: its reader task and the `rows` and
/// `skipped` events it read.
type Watcher = (tokio::task::JoinHandle<()>, Arc<std::sync::Mutex<(u64, u64)>>);

/// `n` clients reading the bench stream's live feed, each connected (its `open` event read)
/// before this returns.
async fn watch_feed(server: &ServerProcess, http: &reqwest::Client, n: usize) -> Result<Vec<Watcher>, String> {
    let mut watchers = Vec::with_capacity(n);
    for _ in 0..n {
        let url = format!("{}/api/streams/bench/feed", server.base);
        let mut r = http.get(url).send().await.map_err(|e| e.to_string())?;
        if r.status() != 200 {
            return Err(format!("the live feed answered {}", r.status()));
        }
        r.chunk().await.map_err(|e| e.to_string())?;
        let counts = Arc::new(std::sync::Mutex::new((0u64, 0u64)));
        let seen = counts.clone();
        let reader = tokio::spawn(async move {
            while let Ok(Some(chunk)) = r.chunk().await {
                let text = String::from_utf8_lossy(&chunk);
                if let Ok(mut c) = seen.lock() {
                    c.0 += text.matches("event: rows").count() as u64;
                    c.1 += text.matches("event: skipped").count() as u64;
                }
            }
        });
        watchers.push((reader, counts));
    }
    Ok(watchers)
}

/// Open-loop pushes at a fixed rate: each request's send→202 time is its push→queryable
/// latency, since a 202 is answered only after the rows are committed.
async fn latency_run(
    args: &BenchArgs,
    server: &ServerProcess,
    http: &reqwest::Client,
    key: &str,
) -> Result<Vec<Duration>, String> {
    let (lines, _) = events::generate(args.rate * args.seconds as usize);
    let bodies: Vec<String> = lines.chunks(args.latency_batch).map(|c| c.join("\n")).collect();
    let interval = Duration::from_secs_f64(args.latency_batch as f64 / args.rate as f64);
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::with_capacity(bodies.len());
    for (i, body) in bodies.into_iter().enumerate() {
        tokio::time::sleep_until(start + interval * i as u32).await;
        let (http, url, key) = (http.clone(), server.push_url("bench"), key.to_string());
        tasks.push(tokio::spawn(async move {
            let sent = Instant::now();
            let r = http.post(&url).bearer_auth(&key).body(body).send().await.map_err(|e| e.to_string())?;
            if r.status() != 202 {
                return Err(format!("push answered {}", r.status()));
            }
            Ok(sent.elapsed())
        }));
    }
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        out.push(t.await.map_err(|e| e.to_string())??);
    }
    Ok(out)
}

/// Rows a stream has written where they belong: its committed rows, less those a staged load
/// still holds.
fn in_destination(metrics: &Value) -> Option<i64> {
    let pending = metrics["destination"]["pending_rows"].as_f64().unwrap_or(0.0) as i64;
    Some(metrics["rows_written"].as_i64()? - pending)
}

/// In a throwaway server, a stream `bench` reading `source` into table `bench` (with the
/// stream's fields in `extra`, such as `stage` or `flush`): seconds from its creation until
/// `events` rows are queryable, the server's peak RSS (KiB) and the CPU seconds it used (user
/// and system, all threads).
async fn time_stream(
    label: &str,
    source: Value,
    destination: Option<Value>,
    extra: serde_json::Map<String, Value>,
    events: usize,
) -> Result<(f64, u64, f64), String> {
    let dir = std::env::temp_dir().join(format!("sluice-bench-{label}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let server = ServerProcess::start(&dir).await?;
    let http = server.client()?;
    let t = Instant::now();
    let mut config = json!({"name": "bench", "table": "bench", "source": source});
    for (field, value) in extra {
        config[field] = value;
    }
    let secs = if let Some(destination) = destination {
        config["destination"] = destination;
        server.create(&http, config).await?;
        server.wait_written(&http, "bench", events, t).await
    } else {
        server.create(&http, config).await?;
        server.wait_rows(&http, "bench", events, t).await
    };
    let (rss, cpu) = (server.peak_rss_kib(), server.cpu_seconds());
    server.stop();
    let _ = std::fs::remove_dir_all(&dir);
    Ok((secs?, rss, cpu))
}

/// A `sluice serve` child process.
struct ServerProcess {
    child: Child,
    base: String,
    /// The admin token the first start wrote into the data dir.
    token: String,
}

impl ServerProcess {
    async fn start(data_dir: &Path) -> Result<Self, String> {
        let port =
            std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map_err(|e| e.to_string())?.port();
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let child = Command::new(exe)
            .args(["serve", "--data-dir"])
            .arg(data_dir)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .env("RUST_LOG", std::env::var("SLUICE_BENCH_LOG").unwrap_or_else(|_| "warn".into()))
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| e.to_string())?;
        let mut server = Self { child, base: format!("http://127.0.0.1:{port}"), token: String::new() };
        let deadline = Instant::now() + Duration::from_secs(30);
        while reqwest::get(format!("{}/health", server.base)).await.is_err() {
            if Instant::now() > deadline {
                return Err("the server did not start".into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        server.token = crate::auth::setup::cli_token(data_dir).ok_or("the server wrote no admin token")?;
        Ok(server)
    }

    /// A client that sends the admin token (a push's own key header takes its place).
    fn client(&self) -> Result<reqwest::Client, String> {
        let mut headers = reqwest::header::HeaderMap::new();
        let bearer = format!("Bearer {}", self.token).parse().map_err(|_| "the admin token is not a header value")?;
        headers.insert(reqwest::header::AUTHORIZATION, bearer);
        reqwest::Client::builder()
            .pool_max_idle_per_host(64)
            .default_headers(headers)
            .build()
            .map_err(|e| e.to_string())
    }

    fn push_url(&self, stream: &str) -> String {
        format!("{}/api/streams/{stream}/push", self.base)
    }

    /// Events the stream's transform skipped.
    async fn filtered(&self, http: &reqwest::Client, stream: &str) -> Result<i64, String> {
        let url = format!("{}/api/streams/{stream}/metrics", self.base);
        let m: Value =
            http.get(url).send().await.map_err(|e| e.to_string())?.json().await.map_err(|e| e.to_string())?;
        m["filtered"].as_i64().ok_or_else(|| format!("no filtered in {m}"))
    }

    async fn create(&self, http: &reqwest::Client, stream: Value) -> Result<Value, String> {
        let r =
            http.post(format!("{}/api/streams", self.base)).json(&stream).send().await.map_err(|e| e.to_string())?;
        let status = r.status();
        let body: Value = r.json().await.map_err(|e| e.to_string())?;
        if status.is_success() { Ok(body) } else { Err(format!("create failed: {body}")) }
    }

    /// Rows of the ledger (`sluice.rejects`) for `stream`.
    async fn ledger_rows(&self, http: &reqwest::Client, stream: &str) -> Result<i64, String> {
        let sql = format!("SELECT count(*) AS n FROM sluice.rejects WHERE stream = '{stream}'");
        let r = http.post(format!("{}/api/sql", self.base)).json(&json!({"sql": sql})).send().await;
        let body: Value = r.map_err(|e| e.to_string())?.json().await.map_err(|e| e.to_string())?;
        body["rows"][0]["n"].as_i64().ok_or_else(|| format!("ledger count failed: {body}"))
    }

    async fn count(&self, http: &reqwest::Client, table: &str) -> Result<i64, String> {
        let r = http
            .post(format!("{}/api/sql", self.base))
            .json(&json!({"sql": format!("SELECT count(*) AS n FROM \"{table}\"")}))
            .send()
            .await
            .map_err(|e| e.to_string())?;
        let body: Value = r.json().await.map_err(|e| e.to_string())?;
        body["rows"][0]["n"].as_i64().ok_or_else(|| format!("count failed: {body}"))
    }

    /// Wait until `table` holds `n` rows; seconds from `since`.
    async fn wait_rows(&self, http: &reqwest::Client, table: &str, n: usize, since: Instant) -> Result<f64, String> {
        loop {
            let rows = self.count(http, table).await.unwrap_or(0);
            if rows >= n as i64 {
                return Ok(since.elapsed().as_secs_f64());
            }
            if since.elapsed() > Duration::from_secs(1200) {
                return Err(format!("only {rows} rows after 1200 s"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Rows `stream` has written, by its metrics.
    async fn written(&self, http: &reqwest::Client, stream: &str) -> Result<i64, String> {
        let url = format!("{}/api/streams/{stream}/metrics", self.base);
        let m: Value =
            http.get(url).send().await.map_err(|e| e.to_string())?.json().await.map_err(|e| e.to_string())?;
        in_destination(&m).ok_or_else(|| format!("no rows_written in {m}"))
    }

    /// Wait until `stream` has written `n` rows (to its destination); seconds from `since`.
    async fn wait_written(
        &self,
        http: &reqwest::Client,
        stream: &str,
        n: usize,
        since: Instant,
    ) -> Result<f64, String> {
        loop {
            let url = format!("{}/api/streams/{stream}/metrics", self.base);
            let m: Value = match http.get(url).send().await {
                Ok(r) => r.json().await.unwrap_or(Value::Null),
                Err(_) => Value::Null,
            };
            if in_destination(&m).unwrap_or(0) >= n as i64 {
                return Ok(since.elapsed().as_secs_f64());
            }
            if since.elapsed() > Duration::from_secs(1200) {
                return Err(format!("only {} rows after 1200 s: {m}", m["rows_written"]));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Peak resident set size (VmHWM) of the server, KiB.
    fn peak_rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    }

    /// CPU seconds the server has used so far, user and system, over all its threads
    /// (`/proc/<pid>/stat` fields 14 and 15, in clock ticks of 1/100 s on Linux).
    fn cpu_seconds(&self) -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap_or_default();
        // The fields after the command name, which is in parentheses and may hold spaces.
        let fields: Vec<&str> =
            stat.rsplit_once(')').map(|(_, rest)| rest.split_whitespace().collect()).unwrap_or_default();
        let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
        (ticks(11) + ticks(12)) / 100.0
    }

    fn stop(mut self) {
        let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        let _ = self.child.wait();
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
