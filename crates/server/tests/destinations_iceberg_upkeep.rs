//! Iceberg small-file upkeep against a real REST catalog (lakana-server): a push stream leaves a
//! data file per micro-batch; a compaction on demand, while another client pushes, rewrites the
//! table into one file in a `replace` snapshot (lakana refuses to expire snapshots through a
//! commit, and the report says so), and a scheduled one runs by itself. 200 pushes, not 1,000:
//! each is a commit through lakana, about 0.6 s in a debug build. pyiceberg and DuckDB's iceberg extension (readers Sluice did not write)
//! see the same rows before and after, and every pushed row once.

use std::time::Duration;

use serde_json::{Value, json};

use crate::harness::{DataDir, Server, wait_until};
use crate::iceberg_rest::IcebergRest;

/// Rows of `sql` over `bronze.<table>` (as `t`) read by DuckDB's iceberg extension through the
/// catalog, `|`-joined.
fn duckdb_read(catalog: &IcebergRest, table: &str, sql: &str) -> Vec<String> {
    let script = format!(
        "import duckdb, os\nc = duckdb.connect(); c.execute('SET enable_progress_bar = false')\n\
         c.execute(\"SET extension_directory = '{ext}'; SET autoinstall_known_extensions = false; \
         LOAD httpfs; LOAD avro; LOAD iceberg\")\n\
         c.execute(\"CREATE SECRET s (TYPE iceberg, TOKEN '\" + os.environ['ICEBERG_TOKEN'] + \"')\")\n\
         c.execute(\"ATTACH '{wh}' AS cat (TYPE iceberg, SECRET s, ENDPOINT '{uri}', DISABLE_MULTI_TABLE_COMMIT true)\")\n\
         c.execute('CREATE VIEW t AS SELECT * FROM cat.bronze.{table}')\n\
         for r in c.execute({sql:?}).fetchall():\n    print('|'.join(str(v) for v in r))\n",
        ext = std::env::var("SLUICE_DUCKDB_EXTENSIONS").unwrap(),
        wh = catalog.warehouse,
        uri = catalog.uri,
    );
    let python = std::env::var("PYTOOLS_PYTHON").expect("PYTOOLS_PYTHON: run the tests through scripts/test.sh");
    // The token in the environment, not on a command line others can list.
    let out =
        std::process::Command::new(python).args(["-c", &script]).env("ICEBERG_TOKEN", &catalog.token).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect()
}

/// The table's live files, as DuckDB's extension lists them.
const LIVE_FILES: &str = "SELECT count(*) FROM iceberg_metadata('cat.bronze.clicks') WHERE status <> 'DELETED'";

#[tokio::test(flavor = "multi_thread")]
async fn small_iceberg_files_are_compacted_on_demand_and_on_schedule_while_the_stream_goes_on() {
    let catalog = IcebergRest::start();
    let dir = DataDir::new("iceberg-upkeep");
    let server = Server::start(&dir.0).await;
    let mut destination = catalog.destination();
    destination["compaction"] = json!({"every_s": 0, "min_files": 2, "keep_snapshots_s": 0});
    let key = server
        .create_stream(json!({"name": "i", "table": "clicks", "destination": destination,
                              "flush": {"max_wait_ms": 10}}))
        .await;
    // Pushes of 20 rows one after another: a micro-batch, so a commit and a data file, each.
    const PUSHES: usize = 200;
    let push = |from: usize| {
        let body: Vec<Value> = (from..from + 20).map(|i| json!({"id": i, "page": format!("/p{i}")})).collect();
        serde_json::to_string(&body).unwrap()
    };
    for round in 0..PUSHES {
        assert_eq!(server.push("i", &key, push(round * 20)).await.0, 202);
    }
    let n = (PUSHES * 20) as u64;
    let first = format!("SELECT count(*), sum(id), count(DISTINCT page) FROM t WHERE id < {n}");
    let first = first.as_str();
    let expected = vec![format!("{n}|{}|{n}", n * (n - 1) / 2)];
    assert_eq!(catalog.read("clicks", first), Some(expected.clone()));
    let files_before = duckdb_read(&catalog, "clicks", LIVE_FILES);
    println!("data files before: {files_before:?}");

    // Compact on demand while another client keeps pushing.
    let pushing = {
        let (http, url, key) = (server.http.clone(), server.url("/api/streams/i/push"), key.clone());
        tokio::spawn(async move {
            for round in PUSHES..PUSHES + 50 {
                let body: Vec<Value> = (round * 20..round * 20 + 20).map(|i| json!({"id": i, "page": "/q"})).collect();
                let r = http.post(&url).bearer_auth(&key).json(&body).send().await.unwrap();
                assert_eq!(r.status(), 202, "{}", r.text().await.unwrap());
            }
        })
    };
    let r = server.http.post(server.url("/api/streams/i/compact")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let report: Value = r.json().await.unwrap();
    println!("compaction while pushing: {report}");
    let (before, after) = (report["before"]["files"].as_u64().unwrap(), report["after"]["files"].as_u64().unwrap());
    assert!(before >= PUSHES as u64 && after == 1, "a file per push to one: {report}");
    assert_eq!(report["after"]["delete_files"], 0, "{report}");
    // The replaced files are in the new snapshot's manifest as DELETED, as DuckDB reads it.
    let deleted = duckdb_read(&catalog, "clicks", &LIVE_FILES.replace("<>", "="));
    assert_eq!(deleted, [before.to_string()], "{report}");
    // lakana keeps expiring snapshots to its own maintenance: it refuses `remove-snapshots`
    // in an Iceberg commit with a 403, which the report carries (the compaction stands).
    let refused = report["expire_refused"].as_str().unwrap_or_default();
    assert!(refused.contains("403") && refused.contains("lakana table maintain"), "{report}");
    assert_eq!(report["expired_snapshots"], 0, "{report}");
    pushing.await.unwrap();
    let total = ((PUSHES + 50) * 20) as i64;
    wait_until("every push written", Duration::from_secs(120), || async {
        server.get("/api/streams/i/metrics").await.1["rows_written"] == total
    })
    .await;
    assert_eq!(catalog.read("clicks", first), Some(expected.clone()), "pyiceberg sees the same rows after");
    assert_eq!(duckdb_read(&catalog, "clicks", first), expected, "DuckDB sees the same rows after");
    let all = "SELECT count(*), count(DISTINCT id) FROM t";
    assert_eq!(catalog.read("clicks", all), Some(vec![format!("{total}|{total}")]), "each row once");
    // The compacted file and the files of the pushes after it.
    let files = duckdb_read(&catalog, "clicks", LIVE_FILES);
    let files: u64 = files[0].parse().unwrap();
    assert!(files <= 51, "{files} files after the compaction");
    let (_, metrics) = server.get("/api/streams/i/metrics").await;
    assert_eq!(metrics["destination"]["compactions"], 1.0, "{metrics}");
    assert_eq!(metrics["state"], "running", "{metrics}");

    // On a schedule: every second here.
    let r = server
        .http
        .patch(server.url("/api/streams/i"))
        .json(&json!({"destination": {"compaction": {"every_s": 1, "min_files": 2, "keep_snapshots_s": 0}}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
    wait_until("a scheduled compaction", Duration::from_secs(60), || async {
        let (_, m) = server.get("/api/streams/i/metrics").await;
        m["destination"]["compactions"].as_f64().unwrap_or(0.0) >= 1.0
            && m["destination"]["files"].as_f64() == Some(1.0)
    })
    .await;
    assert_eq!(catalog.read("clicks", all), Some(vec![format!("{total}|{total}")]));
}
