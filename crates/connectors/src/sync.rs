//! A reverse ETL sync's config (the API's and the YAML's type) and the one place destinations
//! are built.

use std::collections::BTreeMap;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use croner::Cron;
use croner::parser::{CronParser, Seconds};
use serde::{Deserialize, Serialize};
use sluice_core::secret::{REDACTED, keep, restore};
use sluice_core::{Destination, Error, Result, Secret, SyncMode};

use crate::clickhouse::{ClickhouseConfig, ClickhouseTarget};
use crate::delta::{DeltaConfig, DeltaTarget};
use crate::ducklake::{DuckLakeConfig, DuckLakeTarget};
use crate::files::{FilesConfig, FilesTarget};
use crate::http_api::{HttpApiConfig, HttpApiTarget, restore_url_password, url_password};
use crate::iceberg::{IcebergConfig, IcebergTarget};
use crate::mysql::{MysqlTableConfig, MysqlTarget};
use crate::postgres::{PostgresTableConfig, PostgresTarget};
use crate::snowflake::{SnowflakeConfig, SnowflakeTarget};
use crate::sqlite::{SqliteTableConfig, SqliteTarget};

/// One sync: a read-only SELECT on the workspace, a destination and a mode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SyncConfig {
    /// Unique name; also the sync's id in URLs. Letters, digits, `_` and `-`.
    pub name: String,
    /// One SELECT or WITH statement on the workspace.
    pub query: String,
    /// Where the result goes. The `kind` field picks the variant.
    pub destination: DestinationConfig,
    /// `replace`, `append`, `upsert` or `mirror`.
    #[serde(default)]
    pub mode: SyncMode,
    /// Key columns (upsert and mirror).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keys: Vec<String>,
    /// Run on a schedule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<Schedule>,
}

/// A cron schedule in a time zone.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Schedule {
    /// Five fields (minute hour day month weekday), or six with seconds first.
    pub cron: String,
    /// An IANA time zone name.
    #[serde(default = "utc")]
    pub timezone: String,
}

fn utc() -> String {
    "UTC".into()
}

impl Schedule {
    fn parsed(&self) -> Result<(Cron, chrono_tz::Tz)> {
        let cron = CronParser::builder()
            .seconds(Seconds::Optional)
            .build()
            .parse(&self.cron)
            .map_err(|e| Error::config("schedule.cron", e))?;
        let tz = chrono_tz::Tz::from_str(&self.timezone)
            .map_err(|_| Error::config("schedule.timezone", format!("'{}' is not an IANA time zone", self.timezone)))?;
        Ok((cron, tz))
    }

    /// The first time after `after` the schedule fires.
    pub fn next_after(&self, after: DateTime<Utc>) -> Result<DateTime<Utc>> {
        let (cron, tz) = self.parsed()?;
        let next = cron
            .find_next_occurrence(&after.with_timezone(&tz), false)
            .map_err(|e| Error::config("schedule.cron", e))?;
        Ok(next.with_timezone(&Utc))
    }
}

/// Where a sync delivers. The `kind` field picks the variant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum DestinationConfig {
    /// A Postgres table.
    Postgres(PostgresTableConfig),
    /// A MySQL or MariaDB table.
    Mysql(MysqlTableConfig),
    /// A SQLite table.
    Sqlite(SqliteTableConfig),
    /// Parquet, CSV or JSON lines files, local or on S3.
    Files(FilesConfig),
    /// An HTTP API.
    Http(HttpApiConfig),
    /// A DuckLake table (SQLite or Postgres catalog, data in a folder or on S3).
    Ducklake(DuckLakeConfig),
    /// A table of an Iceberg REST catalog.
    Iceberg(IcebergConfig),
    /// A Delta Lake table (a folder or S3), written by Sluice's own log writer.
    Delta(DeltaConfig),
    /// A ClickHouse table, over its HTTP interface.
    Clickhouse(ClickhouseConfig),
    /// A Snowflake table, over the drivers' REST protocol.
    Snowflake(SnowflakeConfig),
}

impl DestinationConfig {
    /// What the destination can do, from its config alone.
    pub fn capabilities(&self) -> sluice_core::Capabilities {
        match self {
            Self::Postgres(c) => c.capabilities(),
            Self::Mysql(c) => c.capabilities(),
            Self::Sqlite(c) => c.capabilities(),
            Self::Files(c) => c.capabilities(),
            Self::Http(c) => c.capabilities(),
            Self::Ducklake(c) => c.capabilities(),
            Self::Iceberg(c) => c.capabilities(),
            Self::Delta(c) => c.capabilities(),
            Self::Clickhouse(c) => c.capabilities(),
            Self::Snowflake(c) => c.capabilities(),
        }
    }
}

