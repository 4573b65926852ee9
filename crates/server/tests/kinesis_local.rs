//! A real Kinesis emulator for tests: kinesis-local 0.6.2 (npm), installed by scripts/test.sh,
//! started per test on free ports; and an AWS SDK client as the independent producer.

use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::{PutRecordsRequestEntry, ScalingType, StreamStatus};
use serde_json::{Value, json};

use crate::harness::wait_until;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

pub struct KinesisLocal {
    child: Child,
    pub endpoint: String,
    pub client: Client,
}

impl KinesisLocal {
    pub async fn start() -> Self {
        let dir = std::env::var("KINESIS_LOCAL_DIR").expect(
            "KINESIS_LOCAL_DIR is not set: run the tests through scripts/test.sh, which installs kinesis-local",
        );
        let (plain, tls) = (free_port(), free_port());
        let mut cmd = Command::new("node");
        cmd.arg(format!("{dir}/main.js"))
            .env("KINESIS_MOCK_CERT_PATH", format!("{dir}/server.json"))
            .env("KINESIS_MOCK_PLAIN_PORT", plain.to_string())
            .env("KINESIS_MOCK_TLS_PORT", tls.to_string())
            .env("LOG_LEVEL", "WARN")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        for op in ["CREATE_STREAM", "DELETE_STREAM", "SPLIT_SHARD", "MERGE_SHARDS", "UPDATE_SHARD_COUNT"] {
            cmd.env(format!("{op}_DURATION"), "50ms");
        }
        let child = cmd.spawn().expect("start kinesis-local");
        let deadline = Instant::now() + Duration::from_secs(60);
        while TcpStream::connect(("127.0.0.1", plain)).is_err() {
            assert!(Instant::now() < deadline, "kinesis-local did not listen on {plain}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let endpoint = format!("http://127.0.0.1:{plain}");
        let config = aws_sdk_kinesis::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new("us-east-1"))
            .credentials_provider(Credentials::new("test", "test", None, None, "tests"))
            .endpoint_url(&endpoint)
            .build();
        Self { child, endpoint, client: Client::from_conf(config) }
    }

    /// The source config of a Sluice stream reading `stream` here.
    pub fn source(&self, stream: &str) -> Value {
        json!({
            "type": "kinesis",
            "stream": stream,
            "region": "us-east-1",
            "endpoint": self.endpoint,
            "credentials": {"access_key_id": "test", "secret_access_key": "test"},
            "poll_interval_ms": 50,
        })
    }

    pub async fn create_stream(&self, name: &str, shards: i32) {
        self.client.create_stream().stream_name(name).shard_count(shards).send().await.unwrap();
        self.wait_active(name).await;
    }

    pub async fn wait_active(&self, name: &str) {
        wait_until("the stream to be ACTIVE", Duration::from_secs(30), || async {
            let d = self.client.describe_stream_summary().stream_name(name).send().await.unwrap();
            d.stream_description_summary().is_some_and(|s| s.stream_status() == &StreamStatus::Active)
        })
        .await;
    }

    /// Open shards as (id, starting hash key, ending hash key).
    pub async fn open_shards(&self, name: &str) -> Vec<(String, u128, u128)> {
        let out = self.client.list_shards().stream_name(name).send().await.unwrap();
        out.shards()
            .iter()
            .filter(|s| s.sequence_number_range().and_then(|r| r.ending_sequence_number()).is_none())
            .map(|s| {
                let r = s.hash_key_range().unwrap();
                (s.shard_id().to_string(), r.starting_hash_key().parse().unwrap(), r.ending_hash_key().parse().unwrap())
            })
            .collect()
    }

    pub async fn split(&self, name: &str) {
        let (id, lo, hi) = self.open_shards(name).await.remove(0);
        let mid = lo + (hi - lo) / 2;
        self.client
            .split_shard()
            .stream_name(name)
            .shard_to_split(&id)
            .new_starting_hash_key(mid.to_string())
            .send()
            .await
            .unwrap();
        self.wait_active(name).await;
    }

    /// Merge the first two adjacent open shards.
    pub async fn merge(&self, name: &str) {
        let mut open = self.open_shards(name).await;
        open.sort_by_key(|s| s.1);
        let pair = open.windows(2).find(|w| w[0].2 + 1 == w[1].1).expect("two adjacent open shards");
        self.client
            .merge_shards()
            .stream_name(name)
            .shard_to_merge(&pair[0].0)
            .adjacent_shard_to_merge(&pair[1].0)
            .send()
            .await
            .unwrap();
        self.wait_active(name).await;
    }

    pub async fn update_shard_count(&self, name: &str, count: i32) {
        self.client
            .update_shard_count()
            .stream_name(name)
            .target_shard_count(count)
            .scaling_type(ScalingType::UniformScaling)
            .send()
            .await
            .unwrap();
        self.wait_active(name).await;
    }

    /// PutRecords of (partition key, data).
    pub async fn put(&self, name: &str, records: &[(String, Vec<u8>)]) {
        self.producer().put(name, records).await;
    }

    /// A producer that can move to another task.
    pub fn producer(&self) -> Producer {
        Producer { client: self.client.clone() }
    }
}

/// The independent producer: the AWS SDK's PutRecords.
pub struct Producer {
    client: Client,
}

impl Producer {
    /// PutRecords of (partition key, data), retrying entries the emulator refuses.
    pub async fn put(&self, name: &str, records: &[(String, Vec<u8>)]) {
        for chunk in records.chunks(500) {
            let mut pending: Vec<&(String, Vec<u8>)> = chunk.iter().collect();
            while !pending.is_empty() {
                let entries = pending
                    .iter()
                    .map(|(k, d)| PutRecordsRequestEntry::builder().partition_key(k).data(Blob::new(d.clone())).build())
                    .collect::<Result<Vec<_>, _>>()
                    .unwrap();
                let out = self.client.put_records().stream_name(name).set_records(Some(entries)).send().await.unwrap();
                pending = pending
                    .into_iter()
                    .zip(out.records())
                    .filter(|(_, r)| r.error_code().is_some())
                    .map(|(p, _)| p)
                    .collect();
            }
        }
    }
}

impl Drop for KinesisLocal {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A fault injector in front of the emulator (kinesis-local never throttles, and its iterators
/// expire only after 300 s): it forwards every call, but answers every `every`-th GetRecords
/// with the AWS error `code`.
pub struct FaultProxy {
    pub endpoint: String,
    pub injected: std::sync::Arc<std::sync::atomic::AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl FaultProxy {
    pub async fn start(upstream: &str, code: &'static str, every: u64) -> Self {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicU64, Ordering};

        use axum::body::Bytes;
        use axum::http::{HeaderMap, Method, StatusCode, Uri};

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let throttled = Arc::new(AtomicU64::new(0));
        let calls = Arc::new(AtomicU64::new(0));
        let (upstream, http) = (upstream.to_string(), reqwest::Client::new());
        let counter = throttled.clone();
        let app = axum::Router::new().fallback(move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
            let (upstream, http, calls, counter) = (upstream.clone(), http.clone(), calls.clone(), counter.clone());
            async move {
                let target = headers.get("x-amz-target").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
                if target.ends_with(".GetRecords") && calls.fetch_add(1, Ordering::Relaxed) % every == every - 1 {
                    counter.fetch_add(1, Ordering::Relaxed);
                    let body = format!(r#"{{"__type":"{code}","message":"injected by the test"}}"#);
                    return (StatusCode::BAD_REQUEST, [("content-type", "application/x-amz-json-1.1")], body);
                }
                let answer = crate::losing_proxy::forward(&http, &upstream, method, &uri, &headers, body).await;
                let status = StatusCode::from_u16(answer.status().as_u16()).unwrap();
                (status, [("content-type", "application/x-amz-json-1.1")], answer.text().await.unwrap())
            }
        });
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { endpoint, injected: throttled, task }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}
