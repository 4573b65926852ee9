//! The soak: four pushers at a steady rate, a kill -9 at intervals, PATCHes and bad events mixed
//! in. Every acknowledged event is stored exactly once (pushers retry with an Idempotency-Key
//! until they get a 202), a good push never sees 404 or 500, and memory stays flat.
//!
//! CI runs it for 45 s with a kill every 15 s; `scripts/soak.sh` runs the 10-minute version
//! (`SLUICE_SOAK_SECONDS=600 SLUICE_SOAK_KILL_EVERY=60`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::harness::{DataDir, Server, wait_until};

const PUSHERS: usize = 4;
const EVENTS_PER_PUSH: usize = 20;
const PUSH_EVERY: Duration = Duration::from_millis(25);

fn seconds(var: &str, default: u64) -> Duration {
    Duration::from_secs(std::env::var(var).ok().and_then(|v| v.parse().ok()).unwrap_or(default))
}

fn rss_mib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |kb| kb / 1024)
}

#[derive(Default)]
struct Tally {
    statuses: BTreeMap<String, u64>,
    acknowledged: u64,
    bad_rows: u64,
}

async fn start(dir: &std::path::Path) -> Server {
    let server = Server::start(dir).await;
    wait_until("the stream to run", Duration::from_secs(60), || async {
        server.get("/api/streams/s").await.1["metrics"]["state"] == "running"
    })
    .await;
    server
}

#[tokio::test]
async fn soak_pushers_kills_patches_and_bad_events_lose_nothing() {
    let duration = seconds("SLUICE_SOAK_SECONDS", 45);
    let kill_every = seconds("SLUICE_SOAK_KILL_EVERY", 15);
    let dir = DataDir::new("soak");
    let first = Server::start(&dir.0).await;
    let key = first.create_stream(json!({"name": "s", "table": "soak"})).await;
    let base = Arc::new(RwLock::new(first.base.clone()));
    let stop = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Mutex::new(Tally::default()));
    let mut tasks = Vec::new();
    for p in 0..PUSHERS {
        let (base, stop, tally, key) = (base.clone(), stop.clone(), tally.clone(), key.clone());
        tasks.push(tokio::spawn(async move {
            let http = crate::harness::client_builder().timeout(Duration::from_secs(30)).build().unwrap();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                // Every tenth push carries one event that is not an object and one misfit.
                let bad = n.is_multiple_of(10);
                let mut events: Vec<Value> =
                    (0..EVENTS_PER_PUSH as u64).map(|i| json!({"pusher": p, "push": n, "i": i, "v": i})).collect();
                if bad {
                    events.push(json!(42));
                    events.push(json!({"pusher": p, "push": n, "i": 999, "v": "not a number"}));
                }
                let body = Value::Array(events).to_string();
                let idempotency = format!("p{p}-n{n}");
                // Retry the same push until it is acknowledged.
                loop {
                    let url = { format!("{}/api/streams/s/push", base.read().unwrap()) };
                    let sent = http
                        .post(&url)
                        .bearer_auth(&key)
                        .header("idempotency-key", &idempotency)
                        .body(body.clone())
                        .send()
                        .await;
                    let status =
                        sent.as_ref().map_or_else(|_| "connection".to_string(), |r| r.status().as_u16().to_string());
                    let done = {
                        let mut t = tally.lock().unwrap();
                        *t.statuses.entry(status.clone()).or_default() += 1;
                        if status == "202" {
                            t.acknowledged += EVENTS_PER_PUSH as u64 + u64::from(bad);
                            t.bad_rows += 2 * u64::from(bad);
                        }
                        status == "202"
                    };
                    if done {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                tokio::time::sleep(PUSH_EVERY).await;
            }
        }));
    }
    {
        let (base, stop, token) = (base.clone(), stop.clone(), first.token.clone());
        tasks.push(tokio::spawn(async move {
            let http = crate::harness::client_with_token(&token);
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let url = { format!("{}/api/streams/s", base.read().unwrap()) };
                let _ = http.patch(&url).json(&json!({"flush": {"max_wait_ms": 100 + i % 50}})).send().await;
                tokio::time::sleep(Duration::from_secs(3)).await;
            }
        }));
    }
    let started = Instant::now();
    let mut server = first;
    let mut peaks = Vec::new();
    while started.elapsed() < duration {
        tokio::time::sleep(kill_every.min(duration.saturating_sub(started.elapsed()))).await;
        peaks.push(rss_mib(server.child.id(), "VmHWM:"));
        if started.elapsed() >= duration {
            break;
        }
        server.kill9();
        server = start(&dir.0).await;
        *base.write().unwrap() = server.base.clone();
    }
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.unwrap();
    }
    peaks.push(rss_mib(server.child.id(), "VmHWM:"));
    let tally = Arc::try_unwrap(tally).ok().unwrap().into_inner().unwrap();
    eprintln!(
        "soak: {:?}, {} events acknowledged, peak RSS per life {peaks:?} MiB",
        tally.statuses, tally.acknowledged
    );
    let allowed = ["202", "503", "409", "429", "connection"];
    assert!(tally.statuses.keys().all(|s| allowed.contains(&s.as_str())), "{:?}", tally.statuses);
    assert!(tally.acknowledged > 0);
    // Every acknowledged event once: 20 good rows a push, plus the misfit's row of a bad push
    // (its `v` NULL); a bad push's `42` and the misfit's value are the two ledger rows.
    let rows = server.sql("SELECT count(*) AS n, count(DISTINCT (pusher, push, i)) AS d FROM soak").await;
    assert_eq!(rows[0]["n"], json!(tally.acknowledged), "rows stored");
    assert_eq!(rows[0]["d"], json!(tally.acknowledged), "no row twice");
    let ledger = server.sql("SELECT count(*) AS n FROM sluice.rejects").await;
    assert_eq!(ledger[0]["n"], json!(tally.bad_rows), "ledger rows");
    assert!(peaks.iter().all(|p| *p < 512), "{peaks:?}");
}
