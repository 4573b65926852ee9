//! moto server (S3) on a free 127.0.0.1 port, and Python readers (duckdb, pyarrow, boto3) that
//! check what Sluice wrote; scripts/services/pytools.sh installs them into a venv.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Moto {
    pub endpoint: String,
    child: Child,
}

/// The venv's Python.
pub fn python() -> String {
    std::env::var("PYTOOLS_PYTHON").expect("PYTOOLS_PYTHON: run the tests through scripts/test.sh")
}

/// Run a Python snippet with the readers; its stdout. The snippet ends with `os._exit(0)`
/// once its output is flushed: pyarrow's and boto3's threads can abort the interpreter's
/// teardown ("terminate called without an active exception") after the work is done, which
/// says nothing about the files read. An exception before that still fails the snippet.
pub fn py(code: &str) -> String {
    let code = format!("{code}\nimport os, sys\nsys.stdout.flush()\nos._exit(0)\n");
    let out = Command::new(python()).args(["-c", &code]).output().expect("run python");
    assert!(out.status.success(), "python failed: {}\n{code}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

impl Moto {
    pub fn start() -> Self {
        let bin = std::env::var("MOTO_SERVER").expect("MOTO_SERVER: run the tests through scripts/test.sh");
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new(bin)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start moto_server");
        let moto = Self { endpoint: format!("http://127.0.0.1:{port}"), child };
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "moto did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
        moto
    }

    /// A Python prelude with an S3 client on this server.
    pub fn boto(&self) -> String {
        format!(
            "import boto3, io\ns3 = boto3.client('s3', endpoint_url='{}', aws_access_key_id='test', \
             aws_secret_access_key='test', region_name='us-east-1')\n",
            self.endpoint
        )
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
