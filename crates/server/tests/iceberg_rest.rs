//! A throwaway Iceberg REST catalog (lakana-server, from PyPI, with its metadata in a throwaway
//! PostgreSQL), started by `scripts/iceberg-rest-up.sh`, and pyiceberg reading what Sluice
//! wrote: a reader Sluice did not write.

use std::collections::HashMap;
use std::process::Command;

use serde_json::{Value, json};

use crate::harness::DataDir;

pub struct IcebergRest {
    pub uri: String,
    pub warehouse: String,
    pub token: String,
    /// The S3 server of the warehouse's files, when they are on one.
    s3: Option<String>,
    dir: DataDir,
}

impl IcebergRest {
    /// A catalog whose files are in a local folder.
    pub fn start() -> Self {
        Self::start_on(None)
    }

    /// A catalog whose files are in `bucket` of the S3 server at `endpoint` (moto; key test/test).
    pub fn start_on_s3(endpoint: &str, bucket: &str) -> Self {
        Self::start_on(Some((endpoint, bucket)))
    }

    fn start_on(s3: Option<(&str, &str)>) -> Self {
        let dir = DataDir::new("iceberg-rest");
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/iceberg-rest-up.sh");
        let mut command = Command::new("bash");
        command.args([script, dir.0.to_str().unwrap(), &port.to_string()]);
        if let Some((endpoint, bucket)) = s3 {
            command
                .env("ICEBERG_REST_S3_ROOT", format!("s3://{bucket}/warehouse"))
                .env("ICEBERG_REST_S3_ENDPOINT", endpoint);
        }
        let out = command.output().unwrap();
        assert!(out.status.success(), "iceberg-rest-up.sh: {}", String::from_utf8_lossy(&out.stderr));
        let vars: HashMap<String, String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())))
            .collect();
        Self {
            uri: vars["ICEBERG_REST_URI"].clone(),
            warehouse: vars["ICEBERG_REST_WAREHOUSE"].clone(),
            token: vars["ICEBERG_REST_TOKEN"].clone(),
            s3: s3.map(|(endpoint, _)| endpoint.to_string()),
            dir,
        }
    }

    /// A destination into namespace `bronze` (lakana keeps tables under bronze, silver, gold).
    pub fn destination(&self) -> Value {
        // Compaction on demand only, and of tables of two files or more.
        let mut destination = json!({"kind": "iceberg", "endpoint": self.uri, "warehouse": self.warehouse,
                                     "token": self.token, "namespace": "bronze", "simple_create": true,
                                     "compaction": {"every_s": 0, "min_files": 2}});
        if let Some(endpoint) = &self.s3 {
            destination["s3"] = json!({"endpoint": endpoint, "access_key_id": "test", "secret_access_key": "test"});
        }
        destination
    }

    /// The rows of `sql` over the table `bronze.<table>` (as `t`), read by pyiceberg into Arrow
    /// and queried by Python's duckdb: `|`-joined values, NULL as `-`; `None` while the table
    /// cannot be read (not made yet).
    pub fn read(&self, table: &str, sql: &str) -> Option<Vec<String>> {
        let script = format!(
            "import sys, duckdb\n\
             from pyiceberg.catalog.rest import RestCatalog\n\
             c = RestCatalog('sluice', uri={uri:?}, warehouse={wh:?}, token={token:?}, **{files})\n\
             try:\n    t = c.load_table('bronze.{table}').scan().to_arrow()\n\
             except Exception as e:\n    print(e, file=sys.stderr); sys.exit(3)\n\
             for r in duckdb.sql({sql:?}).fetchall():\n    print('|'.join('-' if v is None else str(v) for v in r))\n",
            uri = self.uri,
            wh = self.warehouse,
            token = self.token,
            files = self.s3.as_ref().map_or_else(
                || "{}".to_string(),
                |e| format!(
                    "{{'s3.endpoint': {e:?}, 's3.access-key-id': 'test', 's3.secret-access-key': 'test', \
                     's3.region': 'us-east-1', 's3.path-style-access': 'true'}}"
                )
            ),
        );
        let python = std::env::var("PYTOOLS_PYTHON").expect("PYTOOLS_PYTHON: run the tests through scripts/test.sh");
        let out = Command::new(python).args(["-c", &script]).output().expect("run python");
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect())
    }

    pub fn count(&self, table: &str) -> i64 {
        self.read(table, "SELECT count(*) FROM t").and_then(|l| l.first().and_then(|n| n.parse().ok())).unwrap_or(0)
    }
}

impl Drop for IcebergRest {
    /// lakana killed, then its PostgreSQL told to stop at once (SIGQUIT: immediate shutdown),
    /// so neither outlives the test.
    fn drop(&mut self) {
        if let Ok(pids) = std::fs::read_to_string(self.dir.0.join("pids")) {
            let pids: Vec<&str> = pids.split_whitespace().collect();
            if let Some(lakana) = pids.first() {
                let _ = Command::new("kill").args(["-KILL", lakana]).status();
            }
            if let Some(postgres) = pids.get(1) {
                let _ = Command::new("kill").args(["-QUIT", postgres]).status();
            }
        }
    }
}
