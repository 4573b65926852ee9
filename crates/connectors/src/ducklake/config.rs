//! Where a DuckLake lives: its catalog (a SQLite file or a Postgres database), its data folder
//! (local or on S3), and the DuckDB extensions that read and write it.

use std::path::PathBuf;

use duckdb::Connection;
use serde::{Deserialize, Serialize};
use sluice_core::{Error, Result, Secret, Stamp};

use crate::lakehouse::{Lakehouse, existing_columns, lake_error, literal};

use crate::files::S3Config;

/// A table in a DuckLake: the catalog holds the metadata, the data path holds Parquet files.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DuckLakeConfig {
    /// The catalog: `sqlite:/path/lake.sqlite`, or `postgres:host=… port=… dbname=… user=…`
    /// (its password in `catalog_password`).
    pub catalog: String,
    /// Password of a Postgres catalog; never serialized back.
    #[serde(default, skip_serializing)]
    pub catalog_password: Option<Secret>,
    /// Where the data files go: a folder, or `s3://bucket/prefix/`.
    pub data_path: String,
    /// The S3 account of an `s3://` data path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3: Option<S3Config>,
    /// Schema of the table in the lake.
    #[serde(default = "default_schema")]
    pub schema: String,
    /// The table; created when missing. A stream leaves it out: its `table` names the table.
    #[serde(default)]
    pub table: String,
    /// The folder of DuckDB extensions (`<dir>/v<version>/linux_amd64/*.duckdb_extension`);
    /// default `SLUICE_DUCKDB_EXTENSIONS`, else DuckDB's own. Nothing is downloaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extension_directory: Option<PathBuf>,
    /// Small-file upkeep of the schema's tables, on a schedule and on demand.
    #[serde(default)]
    pub compaction: Compaction,
}

fn default_schema() -> String {
    "main".into()
}

/// Small-file upkeep: each micro-batch is a Parquet file (and a mirror's deletes delete files),
/// so a stream leaves many small files. A compaction rewrites files whose rows are much deleted,
/// merges adjacent small files, expires old snapshots and removes the files nothing reads any
/// more, on a connection of its own while the stream goes on (each step is a DuckLake commit).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Compaction {
    /// Seconds between two compactions; 0 compacts only on demand
    /// (`POST /api/streams/:id/compact`).
    #[serde(default = "default_every")]
    pub every_s: u64,
    /// Seconds of snapshots kept for time travel; older ones expire and their files go.
    #[serde(default = "default_keep")]
    pub keep_snapshots_s: u64,
    /// A file is rewritten without its deleted rows when more than this share of them is deleted.
    #[serde(default = "default_threshold")]
    pub delete_threshold: f64,
}

impl Default for Compaction {
    fn default() -> Self {
        Self { every_s: default_every(), keep_snapshots_s: default_keep(), delete_threshold: default_threshold() }
    }
}

fn default_every() -> u64 {
    600
}

fn default_keep() -> u64 {
    3600
}

fn default_threshold() -> f64 {
    0.2
}

impl DuckLakeConfig {
    /// One DuckLake transaction holds every table and the stamp.
    pub fn capabilities(&self) -> sluice_core::Capabilities {
        sluice_core::Capabilities { multi_table: true, multiset: true, ..Default::default() }
    }

    /// Check the fields; pure.
    pub fn validate(&self) -> Result<()> {
        if self.table.trim().is_empty() {
            return Err(Error::config("destination.table", "must not be empty"));
        }
        self.validate_connection()
    }

