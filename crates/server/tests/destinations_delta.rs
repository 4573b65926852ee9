//! Streams and syncs into Delta Lake tables, read back by two readers Sluice did not write:
//! delta-rs's Python package (`deltalake`) and DuckDB's delta extension (delta-kernel-rs).
//! Postgres CDC mirrored across two kill -9 equal to the source; a mirror sync whose changes
//! show after each run and whose failed run commits nothing; HTTP push on S3 (moto) with a
//! column widened from integers to doubles; 1,000 small files compacted while the stream writes.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::harness::{DataDir, Server, wait_slowly, wait_until};
use crate::postgres::Postgres;

/// Who reads the table.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Reader {
    /// delta-rs's Python package, its rows handed to DuckDB as an Arrow table.
    Deltalake,
    /// DuckDB's delta extension (`delta_scan`).
    Duckdb,
}

/// The rows of `sql` over the table at `table` (a folder or `s3://…`, queried as `t`), as
/// `|`-joined values (NULL as `-`); `None` while the table cannot be read (not made yet).
pub(crate) fn read(table: &str, sql: &str, reader: Reader, s3: Option<&str>) -> Option<Vec<String>> {
    let options = s3.map_or("{}".to_string(), |endpoint| {
        format!(
            "{{'AWS_ENDPOINT_URL': '{endpoint}', 'AWS_ACCESS_KEY_ID': 'test', 'AWS_SECRET_ACCESS_KEY': 'test', \
             'AWS_REGION': 'us-east-1', 'AWS_ALLOW_HTTP': 'true'}}"
        )
    });
    let ext = std::env::var("SLUICE_DUCKDB_EXTENSIONS").expect("SLUICE_DUCKDB_EXTENSIONS: run through scripts/test.sh");
    let open = match reader {
        Reader::Deltalake => format!(
            "from deltalake import DeltaTable\n\
             try:\n    dt = DeltaTable({table:?}, storage_options={options})\n\
             except Exception:\n    sys.exit(3)\n\
             c.register('t', dt.to_pyarrow_table())\n"
        ),
        Reader::Duckdb => format!(
            "if not os.path.exists(os.path.join({table:?}, '_delta_log')): sys.exit(3)\n\
             c.execute(\"SET extension_directory = '{ext}'; SET autoinstall_known_extensions = false; \
             SET autoload_known_extensions = false; LOAD delta\")\n\
             c.execute(\"CREATE VIEW t AS SELECT * FROM delta_scan('{table}')\")\n"
        ),
    };
    let script = format!(
        "import duckdb, os, sys\nc = duckdb.connect(); c.execute('SET enable_progress_bar = false')\n{open}\
         for r in c.execute({sql:?}).fetchall():\n    print('|'.join('-' if v is None else str(v) for v in r))\n\
         sys.stdout.flush()\nos._exit(0)\n"
    );
    let out = std::process::Command::new(crate::moto::python()).args(["-c", &script]).output().expect("run python");
    if !out.status.success() && out.status.code() != Some(3) {
        eprintln!("{reader:?} could not read {table}: {}", String::from_utf8_lossy(&out.stderr));
    }
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect())
}

fn count(table: &Path) -> i64 {
    read(&table.display().to_string(), "SELECT count(*) FROM t", Reader::Deltalake, None)
        .and_then(|l| l.first().and_then(|n| n.parse().ok()))
        .unwrap_or(0)
}

/// The table's data files and the log's facts, by delta-rs: files, version, the position key.
fn facts(table: &Path) -> Value {
    let out = crate::moto::py(&format!(
        "import json\nfrom deltalake import DeltaTable\ndt = DeltaTable({:?})\n\
         print(json.dumps({{'files': len(dt.file_uris()), 'version': dt.version(), \
         'configuration': dt.metadata().configuration, 'protocol': [dt.protocol().min_reader_version, \
         dt.protocol().min_writer_version]}}))\n",
        table.display().to_string()
    ));
    serde_json::from_str(out.trim()).unwrap()
}

