//! Where an Iceberg table lives: a REST catalog (or a SQL catalog, served to DuckDB through
//! Sluice's own REST front), its warehouse and namespace, how to log in, and the S3 account of
//! the data files when the catalog does not hand out credentials.

use std::path::PathBuf;

use duckdb::Connection;
use serde::{Deserialize, Serialize};
use sluice_core::{Error, Result, Secret, Stamp};

use super::sql_catalog::{self, IcebergSqlCatalog};
use crate::files::S3Config;
use crate::lakehouse::{Lakehouse, lake_error, literal};

/// A table in an Iceberg REST catalog, or in a SQL catalog.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IcebergConfig {
    /// The REST catalog's base URL (the part before `/v1/`); leave out with `sql`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub endpoint: String,
    /// An Iceberg SQL (JDBC) catalog in place of a REST one: its SQLite file or Postgres
    /// database, and where new tables go.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sql: Option<IcebergSqlCatalog>,
    /// The warehouse the catalog serves, as the catalog names it; for a SQL catalog, its
    /// `catalog_name` (default `sluice`).
    #[serde(default)]
    pub warehouse: String,
    /// A bearer token for the catalog; never serialized back. Without it (and without
    /// `client_id`), the catalog is used without logging in.
    #[serde(default, skip_serializing)]
    pub token: Option<Secret>,
    /// OAuth2 client credentials: the client id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_id: Option<String>,
    /// OAuth2 client credentials: the secret; never serialized back.
    #[serde(default, skip_serializing)]
    pub client_secret: Option<Secret>,
    /// OAuth2 token endpoint; the catalog's own `/v1/oauth/tokens` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oauth2_server_uri: Option<String>,
    /// The catalog commits several tables in one request (`/v1/transactions/commit`); off, each
    /// table is committed on its own (a stream then writes one table).
    #[serde(default)]
    pub multi_table_commit: bool,
    /// The catalog takes neither a staged create nor a metadata update right after a create
    /// (lakana): a new table is created on its own, before its rows.
    #[serde(default)]
    pub simple_create: bool,
    /// Namespace of the table.
    #[serde(default = "default_namespace")]
    pub namespace: String,
    /// The table; created when missing. A stream leaves it out: its `table` names the table.
    #[serde(default)]
    pub table: String,
    /// The S3 account of the data files, when the catalog does not hand out credentials.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3: Option<S3Config>,
    /// The folder of DuckDB extensions (`<dir>/v<version>/linux_amd64/*.duckdb_extension`);
    /// default `SLUICE_DUCKDB_EXTENSIONS`, else DuckDB's own. Nothing is downloaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extension_directory: Option<PathBuf>,
    /// Small-file upkeep of the stream's table.
    #[serde(default)]
    pub compaction: IcebergCompaction,
}

/// Small-file upkeep: each write is a commit with a data file (and a mirror's deletes position
/// delete files), so a stream leaves many small files. A compaction rewrites the table's live
/// rows into one file in a `replace` snapshot (the whole table: for tables of many gigabytes,
/// compact on demand at a quiet time), then expires old snapshots if asked to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IcebergCompaction {
    /// Seconds between two compactions; 0 compacts only on demand
    /// (`POST /api/streams/:id/compact`).
    #[serde(default = "default_every")]
    pub every_s: u64,
    /// A compaction runs once the table has this many files (data and delete files).
    #[serde(default = "default_min_files")]
    pub min_files: u64,
    /// Seconds of snapshots kept for time travel; older ones are expired, except those a
    /// branch or tag points to (their files stay in the store for the catalog's or an engine's
    /// orphan-file cleanup). Unset (the default): snapshots are left to the catalog's own
    /// maintenance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_snapshots_s: Option<u64>,
}

impl Default for IcebergCompaction {
    fn default() -> Self {
        Self { every_s: default_every(), min_files: default_min_files(), keep_snapshots_s: None }
    }
}

fn default_min_files() -> u64 {
    32
}

fn default_every() -> u64 {
    600
}

fn default_namespace() -> String {
    "default".into()
}

/// The table property that holds a stream's position: `sluice.position.<stream>`.
const POSITION: &str = "sluice.position.";

