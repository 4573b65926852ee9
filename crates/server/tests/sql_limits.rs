//! `/api/sql` within limits: result size, time, memory, a client that leaves, a SIGTERM.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::harness::{DataDir, Server, wait_until};

/// Rows no sane client reads at once: ~1 GB as JSON.
const HUGE: &str = "SELECT repeat('x', 1000) AS x FROM range(1000000)";
/// Runs for hours unless stopped.
const ENDLESS: &str = "SELECT count(*) AS n FROM range(1000000000) a CROSS JOIN range(1000000000) b";
/// The RSS bound README documents for the defaults.
const RSS_BOUND_KB: u64 = 512 * 1024;

fn status_kb(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// CPU time (user + system) of a process, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat.rsplit(')').next().unwrap().split_whitespace().collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// Whether the process uses under a tenth of a core over a quarter second (a query running
/// takes every core).
async fn idle(pid: u32) -> bool {
    let before = cpu_ticks(pid);
    tokio::time::sleep(Duration::from_millis(250)).await;
    cpu_ticks(pid) - before <= 3
}

async fn busy(pid: u32) -> bool {
    let before = cpu_ticks(pid);
    tokio::time::sleep(Duration::from_millis(250)).await;
    cpu_ticks(pid) - before >= 10
}

async fn ask(server: &Server, body: Value) -> (u16, Value) {
    let r = server.http.post(server.url("/api/sql")).json(&body).send().await.unwrap();
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn sql_huge_result_is_refused_and_memory_stays_bounded() {
    let dir = DataDir::new("sql-huge");
    let server = Server::start(&dir.0).await;
    let pid = server.child.id();
    let started = Instant::now();
    let (status, body) = ask(&server, json!({"sql": HUGE, "limit": 1_000_000})).await;
    assert_eq!(status, 413, "{}", &body.to_string()[..body.to_string().len().min(300)]);
    assert_eq!(body["limit"], "result_bytes");
    let error = body["error"].as_str().unwrap();
    assert!(error.contains("67108864 bytes") && error.contains("--sql-max-result-bytes"), "{error}");
    let hwm = status_kb(pid, "VmHWM");
    eprintln!("huge result: refused after {:?}, server peak RSS {} MB", started.elapsed(), hwm / 1024);
    assert!(hwm < RSS_BOUND_KB, "peak RSS {hwm} kB");
    // Under the limit the rows come through, NULLs included.
    let (status, body) =
        ask(&server, json!({"sql": "SELECT repeat('x', 1000) AS x, NULL AS y FROM range(1000)"})).await;
    assert_eq!(status, 200);
    assert_eq!(body["rows"].as_array().unwrap().len(), 1000);

    // DuckDB's memory cap: an aggregate that cannot spill fails with a clear error.
    let dir = DataDir::new("sql-memory");
    let server = Server::start_env(&dir.0, &[], &[("SLUICE_DUCKDB_MEMORY", "256MB")]).await;
    let pid = server.child.id();
    let (status, body) = ask(&server, json!({"sql": "SELECT list(repeat('x', 100)) FROM range(100000000)"})).await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["limit"], "memory");
    let error = body["error"].as_str().unwrap();
    assert!(error.contains("SLUICE_DUCKDB_MEMORY") && error.contains("Out of Memory"), "{error}");
    let hwm = status_kb(pid, "VmHWM");
    eprintln!("memory cap 256MB: server peak RSS {} MB", hwm / 1024);
    assert!(hwm < RSS_BOUND_KB, "peak RSS {hwm} kB");
    assert_eq!(server.sql("SELECT 42 AS n").await, vec![json!({"n": 42})], "the server still answers");
}

/// README's bound with the defaults: DuckDB's 112 MB, the 64 MiB result limit and ~150 MB.
const DOCUMENTED_KB: u64 = (112 + 64 + 150) * 1024;

#[tokio::test]
async fn sql_results_far_over_the_limit_keep_the_whole_process_within_readmes_bound() {
    let dir = DataDir::new("sql-rss");
    let server = Server::start(&dir.0).await;
    let pid = server.child.id();
    // Each ~500 MB or more as JSON, from a short query: long strings, wide rows, strings that
    // escape to six times their size, many short rows, and rows of 64 KB, for which README adds
    // about three of DuckDB's 2,048-row chunks (3 x 2,048 x 64 KB) to the bound.
    let queries = [
        ("SELECT repeat('x', 10000) AS x FROM range(50000)", 0),
        (
            "SELECT r.*, r.* FROM (SELECT repeat('w', 256) AS c1, repeat('w', 256) AS c2, repeat('w', 256) AS c3, \
             repeat('w', 256) AS c4, repeat('w', 256) AS c5, repeat('w', 256) AS c6, repeat('w', 256) AS c7, \
             repeat('w', 256) AS c8 FROM range(200000)) r",
            0,
        ),
        ("SELECT repeat(chr(1), 5000) AS z FROM range(20000)", 0),
        ("SELECT range AS n, repeat('abc', 30) AS t FROM range(100000000)", 0),
        ("SELECT repeat('y', 64000) AS y FROM range(10000)", 3 * 2048 * 64000 / 1024),
    ];
    for (sql, chunks_kb) in queries {
        let started = Instant::now();
        let (status, body) = ask(&server, json!({"sql": sql, "limit": 1_000_000})).await;
        let text = body.to_string();
        assert_eq!(status, 413, "{sql}: {}", &text[..text.len().min(300)]);
        let hwm = status_kb(pid, "VmHWM");
        eprintln!("{sql}: refused after {:?}, peak RSS so far {} MB", started.elapsed(), hwm / 1024);
        let bound = DOCUMENTED_KB + chunks_kb;
        assert!(hwm < bound, "{sql}: peak RSS {hwm} kB over README's {bound} kB");
    }
    assert_eq!(server.sql("SELECT 42 AS n").await, vec![json!({"n": 42})], "the server still answers");
}

#[tokio::test]
async fn sql_time_limit_stops_long_queries() {
    let dir = DataDir::new("sql-time");
    let server = Server::start_with(&dir.0, &["--sql-timeout-ms", "2000"]).await;
    let started = Instant::now();
    let (status, body) = ask(&server, json!({"sql": ENDLESS})).await;
    let took = started.elapsed();
    eprintln!("server time limit 2000 ms: answered after {took:?}");
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["limit"], "time");
    assert!(body["error"].as_str().unwrap().contains("2000 ms"), "{body}");
    assert!(took >= Duration::from_millis(1900) && took < Duration::from_secs(6), "{took:?}");

    // A request may ask for less, never for more.
    let started = Instant::now();
    let (status, body) = ask(&server, json!({"sql": ENDLESS, "timeout_ms": 300})).await;
    eprintln!("request time limit 300 ms: answered after {:?}", started.elapsed());
    assert_eq!(status, 422, "{body}");
    assert!(body["error"].as_str().unwrap().contains("300 ms"), "{body}");
    assert!(started.elapsed() < Duration::from_secs(3));
    let (status, body) = ask(&server, json!({"sql": ENDLESS, "timeout_ms": 60_000})).await;
    assert_eq!(status, 422);
    assert!(body["error"].as_str().unwrap().contains("2000 ms"), "capped at the server's: {body}");
    assert_eq!(server.sql("SELECT 1 AS n").await, vec![json!({"n": 1})]);
}

