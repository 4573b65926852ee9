//! kill -9 while several clients push: every event that got a 202 is in the table exactly once.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;

use crate::harness::{DataDir, Server, wait_until};

const CLIENTS: u64 = 4;
const PER_PUSH: u64 = 50;

/// Push continuously from `CLIENTS` tasks; ids are unique across clients and rounds.
fn start_clients(
    server: &Server,
    key: &str,
    round: u64,
    acked: Arc<Mutex<Vec<i64>>>,
    count: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..CLIENTS)
        .map(|client| {
            let http = server.http.clone();
            let url = server.url("/api/streams/c/push");
            let key = key.to_string();
            let acked = acked.clone();
            let count = count.clone();
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let ids: Vec<i64> = (0..PER_PUSH)
                        .map(|i| (round * 1_000_000_000 + client * 10_000_000 + n * PER_PUSH + i) as i64)
                        .collect();
                    n += 1;
                    let body: String = ids
                        .iter()
                        .map(|id| format!("{{\"id\": {id}, \"client\": {client}, \"pad\": \"{}\"}}\n", "p".repeat(40)))
                        .collect();
                    match http.post(&url).bearer_auth(&key).body(body).send().await {
                        Ok(r) if r.status() == 202 => {
                            acked.lock().unwrap().extend(&ids);
                            count.fetch_add(ids.len(), Ordering::Relaxed);
                        }
                        // The server died: this push was never acknowledged.
                        _ => break,
                    }
                }
            })
        })
        .collect()
}

#[tokio::test]
async fn kill_9_mid_stream_loses_nothing_and_duplicates_nothing() {
    let dir = DataDir::new("crash");
    let mut server = Server::start(&dir.0).await;
    let key = server.create_stream(json!({"name": "c", "table": "t", "metadata": {"position": true}})).await;
    let acked = Arc::new(Mutex::new(Vec::new()));

    for round in 0..3u64 {
        let count = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let clients = start_clients(&server, &key, round, acked.clone(), count.clone(), stop.clone());
        // Kill at a random moment: after a random number of acknowledged events.
        let threshold = 1_000 + (rand::random::<u64>() % 4_000) as usize;
        wait_until("enough acknowledged pushes", Duration::from_secs(120), || {
            let count = count.clone();
            async move { count.load(Ordering::Relaxed) >= threshold }
        })
        .await;
        server.kill9();
        for c in clients {
            c.await.unwrap();
        }
        stop.store(true, Ordering::Relaxed);

        server = Server::start(&dir.0).await;
        let rows = server.sql("SELECT id, _position FROM t").await;
        let mut seen = HashSet::new();
        let mut positions = HashSet::new();
        for row in &rows {
            let id = row["id"].as_i64().unwrap();
            assert!(seen.insert(id), "id {id} stored twice after kill -9 in round {round}");
            assert!(positions.insert(row["_position"].as_i64().unwrap()), "a position was reused");
        }
        let acked: Vec<i64> = acked.lock().unwrap().clone();
        let missing: Vec<&i64> = acked.iter().filter(|id| !seen.contains(id)).take(5).collect();
        assert!(
            missing.is_empty(),
            "round {round}: acknowledged ids missing after kill -9: {missing:?} ({} acked, {} stored)",
            acked.len(),
            seen.len()
        );
        let (_, m) = server.get("/api/streams/c/metrics").await;
        assert_eq!(m["rows_written"].as_u64(), Some(rows.len() as u64), "totals are committed with the rows");
    }
}