impl IcebergConfig {
    /// Several tables at once only through a catalog's multi-table commit.
    pub fn capabilities(&self) -> sluice_core::Capabilities {
        sluice_core::Capabilities { multi_table: self.multi_table_commit, multiset: true, ..Default::default() }
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
        if let Some(sql) = &self.sql {
            if !self.endpoint.is_empty() {
                return Err(Error::config("destination.endpoint", "give a REST endpoint or a SQL catalog, not both"));
            }
            if self.token.is_some() || self.client_id.is_some() {
                return Err(Error::config("destination.token", "a SQL catalog takes no token: it is its database"));
            }
            if !self.warehouse.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
                return Err(Error::config("destination.warehouse", "the catalog's name: letters, digits, _ and -"));
            }
            sql.validate()?;
        } else if !(self.endpoint.starts_with("http://") || self.endpoint.starts_with("https://")) {
            return Err(Error::config("destination.endpoint", "the REST catalog's http(s):// URL, or `sql`"));
        }
        for (field, value) in
            [("endpoint", &self.endpoint), ("warehouse", &self.warehouse), ("namespace", &self.namespace)]
        {
            if value.contains('\'') {
                return Err(Error::config(&format!("destination.{field}"), "must not contain a single quote"));
            }
        }
        if self.namespace.trim().is_empty() {
            return Err(Error::config("destination.namespace", "must not be empty"));
        }
        if self.client_id.is_some() != self.client_secret.is_some() {
            return Err(Error::config("destination.client_secret", "OAuth2 needs both client_id and client_secret"));
        }
        if self.token.is_some() && self.client_id.is_some() {
            return Err(Error::config("destination.token", "give a token or client credentials, not both"));
        }
        Ok(())
    }
}

impl IcebergConfig {
    /// The REST catalog DuckDB and the compaction talk to: this config, or for a SQL catalog
    /// the same with the endpoint and token of Sluice's front for it (started on first use).
    pub(crate) fn rest(&self) -> Result<IcebergConfig> {
        let Some(sql) = &self.sql else { return Ok(self.clone()) };
        let warehouse = if self.warehouse.is_empty() { "sluice" } else { &self.warehouse };
        let front = sql_catalog::serve(sql, warehouse, self.s3.as_ref())?;
        Ok(IcebergConfig {
            endpoint: front.endpoint,
            sql: None,
            warehouse: warehouse.to_string(),
            token: Some(Secret::new(front.token)),
            client_id: None,
            client_secret: None,
            oauth2_server_uri: None,
            multi_table_commit: false,
            simple_create: false,
            ..self.clone()
        })
    }

    /// The statements that attach the REST catalog as `lake`; `stage_create` off when the
    /// catalog takes no staged create.
    fn attach_rest(&self, stage_create: bool) -> Result<String> {
        let mut sql = String::from("SET autoinstall_known_extensions = false; SET autoload_known_extensions = false; ");
        if let Some(dir) = self.extensions() {
            sql.push_str(&format!("SET extension_directory = '{}'; ", literal(&dir.display().to_string())));
        }
        sql.push_str("LOAD httpfs; LOAD avro; LOAD iceberg; ");
        if let Some(s3) = &self.s3 {
            sql.push_str(&s3.duckdb_secret("sluice_iceberg_s3"));
        }
        let auth = match (&self.token, &self.client_id, &self.client_secret) {
            (Some(token), _, _) => {
                sql.push_str(&format!(
                    "CREATE OR REPLACE SECRET sluice_iceberg (TYPE iceberg, TOKEN '{}'); ",
                    literal(token.expose())
                ));
                "SECRET sluice_iceberg".to_string()
            }
            (None, Some(id), Some(secret)) => {
                let mut s = format!(
                    "CREATE OR REPLACE SECRET sluice_iceberg (TYPE iceberg, CLIENT_ID '{}', CLIENT_SECRET '{}'",
                    literal(id),
                    literal(secret.expose())
                );
                if let Some(uri) = &self.oauth2_server_uri {
                    s.push_str(&format!(", OAUTH2_SERVER_URI '{}'", literal(uri)));
                }
                sql.push_str(&s);
                sql.push_str("); ");
                "SECRET sluice_iceberg".to_string()
            }
            _ => "AUTHORIZATION_TYPE 'none'".to_string(),
        };
        let create = if self.simple_create {
            ", STAGE_CREATE_TABLES false, SKIP_CREATE_TABLE_METADATA_UPDATES true"
        } else {
            ""
        };
        let create = if stage_create || self.simple_create { create } else { ", STAGE_CREATE_TABLES false" };
        // DuckDB's iceberg extension removes the files a transaction wrote when its commit
        // request fails, whatever the failure: a commit the catalog took but whose answer was
        // lost (a proxy's 502, a cut connection) then lists files that are gone, and the table
        // no longer reads. Kept instead: a commit that truly failed leaves files no snapshot
        // lists, for an orphan-file cleanup.
        sql.push_str(&format!(
            "ATTACH '{}' AS lake (TYPE iceberg, ENDPOINT '{}', {auth}, DISABLE_MULTI_TABLE_COMMIT {}, \
             REMOVE_FILES_ON_DELETE false{create})",
            literal(&self.warehouse),
            literal(&self.endpoint),
            !self.multi_table_commit
        ));
        Ok(sql)
    }
}

