//! A Snowflake destination's config.

use serde::{Deserialize, Serialize};
use sluice_core::{Error, Result, Secret};

/// A table in a Snowflake database.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SnowflakeConfig {
    /// The account's URL, `https://<account>.snowflakecomputing.com` (or an emulator's).
    pub url: String,
    /// The account identifier; taken from the URL's first label when left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
    /// The user.
    pub user: String,
    /// The password; never serialized back.
    #[serde(default, skip_serializing)]
    pub password: Option<Secret>,
    /// Key-pair login instead of a password: the user's RSA private key as PEM (PKCS#8 or
    /// PKCS#1, unencrypted; Sluice encrypts it at rest); never serialized back.
    #[serde(default, skip_serializing)]
    pub private_key: Option<Secret>,
    /// The database.
    pub database: String,
    /// The schema.
    #[serde(default = "default_schema")]
    pub schema: String,
    /// The warehouse the session uses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warehouse: Option<String>,
    /// The role the session takes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// The table; created when missing. A stream leaves it out: its `table` names the table.
    #[serde(default)]
    pub table: String,
    /// Write table and column names in upper case, unquoted as Snowflake folds them (`events`
    /// becomes `EVENTS`). By default names are quoted and keep their case.
    #[serde(default)]
    pub uppercase: bool,
    /// A write of at least this many rows (and deletes) goes through the stage: one Parquet
    /// file put into `SLUICE_STAGE`, then `COPY INTO` (for keyed modes into a landing table,
    /// whose keys are deleted from the table and whose rows are inserted) in the unit's transaction. Fewer go as INSERTs with array bindings. 0: never.
    #[serde(default = "default_copy_rows")]
    pub copy_rows: u64,
}

fn default_copy_rows() -> u64 {
    1000
}

fn default_schema() -> String {
    "PUBLIC".into()
}

impl SnowflakeConfig {
    /// Several tables in one transaction, and a stage of its own.
    pub fn capabilities(&self) -> sluice_core::Capabilities {
        sluice_core::Capabilities { multi_table: true, stage: true, ..Default::default() }
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
        if self.password.is_some() && self.private_key.is_some() {
            return Err(Error::config("destination.private_key", "give a password or a private key, not both"));
        }
        let url = reqwest::Url::parse(&self.url).map_err(|e| Error::config("destination.url", e))?;
        if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
            return Err(Error::config("destination.url", "must be https://<account>.snowflakecomputing.com"));
        }
        for (field, value) in [("user", &self.user), ("database", &self.database), ("schema", &self.schema)] {
            if value.trim().is_empty() {
                return Err(Error::config(&format!("destination.{field}"), "must not be empty"));
            }
        }
        Ok(())
    }

    /// The account: as configured, else the URL's first label.
    pub(super) fn account(&self) -> String {
        self.account.clone().unwrap_or_else(|| {
            reqwest::Url::parse(&self.url)
                .ok()
                .and_then(|u| u.host_str().and_then(|h| h.split('.').next()).map(str::to_string))
                .unwrap_or_default()
        })
    }

    /// A name as written in SQL: quoted as is, or upper case (Snowflake's folding) quoted.
    pub(super) fn name(&self, name: &str) -> String {
        format!("\"{}\"", self.fold(name).replace('"', "\"\""))
    }

    /// A name as the table has it: upper case with `uppercase`.
    pub(super) fn fold(&self, name: &str) -> String {
        if self.uppercase { name.to_uppercase() } else { name.to_string() }
    }
}
