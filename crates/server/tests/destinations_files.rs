//! Streams into files: HTTP push into Parquet on S3 (moto) rotated by rows, each event once
//! across kill -9; CSV gzip on Azure Blob (Azurite) and JSON lines on Google Cloud Storage
//! (fake-gcs-server); Debezium changes as change files with an op column. Every file is read
//! back by independent readers (Python pyarrow and duckdb).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

use crate::azurite::{self, Azurite};
use crate::gcs::FakeGcs;
use crate::harness::{DataDir, Server, wait_until};
use crate::moto::{Moto, py};

/// Every Parquet file under `prefix` in bucket `lake`, read with pyarrow: `files rows distinct
/// coupons max_rows_per_file`.
fn s3_parquet(moto: &Moto, prefix: &str) -> Vec<i64> {
    let out = py(&format!(
        "{}import pyarrow as pa, pyarrow.parquet as pq\n\
         keys = [o['Key'] for o in s3.list_objects_v2(Bucket='lake', Prefix='{prefix}').get('Contents', [])]\n\
         tables = [pq.read_table(io.BytesIO(s3.get_object(Bucket='lake', Key=k)['Body'].read())) for k in keys if k.endswith('.parquet')]\n\
         ids = [i for t in tables for i in t.column('id').to_pylist()]\n\
         coupons = sum(t.column('coupon').null_count < t.num_rows and t.num_rows - t.column('coupon').null_count or 0 for t in tables if 'coupon' in t.column_names)\n\
         print(len(tables), len(ids), len(set(ids)), coupons, max([t.num_rows for t in tables] or [0]))",
        moto.boto()
    ));
    out.split_whitespace().map(|n| n.parse().unwrap()).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn http_push_to_parquet_on_s3_rotated_by_rows_each_event_once_across_kill_9() {
    let moto = Moto::start();
    py(&format!("{}s3.create_bucket(Bucket='lake')", moto.boto()));
    let dir = DataDir::new("dest-files-s3");
    let mut server = Server::start(&dir.0).await;
    let destination = json!({
        "kind": "files", "location": "s3://lake/events", "format": "parquet",
        "path": "{table}/{date}/part-{seq}.{ext}", "rotate": {"rows": 500, "seconds": 2},
        "s3": {"endpoint": moto.endpoint, "access_key_id": "test", "secret_access_key": "test"},
    });
    let key = server
        .create_stream(
            json!({"name": "f", "table": "orders", "destination": destination, "flush": {"max_wait_ms": 50}}),
        )
        .await;
    let (_, stream) = server.get("/api/streams/f").await;
    assert!(!stream.to_string().contains("secret_access_key"), "{stream}");

    const PUSHES: usize = 300;
    let base = Arc::new(Mutex::new(server.base.clone()));
    let pushing = crate::harness::push_orders(base.clone(), "f", key, PUSHES, 20);
    let threshold = 500 + (rand::random::<u64>() % 800) as i64;
    wait_until("rows in files on S3", Duration::from_secs(90), || async {
        s3_parquet(&moto, "events/")[1] >= threshold
    })
    .await;
    server.kill9();
    let seen = s3_parquet(&moto, "events/")[1];
    assert!(seen < (PUSHES * 10) as i64, "the kill came after the last event ({seen}): it tests nothing");
    server = Server::start(&dir.0).await;
    *base.lock().unwrap() = server.base.clone();
    pushing.await.unwrap();
    wait_until("every event in files on S3", Duration::from_secs(90), || async {
        s3_parquet(&moto, "events/")[1] >= (PUSHES * 10) as i64
    })
    .await;
    let [files, rows, distinct, coupons, largest] = s3_parquet(&moto, "events/")[..] else { panic!() };
    assert_eq!((rows, distinct, coupons), (3000, 3000, 1500), "each event once, coupons where sent");
    assert!(files >= 6, "rotated by 500 rows and at the new column: {files} files");
    assert!(largest < 1000, "a file closes once it holds 500 rows: one had {largest}");

    // duckdb reads the same files (downloaded) as one table, by name and date folder.
    let check = py(&format!(
        "{}import duckdb, os, tempfile\nd = tempfile.mkdtemp()\n\
         for o in s3.list_objects_v2(Bucket='lake', Prefix='events/')['Contents']:\n    \
             p = os.path.join(d, o['Key']); os.makedirs(os.path.dirname(p), exist_ok=True)\n    \
             s3.download_file('lake', o['Key'], p)\n\
         print(duckdb.sql(f\"SELECT count(*), count(DISTINCT id), sum((amount = id % 97 + 0.5)::INT), \
         count(DISTINCT filename.split('/')[-3]) FROM read_parquet('{{d}}/events/orders/*/*.parquet', union_by_name=true, filename=true)\").fetchall())",
        moto.boto()
    ));
    assert_eq!(check.trim(), "[(3000, 3000, 3000, 1)]", "one table folder, every row right");
    let (_, metrics) = server.get("/api/streams/f/metrics").await;
    assert_eq!(metrics["state"], "running", "{metrics}");
}

/// Push `n` events (`id`, `name` with a comma and a quote, `amount`) to stream `name`.
async fn push_events(server: &Server, name: &str, key: &str, n: usize) {
    for chunk in (0..n).collect::<Vec<_>>().chunks(50) {
        let body: Vec<String> = chunk
            .iter()
            .map(|i| json!({"id": i, "name": format!("n, \"{i}\""), "amount": *i as f64 / 4.0}).to_string())
            .collect();
        let (status, body) = server.push(name, key, body.join("\n")).await;
        assert_eq!(status, 202, "{body}");
    }
}

/// Read files (their bytes, hex) with duckdb after writing them to a temporary folder:
/// `rows distinct_ids names_right amounts_right`.
fn duckdb_check(files: &[(String, Vec<u8>)], reader: &str) -> String {
    let files: Vec<Value> = files.iter().map(|(n, b)| json!([n.replace('/', "_"), hex::encode(b)])).collect();
    py(&format!(
        "import duckdb, os, tempfile, json\nd = tempfile.mkdtemp()\n\
         for name, data in json.loads({files:?}):\n    open(os.path.join(d, name), 'wb').write(bytes.fromhex(data))\n\
         q = \"\"\"SELECT count(*), count(DISTINCT id), sum((name = 'n, \"' || id || '\"')::INT), \
         sum((amount = id / 4)::INT) FROM {reader}('DIR/*')\"\"\"\n\
         print(*duckdb.sql(q.replace('DIR', d)).fetchone())",
        files = Value::Array(files).to_string()
    ))
    .trim()
    .to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn csv_gzip_on_azure_blob_and_json_lines_on_gcs_read_back() {
    let azurite = Azurite::start();
    azurite.create_container("lake");
    let gcs = FakeGcs::start();
    gcs.create_bucket("lake");
    let dir = DataDir::new("dest-files-cloud");
    let server = Server::start(&dir.0).await;
    let azure = json!({
        "kind": "files", "location": "az://lake/exports", "format": "csv", "compression": "gzip",
        "rotate": {"rows": 100, "seconds": 1},
        "azure": {"account": azurite::ACCOUNT, "access_key": azurite::KEY, "endpoint": azurite.endpoint()},
    });
    let key_a = server.create_stream(json!({"name": "a", "table": "orders", "destination": azure})).await;
    let google = json!({
        "kind": "files", "location": "gs://lake/raw", "format": "jsonl", "path": "{stream}/{table}-{uuid}.{ext}",
        "rotate": {"rows": 100, "seconds": 1}, "gcs": {"endpoint": gcs.endpoint()},
    });
    let key_g = server.create_stream(json!({"name": "g", "table": "orders", "destination": google})).await;
    let (_, listed) = server.get("/api/streams").await;
    assert!(!listed.to_string().contains(azurite::KEY), "the account key is never shown: {listed}");

    push_events(&server, "a", &key_a, 450).await;
    push_events(&server, "g", &key_g, 450).await;
    // The last files close by age (1 s) while nothing more arrives.
    let rows_in = |names: &[String], bytes: &dyn Fn(&str) -> Vec<u8>, gz: bool| -> usize {
        names
            .iter()
            .map(|n| {
                let data = bytes(n);
                let text = if gz {
                    let mut s = String::new();
                    std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&data[..]), &mut s).unwrap();
                    s
                } else {
                    String::from_utf8(data).unwrap()
                };
                text.lines().count() - usize::from(gz)
            })
            .sum()
    };
    wait_until("450 rows in CSV files on Azurite", Duration::from_secs(60), || async {
        let names = azurite.list("lake", "exports/");
        rows_in(&names, &|n| azurite.download("lake", n), true) >= 450
    })
    .await;
    wait_until("450 rows in JSON lines on GCS", Duration::from_secs(60), || async {
        let names = gcs.list("lake", "raw/");
        rows_in(&names, &|n| gcs.download("lake", n), false) >= 450
    })
    .await;

    let blobs = azurite.list("lake", "exports/");
    assert!(blobs.len() >= 4, "rotated by 100 rows: {blobs:?}");
    assert!(blobs.iter().all(|b| b.starts_with("exports/orders/") && b.ends_with(".csv.gz")), "{blobs:?}");
    let files: Vec<(String, Vec<u8>)> = blobs.iter().map(|b| (b.clone(), azurite.download("lake", b))).collect();
    assert_eq!(duckdb_check(&files, "read_csv"), "450 450 450 450", "gzip CSV read back by duckdb");

    let objects = gcs.list("lake", "raw/");
    assert!(objects.len() >= 4, "rotated by 100 rows: {objects:?}");
    assert!(objects.iter().all(|o| o.starts_with("raw/g/orders-") && o.ends_with(".jsonl")), "{objects:?}");
    let files: Vec<(String, Vec<u8>)> = objects.iter().map(|o| (o.clone(), gcs.download("lake", o))).collect();
    assert_eq!(duckdb_check(&files, "read_json"), "450 450 450 450", "JSON lines read back by duckdb");
}

