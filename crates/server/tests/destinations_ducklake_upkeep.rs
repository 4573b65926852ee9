//! DuckLake small-file upkeep against a real lake (SQLite catalog, local data folder): a push
//! stream leaves 1,000 files, one per micro-batch; a compaction on demand, while pushes go on,
//! merges them into a handful, expires old snapshots and removes the files nothing reads, and
//! a scheduled one runs by itself. Python's duckdb reads the same rows before and after, and
//! every pushed row once.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::destinations_ducklake::{count, lake_destination, read};
use crate::harness::{DataDir, Server, wait_slowly, wait_until};

/// Parquet files under the lake's data folder.
fn parquet_files(lake: &Path) -> usize {
    fn walk(dir: &Path, n: &mut usize) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, n);
            } else if path.extension().is_some_and(|e| e == "parquet") {
                *n += 1;
            }
        }
    }
    let mut n = 0;
    walk(&lake.join("data"), &mut n);
    n
}

#[tokio::test(flavor = "multi_thread")]
async fn small_files_are_compacted_on_demand_and_on_schedule_while_the_stream_goes_on() {
    let dir = DataDir::new("ducklake-upkeep");
    let lake = DataDir::new("ducklake-upkeep-lake");
    let server = Server::start(&dir.0).await;
    let mut destination = lake_destination(&lake.0);
    destination["compaction"] = json!({"every_s": 0, "keep_snapshots_s": 0});
    let key = server
        .create_stream(json!({"name": "l", "table": "clicks", "destination": destination,
                              "flush": {"max_wait_ms": 10}}))
        .await;
    // 1,000 pushes of 20 rows, one after another: a micro-batch, so a file, each (DuckLake
    // keeps inserts of up to 10 rows in its catalog instead: inlined data).
    let push = |from: usize| {
        let body: Vec<Value> = (from..from + 20).map(|i| json!({"id": i, "page": format!("/p{i}")})).collect();
        serde_json::to_string(&body).unwrap()
    };
    for round in 0..1000 {
        assert_eq!(server.push("l", &key, push(round * 20)).await.0, 202);
    }
    let files_before = parquet_files(&lake.0);
    assert!(files_before >= 1000, "a file per micro-batch: {files_before}");
    const FIRST: &str = "SELECT count(*), sum(id), count(DISTINCT page) FROM clicks WHERE id < 20000";
    let rows_before = read(&lake.0, FIRST).unwrap();
    assert_eq!(rows_before, ["20000|199990000|20000"]);

    // Compact on demand while another client keeps pushing.
    let pushing = {
        let (http, url, key) = (server.http.clone(), server.url("/api/streams/l/push"), key.clone());
        tokio::spawn(async move {
            for round in 1000..1100 {
                let body: Vec<Value> = (round * 20..round * 20 + 20).map(|i| json!({"id": i, "page": "/q"})).collect();
                let r = http.post(&url).bearer_auth(&key).json(&body).send().await.unwrap();
                assert_eq!(r.status(), 202, "{}", r.text().await.unwrap());
            }
        })
    };
    let r = server.http.post(server.url("/api/streams/l/compact")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let report: Value = r.json().await.unwrap();
    println!("compaction while pushing: {report}");
    let (before, after) = (report["before"]["files"].as_u64().unwrap(), report["after"]["files"].as_u64().unwrap());
    assert!(before >= 1000 && after <= 20, "1,000 small files to a handful: {report}");
    pushing.await.unwrap();
    wait_until("every push written", Duration::from_secs(60), || async {
        server.get("/api/streams/l/metrics").await.1["rows_written"] == 22000
    })
    .await;
    assert_eq!(read(&lake.0, FIRST).unwrap(), rows_before, "a reader sees the same rows after the compaction");
    assert_eq!(count(&lake.0, "clicks"), 22000, "each row once");
    assert!(report["removed_files"].as_u64() > Some(0), "{report}");
    // Once the pushes stopped, a second compaction leaves on disk only the files the lake reads.
    let again: Value =
        server.http.post(server.url("/api/streams/l/compact")).send().await.unwrap().json().await.unwrap();
    let live = again["after"]["files"].as_u64().unwrap() + again["after"]["delete_files"].as_u64().unwrap();
    assert_eq!(parquet_files(&lake.0) as u64, live, "expired files are removed from the folder: {again}");
    assert!(live <= 20, "{again}");
    let (_, metrics) = server.get("/api/streams/l/metrics").await;
    assert_eq!(metrics["destination"]["compactions"], 2.0, "{metrics}");
    assert_eq!(metrics["destination"]["files"].as_f64(), again["after"]["files"].as_f64(), "{metrics}");

    // A stream other than a DuckLake one has nothing to compact.
    server.create_stream(json!({"name": "w", "table": "w"})).await;
    assert_eq!(server.http.post(server.url("/api/streams/w/compact")).send().await.unwrap().status(), 409);

    // On a schedule: every second here.
    let r = server
        .http
        .patch(server.url("/api/streams/l"))
        .json(&json!({"destination": {"compaction": {"every_s": 1, "keep_snapshots_s": 0}}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    for round in 1100..1150 {
        assert_eq!(server.push("l", &key, push(round * 20)).await.0, 202);
    }
    wait_until("a scheduled compaction", Duration::from_secs(60), || async {
        let (_, m) = server.get("/api/streams/l/metrics").await;
        m["destination"]["compactions"].as_f64().unwrap_or(0.0) >= 1.0
            && m["destination"]["files"].as_f64() < Some(10.0)
    })
    .await;
    // The schedule goes on compacting every second and removes expired files at once
    // (`keep_snapshots_s: 0`), so a reader can find its snapshot's files gone or the catalog
    // busy, and read nothing: it reads again until a read succeeds. (A read that took over
    // 2 s also printed DuckDB's progress bar before its rows once: readers now turn it off.)
    let mut seen = None;
    wait_slowly("a read of the lake", Duration::from_secs(60), || {
        seen = read(&lake.0, "SELECT count(*) FROM clicks");
        seen.is_some()
    })
    .await;
    assert_eq!(seen, Some(vec!["23000".to_string()]), "each row once");
}

/// A compaction expires only snapshots older than `keep_snapshots_s` (an hour by default): a
/// reader of a snapshot taken seconds before still reads it afterwards. DuckLake 1.5's own
/// `older_than` compared a SQLite catalog's times as text and expired all but the newest.
#[tokio::test(flavor = "multi_thread")]
async fn a_compaction_keeps_the_snapshots_of_keep_snapshots_s() {
    let (dir, lake) = (DataDir::new("ducklake-keep"), DataDir::new("ducklake-keep-lake"));
    let server = Server::start(&dir.0).await;
    let mut destination = lake_destination(&lake.0);
    destination["compaction"] = json!({"every_s": 0});
    let key = server
        .create_stream(json!({"name": "k", "table": "clicks", "destination": destination,
                              "flush": {"max_wait_ms": 10}}))
        .await;
    let push =
        |from: usize| serde_json::to_string(&(from..from + 20).map(|i| json!({"id": i})).collect::<Vec<_>>()).unwrap();
    for round in 0..20 {
        assert_eq!(server.push("k", &key, push(round * 20)).await.0, 202);
    }
    let version = read(&lake.0, "SELECT max(snapshot_id) FROM ducklake_snapshots('lake')").unwrap()[0].clone();
    let at = format!("SELECT count(*) FROM clicks AT (VERSION => {version})");
    assert_eq!(read(&lake.0, &at), Some(vec!["400".to_string()]));
    for round in 20..40 {
        assert_eq!(server.push("k", &key, push(round * 20)).await.0, 202);
    }
    let report: Value =
        server.http.post(server.url("/api/streams/k/compact")).send().await.unwrap().json().await.unwrap();
    assert_eq!(report["expired_snapshots"], 0, "nothing is an hour old: {report}");
    assert_eq!(read(&lake.0, &at), Some(vec!["400".to_string()]), "the snapshot of seconds ago still reads");
    assert_eq!(count(&lake.0, "clicks"), 800);
}

/// DuckDB matches names without regard to case: a stream into `Clicks` writes the lake's
/// existing `clicks`, and its field `page` fills the column `Page`, instead of failing to
/// create them again.
#[tokio::test(flavor = "multi_thread")]
async fn names_match_the_lakes_without_regard_to_case() {
    let dir = DataDir::new("ducklake-case");
    let lake = DataDir::new("ducklake-case-lake");
    let meta = lake.0.join("meta.sqlite");
    let script = format!(
        "import duckdb\nc = duckdb.connect(); c.execute('SET enable_progress_bar = false')\n\
         c.execute(\"SET extension_directory = '{ext}'; SET autoinstall_known_extensions = false; LOAD ducklake; LOAD sqlite_scanner\")\n\
         c.execute(\"ATTACH 'ducklake:sqlite:{meta}' AS lake (DATA_PATH '{data}/')\")\n\
         c.execute('CREATE TABLE lake.main.clicks (id BIGINT, \"Page\" VARCHAR)')\n",
        ext = std::env::var("SLUICE_DUCKDB_EXTENSIONS").unwrap(),
        meta = meta.display(),
        data = lake.0.join("data").display(),
    );
    let python = std::env::var("PYTOOLS_PYTHON").expect("PYTOOLS_PYTHON: run the tests through scripts/test.sh");
    let out = std::process::Command::new(python).args(["-c", &script]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let server = Server::start(&dir.0).await;
    let key = server
        .create_stream(json!({"name": "c", "table": "Clicks", "destination": lake_destination(&lake.0),
                              "flush": {"max_wait_ms": 10}}))
        .await;
    assert_eq!(server.push("c", &key, r#"[{"id": 1, "page": "/a"}, {"id": 2, "page": "/b"}]"#).await.0, 202);
    wait_until("the rows in the lake's clicks", Duration::from_secs(30), || async {
        server.get("/api/streams/c/metrics").await.1["rows_written"] == 2
    })
    .await;
    assert_eq!(read(&lake.0, "SELECT count(\"Page\") FROM clicks"), Some(vec!["2".into()]));
}
