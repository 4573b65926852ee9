//! A ClickHouse destination's config.

use serde::{Deserialize, Serialize};
use sluice_core::{Error, Result, Secret};

/// A table in a ClickHouse database, reached over HTTP.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClickhouseConfig {
    /// The HTTP interface, e.g. `http://127.0.0.1:8123`.
    pub url: String,
    /// The database.
    #[serde(default = "default_database")]
    pub database: String,
    /// The user.
    #[serde(default = "default_user")]
    pub user: String,
    /// The password; never serialized back.
    #[serde(default, skip_serializing)]
    pub password: Option<Secret>,
    /// The table; created when missing. A stream leaves it out: its `table` names the table.
    #[serde(default)]
    pub table: String,
}

fn default_database() -> String {
    "default".into()
}

fn default_user() -> String {
    "default".into()
}

impl ClickhouseConfig {
    /// Its `done` rows cover several tables; a row of a ReplacingMergeTree replaces the whole
    /// row, so no column is kept and a table without a key is no multiset.
    pub fn capabilities(&self) -> sluice_core::Capabilities {
        sluice_core::Capabilities { multi_table: true, keeps_columns: false, ..Default::default() }
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
        let url = reqwest::Url::parse(&self.url).map_err(|e| Error::config("destination.url", e))?;
        if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
            return Err(Error::config("destination.url", "must be http(s)://host:port of the HTTP interface"));
        }
        if self.database.trim().is_empty() {
            return Err(Error::config("destination.database", "must not be empty"));
        }
        if self.user.trim().is_empty() {
            return Err(Error::config("destination.user", "must not be empty"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_checked_by_name() {
        let c: ClickhouseConfig = serde_json::from_value(serde_json::json!({"url": "ftp://x"})).unwrap();
        assert!(c.validate_connection().unwrap_err().to_string().starts_with("destination.url"));
        let c: ClickhouseConfig = serde_json::from_value(serde_json::json!({"url": "http://127.0.0.1:8123"})).unwrap();
        c.validate_connection().unwrap();
        assert!(c.validate().unwrap_err().to_string().starts_with("destination.table"));
        assert!(
            serde_json::to_string(&ClickhouseConfig { password: Some(Secret::new("p")), ..c })
                .unwrap()
                .find("\"p\"")
                .is_none()
        );
    }
}