/// A Debezium change for `public.items` at `lsn`, as a pushed key/value pair.
fn change(op: &str, lsn: u64, id: i64, before: Value, after: Value) -> String {
    let value = json!({
        "before": before, "after": after, "op": op, "ts_ms": 1_700_000_000_000u64 + lsn,
        "source": {"version": "3.6.3.Final", "connector": "postgresql", "name": "dbserver1",
                   "ts_ms": 1_700_000_000_000u64 + lsn, "snapshot": "false",
                   "db": "inventory", "schema": "public", "table": "items", "txId": 700 + lsn, "lsn": lsn},
    });
    json!({"key": {"id": id}, "value": value}).to_string()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_mirror_stream_writes_change_files_with_an_op_column() {
    let dir = DataDir::new("dest-files-mirror");
    let out = DataDir::new("dest-files-mirror-out");
    let server = Server::start(&dir.0).await;
    let destination = json!({"kind": "files", "location": out.0, "format": "parquet", "rotate": {"seconds": 1}});
    let key = server
        .create_stream(json!({"name": "m", "table": "[table]", "mode": "mirror", "format": "debezium",
                              "keys": ["id"], "destination": destination, "flush": {"max_wait_ms": 20}}))
        .await;
    let row = |id: i64, qty: i64| json!({"id": id, "qty": qty});
    let changes = [
        change("c", 10, 1, Value::Null, row(1, 1)),
        change("c", 11, 2, Value::Null, row(2, 2)),
        change("u", 12, 1, row(1, 1), row(1, 10)),
        change("d", 13, 2, row(2, 2), Value::Null),
    ];
    let (status, body) = server.push("m", &key, changes.join("\n")).await;
    assert_eq!(status, 202, "{body}");
    let read = || {
        py(&format!(
            "import duckdb, glob\nfiles = glob.glob({:?} + '/items/*/*.parquet')\n\
             if files:\n    \
                 for r in duckdb.sql(f\"SELECT id, qty, _sluice_op FROM read_parquet({{files}}) ORDER BY id\").fetchall(): print(*r)",
            out.0.display().to_string()
        ))
    };
    wait_until("a change file", Duration::from_secs(30), || async { !read().is_empty() }).await;
    // Within a unit the last change per key wins: key 1 upserted with its last image, key 2 deleted.
    assert_eq!(read().trim(), "1 10 upsert\n2 None delete");
    // The destination's figures: what it was handed, and nothing left in open files.
    let (_, metrics) = server.get("/api/streams/m/metrics").await;
    let d = &metrics["destination"];
    assert_eq!((d["rows"].as_f64(), d["deletes"].as_f64()), (Some(1.0), Some(1.0)), "{metrics}");
    assert!(d["writes"].as_f64() >= Some(1.0) && d["load_ms"].as_f64() > Some(0.0), "{metrics}");
    wait_until("no pending rows", Duration::from_secs(10), || async {
        server.get("/api/streams/m/metrics").await.1["destination"]["pending_rows"].as_f64() == Some(0.0)
    })
    .await;
    let prometheus = server.http.get(server.url("/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(prometheus.contains("sluice_stream_destination_rows{stream=\"m\"} 1"), "{prometheus}");
}

/// The bucket goes away while events are pushed: pushes are still answered (the rows wait in
/// the spool, which the figures show), and once the bucket is back every row reaches it once.
#[tokio::test(flavor = "multi_thread")]
async fn a_missing_bucket_holds_rows_in_the_spool_until_it_is_back() {
    let moto = Moto::start();
    let dir = DataDir::new("dest-files-outage");
    let server = Server::start(&dir.0).await;
    let destination = json!({
        "kind": "files", "location": "s3://late/events", "format": "jsonl", "rotate": {"rows": 100, "seconds": 1},
        "s3": {"endpoint": moto.endpoint, "access_key_id": "test", "secret_access_key": "test"},
    });
    let key = server.create_stream(json!({"name": "o", "table": "t", "destination": destination})).await;
    push_events(&server, "o", &key, 300).await;
    wait_until("rows held in the spool", Duration::from_secs(30), || async {
        server.get("/api/streams/o/metrics").await.1["destination"]["pending_rows"].as_f64() == Some(300.0)
    })
    .await;
    py(&format!("{}s3.create_bucket(Bucket='late')", moto.boto()));
    let count = || {
        py(&format!(
            "{}import json\nids = []\n\
             for o in s3.list_objects_v2(Bucket='late', Prefix='events/').get('Contents', []):\n    \
                 ids += [json.loads(l)['id'] for l in s3.get_object(Bucket='late', Key=o['Key'])['Body'].read().splitlines()]\n\
             print(len(ids), len(set(ids)))",
            moto.boto()
        ))
        .trim()
        .to_string()
    };
    wait_until("every row in the bucket", Duration::from_secs(60), || async { count() == "300 300" }).await;
    wait_until("an empty spool", Duration::from_secs(10), || async {
        server.get("/api/streams/o/metrics").await.1["destination"]["pending_rows"].as_f64() == Some(0.0)
    })
    .await;
}
