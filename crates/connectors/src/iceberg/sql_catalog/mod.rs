//! An Iceberg SQL catalog (the tables of Iceberg's JDBC catalog, which pyiceberg's `SqlCatalog`,
//! Spark's and Flink's `JdbcCatalog` read and write), in a SQLite file or a Postgres database.
//! DuckDB's extension speaks only the REST protocol, so Sluice serves one in front of it: a REST
//! catalog on 127.0.0.1 (a random port and token, one per catalog and process) that keeps each
//! table's metadata files beside its data (`metadata.rs`) and commits by swapping the table's
//! `metadata_location` in the database, compare-and-set (`pointers.rs`), so other writers of
//! the same catalog are refused rather than overwritten.

mod front;
mod metadata;
mod pointers;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use sluice_core::{Error, Result, Secret};

use crate::postgres::SslMode;

pub use front::{serve, tokens};

/// Where an Iceberg SQL catalog is, and where its new tables go.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IcebergSqlCatalog {
    /// The catalog's database.
    #[serde(flatten)]
    pub database: SqlCatalogDatabase,
    /// Where new tables' folders go (`<location>/<namespace>/<table>`): a local folder
    /// (`file:///…`) or a bucket (`s3://bucket/prefix`, with the destination's `s3` account).
    pub location: String,
}

/// A SQLite file, or a Postgres database.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SqlCatalogDatabase {
    /// The SQLite file (made when missing); leave out for Postgres.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sqlite: Option<PathBuf>,
    /// Postgres: host name or address.
    #[serde(default)]
    pub host: String,
    /// Postgres: port.
    #[serde(default = "default_port")]
    pub port: u16,
    /// Postgres: database.
    #[serde(default)]
    pub database: String,
    /// Postgres: user.
    #[serde(default)]
    pub user: String,
    /// Postgres: password; never serialized back.
    #[serde(default, skip_serializing)]
    pub password: Option<Secret>,
    /// Postgres: TLS, as libpq's `sslmode` (`disable`, `prefer`, `require`).
    #[serde(default)]
    pub sslmode: SslMode,
}

fn default_port() -> u16 {
    5432
}

impl IcebergSqlCatalog {
    /// Check the fields; pure.
    pub fn validate(&self) -> Result<()> {
        let d = &self.database;
        match &d.sqlite {
            Some(path) if path.as_os_str().is_empty() => {
                return Err(Error::config("destination.sql.sqlite", "the catalog's SQLite file"));
            }
            Some(_) if !d.host.is_empty() => {
                return Err(Error::config("destination.sql.host", "give a SQLite file or a Postgres host, not both"));
            }
            Some(_) => {}
            None => {
                for (field, value) in [("host", &d.host), ("database", &d.database), ("user", &d.user)] {
                    if value.trim().is_empty() {
                        return Err(Error::config(
                            &format!("destination.sql.{field}"),
                            "give the catalog's Postgres database, or `sqlite` for a SQLite file",
                        ));
                    }
                }
                if matches!(d.sslmode, SslMode::VerifyCa | SslMode::VerifyFull) {
                    return Err(Error::config("destination.sql.sslmode", "disable, prefer or require"));
                }
            }
        }
        let location = self.location.trim_end_matches('/');
        let folder = location.strip_prefix("file://").is_some_and(|p| p.starts_with('/'));
        let bucket = location.strip_prefix("s3://").is_some_and(|b| !b.is_empty() && !b.starts_with('/'));
        if !(folder || bucket) {
            return Err(Error::config("destination.sql.location", "file:///a/folder or s3://bucket/prefix"));
        }
        Ok(())
    }

    /// The catalog's database, for messages (no secret in it).
    pub fn describe(&self) -> String {
        match &self.database.sqlite {
            Some(path) => format!("SQL catalog {}", path.display()),
            None => format!("SQL catalog {}:{}/{}", self.database.host, self.database.port, self.database.database),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn catalog(value: serde_json::Value) -> IcebergSqlCatalog {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn each_field_is_checked_by_name() {
        let ok = catalog(serde_json::json!({"sqlite": "/tmp/c.db", "location": "file:///tmp/w"}));
        assert!(ok.validate().is_ok());
        let field = |v: serde_json::Value| catalog(v).validate().unwrap_err().to_string();
        assert!(field(serde_json::json!({"location": "file:///w"})).starts_with("destination.sql.host"));
        assert!(
            field(serde_json::json!({"host": "h", "database": "d", "location": "file:///w"}))
                .starts_with("destination.sql.user")
        );
        assert!(
            field(serde_json::json!({"sqlite": "/c.db", "location": "w/x"})).starts_with("destination.sql.location")
        );
        assert!(
            field(serde_json::json!({"sqlite": "/c.db", "host": "h", "location": "file:///w"}))
                .starts_with("destination.sql.host")
        );
        let pg = catalog(serde_json::json!({"host": "h", "database": "d", "user": "u", "password": "pw",
            "location": "s3://bucket/w"}));
        assert!(pg.validate().is_ok());
        let shown = serde_json::to_string(&pg).unwrap();
        assert!(!shown.contains("pw") && pg.describe() == "SQL catalog h:5432/d", "{shown}");
        let unknown = serde_json::json!({"sqlite": "/c.db", "location": "file:///w", "catalog_uri": "x"});
        assert!(serde_json::from_value::<IcebergSqlCatalog>(unknown).is_err(), "an unknown field is refused");
    }
}