fn destination(location: &Path) -> Value {
    json!({"kind": "delta", "location": location.display().to_string()})
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_cdc_mirrored_into_delta_across_two_kill_9_equals_the_source() {
    let pg = Postgres::start();
    pg.sql(
        "CREATE TABLE accounts (id int PRIMARY KEY, name text, amount numeric(12,2), at timestamptz);
         INSERT INTO accounts SELECT g, 'n' || g, g * 1.25, timestamptz '2024-01-01 00:00:00+00' + g * interval '1 minute'
           FROM generate_series(1, 3000) g;",
    );
    let dir = DataDir::new("dest-delta-cdc");
    let lake = DataDir::new("dest-delta-cdc-lake");
    let table = lake.0.join("accounts");
    let mut server = Server::start(&dir.0).await;
    server
        .create_stream(json!({
            "name": "m", "table": "accounts", "destination": destination(&lake.0),
            "source": {"type": "postgres", "host": "127.0.0.1", "port": pg.port, "database": "etltest",
                       "user": "etl", "password": "etl", "tables": ["public.accounts"], "snapshot_chunk_rows": 500},
            "flush": {"max_wait_ms": 20},
        }))
        .await;
    wait_slowly("the snapshot in the table", Duration::from_secs(240), || count(&table) >= 3000).await;
    // Rounds of updates, deletes and inserts, with a kill -9 after the 3rd and the 6th, each
    // while the round's changes are still on their way.
    for round in 0..9 {
        pg.sql(&format!(
            "UPDATE accounts SET amount = amount + 1, name = CASE WHEN id % 2 = 0 THEN NULL ELSE 'r{round}' END \
               WHERE id % 9 = {round};
             DELETE FROM accounts WHERE id % 50 = {round};
             INSERT INTO accounts VALUES ({id}, 'new', 0.5, now()), ({id2}, 'new2', 1.5, NULL);",
            id = 10_000 + round,
            id2 = 20_000 + round,
        ));
        if round == 2 || round == 5 {
            server.kill9();
            server = Server::start(&dir.0).await;
        }
    }
    const ROWS: &str = "SELECT count(*), count(name), sum(amount), sum(id), count(DISTINCT id), \
                        count(*) FILTER (WHERE name LIKE 'r%') FROM t";
    let want = pg.lines(&ROWS.replace("FROM t", "FROM accounts"));
    let path = table.display().to_string();
    wait_slowly("the table to equal the source", Duration::from_secs(240), || {
        read(&path, ROWS, Reader::Deltalake, None).is_some_and(|got| got == want)
    })
    .await;
    // A second reader agrees, row by row on a sample of keys.
    assert_eq!(read(&path, ROWS, Reader::Duckdb, None), Some(want));
    let sample = "SELECT id, coalesce(name, '-'), amount FROM t WHERE id % 97 = 3 OR id >= 10000 ORDER BY id";
    let source = pg.lines(&sample.replace("FROM t", "FROM accounts"));
    assert_eq!(read(&path, sample, Reader::Duckdb, None), Some(source));
    // The position is in the table's configuration, committed with the rows.
    let facts = facts(&table);
    assert!(facts["configuration"]["sluice.position.m"].as_str().is_some_and(|p| p.contains("lsn")), "{facts}");
    let (_, metrics) = server.get("/api/streams/m/metrics").await;
    assert_eq!(metrics["state"], "running", "{metrics}");
}

/// Rows the stream has committed to its destination, from its metrics (cheap to poll).
async fn written(server: &Server, stream: &str) -> i64 {
    server.get(&format!("/api/streams/{stream}/metrics")).await.1["rows_written"].as_i64().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn http_push_to_delta_exactly_once_across_two_kill_9_with_a_column_added_mid_stream() {
    let dir = DataDir::new("dest-delta-push");
    let lake = DataDir::new("dest-delta-push-lake");
    let table = lake.0.join("events");
    let mut server = Server::start(&dir.0).await;
    let key = server
        .create_stream(json!({"name": "o", "table": "events", "destination": destination(&lake.0),
                              "flush": {"max_wait_ms": 50}}))
        .await;
    // 300 pushes of 10 events, a `coupon` from the 150th on, each retried with its
    // Idempotency-Key across the restarts.
    const PUSHES: usize = 300;
    const TOTAL: i64 = (PUSHES * 10) as i64;
    let base = std::sync::Arc::new(std::sync::Mutex::new(server.base.clone()));
    let pushing = crate::harness::push_orders(base.clone(), "o", key, PUSHES, 30);
    // Two kills, at random points of the first and the second half.
    for half in 0..2i64 {
        let threshold = 300 + half * 1200 + (rand::random::<u64>() % 600) as i64;
        wait_until("events in the table", Duration::from_secs(240), || async {
            written(&server, "o").await >= threshold
        })
        .await;
        server.kill9();
        let seen = count(&table);
        assert!(seen < TOTAL, "the kill came after the last event ({seen}): it tests nothing");
        server = Server::start(&dir.0).await;
        *base.lock().unwrap() = server.base.clone();
    }
    pushing.await.unwrap();
    wait_slowly("every event in the table", Duration::from_secs(240), || count(&table) >= TOTAL).await;
    const CHECK: &str = "SELECT count(*), count(DISTINCT id), count(coupon), min(id), max(id), \
         sum((coupon IS DISTINCT FROM (CASE WHEN id >= 1500 THEN 'c' || id END))::int), \
         sum((amount IS DISTINCT FROM (id % 97) + 0.5)::int) FROM t";
    let path = table.display().to_string();
    for reader in [Reader::Deltalake, Reader::Duckdb] {
        assert_eq!(read(&path, CHECK, reader, None), Some(vec!["3000|3000|1500|0|2999|0|0".to_string()]), "{reader:?}");
    }
    // Each commit carried the stream's position and its transaction version.
    let facts = facts(&table);
    assert!(facts["configuration"]["sluice.position.o"].is_string(), "{facts}");
    let (_, metrics) = server.get("/api/streams/o/metrics").await;
    assert_eq!(metrics["state"], "running", "{metrics}");
}

/// Kafka appended across two kill -9: each restart resumes from the position the table holds,
/// so no order is read twice (without it the stream would start the topic over).
#[tokio::test(flavor = "multi_thread")]
async fn kafka_to_delta_append_exactly_once_across_two_kill_9() {
    let broker = crate::broker::Broker::start();
    broker.create_topic("orders", 3);
    let dir = DataDir::new("dest-delta-kafka");
    let lake = DataDir::new("dest-delta-kafka-lake");
    let table = lake.0.join("orders");
    let mut server = Server::start(&dir.0).await;
    let mut stream = crate::kafka::kafka_stream("k", "orders", &broker, json!(["orders"]));
    stream["destination"] = destination(&lake.0);
    stream["flush"] = json!({"max_rows": 1000, "max_wait_ms": 50});
    server.create_stream(stream).await;
    // 6,000 orders over about six seconds; from the 3,000th on they carry a `coupon`.
    const TOTAL: i64 = 6_000;
    let producing = crate::broker::produce_orders(broker.producer(&[]), "orders", TOTAL as usize, 100, 100);
    for round in 0..2i64 {
        let threshold = 800 * (round + 1) + (rand::random::<u64>() % 1_200) as i64;
        wait_until("orders in the table", Duration::from_secs(180), || async {
            written(&server, "k").await >= threshold
        })
        .await;
        server.kill9();
        let seen = count(&table);
        assert!(seen < TOTAL, "the kill came after the last order ({seen}): it tests nothing");
        server = Server::start(&dir.0).await;
    }
    producing.await.unwrap();
    wait_slowly("every order in the table", Duration::from_secs(240), || count(&table) >= TOTAL).await;
    const CHECK: &str = "SELECT count(*), count(DISTINCT id), count(coupon), min(id), max(id), \
         count(*) FILTER (WHERE coupon IS DISTINCT FROM CASE WHEN id >= 3000 THEN 'c' || id END) FROM t";
    let path = table.display().to_string();
    for reader in [Reader::Deltalake, Reader::Duckdb] {
        assert_eq!(read(&path, CHECK, reader, None), Some(vec!["6000|6000|3000|0|5999|0".to_string()]), "{reader:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_mirror_sync_into_delta_shows_each_runs_changes_and_a_failed_run_commits_nothing() {
    let dir = DataDir::new("dest-delta-sync");
    let lake = DataDir::new("dest-delta-sync-lake");
    let table = lake.0.join("people_copy");
    let server = Server::start(&dir.0).await;
    let key = server
        .create_stream(json!({"name": "people", "table": "people", "metadata": {"position": true},
                              "flush": {"max_wait_ms": 20}}))
        .await;
    let first =
        r#"[{"id": 1, "name": "a", "gone": false, "score": 1}, {"id": 2, "name": "b", "gone": false, "score": 2}]"#;
    assert_eq!(server.push("people", &key, first).await.0, 202);
    wait_until("people in the workspace", Duration::from_secs(30), || async { server.count("people").await == 2 })
        .await;
    let mut to = destination(&lake.0);
    to["table"] = json!("people_copy");
    let query = "SELECT id, arg_max(name, _position) AS name, arg_max(score, _position) AS score, \
                 TIMESTAMPTZ '2024-01-01 00:00:00+00' AS at FROM people GROUP BY id HAVING NOT bool_or(gone)";
    let (status, body) = server
        .create_sync(json!({"name": "to_delta", "mode": "mirror", "keys": ["id"], "destination": to, "query": query}))
        .await;
    assert_eq!(status, 201, "{body}");
    let run = server.run_sync("to_delta").await;
    assert_eq!(run["status"], "succeeded", "{run}");
    let path = table.display().to_string();
    let rows = |reader| read(&path, "SELECT id, name, score FROM t ORDER BY id", reader, None);
    assert_eq!(rows(Reader::Deltalake), Some(vec!["1|a|1".to_string(), "2|b|2".to_string()]));
    assert_eq!(rows(Reader::Duckdb), Some(vec!["1|a|1".to_string(), "2|b|2".to_string()]));
    let body = r#"[{"id": 2, "name": "B", "gone": false, "score": 2.5}, {"id": 3, "name": "c", "gone": false, "score": 3},
                   {"id": 1, "gone": true}]"#;
    assert_eq!(server.push("people", &key, body).await.0, 202);
    wait_until("the changes in the workspace", Duration::from_secs(30), || async { server.count("people").await == 5 })
        .await;
    // A run that fails halfway: its data files are written (key 2's file rewritten, the new
    // rows), then its commit cannot be put (something else holds the next version's name).
    let before = facts(&table);
    let next = table.join(format!("_delta_log/{:020}.json", before["version"].as_i64().unwrap() + 1));
    std::fs::create_dir(&next).unwrap();
    let run = server.run_sync("to_delta").await;
    assert_eq!(run["status"], "failed", "{run}");
    std::fs::remove_dir(&next).unwrap();
    assert_eq!(facts(&table)["version"], before["version"], "no commit");
    assert_eq!(rows(Reader::Deltalake), Some(vec!["1|a|1".to_string(), "2|b|2".to_string()]));
    let parquet = std::fs::read_dir(&table)
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_name().to_string_lossy().ends_with(".parquet"))
        .count();
    assert_eq!(parquet as u64, before["files"].as_u64().unwrap(), "the failed run's files are gone");
    // The next run delivers every change since the last good run: the hashes did not move.
    let run = server.run_sync("to_delta").await;
    assert_eq!(
        (run["status"].clone(), run["inserted"].clone(), run["updated"].clone(), run["deleted"].clone()),
        (json!("succeeded"), json!(1), json!(1), json!(1)),
        "{run}"
    );
    for reader in [Reader::Deltalake, Reader::Duckdb] {
        assert_eq!(rows(reader), Some(vec!["2|B|2.5".to_string(), "3|c|3.0".to_string()]), "{reader:?}");
    }
}

/// A table on S3 (moto): pushes exactly once across a kill -9, a column that starts as
/// integers and gets fractions (the table's column widens to double, its files rewritten),
/// and a column added mid-stream.
#[tokio::test(flavor = "multi_thread")]
async fn a_delta_table_on_s3_widens_and_adds_columns_exactly_once_across_a_kill_9() {
    let moto = crate::moto::Moto::start();
    crate::moto::py(&format!("{}s3.create_bucket(Bucket='lake')\n", moto.boto()));
    let dir = DataDir::new("dest-delta-s3");
    let mut server = Server::start(&dir.0).await;
    let to = json!({"kind": "delta", "location": "s3://lake/tables",
                    "s3": {"endpoint": moto.endpoint, "region": "us-east-1", "access_key_id": "test",
                           "secret_access_key": "test"}});
    let key = server
        .create_stream(json!({"name": "s", "table": "events", "destination": to, "flush": {"max_wait_ms": 20}}))
        .await;
    for round in 0..8 {
        if round == 4 {
            server.kill9();
            server = Server::start(&dir.0).await;
        }
        let events: Vec<Value> = (0..25)
            .map(|i| {
                let id = round * 25 + i;
                // `amount` is whole until round 3; `coupon` appears in round 5.
                let amount = if round >= 3 { json!(id as f64 + 0.5) } else { json!(id) };
                if round >= 5 {
                    json!({"id": id, "amount": amount, "coupon": format!("c{id}")})
                } else {
                    json!({"id": id, "amount": amount})
                }
            })
            .collect();
        let r = server
            .http
            .post(server.url("/api/streams/s/push"))
            .bearer_auth(&key)
            .header("idempotency-key", format!("round-{round}"))
            .body(Value::Array(events).to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 202, "{}", r.text().await.unwrap());
    }
    let url = "s3://lake/tables/events";
    const CHECK: &str =
        "SELECT count(*), count(DISTINCT id), count(coupon), sum(amount), typeof(any_value(amount)) FROM t";
    // Ids 0..199 once each, plus .5 on the 125 from round 3 on.
    let want = vec!["200|200|75|19962.5|DOUBLE".to_string()];
    wait_slowly("every row in the table", Duration::from_secs(120), || {
        read(url, CHECK, Reader::Deltalake, Some(&moto.endpoint)).is_some_and(|r| r == want)
    })
    .await;
    let listed = crate::moto::py(&format!(
        "{}print(sum(o['Key'].startswith('tables/events/_delta_log/') for o in s3.list_objects_v2(Bucket='lake')['Contents']))\n",
        moto.boto()
    ));
    assert!(listed.trim().parse::<u32>().unwrap() >= 2, "commits in the bucket: {listed}");
}

/// 1,000 small files (one per push) merged into a handful on demand while pushes go on, and
/// the rows the same before and after, for both readers.
#[tokio::test(flavor = "multi_thread")]
async fn a_thousand_small_files_are_compacted_while_the_stream_writes() {
    let dir = DataDir::new("dest-delta-compact");
    let lake = DataDir::new("dest-delta-compact-lake");
    let table = lake.0.join("clicks");
    let server = Server::start(&dir.0).await;
    let mut to = destination(&lake.0);
    to["compaction"] = json!({"small_files": 0, "keep_versions_s": 0});
    let key = server
        .create_stream(json!({"name": "c", "table": "clicks", "destination": to, "flush": {"max_wait_ms": 20}}))
        .await;
    let mut pushed = 0;
    while facts_or_zero(&table) < 1000 {
        for _ in 0..50 {
            let body = json!([{"id": pushed, "page": format!("p{}", pushed % 7)}]).to_string();
            assert_eq!(server.push("c", &key, body).await.0, 202);
            pushed += 1;
        }
    }
    // Pushes go on beside the compaction.
    let base = server.base.clone();
    let (http, key2) = (server.http.clone(), key.clone());
    let more = tokio::spawn(async move {
        for i in 0..200 {
            let body = json!([{"id": 1_000_000 + i, "page": "late"}]).to_string();
            let r = http.post(format!("{base}/api/streams/c/push")).bearer_auth(&key2).body(body).send().await.unwrap();
            assert_eq!(r.status(), 202);
        }
    });
    let r = server.http.post(server.url("/api/streams/c/compact")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let report: Value = r.json().await.unwrap();
    more.await.unwrap();
    assert!(report["before"]["files"].as_u64().unwrap() >= 1000, "{report}");
    assert!(report["after"]["files"].as_u64().unwrap() <= 5, "{report}");
    let total = pushed + 200;
    let path = table.display().to_string();
    const CHECK: &str = "SELECT count(*), count(DISTINCT id), sum(id), count(*) FILTER (WHERE page = 'late') FROM t";
    let sum: i64 = (0..pushed).sum::<i64>() + (0..200).map(|i| 1_000_000 + i).sum::<i64>();
    let want = vec![format!("{total}|{total}|{sum}|200")];
    wait_slowly("every row after the compaction", Duration::from_secs(120), || {
        read(&path, CHECK, Reader::Deltalake, None).is_some_and(|r| r == want)
    })
    .await;
    assert_eq!(read(&path, CHECK, Reader::Duckdb, None), Some(want));
    let facts = facts(&table);
    assert!(facts["files"].as_u64().unwrap() <= 210, "{facts}");
    let (_, metrics) = server.get("/api/streams/c/metrics").await;
    assert!(metrics["destination"]["files"].as_f64().is_some(), "{metrics}");
    // The checkpoint and the retention of 0 s removed the merged files and the old commits.
    let log = std::fs::read_dir(table.join("_delta_log")).unwrap().count();
    assert!(log < 300, "old commits deleted after the checkpoint: {log} left");
    assert!(table.join("_delta_log/_last_checkpoint").exists());
}

/// Live data files, or 0 before the table exists.
fn facts_or_zero(table: &Path) -> u64 {
    if !table.join("_delta_log").exists() {
        return 0;
    }
    facts(table)["files"].as_u64().unwrap_or(0)
}

/// A Delta table on S3 behind a proxy that loses the answer of one commit (the put of the
/// log's next version is done by the store, then answered 502): a mirror sync run and a mirror
/// stream each learn that it landed (the put retried finds its own commit there), every data
/// file the log lists is present, each row is there once, and the next run goes through.
#[tokio::test(flavor = "multi_thread")]
async fn a_lost_commit_answer_leaves_a_delta_table_whole_for_a_sync_and_a_stream() {
    use crate::losing_proxy::{LosingProxy, delta_commit};
    let moto = crate::moto::Moto::start();
    crate::moto::py(&format!("{}s3.create_bucket(Bucket='lake')\n", moto.boto()));
    let proxy = LosingProxy::start(&moto.endpoint, delta_commit).await;
    let dir = DataDir::new("dest-delta-lost");
    let server = Server::start(&dir.0).await;
    let to = |table: &str| {
        json!({"kind": "delta", "location": "s3://lake/tables", "table": table,
               "s3": {"endpoint": proxy.endpoint, "region": "us-east-1", "access_key_id": "test",
                      "secret_access_key": "test"}})
    };
    let key = server
        .create_stream(json!({"name": "people", "table": "people", "metadata": {"position": true},
                              "flush": {"max_wait_ms": 20}}))
        .await;
    let rows = |from: i64, tag: &str| json!((from..from + 10).map(|i| json!({"id": i, "v": tag})).collect::<Vec<_>>());
    assert_eq!(server.push("people", &key, rows(0, "a").to_string()).await.0, 202);
    wait_until("people in the workspace", Duration::from_secs(30), || async { server.count("people").await == 10 })
        .await;
    let query = "SELECT id, arg_max(v, _position) AS v FROM people GROUP BY id";
    let (status, body) = server
        .create_sync(json!({"name": "to_delta", "mode": "mirror", "keys": ["id"], "destination": to("copy"),
                            "query": query}))
        .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(server.run_sync("to_delta").await["status"], "succeeded");
    assert_eq!(server.push("people", &key, rows(5, "b").to_string()).await.0, 202);
    wait_until("the changes in the workspace", Duration::from_secs(30), || async {
        server.count("people").await == 20
    })
    .await;
    let want: Vec<String> = (0..15).map(|i| format!("{i}|{}", if i < 5 { "a" } else { "b" })).collect();
    let read_copy =
        || read("s3://lake/tables/copy", "SELECT id, v FROM t ORDER BY id", Reader::Deltalake, Some(&moto.endpoint));
    proxy.lose_next();
    let run = server.run_sync("to_delta").await;
    assert_eq!(proxy.lost(), 1, "the commit went through the proxy: {run}");
    assert_eq!(run["status"], "succeeded", "the table holds the run: {run}");
    assert_eq!(read_copy(), Some(want.clone()));
    let run = server.run_sync("to_delta").await;
    assert_eq!(run["status"], "succeeded", "{run}");
    assert_eq!(read_copy(), Some(want));

    // A mirror stream into Delta through the same proxy.
    let mut destination = to("");
    destination.as_object_mut().unwrap().remove("table");
    let key = server
        .create_stream(json!({"name": "s", "table": "events", "mode": "mirror", "keys": ["id"],
                              "destination": destination, "flush": {"max_wait_ms": 20}}))
        .await;
    assert_eq!(server.push("s", &key, rows(0, "a").to_string()).await.0, 202);
    proxy.lose_next();
    let push = server.push("s", &key, rows(5, "b").to_string());
    let (status, answer) =
        tokio::time::timeout(Duration::from_secs(60), push).await.expect("the push was never answered");
    assert_eq!(status, 202, "{answer}");
    assert_eq!(proxy.lost(), 2, "the stream's commit went through the proxy");
    assert_eq!(server.push("s", &key, rows(15, "c").to_string()).await.0, 202);
    let want: Vec<String> = (0..25)
        .map(|i| {
            format!(
                "{i}|{}",
                if i < 5 {
                    "a"
                } else if i < 15 {
                    "b"
                } else {
                    "c"
                }
            )
        })
        .collect();
    wait_slowly("every row once, in a table that reads", Duration::from_secs(60), || {
        read("s3://lake/tables/events", "SELECT id, v FROM t ORDER BY id", Reader::Deltalake, Some(&moto.endpoint))
            == Some(want.clone())
    })
    .await;
    let (_, metrics) = server.get("/api/streams/s/metrics").await;
    assert_eq!(metrics["state"], "running", "{metrics}");
}