    /// Check every field but the table (a stream's destination takes the stream's); pure.
    pub fn validate_connection(&self) -> Result<()> {
        let kind = self.catalog.split_once(':').map(|(k, rest)| (k, rest.trim()));
        match kind {
            Some(("sqlite" | "postgres", rest)) if !rest.is_empty() => {}
            _ => {
                return Err(Error::config(
                    "destination.catalog",
                    "give `sqlite:/path/lake.sqlite` or `postgres:host=… dbname=… user=…`",
                ));
            }
        }
        if self.catalog.contains('\'') {
            return Err(Error::config("destination.catalog", "must not contain a single quote"));
        }
        if self.catalog.to_ascii_lowercase().contains("password") {
            return Err(Error::config(
                "destination.catalog",
                "give the password in `catalog_password` (kept as a secret), not in the connection string",
            ));
        }
        if self.data_path.trim().is_empty() || self.data_path.contains('\'') {
            return Err(Error::config("destination.data_path", "a folder or s3://bucket/prefix/, without quotes"));
        }
        if self.data_path.starts_with("s3://") != self.s3.is_some() {
            return Err(Error::config("destination.s3", "an s3:// data_path needs `s3`, and only it takes one"));
        }
        if self.schema.trim().is_empty() {
            return Err(Error::config("destination.schema", "must not be empty"));
        }
        if !(0.0..=1.0).contains(&self.compaction.delete_threshold) {
            return Err(Error::config("destination.compaction.delete_threshold", "must be between 0 and 1"));
        }
        Ok(())
    }

    /// `message` with the secrets this config holds replaced by `***` (DuckDB's Postgres scanner
    /// puts the whole connection string in its errors).
    fn redact_secrets(&self, message: &str) -> String {
        let secrets = [self.catalog_password.as_ref(), self.s3.as_ref().and_then(|s| s.secret_access_key.as_ref())];
        let mut out = message.to_string();
        for secret in secrets.into_iter().flatten().map(Secret::expose).filter(|s| !s.is_empty()) {
            // As given, as escaped inside the libpq value, and as doubled inside the SQL literal.
            let escaped = secret.replace('\\', "\\\\").replace('\'', "\\'");
            for form in [escaped.replace('\'', "''"), escaped, secret.to_string()] {
                out = out.replace(&form, "***");
            }
        }
        out
    }

    /// The statements that make `lake` this DuckLake on a new connection.
    fn attach_statements(&self) -> String {
        let mut sql = String::from("SET autoinstall_known_extensions = false; SET autoload_known_extensions = false; ");
        if let Some(dir) = extension_dir(&self.extension_directory) {
            sql.push_str(&format!("SET extension_directory = '{}'; ", literal(&dir.display().to_string())));
        }
        let scanner = if self.catalog.starts_with("sqlite:") { "sqlite_scanner" } else { "postgres_scanner" };
        sql.push_str(&format!("LOAD ducklake; LOAD {scanner}; "));
        if let Some(s3) = &self.s3 {
            sql.push_str("LOAD httpfs; ");
            sql.push_str(&s3.duckdb_secret("sluice_lake_s3"));
        }
        let mut catalog = self.catalog.clone();
        if let Some(password) = &self.catalog_password {
            // A libpq value in single quotes, with its backslashes and quotes escaped.
            let value = password.expose().replace('\\', "\\\\").replace('\'', "\\'");
            catalog.push_str(&format!(" password='{value}'"));
        }
        sql.push_str(&format!(
            "ATTACH 'ducklake:{}' AS lake (DATA_PATH '{}')",
            literal(&catalog),
            literal(&self.data_path)
        ));
        sql
    }
}

/// The table in the lake's `main` schema where streams keep their positions.
const POSITIONS: &str = "sluice_positions";

impl Lakehouse for DuckLakeConfig {
    fn attach_sql(&self) -> Result<String> {
        Ok(self.attach_statements())
    }

    fn schema(&self) -> &str {
        &self.schema
    }

    fn table(&self) -> &str {
        &self.table
    }

    fn redact(&self, message: &str) -> String {
        self.redact_secrets(message)
    }

    fn extensions(&self) -> Option<PathBuf> {
        extension_dir(&self.extension_directory)
    }