impl SyncConfig {
    /// Check every field; pure. Errors name the field.
    pub fn validate(&self) -> Result<()> {
        let name_ok = !self.name.is_empty()
            && self.name.len() <= 64
            && self.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !name_ok {
            return Err(Error::config("name", "must be 1-64 letters, digits, '_' or '-'"));
        }
        if self.query.trim().is_empty() {
            return Err(Error::config("query", "a SELECT statement is needed"));
        }
        if self.mode.keyed() && self.keys.is_empty() {
            return Err(Error::config("keys", format!("mode '{}' matches rows on key columns; name them", self.mode)));
        }
        if let Some(schedule) = &self.schedule {
            schedule.parsed()?;
        }
        match &self.destination {
            DestinationConfig::Postgres(c) => c.validate(),
            DestinationConfig::Mysql(c) => c.validate(),
            DestinationConfig::Sqlite(c) => c.validate(),
            DestinationConfig::Files(c) => c.validate(),
            DestinationConfig::Http(c) => c.validate(),
            DestinationConfig::Ducklake(c) => c.validate(),
            DestinationConfig::Iceberg(c) => c.validate(),
            DestinationConfig::Delta(c) => c.validate(),
            DestinationConfig::Clickhouse(c) => c.validate(),
            DestinationConfig::Snowflake(c) => c.validate(),
        }
    }

    /// The secrets inside the destination, by field path; the server keeps them apart,
    /// encrypted, and never serializes them.
    pub fn secrets(&self) -> BTreeMap<String, String> {
        self.destination.secrets()
    }

    /// Put secrets back where [`SyncConfig::secrets`] found them, unless already set.
    pub fn restore_secrets(&mut self, secrets: &BTreeMap<String, String>) {
        self.destination.restore_secrets(secrets);
    }

    /// Header names of an HTTP destination (their values are never shown).
    pub fn header_names(&self) -> Vec<String> {
        match &self.destination {
            DestinationConfig::Http(c) => c.headers.keys().cloned().collect(),
            _ => Vec::new(),
        }
    }
}

impl DestinationConfig {
    /// The table template a stream into this destination decodes to: its `table`, qualified by
    /// a templated Postgres schema.
    pub fn table_template(&self, table: &str) -> String {
        match self {
            Self::Postgres(c) => c.table_template(table),
            _ => table.to_string(),
        }
    }

    /// The secrets inside the destination, by field path (`destination.password`, …).
    pub fn secrets(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        match self {
            Self::Postgres(c) => keep(&mut out, "destination.password", c.password.as_ref()),
            Self::Mysql(c) => keep(&mut out, "destination.password", c.password.as_ref()),
            Self::Sqlite(_) => {}
            Self::Clickhouse(c) => keep(&mut out, "destination.password", c.password.as_ref()),
            Self::Snowflake(c) => {
                keep(&mut out, "destination.password", c.password.as_ref());
                keep(&mut out, "destination.private_key", c.private_key.as_ref());
            }
            Self::Ducklake(c) => {
                keep(&mut out, "destination.catalog_password", c.catalog_password.as_ref());
                keep(
                    &mut out,
                    "destination.s3.secret_access_key",
                    c.s3.as_ref().and_then(|s| s.secret_access_key.as_ref()),
                );
            }
            Self::Delta(c) => keep(
                &mut out,
                "destination.s3.secret_access_key",
                c.s3.as_ref().and_then(|s| s.secret_access_key.as_ref()),
            ),
            Self::Iceberg(c) => {
                keep(&mut out, "destination.token", c.token.as_ref());
                keep(&mut out, "destination.client_secret", c.client_secret.as_ref());
                keep(&mut out, "destination.sql.password", c.sql.as_ref().and_then(|s| s.database.password.as_ref()));
                keep(
                    &mut out,
                    "destination.s3.secret_access_key",
                    c.s3.as_ref().and_then(|s| s.secret_access_key.as_ref()),
                );
            }
            Self::Files(c) => {
                keep(
                    &mut out,
                    "destination.s3.secret_access_key",
                    c.s3.as_ref().and_then(|s| s.secret_access_key.as_ref()),
                );
                keep(&mut out, "destination.azure.access_key", c.azure.as_ref().and_then(|a| a.access_key.as_ref()));
                keep(&mut out, "destination.gcs.token", c.gcs.as_ref().and_then(|g| g.token.as_ref()));
            }
            Self::Http(c) => {
                for (name, value) in &c.headers {
                    keep(&mut out, &format!("destination.headers.{name}"), Some(value));
                }
                for (path, url) in [
                    ("destination.url.password", Some(&c.url)),
                    ("destination.deletes.url.password", c.deletes.url.as_ref()),
                ] {
                    if let Some(password) = url.and_then(|u| url_password(u)).filter(|p| p != REDACTED) {
                        out.insert(path.to_string(), password);
                    }
                }
            }
        }
        out
    }

