//! `sluice bench-mirror`: Debezium change events (inserts, updates, deletes over a key space)
//! pushed into a mirrored table; changes/s until the table matches the expected final state.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use clap::Args;
use serde_json::{Value, json};

use super::ServerProcess;
use super::events::Rng;

/// Mirror bench options.
#[derive(Args, Debug)]
pub struct MirrorBenchArgs {
    /// Changes to send.
    #[arg(long, default_value_t = 500_000)]
    pub changes: usize,
    /// Key space.
    #[arg(long, default_value_t = 100_000)]
    pub keys: usize,
    /// Changes per push request.
    #[arg(long, default_value_t = 2000)]
    pub batch: usize,
    /// Concurrent clients; each owns a share of the keys, so per-key order holds.
    #[arg(long, default_value_t = 4)]
    pub clients: usize,
    /// A stream destination (JSON, as in a stream's config): the mirror is kept there instead
    /// of in the workspace; each push is answered once its changes are committed there (the
    /// final state is then checked by the destination's own tests, not here).
    #[arg(long)]
    pub destination: Option<String>,
    /// The stream's `flush` (JSON, as in a stream's config), to compare batching rules.
    #[arg(long)]
    pub flush: Option<String>,
}

/// Changes per client (as Debezium events) and the expected final rows (key → version).
fn generate(args: &MirrorBenchArgs) -> (Vec<Vec<String>>, HashMap<u64, u64>) {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut live: Vec<u64> = Vec::new();
    let mut state: HashMap<u64, u64> = HashMap::new();
    let mut next_key = 0u64;
    let mut out: Vec<Vec<String>> = vec![Vec::new(); args.clients];
    let row = |id: u64, version: u64| {
        let city = ["Lisbon", "Oslo", "Lima", "Pune"][(id % 4) as usize];
        json!({"id": id, "version": version, "name": format!("customer-{id}"), "balance": (version % 10_000) as f64 / 100.0,
               "city": city, "active": !version.is_multiple_of(3)})
    };
    for n in 0..args.changes as u64 {
        let roll = rng.next() % 100;
        let (op, id, before, after) = if live.is_empty() || (roll < 20 && (next_key as usize) < args.keys) {
            let id = next_key;
            next_key += 1;
            live.push(id);
            state.insert(id, n);
            ("c", id, Value::Null, row(id, n))
        } else if roll < 90 || live.len() < 2 {
            let id = live[(rng.next() % live.len() as u64) as usize];
            let old = state.insert(id, n).unwrap_or(0);
            ("u", id, row(id, old), row(id, n))
        } else {
            let at = (rng.next() % live.len() as u64) as usize;
            let id = live.swap_remove(at);
            let old = state.remove(&id).unwrap_or(0);
            ("d", id, row(id, old), Value::Null)
        };
        let event = json!({
            "before": before, "after": after, "op": op, "ts_ms": 1_700_000_000_000u64 + n,
            "source": {"connector": "postgresql", "db": "bench", "schema": "public", "table": "customers",
                       "lsn": 1_000_000 + n * 64, "ts_ms": 1_700_000_000_000u64 + n},
        });
        out[(id % args.clients as u64) as usize].push(event.to_string());
    }
    (out, state)
}

/// Push the changes, then check the table against the expected state.
pub async fn run(args: MirrorBenchArgs) -> Result<(), String> {
    let (per_client, expected) = generate(&args);
    let dir = std::env::temp_dir().join(format!("sluice-bench-mirror-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let server = ServerProcess::start(&dir).await?;
    let http = server.client()?;
    let mut config =
        json!({"name": "mirror", "table": "customers", "mode": "mirror", "format": "debezium", "keys": ["id"]});
    if let Some(destination) = &args.destination {
        config["destination"] =
            serde_json::from_str(destination).map_err(|e| format!("--destination is not JSON: {e}"))?;
    }
    if let Some(flush) = &args.flush {
        config["flush"] = serde_json::from_str(flush).map_err(|e| format!("--flush is not JSON: {e}"))?;
    }
    let created = server.create(&http, config).await?;
    let key = created["push_key"].as_str().ok_or("no push key")?.to_string();
    eprintln!("pushing {} changes over {} keys", args.changes, args.keys);
    let t = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for changes in per_client {
        let (http, url, key, batch) = (http.clone(), server.push_url("mirror"), key.clone(), args.batch);
        tasks.spawn(async move {
            for chunk in changes.chunks(batch) {
                let body = format!("[{}]", chunk.join(","));
                loop {
                    let r =
                        http.post(&url).bearer_auth(&key).body(body.clone()).send().await.map_err(|e| e.to_string())?;
                    match r.status().as_u16() {
                        202 => break,
                        503 | 429 => tokio::time::sleep(Duration::from_millis(10)).await,
                        s => return Err(format!("push answered {s}: {}", r.text().await.unwrap_or_default())),
                    }
                }
            }
            Ok::<(), String>(())
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.map_err(|e| e.to_string())??;
    }
    let secs = t.elapsed().as_secs_f64();
    if args.destination.is_some() {
        let rss = server.peak_rss_kib();
        server.stop();
        let _ = std::fs::remove_dir_all(&dir);
        println!("changes: {} over {} keys, into the destination", args.changes, args.keys);
        println!("| run | changes/s | seconds |");
        println!("|---|---|---|");
        println!(
            "| Debezium events pushed → mirrored destination table (every push acknowledged after its commit) | {:.0} | {secs:.1} |",
            args.changes as f64 / secs
        );
        println!("peak RSS of the server: {:.0} MiB", rss as f64 / 1024.0);
        // For a reader of the destination to check against.
        println!(
            "expected final state: {} rows, sum(id) {}, sum(version) {}",
            expected.len(),
            expected.keys().sum::<u64>(),
            expected.values().sum::<u64>()
        );
        return Ok(());
    }
    // Every push was answered after its commit, so the table is final now; check it.
    let r = http
        .post(format!("{}/api/sql", server.base))
        .json(&json!({"sql": "SELECT count(*) AS n, sum(version)::VARCHAR AS v, sum(id)::VARCHAR AS k FROM customers"}))
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let body: Value = r.json().await.map_err(|e| e.to_string())?;
    let checked = t.elapsed().as_secs_f64();
    let row = &body["rows"][0];
    let want =
        (expected.len() as i64, expected.values().sum::<u64>().to_string(), expected.keys().sum::<u64>().to_string());
    let got = (
        row["n"].as_i64().unwrap_or(-1),
        row["v"].as_str().unwrap_or("").to_string(),
        row["k"].as_str().unwrap_or("").to_string(),
    );
    let rss = server.peak_rss_kib();
    server.stop();
    let _ = std::fs::remove_dir_all(&dir);
    if got != want {
        return Err(format!("the table does not match: got {got:?}, expected {want:?}"));
    }
    println!("changes: {} (about 20% inserts, 70% updates, 10% deletes) over {} keys", args.changes, args.keys);
    println!("| run | changes/s | seconds |");
    println!("|---|---|---|");
    println!(
        "| Debezium events pushed → mirrored table (every push acknowledged after commit) | {:.0} | {secs:.1} |",
        args.changes as f64 / secs
    );
    println!(
        "| … until the check query confirmed the final state ({} rows) | {:.0} | {checked:.1} |",
        want.0,
        args.changes as f64 / checked
    );
    println!("peak RSS of the server: {:.0} MiB", rss as f64 / 1024.0);
    Ok(())
}
