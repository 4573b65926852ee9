//! A throwaway fakesnow server (PyPI; scripts/services/snowflake.sh installs it), which speaks
//! the REST protocol of Snowflake's drivers over DuckDB, read back with Snowflake's own Python
//! connector.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct FakeSnow {
    pub port: u16,
    child: Child,
}

impl FakeSnow {
    pub fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let bin = std::env::var("FAKESNOW_BIN").expect("FAKESNOW_BIN (source scripts/services/snowflake.sh)");
        let child = Command::new(bin)
            .args(["-s", "--host", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start fakesnow");
        let deadline = Instant::now() + Duration::from_secs(90);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "fakesnow did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
        let snow = Self { port, child };
        snow.lines("CREATE DATABASE IF NOT EXISTS SLUICE; CREATE SCHEMA IF NOT EXISTS SLUICE.PUBLIC");
        snow
    }

    /// A destination into database SLUICE, schema PUBLIC.
    pub fn destination(&self) -> serde_json::Value {
        serde_json::json!({"kind": "snowflake", "url": format!("http://127.0.0.1:{}", self.port), "account": "test",
                           "user": "etl", "password": "etl", "database": "SLUICE", "schema": "PUBLIC"})
    }

    /// Rows of the last of `sql`'s `;`-separated statements, run by the Python connector, as
    /// `|`-joined values (NULL as `-`).
    pub fn lines(&self, sql: &str) -> Vec<String> {
        let python = std::env::var("SNOW_PYTHON").expect("SNOW_PYTHON");
        let script = format!(
            "import snowflake.connector\n\
             c = snowflake.connector.connect(user='etl', password='etl', account='test', host='127.0.0.1', \
             port={port}, protocol='http', database='SLUICE', schema='PUBLIC')\n\
             cur = c.cursor()\n\
             rows = []\n\
             for statement in {sql:?}.split(';'):\n\
             \x20   if statement.strip():\n\
             \x20       rows = cur.execute(statement).fetchall()\n\
             for r in rows:\n\
             \x20   print('|'.join('-' if v is None else str(v) for v in r))\n",
            port = self.port,
        );
        let out = Command::new(python).args(["-c", &script]).output().expect("run python");
        assert!(out.status.success(), "{sql}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect()
    }

    /// Rows in `table`, 0 while it does not exist.
    pub fn count(&self, table: &str) -> i64 {
        let exists = self.lines(&format!(
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'PUBLIC' AND table_name = '{table}'"
        ));
        if exists.first().map(String::as_str) != Some("1") {
            return 0;
        }
        self.lines(&format!("SELECT count(*) FROM \"{table}\""))[0].parse().unwrap()
    }
}

impl Drop for FakeSnow {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