    /// Put secrets back where [`DestinationConfig::secrets`] found them, unless already set.
    pub fn restore_secrets(&mut self, secrets: &BTreeMap<String, String>) {
        match self {
            Self::Postgres(c) => restore(&mut c.password, secrets, "destination.password"),
            Self::Mysql(c) => restore(&mut c.password, secrets, "destination.password"),
            Self::Sqlite(_) => {}
            Self::Clickhouse(c) => restore(&mut c.password, secrets, "destination.password"),
            // One way to log in: a new password or key replaces the stored one, whichever it was.
            Self::Snowflake(c) if c.password.is_none() && c.private_key.is_none() => {
                restore(&mut c.password, secrets, "destination.password");
                restore(&mut c.private_key, secrets, "destination.private_key");
            }
            Self::Snowflake(_) => {}
            Self::Ducklake(c) => {
                restore(&mut c.catalog_password, secrets, "destination.catalog_password");
                if let Some(s3) = &mut c.s3 {
                    restore(&mut s3.secret_access_key, secrets, "destination.s3.secret_access_key");
                }
            }
            Self::Delta(c) => {
                if let Some(s3) = &mut c.s3 {
                    restore(&mut s3.secret_access_key, secrets, "destination.s3.secret_access_key");
                }
            }
            Self::Iceberg(c) => {
                restore(&mut c.token, secrets, "destination.token");
                restore(&mut c.client_secret, secrets, "destination.client_secret");
                if let Some(sql) = &mut c.sql {
                    restore(&mut sql.database.password, secrets, "destination.sql.password");
                }
                if let Some(s3) = &mut c.s3 {
                    restore(&mut s3.secret_access_key, secrets, "destination.s3.secret_access_key");
                }
            }
            Self::Files(c) => {
                if let Some(s3) = &mut c.s3 {
                    restore(&mut s3.secret_access_key, secrets, "destination.s3.secret_access_key");
                }
                if let Some(azure) = &mut c.azure {
                    restore(&mut azure.access_key, secrets, "destination.azure.access_key");
                }
                if let Some(gcs) = &mut c.gcs {
                    restore(&mut gcs.token, secrets, "destination.gcs.token");
                }
            }
            Self::Http(c) => {
                for (path, value) in secrets {
                    if let Some(name) = path.strip_prefix("destination.headers.") {
                        c.headers.entry(name.to_string()).or_insert_with(|| Secret::new(value.clone()));
                    }
                }
                // A URL password shows as `***`; sent back so, it keeps the stored one.
                if let Some(p) = secrets.get("destination.url.password") {
                    restore_url_password(&mut c.url, p);
                }
                if let (Some(url), Some(p)) = (c.deletes.url.as_mut(), secrets.get("destination.deletes.url.password"))
                {
                    restore_url_password(url, p);
                }
            }
        }
    }
}

/// Build a sync's destination; the one `match` over destination kinds.
pub fn build_destination(config: &DestinationConfig) -> Result<Box<dyn Destination>> {
    Ok(match config {
        DestinationConfig::Postgres(c) => Box::new(PostgresTarget::new(c.clone())),
        DestinationConfig::Mysql(c) => Box::new(MysqlTarget::new(c.clone())),
        DestinationConfig::Sqlite(c) => Box::new(SqliteTarget::new(c.clone())),
        DestinationConfig::Files(c) => Box::new(FilesTarget::new(c.clone())),
        DestinationConfig::Http(c) => Box::new(HttpApiTarget::new(c.clone())?),
        DestinationConfig::Ducklake(c) => Box::new(DuckLakeTarget::new(c.clone())),
        DestinationConfig::Iceberg(c) => Box::new(IcebergTarget::new(c.clone())),
        DestinationConfig::Delta(c) => Box::new(DeltaTarget::new(c.clone())),
        DestinationConfig::Clickhouse(c) => Box::new(ClickhouseTarget::new(c.clone())),
        DestinationConfig::Snowflake(c) => Box::new(SnowflakeTarget::new(c.clone())),
    })
}
