//! An Iceberg SQL catalog for one test: a SQLite file, or the tables of a throwaway PostgreSQL's
//! database, with the warehouse in a local folder. Sluice writes it (through its own REST front
//! for DuckDB); pyiceberg's `SqlCatalog` (through SQLAlchemy) and DuckDB's `iceberg_scan` of
//! the metadata file the catalog points at read it back: readers Sluice did not write.

use std::process::Command;

use serde_json::{Value, json};

use crate::harness::DataDir;
use crate::postgres::Postgres;

pub struct IcebergSql {
    /// pyiceberg's `uri` for the catalog's database.
    uri: String,
    /// The destination's `sql` block.
    sql: Value,
    /// The S3 server (moto; key test/test) of the warehouse, when it is on one.
    s3: Option<String>,
    /// The catalog's folder (the SQLite file, the warehouse), removed with it.
    _dir: DataDir,
}

impl IcebergSql {
    /// A catalog in a SQLite file.
    pub fn sqlite() -> Self {
        let dir = DataDir::new("iceberg-sql");
        let file = dir.0.join("catalog.db");
        let sql = json!({"sqlite": file, "location": format!("file://{}/warehouse", dir.0.display())});
        Self { uri: format!("sqlite:///{}", file.display()), sql, s3: None, _dir: dir }
    }

    /// A catalog in a SQLite file, its tables' files (metadata and data) in `bucket` of the S3
    /// server at `endpoint`.
    pub fn sqlite_on_s3(endpoint: &str, bucket: &str) -> Self {
        let mut catalog = Self::sqlite();
        catalog.sql["location"] = json!(format!("s3://{bucket}/warehouse"));
        catalog.s3 = Some(endpoint.to_string());
        catalog
    }

    /// A catalog in the database `etltest` of `pg`.
    pub fn postgres(pg: &Postgres) -> Self {
        let dir = DataDir::new("iceberg-sql-pg");
        let sql = json!({"host": "127.0.0.1", "port": pg.port, "database": "etltest", "user": "etl",
                         "password": "etl", "sslmode": "disable",
                         "location": format!("file://{}/warehouse", dir.0.display())});
        Self { uri: format!("postgresql+psycopg2://etl:etl@127.0.0.1:{}/etltest", pg.port), sql, s3: None, _dir: dir }
    }

    /// A destination into namespace `bronze` of catalog `lake`; compaction on demand only.
    pub fn destination(&self) -> Value {
        let mut destination = json!({"kind": "iceberg", "sql": self.sql, "warehouse": "lake", "namespace": "bronze",
                                     "compaction": {"every_s": 0, "min_files": 2}});
        if let Some(endpoint) = &self.s3 {
            destination["s3"] = json!({"endpoint": endpoint, "access_key_id": "test", "secret_access_key": "test"});
        }
        destination
    }

    /// pyiceberg's `SqlCatalog` over the catalog (and its S3 server), as Python.
    fn catalog(&self) -> String {
        let files = self.s3.as_ref().map_or_else(String::new, |e| {
            format!(
                ", **{{'s3.endpoint': {e:?}, 's3.access-key-id': 'test', 's3.secret-access-key': 'test', \
                 's3.region': 'us-east-1', 's3.path-style-access': 'true'}}"
            )
        });
        format!("SqlCatalog('lake', uri={:?}, init_catalog_tables='false'{files})", self.uri)
    }

    fn python(&self, script: &str) -> Option<Vec<String>> {
        let python = std::env::var("PYTOOLS_PYTHON").expect("PYTOOLS_PYTHON: run the tests through scripts/test.sh");
        let out = Command::new(python).args(["-c", script]).output().expect("run python");
        if !out.status.success() {
            return None;
        }
        Some(String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect())
    }

    /// The rows of `sql` over `bronze.<table>` (as `t`), read by pyiceberg's SqlCatalog into
    /// Arrow and queried by Python's duckdb: `|`-joined values, NULL as `-`; `None` while the
    /// table cannot be read (not made yet).
    pub fn read(&self, table: &str, sql: &str) -> Option<Vec<String>> {
        self.python(&format!(
            "import sys, duckdb\n\
             from pyiceberg.catalog.sql import SqlCatalog\n\
             c = {catalog}\n\
             try:\n    t = c.load_table('bronze.{table}').scan().to_arrow()\n\
             except Exception as e:\n    print(e, file=sys.stderr); sys.exit(3)\n\
             for r in duckdb.sql({sql:?}).fetchall():\n    print('|'.join('-' if v is None else str(v) for v in r))\n",
            catalog = self.catalog(),
        ))
    }

