//! Azurite 3.35.0 (Microsoft's Azure Storage emulator, Blob service only) on a free 127.0.0.1
//! port, in memory, one per test; scripts/services/azurite.sh installs it. Blobs are read back
//! with the Python azure-storage-blob package (scripts/services/pytools.sh), independent of the
//! Rust client under test.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::moto::py;

/// The emulator's well-known development account.
pub const ACCOUNT: &str = "devstoreaccount1";
/// Its well-known key (public, the same in every Azurite).
pub const KEY: &str = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

pub struct Azurite {
    pub port: u16,
    child: Child,
}

impl Azurite {
    pub fn start() -> Self {
        let main = std::env::var("AZURITE_BLOB_MAIN")
            .expect("AZURITE_BLOB_MAIN: run the tests through scripts/test.sh, which installs Azurite");
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        // --disableTelemetry: without it Azurite calls an Application Insights host on the
        // internet. --skipApiVersionCheck: SDKs newer than the emulator send newer versions.
        // Its log and debug files stay off (they would land in the working directory).
        let child = Command::new("node")
            .arg(main)
            .args(["--blobHost", "127.0.0.1", "--blobPort", &port.to_string()])
            .args(["--disableTelemetry", "--skipApiVersionCheck", "--loose", "--inMemoryPersistence", "--silent"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start Azurite (node)");
        let azurite = Self { port, child };
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "Azurite did not listen on {port}");
            std::thread::sleep(Duration::from_millis(50));
        }
        azurite
    }

    /// The Blob service of the development account: `http://127.0.0.1:PORT/devstoreaccount1`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}/{ACCOUNT}", self.port)
    }

    /// A connection string for Azure SDKs and tools.
    pub fn connection_string(&self) -> String {
        format!(
            "DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};BlobEndpoint={};",
            self.endpoint()
        )
    }

    /// A Python prelude with `svc`, a BlobServiceClient on this emulator.
    pub fn python(&self) -> String {
        format!(
            "from azure.storage.blob import BlobServiceClient\n\
             svc = BlobServiceClient.from_connection_string({:?})\n",
            self.connection_string()
        )
    }

    /// Create a container (names: 3 to 63 lowercase letters, digits and dashes).
    pub fn create_container(&self, name: &str) {
        py(&format!("{}svc.create_container({name:?})\n", self.python()));
    }

    /// The names of the blobs in `container` that start with `prefix`, sorted.
    pub fn list(&self, container: &str, prefix: &str) -> Vec<String> {
        let out = py(&format!(
            "{}import json\n\
             c = svc.get_container_client({container:?})\n\
             print(json.dumps(sorted(b.name for b in c.list_blobs(name_starts_with={prefix:?}))))\n",
            self.python()
        ));
        serde_json::from_str(out.trim()).expect("blob names as JSON")
    }

    /// A blob's bytes.
    pub fn download(&self, container: &str, name: &str) -> Vec<u8> {
        let out = py(&format!(
            "{}c = svc.get_container_client({container:?})\n\
             print(c.download_blob({name:?}).readall().hex())\n",
            self.python()
        ));
        hex::decode(out.trim()).expect("blob bytes as hex")
    }

    /// Upload `bytes` as a block blob, replacing one that exists.
    pub fn upload(&self, container: &str, name: &str, bytes: &[u8]) {
        py(&format!(
            "{}c = svc.get_container_client({container:?})\n\
             c.upload_blob({name:?}, bytes.fromhex({:?}), overwrite=True)\n",
            self.python(),
            hex::encode(bytes)
        ));
    }
}

impl Drop for Azurite {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn azurite_starts_and_round_trips() {
    let azurite = Azurite::start();
    azurite.create_container("sluice-test");
    let body: Vec<u8> = (0..=255u8).chain(*b"\r\n\0 end").collect();
    azurite.upload("sluice-test", "dir/a b+c.bin", &body);
    azurite.upload("sluice-test", "dir/sub/two.csv", b"x\n1\n");
    azurite.upload("sluice-test", "other.txt", b"");
    assert_eq!(azurite.list("sluice-test", "dir/"), ["dir/a b+c.bin", "dir/sub/two.csv"]);
    assert_eq!(azurite.list("sluice-test", ""), ["dir/a b+c.bin", "dir/sub/two.csv", "other.txt"]);
    assert_eq!(azurite.download("sluice-test", "dir/a b+c.bin"), body);
    assert_eq!(azurite.download("sluice-test", "other.txt"), b"");
    // The key really is checked: a wrong one is refused.
    let wrong = azurite.python().replace(KEY, &KEY.replace('E', "F"));
    let out = py(&format!(
        "{wrong}from azure.core.exceptions import HttpResponseError\n\
         try:\n    list(svc.list_containers())\n    print('accepted')\n\
         except HttpResponseError as e:\n    print(e.status_code)\n"
    ));
    assert_eq!(out.trim(), "403");
}