impl Lakehouse for IcebergConfig {
    fn attach_sql(&self) -> Result<String> {
        match &self.sql {
            // Sluice's front takes no staged create.
            Some(_) => self.rest()?.attach_rest(false),
            None => self.attach_rest(true),
        }
    }

    fn schema(&self) -> &str {
        &self.namespace
    }

    fn table(&self) -> &str {
        &self.table
    }

    fn redact(&self, message: &str) -> String {
        let secrets = [
            self.token.as_ref(),
            self.client_secret.as_ref(),
            self.s3.as_ref().and_then(|s| s.secret_access_key.as_ref()),
            self.sql.as_ref().and_then(|s| s.database.password.as_ref()),
        ];
        let mut out = message.to_string();
        for secret in secrets.into_iter().flatten().map(Secret::expose).filter(|s| !s.is_empty()) {
            out = out.replace(&literal(secret), "***").replace(secret, "***");
        }
        // The bearer tokens of SQL catalog fronts, which DuckDB's attachment carries.
        if self.sql.is_some() {
            for token in sql_catalog::tokens() {
                out = out.replace(&token, "***");
            }
        }
        out
    }

    fn extensions(&self) -> Option<PathBuf> {
        self.extension_directory.clone().or_else(|| std::env::var_os("SLUICE_DUCKDB_EXTENSIONS").map(PathBuf::from))
    }

    fn label(&self) -> &'static str {
        "Iceberg"
    }

    fn needs(&self) -> &'static str {
        "iceberg, avro and httpfs extensions"
    }

    fn widens_integers(&self) -> bool {
        false
    }

    fn catalog_name(&self) -> String {
        match &self.sql {
            Some(sql) => format!("{} (catalog '{}')", sql.describe(), self.warehouse),
            None => format!("{} (warehouse '{}')", self.endpoint, self.warehouse),
        }
    }

    /// A table property of each table the write touched (or, for a write of no rows, each
    /// that holds the stream's position), in the same commit as the rows.
    fn write_stamp(&self, conn: &Connection, tables: &[String], stamp: &Stamp) -> Result<()> {
        let mut targets: Vec<String> = tables.to_vec();
        if targets.is_empty() {
            targets = positions(conn, self, &stamp.owner)?.into_iter().map(|(table, _)| table).collect();
        }
        targets.sort();
        targets.dedup();
        for table in targets {
            conn.execute_batch(&format!(
                "CALL set_iceberg_table_properties({}, {{'{POSITION}{}': '{}'}})",
                qualified(self, &table),
                literal(&stamp.owner),
                literal(&stamp.checkpoint)
            ))
            .map_err(lake_error)?;
        }
        Ok(())
    }

    /// The newest of the positions the namespace's tables hold for `owner` (one table per
    /// stream, unless the catalog commits several at once).
    fn read_stamp(&self, conn: &Connection, owner: &str) -> Result<Option<String>> {
        let newest = positions(conn, self, owner)?.into_iter().map(|(_, value)| value).max_by_key(|value| {
            serde_json::from_str::<serde_json::Value>(value)
                .ok()
                .and_then(|v| v.pointer("/checkpoint/sequence").and_then(serde_json::Value::as_i64))
                .unwrap_or(i64::MIN)
        });
        Ok(newest)
    }
}

