//! fake-gcs-server 1.54.0 (a Google Cloud Storage emulator speaking the JSON API) on a free
//! 127.0.0.1 port, in memory, one per test; scripts/services/gcs.sh installs it. The helpers
//! read through the JSON API with Python's urllib (the pytools venv), independent of the Rust
//! client under test.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use sluice_connectors::files::gcs::{GcsClient, GcsConfig};
use sluice_core::ErrorKind;

use crate::moto::py;

pub struct FakeGcs {
    pub port: u16,
    child: Child,
}

impl FakeGcs {
    pub fn start() -> Self {
        let bin = std::env::var("FAKE_GCS_SERVER")
            .expect("FAKE_GCS_SERVER: run the tests through scripts/test.sh, which installs fake-gcs-server");
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let host = format!("127.0.0.1:{port}");
        // -scheme and -host: the defaults are https on 0.0.0.0.
        let child = Command::new(bin)
            .args(["-scheme", "http", "-host", "127.0.0.1", "-port", &port.to_string(), "-backend", "memory"])
            .args(["-public-host", &host, "-external-url", &format!("http://{host}"), "-log-level", "warn"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start fake-gcs-server");
        let gcs = Self { port, child };
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "fake-gcs-server did not listen on {port}");
            std::thread::sleep(Duration::from_millis(50));
        }
        gcs
    }

    /// The JSON API's base URL, `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// A Python prelude with `call(method, path, body=None)` (the response's bytes) and `q`
    /// (percent-encoding of a name as one path segment or query value).
    fn python(&self) -> String {
        format!(
            "import json, urllib.request, urllib.parse\n\
             def call(method, path, body=None):\n    \
                 req = urllib.request.Request({:?} + path, data=body, method=method)\n    \
                 with urllib.request.urlopen(req, timeout=30) as r:\n        return r.read()\n\
             q = lambda s: urllib.parse.quote(s, safe='')\n",
            self.endpoint()
        )
    }

    pub fn create_bucket(&self, name: &str) {
        py(&format!(
            "{}call('POST', '/storage/v1/b?project=test', json.dumps({{'name': {name:?}}}).encode())\n",
            self.python()
        ));
    }

    /// The names of the objects in `bucket` that start with `prefix`, sorted (every page).
    pub fn list(&self, bucket: &str, prefix: &str) -> Vec<String> {
        let out = py(&format!(
            "{}names, token = [], ''\n\
             while True:\n    \
                 page = json.loads(call('GET', '/storage/v1/b/' + q({bucket:?}) + '/o?prefix=' + q({prefix:?}) + token))\n    \
                 names += [o['name'] for o in page.get('items', [])]\n    \
                 if not page.get('nextPageToken'): break\n    \
                 token = '&pageToken=' + q(page['nextPageToken'])\n\
             print(json.dumps(sorted(names)))\n",
            self.python()
        ));
        serde_json::from_str(out.trim()).expect("object names as JSON")
    }

    /// An object's bytes.
    pub fn download(&self, bucket: &str, name: &str) -> Vec<u8> {
        let out = py(&format!(
            "{}print(call('GET', '/storage/v1/b/' + q({bucket:?}) + '/o/' + q({name:?}) + '?alt=media').hex())\n",
            self.python()
        ));
        hex::decode(out.trim()).expect("object bytes as hex")
    }

    /// Upload `bytes` as `name` (a media upload).
    pub fn upload(&self, bucket: &str, name: &str, bytes: &[u8]) {
        py(&format!(
            "{}call('POST', '/upload/storage/v1/b/' + q({bucket:?}) + '/o?uploadType=media&name=' + q({name:?}), \
             bytes.fromhex({:?}))\n",
            self.python(),
            hex::encode(bytes)
        ));
    }

    /// A Sluice client of `bucket` here.
    pub fn client(&self, bucket: &str) -> GcsClient {
        GcsClient::new(&GcsConfig { endpoint: Some(self.endpoint()), token: None }, bucket).unwrap()
    }
}

impl Drop for FakeGcs {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn gcs_starts_and_round_trips() {
    let gcs = FakeGcs::start();
    gcs.create_bucket("sluice-test");
    let body: Vec<u8> = (0..=255u8).chain(*b"\r\n\0 end").collect();
    gcs.upload("sluice-test", "dir/a b+c?.bin", &body);
    gcs.upload("sluice-test", "dir/sub/two.csv", b"x\n1\n");
    gcs.upload("sluice-test", "other.txt", b"");
    assert_eq!(gcs.list("sluice-test", "dir/"), ["dir/a b+c?.bin", "dir/sub/two.csv"]);
    assert_eq!(gcs.list("sluice-test", ""), ["dir/a b+c?.bin", "dir/sub/two.csv", "other.txt"]);
    assert_eq!(gcs.download("sluice-test", "dir/a b+c?.bin"), body);
    assert_eq!(gcs.download("sluice-test", "other.txt"), b"");
}

#[tokio::test(flavor = "multi_thread")]
async fn gcs_client_puts_gets_and_deletes() {
    let gcs = FakeGcs::start();
    gcs.create_bucket("sluice-test");
    let client = gcs.client("sluice-test");

    // Names with every character that needs encoding, in the query (upload) and the path.
    let names = ["orders/date=2026-11-30/part 0+1?#&%.parquet", "é/ü/ß.csv", "plain.jsonl"];
    let big: Vec<u8> = (0..3 << 20).map(|i: u32| (i.wrapping_mul(2_654_435_761) >> 24) as u8).collect();
    for name in names {
        client.put(name, Bytes::from(format!("body of {name}"))).await.unwrap();
    }
    client.put("big/blob.bin", Bytes::from(big.clone())).await.unwrap();
    client.put("empty", Bytes::new()).await.unwrap();

    // Read back independently, then through the client.
    let mut listed = names.map(String::from).to_vec();
    listed.extend(["big/blob.bin".into(), "empty".into()]);
    listed.sort();
    assert_eq!(gcs.list("sluice-test", ""), listed);
    for name in names {
        assert_eq!(gcs.download("sluice-test", name), format!("body of {name}").as_bytes());
        assert_eq!(client.get(name).await.unwrap().unwrap(), format!("body of {name}").as_bytes());
    }
    assert_eq!(gcs.download("sluice-test", "big/blob.bin"), big);
    assert_eq!(client.get("big/blob.bin").await.unwrap().unwrap(), big);
    assert_eq!(client.get("empty").await.unwrap().unwrap(), b"");
    assert_eq!(client.get("missing/x").await.unwrap(), None);

    // A put replaces; a delete removes; deleting what is gone is fine.
    client.put(names[0], Bytes::from_static(b"second")).await.unwrap();
    assert_eq!(gcs.download("sluice-test", names[0]), b"second");
    client.delete(names[0]).await.unwrap();
    client.delete(names[0]).await.unwrap();
    assert_eq!(client.get(names[0]).await.unwrap(), None);
    assert!(!gcs.list("sluice-test", "orders/").contains(&names[0].to_string()));

    // A missing bucket is the config's fault; a dead endpoint is retryable.
    let err = gcs.client("no-such-bucket").put("a", Bytes::from_static(b"x")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    let port = gcs.port;
    drop(gcs);
    let dead =
        GcsClient::new(&GcsConfig { endpoint: Some(format!("http://127.0.0.1:{port}")), token: None }, "sluice-test")
            .unwrap();
    let err = dead.put("a", Bytes::from_static(b"x")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Connect, "{err}");
    assert!(err.is_retryable());
}