    /// The rows of `sql` over the table as DuckDB's iceberg extension reads the metadata file
    /// the catalog's row points at (found by pyiceberg).
    pub fn duckdb_read(&self, table: &str, sql: &str) -> Option<Vec<String>> {
        self.python(&format!(
            "import duckdb\n\
             from pyiceberg.catalog.sql import SqlCatalog\n\
             m = {catalog}.load_table('bronze.{table}').metadata_location\n\
             c = duckdb.connect(); c.execute('SET enable_progress_bar = false')\n\
             c.execute(\"SET extension_directory = '{ext}'; SET autoinstall_known_extensions = false; \
             LOAD httpfs; LOAD avro; LOAD iceberg\")\n\
             {secret}\n\
             c.execute(\"CREATE VIEW t AS SELECT * FROM iceberg_scan('\" + m + \"')\")\n\
             for r in c.execute({sql:?}).fetchall():\n    print('|'.join('-' if v is None else str(v) for v in r))\n",
            catalog = self.catalog(),
            ext = std::env::var("SLUICE_DUCKDB_EXTENSIONS").unwrap(),
            secret = self.s3.as_ref().map_or_else(String::new, |e| format!(
                "c.execute(\"CREATE SECRET (TYPE s3, KEY_ID 'test', SECRET 'test', REGION 'us-east-1', \
                 ENDPOINT '{}', URL_STYLE 'path', USE_SSL false)\")",
                e.trim_start_matches("http://")
            )),
        ))
    }

    /// The table's property keys that start with `prefix`, as pyiceberg reads them.
    pub fn property_keys(&self, table: &str, prefix: &str) -> Vec<String> {
        self.python(&format!(
            "from pyiceberg.catalog.sql import SqlCatalog\n\
             t = {catalog}.load_table('bronze.{table}')\n\
             for k in sorted(t.properties):\n    print(k) if k.startswith({prefix:?}) else None\n",
            catalog = self.catalog(),
        ))
        .unwrap_or_default()
    }

    /// pyiceberg makes the catalog's tables (its own schema) and the namespace `bronze` first,
    /// as a team whose catalog exists already has them.
    pub fn made_by_pyiceberg(&self) {
        let made = self.python(&format!(
            "from pyiceberg.catalog.sql import SqlCatalog\n\
             {catalog}.create_namespace('bronze')\nprint('made')\n",
            catalog = self.catalog().replace("init_catalog_tables='false'", "init_catalog_tables='true'"),
        ));
        assert_eq!(made, Some(vec!["made".to_string()]));
    }

    /// The metadata file the catalog points the table at.
    pub fn metadata_location(&self, table: &str) -> Option<String> {
        self.python(&format!(
            "from pyiceberg.catalog.sql import SqlCatalog\n\
             print({catalog}.load_table('bronze.{table}').metadata_location)\n",
            catalog = self.catalog(),
        ))
        .and_then(|lines| lines.into_iter().next())
    }

    /// Another client of a SQLite catalog holding its write lock (readers go on) until the
    /// returned process is dropped.
    pub fn hold_write_lock(&self) -> WriteLock {
        let file = self.sql["sqlite"].as_str().expect("a SQLite catalog");
        let python = std::env::var("PYTOOLS_PYTHON").expect("PYTOOLS_PYTHON: run the tests through scripts/test.sh");
        let script = format!(
            "import sqlite3, sys\nc = sqlite3.connect({file:?}, isolation_level=None)\n\
             c.execute('BEGIN IMMEDIATE')\nprint('locked', flush=True)\nsys.stdin.read()\nc.execute('ROLLBACK')\n"
        );
        let mut child = Command::new(python)
            .args(["-c", &script])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("run python");
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut line).unwrap();
        assert_eq!(line.trim(), "locked");
        WriteLock(child)
    }

    pub fn count(&self, table: &str) -> i64 {
        self.read(table, "SELECT count(*) FROM t").and_then(|l| l.first().and_then(|n| n.parse().ok())).unwrap_or(0)
    }
}

/// A process holding a SQLite catalog's write lock; dropped, it lets go and ends.
pub struct WriteLock(std::process::Child);

impl Drop for WriteLock {
    fn drop(&mut self) {
        drop(self.0.stdin.take());
        let _ = self.0.wait();
    }
}