    fn label(&self) -> &'static str {
        "DuckLake"
    }

    fn needs(&self) -> &'static str {
        "ducklake extension and its catalog's scanner (and httpfs for S3)"
    }

    fn catalog_name(&self) -> String {
        self.catalog.clone()
    }

    /// A row of `sluice_positions` in the lake's `main` schema, in the snapshot of the rows.
    fn write_stamp(&self, conn: &Connection, _tables: &[String], stamp: &Stamp) -> Result<()> {
        conn.execute_batch(&format!(
            "CREATE TABLE IF NOT EXISTS lake.main.{POSITIONS} (owner VARCHAR, checkpoint VARCHAR, \
             written_at TIMESTAMPTZ); DELETE FROM lake.main.{POSITIONS} WHERE owner = '{owner}'; \
             INSERT INTO lake.main.{POSITIONS} VALUES ('{owner}', '{checkpoint}', now())",
            owner = literal(&stamp.owner),
            checkpoint = literal(&stamp.checkpoint),
        ))
        .map_err(lake_error)
    }

    fn read_stamp(&self, conn: &Connection, owner: &str) -> Result<Option<String>> {
        if existing_columns(conn, "main", POSITIONS)?.is_empty() {
            return Ok(None);
        }
        let mut statement = conn
            .prepare(&format!("SELECT checkpoint FROM lake.main.{POSITIONS} WHERE owner = ?"))
            .map_err(lake_error)?;
        let mut rows = statement.query([owner]).map_err(lake_error)?;
        match rows.next().map_err(lake_error)? {
            Some(row) => Ok(Some(row.get(0).map_err(lake_error)?)),
            None => Ok(None),
        }
    }
}

/// The extension folder: the config's, else `SLUICE_DUCKDB_EXTENSIONS`, else DuckDB's own.
pub(super) fn extension_dir(configured: &Option<PathBuf>) -> Option<PathBuf> {
    configured.clone().or_else(|| std::env::var_os("SLUICE_DUCKDB_EXTENSIONS").map(PathBuf::from))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> DuckLakeConfig {
        DuckLakeConfig {
            catalog: "sqlite:/tmp/lake.sqlite".into(),
            catalog_password: None,
            data_path: "/tmp/lake/".into(),
            s3: None,
            schema: "main".into(),
            table: String::new(),
            extension_directory: None,
            compaction: Compaction::default(),
        }
    }

    #[test]
    fn each_field_is_checked_by_name() {
        assert!(config().validate_connection().is_ok());
        let field = |c: DuckLakeConfig| c.validate_connection().unwrap_err().to_string();
        assert!(field(DuckLakeConfig { catalog: "mysql:x".into(), ..config() }).contains("destination.catalog"));
        assert!(field(DuckLakeConfig { catalog: "sqlite:".into(), ..config() }).contains("destination.catalog"));
        assert!(field(DuckLakeConfig { data_path: "s3://b/p/".into(), ..config() }).contains("destination.s3"));
        assert!(field(DuckLakeConfig { data_path: "/a'b".into(), ..config() }).contains("destination.data_path"));
        assert!(config().validate().unwrap_err().to_string().contains("destination.table"));
        let with_password = DuckLakeConfig { catalog: "postgres:host=h password=x".into(), ..config() };
        assert!(field(with_password).contains("catalog_password"));
    }

    #[test]
    fn the_catalog_password_is_redacted_in_every_form_it_is_sent() {
        let c = DuckLakeConfig {
            catalog: "postgres:host=h".into(),
            catalog_password: Some(Secret::new("p'w\\x")),
            ..config()
        };
        let sql = c.attach_sql().unwrap();
        let message = format!("Unable to connect: {sql} / host=h password='p\\'w\\\\x' / p'w\\x");
        let redacted = c.redact(&message);
        assert!(!redacted.contains("p'w") && !redacted.contains("p\\'w") && !redacted.contains("p''w"), "{redacted}");
    }
}