/// `lake.<namespace>.<table>`, quoted.
fn qualified(config: &IcebergConfig, table: &str) -> String {
    format!("lake.{}.{}", crate::workspace::quote(&config.namespace), crate::workspace::quote(table))
}

/// The tables of the namespace that hold a position of `owner`, with it.
fn positions(conn: &Connection, config: &IcebergConfig, owner: &str) -> Result<Vec<(String, String)>> {
    let mut statement = conn
        .prepare(
            "SELECT table_name FROM duckdb_tables() WHERE database_name = 'lake' AND lower(schema_name) = lower(?)",
        )
        .map_err(lake_error)?;
    let tables: Vec<String> = statement
        .query_map([&config.namespace], |row| row.get::<_, String>(0))
        .map_err(lake_error)?
        .collect::<std::result::Result<_, _>>()
        .map_err(lake_error)?;
    let key = format!("{POSITION}{owner}");
    let mut out = Vec::new();
    for table in tables {
        let sql = format!("SELECT value FROM iceberg_table_properties({}) WHERE key = ?", qualified(config, &table));
        let read = (|| -> Result<Option<String>> {
            let mut statement = conn.prepare(&sql).map_err(lake_error)?;
            let mut rows = statement.query([&key]).map_err(lake_error)?;
            match rows.next().map_err(lake_error)? {
                Some(row) => Ok(Some(row.get::<_, String>(0).map_err(lake_error)?)),
                None => Ok(None),
            }
        })();
        match read {
            Ok(Some(value)) => out.push((table, value)),
            Ok(None) => {}
            // Another writer's table this login may not read holds no position of ours.
            Err(e) => tracing::warn!(table = %table, error = %e, "Iceberg: a table's properties could not be read."),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> IcebergConfig {
        serde_json::from_value(serde_json::json!({"endpoint": "http://127.0.0.1:8181", "warehouse": "w",
            "token": "t0k'en", "table": "t"}))
        .unwrap()
    }

    #[test]
    fn each_field_is_checked_by_name() {
        assert!(config().validate().is_ok());
        let field = |c: IcebergConfig| c.validate().unwrap_err().to_string();
        assert!(
            field(IcebergConfig { endpoint: "catalog:8181".into(), ..config() }).starts_with("destination.endpoint")
        );
        assert!(field(IcebergConfig { namespace: " ".into(), ..config() }).starts_with("destination.namespace"));
        assert!(
            field(IcebergConfig { client_id: Some("id".into()), ..config() }).starts_with("destination.client_secret")
        );
        assert!(field(IcebergConfig { table: String::new(), ..config() }).starts_with("destination.table"));
    }

    #[test]
    fn the_token_is_sent_quoted_and_redacted_from_messages() {
        let c = config();
        let sql = c.attach_sql().unwrap();
        assert!(sql.contains("TOKEN 't0k''en'") && sql.contains("DISABLE_MULTI_TABLE_COMMIT true"), "{sql}");
        assert!(sql.contains("REMOVE_FILES_ON_DELETE false"), "a lost commit answer must not remove files: {sql}");
        assert!(!c.redact(&format!("failed: {sql} / t0k'en")).contains("t0k"));
        let simple = IcebergConfig { simple_create: true, token: None, ..config() };
        let sql = simple.attach_sql().unwrap();
        assert!(sql.contains("AUTHORIZATION_TYPE 'none'") && sql.contains("STAGE_CREATE_TABLES false"), "{sql}");
    }

    /// The token of Sluice's own front for a SQL catalog is in the attachment, so it is
    /// redacted like a configured one.
    #[test]
    fn a_sql_catalog_front_token_is_redacted() {
        let dir = std::env::temp_dir().join(format!("sluice-sqlcat-{:x}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        let c: IcebergConfig = serde_json::from_value(serde_json::json!({"table": "t",
            "sql": {"sqlite": dir.join("c.db"), "location": format!("file://{}/w", dir.display())}}))
        .unwrap();
        let sql = c.attach_sql().unwrap();
        let token = c.rest().unwrap().token.unwrap().expose().to_string();
        assert!(sql.contains(&token), "{sql}");
        let redacted = c.redact(&format!("failed: {sql}"));
        assert!(!redacted.contains(&token) && redacted.contains("***"), "{redacted}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
