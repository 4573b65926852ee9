//! A full disk under the workspace: pushes are told at once (507, naming the disk), nothing
//! acknowledged is lost, and once space returns the workspace reopens by itself and the stream
//! goes on from its committed position. The data folder is a small tmpfs of its own (the tests
//! run as root, as CI does).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::harness::{DataDir, Server, wait_until};

/// A tmpfs of `mib` MiB, unmounted on drop.
struct Tmpfs {
    dir: DataDir,
}

impl Tmpfs {
    fn mount(name: &str, mib: u64) -> Self {
        let dir = DataDir::new(name);
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(&dir.0)
            .status()
            .expect("mount");
        assert!(status.success(), "mount -t tmpfs needs root, as the tests and CI run");
        Self { dir }
    }

    fn path(&self) -> &Path {
        &self.dir.0
    }

    /// Fill the disk with a file until at most `leave` bytes are free.
    fn ballast(&self, leave: u64) -> PathBuf {
        let file = self.path().join("ballast");
        let free = free_bytes(self.path());
        let size = free.saturating_sub(leave) / (1 << 20);
        let status = Command::new("dd")
            .args(["if=/dev/zero", "bs=1M", &format!("count={size}"), &format!("of={}", file.display())])
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap();
        assert!(status.success());
        file
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir.0).status();
    }
}

fn free_bytes(path: &Path) -> u64 {
    let out = Command::new("df").args(["-B1", "--output=avail"]).arg(path).output().unwrap();
    String::from_utf8_lossy(&out.stdout).lines().nth(1).unwrap().trim().parse().unwrap()
}

/// One NDJSON body of `n` events with the ids from `first`, each with 200 bytes of padding.
fn body(first: u64, n: u64) -> String {
    (first..first + n).map(|id| json!({"id": id, "pad": "p".repeat(200)}).to_string() + "\n").collect()
}

/// Push with a client that gives up after 10 s: a push that hangs fails the test.
async fn push(server: &Server, key: &str, body: String) -> (u16, Option<String>, Value, Duration) {
    let started = Instant::now();
    let r = tokio::time::timeout(
        Duration::from_secs(10),
        server.http.post(server.url("/api/streams/d/push")).bearer_auth(key).body(body).send(),
    )
    .await
    .expect("a push hung for 10 s")
    .unwrap();
    let retry = r.headers().get("retry-after").map(|v| v.to_str().unwrap().to_string());
    (r.status().as_u16(), retry, r.json().await.unwrap_or(Value::Null), started.elapsed())
}

#[tokio::test]
async fn a_full_disk_answers_507_at_once_and_the_workspace_reopens_by_itself() {
    let disk = Tmpfs::mount("disk-full", 64);
    // A checkpoint at each 1MB of WAL: the disk fills when a checkpoint writes the file, which
    // is when DuckDB invalidates the database.
    let env = [("SLUICE_WAL_CHECKPOINT", "1MB")];
    let server = Server::start_env(disk.path(), &[], &env).await;
    let key = server.create_stream(json!({"name": "d", "table": "t"})).await;
    let ballast = disk.ballast(12 << 20);

    let (mut acked, mut next, mut full, mut slowest) = (Vec::new(), 0u64, 0, Duration::ZERO);
    while full < 5 {
        assert!(next < 2_000_000, "the disk never filled: {} MB free", free_bytes(disk.path()) >> 20);
        let (status, retry, answer, took) = push(&server, &key, body(next, 500)).await;
        match status {
            202 => acked.extend(next..next + 500),
            507 => {
                full += 1;
                assert_eq!(retry.as_deref(), Some("5"), "{answer}");
                let error = answer["error"].as_str().unwrap_or_default();
                assert!(error.contains("disk") && error.contains("data folder"), "{answer}");
                assert_eq!(answer["limit"], "disk", "{answer}");
                assert!(took < Duration::from_secs(2), "a 507 took {took:?}");
                slowest = slowest.max(took);
            }
            other => panic!("push answered {other}: {answer}"),
        }
        next += 500;
    }
    assert!(acked.len() > 1000, "some pushes were stored before the disk filled: {}", acked.len());
    eprintln!("{} events stored before the disk filled; the slowest 507 took {slowest:?}", acked.len());
    wait_until("the stream to show the full disk", Duration::from_secs(10), || async {
        server.get("/api/streams/d/metrics").await.1["state"] == "disk_full"
    })
    .await;
    let sql = server.http.post(server.url("/api/sql")).json(&json!({"sql": "SELECT 1 AS n"})).send().await.unwrap();
    assert_eq!(sql.status().as_u16(), 503);
    assert!(sql.headers().contains_key("retry-after"));
    let answer: Value = sql.json().await.unwrap();
    assert_eq!(answer["limit"], "disk", "{answer}");

    // Room again: the workspace reopens by itself and pushes are stored again.
    std::fs::remove_file(&ballast).unwrap();
    let freed = Instant::now();
    wait_until("a push to be stored again", Duration::from_secs(60), || async {
        let (status, _, answer, _) = push(&server, &key, body(10_000_000, 500)).await;
        assert!(status == 202 || status == 507, "{status}: {answer}");
        status == 202
    })
    .await;
    eprintln!("stored again {:?} after the space was freed", freed.elapsed());
    acked.extend(10_000_000..10_000_500);
    wait_until("the stream running", Duration::from_secs(30), || async {
        server.get("/api/streams/d/metrics").await.1["state"] == "running"
    })
    .await;

    // Every acknowledged event once; nothing went to the ledger.
    eprintln!("checking before the kill -9");
    every_one_once(&server, &acked).await;
    assert_eq!(server.lines("SELECT count(*) FROM sluice.rejects").await, ["0"]);
    // The reopened file is sound: after a kill -9 the same rows are there.
    server.kill9();
    let server = Server::start_env(disk.path(), &[], &env).await;
    every_one_once(&server, &acked).await;
    server.stop();
}

/// Every acknowledged event stored once: pushes are of 500 events from a multiple of 500, so
/// each stored group of 500 ids is whole, and no group holds more.
async fn every_one_once(server: &Server, acked: &[u64]) {
    let groups = server.lines("SELECT concat(id // 500, ':', count(*)) FROM t GROUP BY id // 500").await;
    let groups: std::collections::HashMap<u64, u64> = groups
        .iter()
        .map(|g| g.split_once(':').map(|(a, b)| (a.parse().unwrap(), b.parse().unwrap())).unwrap())
        .collect();
    assert!(groups.values().all(|n| *n == 500), "a push stored twice or in part: {groups:?}");
    assert_eq!(groups.len(), acked.len() / 500, "a push answered 507 was stored after all");
    let missing: Vec<&u64> = acked.iter().step_by(500).filter(|id| !groups.contains_key(&(**id / 500))).collect();
    assert!(missing.is_empty(), "{} acknowledged pushes not stored, from {:?}", missing.len(), missing.first());
}