#[tokio::test]
async fn sql_client_that_leaves_frees_the_server() {
    let dir = DataDir::new("sql-leave");
    let server = Server::start(&dir.0).await;
    let pid = server.child.id();
    let impatient = crate::harness::token_builder(&server.token).timeout(Duration::from_millis(1500)).build().unwrap();
    let left = impatient.post(server.url("/api/sql")).json(&json!({"sql": ENDLESS})).send().await;
    assert!(left.is_err_and(|e| e.is_timeout()), "the client gave up");
    // Without the interrupt the query would go on for the whole time limit (30 s) on every core.
    let gone = Instant::now();
    wait_until("the abandoned query to stop", Duration::from_secs(10), || idle(pid)).await;
    eprintln!("abandoned query stopped within {:?}", gone.elapsed());
    let started = Instant::now();
    assert_eq!(server.sql("SELECT 42 AS n").await, vec![json!({"n": 42})]);
    assert!(started.elapsed() < Duration::from_secs(1), "{:?}", started.elapsed());
}

#[tokio::test]
async fn sigterm_during_a_query_exits_promptly() {
    let dir = DataDir::new("sql-term");
    let mut server = Server::start(&dir.0).await;
    let pid = server.child.id();
    let http = server.http.clone();
    let url = server.url("/api/sql");
    let query = tokio::spawn(async move {
        match http.post(url).json(&json!({"sql": ENDLESS})).send().await {
            Ok(r) => Some((r.status().as_u16(), r.text().await.unwrap_or_default())),
            Err(_) => None,
        }
    });
    wait_until("the query to run", Duration::from_secs(10), || busy(pid)).await;
    let signalled = Instant::now();
    assert!(Command::new("kill").args(["-TERM", &pid.to_string()]).status().unwrap().success());
    let mut exited = None;
    wait_until("the server to exit after SIGTERM", Duration::from_secs(10), || {
        exited = exited.or_else(|| server.child.try_wait().unwrap());
        std::future::ready(exited.is_some())
    })
    .await;
    let took = signalled.elapsed();
    eprintln!("SIGTERM during a query: exited after {took:?} with {exited:?}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert!(exited.unwrap().success(), "a clean exit");
    if let Some((status, text)) = query.await.unwrap() {
        assert_eq!(status, 503, "{text}");
        assert!(text.contains("shutting down"), "{text}");
    }
}
