//! A throwaway ClickHouse server (Debian's 18.16; scripts/services/clickhouse.sh installs it) on
//! free 127.0.0.1 ports, read back with `clickhouse-client`.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct ClickHouse {
    pub dir: PathBuf,
    pub http: u16,
    pub tcp: u16,
    child: Child,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl ClickHouse {
    pub fn start() -> Self {
        let dir = std::env::temp_dir().join(format!("sluice-ch-{:x}", rand::random::<u64>()));
        std::fs::create_dir_all(dir.join("data")).unwrap();
        std::fs::create_dir_all(dir.join("log")).unwrap();
        let (http, tcp) = (free_port(), free_port());
        let config = std::fs::read_to_string("/etc/clickhouse-server/config.xml").expect("clickhouse-server installed");
        let data = format!("{}/", dir.join("data").display());
        let log = format!("{}/", dir.join("log").display());
        let config = config
            .replace("/var/lib/clickhouse/", &data)
            .replace("/var/log/clickhouse-server/", &log)
            .replace("<http_port>8123</http_port>", &format!("<http_port>{http}</http_port>"))
            .replace("<tcp_port>9000</tcp_port>", &format!("<tcp_port>{tcp}</tcp_port>"))
            .replace("<interserver_http_port>9009</interserver_http_port>", "")
            .replace("<listen_host>::1</listen_host>", "");
        std::fs::write(dir.join("config.xml"), config).unwrap();
        std::fs::copy("/etc/clickhouse-server/users.xml", dir.join("users.xml")).unwrap();
        let server = std::env::var("CLICKHOUSE_SERVER_BIN").unwrap_or_else(|_| "clickhouse-server".into());
        let config_arg = format!("--config-file={}", dir.join("config.xml").display());
        // As root, the server runs as its own user (it refuses to run as another owner's files).
        let root = Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.starts_with(b"0"));
        let mut cmd = if root {
            Command::new("chown").args(["-R", "clickhouse:clickhouse"]).arg(&dir).status().unwrap();
            let mut c = Command::new("setpriv");
            c.args(["--reuid=clickhouse", "--regid=clickhouse", "--init-groups", &server, &config_arg]);
            c
        } else {
            let mut c = Command::new(&server);
            c.arg(&config_arg);
            c
        };
        let child = cmd.stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("start clickhouse-server");
        let ch = Self { dir, http, tcp, child };
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(("127.0.0.1", tcp)).is_err() || ch.try_lines("SELECT 1").is_none() {
            assert!(Instant::now() < deadline, "ClickHouse did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
        ch
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.http)
    }

    /// Rows of `sql`, or `None` when it fails (a table not created yet).
    pub fn try_lines(&self, sql: &str) -> Option<Vec<String>> {
        let out = Command::new("clickhouse-client")
            .args(["--host", "127.0.0.1", "--port", &self.tcp.to_string(), "--format", "TSV", "--query", sql])
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).lines().map(|l| l.replace('\t', "|")).collect())
    }

    /// Rows of `sql` from `clickhouse-client`, tab-separated values joined with `|`.
    pub fn lines(&self, sql: &str) -> Vec<String> {
        let out = Command::new("clickhouse-client")
            .args(["--host", "127.0.0.1", "--port", &self.tcp.to_string(), "--format", "TSV", "--query", sql])
            .output()
            .expect("run clickhouse-client");
        assert!(out.status.success(), "{sql}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).lines().map(|l| l.replace('\t', "|")).collect()
    }

    /// The number `sql` returns, or `None` when it fails.
    pub fn try_count(&self, sql: &str) -> Option<i64> {
        self.try_lines(sql)?.first()?.parse().ok()
    }

    /// Rows in `table`, 0 while it does not exist.
    pub fn count(&self, table: &str) -> i64 {
        self.try_lines(&format!("SELECT count() FROM {table}"))
            .and_then(|l| l.first().and_then(|n| n.parse().ok()))
            .unwrap_or(0)
    }
}

impl Drop for ClickHouse {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
