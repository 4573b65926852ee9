//! The files destination's config (the API's and the YAML's type): where, which format and
//! compression, and, for streams, how files are named and when they are rotated.

use serde::{Deserialize, Serialize};
use sluice_core::{Error, Result, Secret};

use super::gcs::GcsConfig;
use super::names::Template;

/// The file format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum FileFormat {
    /// Apache Parquet (Snappy by default).
    #[default]
    Parquet,
    /// CSV with a header row.
    Csv,
    /// One JSON object per line.
    Jsonl,
}

impl FileFormat {
    pub(crate) fn extension(self) -> &'static str {
        match self {
            Self::Parquet => "parquet",
            Self::Csv => "csv",
            Self::Jsonl => "jsonl",
        }
    }
}

/// How file bytes are compressed: `gzip` for CSV and JSON lines (the whole file, `.gz` added
/// to the name); `snappy` (the default), `gzip` or `none` for Parquet's pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// Uncompressed.
    None,
    /// gzip (DEFLATE).
    Gzip,
    /// Snappy (Parquet only).
    Snappy,
}

/// When a stream closes a file and starts the next: whichever limit comes first. A table's
/// file also closes when its columns change, so every file has one schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Rotate {
    /// Rows per file.
    #[serde(default = "default_rows")]
    pub rows: u64,
    /// Bytes of (uncompressed Arrow) data per file.
    #[serde(default = "default_bytes")]
    pub bytes: u64,
    /// Seconds a file stays open after its first row.
    #[serde(default = "default_seconds")]
    pub seconds: u64,
}

impl Default for Rotate {
    fn default() -> Self {
        Self { rows: default_rows(), bytes: default_bytes(), seconds: default_seconds() }
    }
}

fn default_rows() -> u64 {
    1_000_000
}

fn default_bytes() -> u64 {
    128 << 20
}

fn default_seconds() -> u64 {
    60
}

/// Where and how files are written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FilesConfig {
    /// A named connection (`/api/connections`) that gives the fields left out here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection: Option<String>,
    /// A local folder, `s3://bucket/prefix`, `az://container/prefix` or `gs://bucket/prefix`.
    pub location: String,
    /// `parquet`, `csv` or `jsonl`.
    #[serde(default)]
    pub format: FileFormat,
    /// `none`, `gzip` or (Parquet) `snappy`; Parquet uses Snappy and the others none when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression: Option<Compression>,
    /// A sync's file name (without extension); the sync's name by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// A stream's file names under the location, from `{table}`, `{stream}`, `{date}`,
    /// `{hour}`, `{seq}`, `{uuid}` and `{ext}`; `{seq}` or `{uuid}` must appear.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// A stream's file rotation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotate: Option<Rotate>,
    /// S3 settings, for an `s3://` location.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3: Option<S3Config>,
    /// Azure Blob settings, for an `az://` location.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub azure: Option<AzureConfig>,
    /// Google Cloud Storage settings, for a `gs://` location.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gcs: Option<GcsConfig>,
}

/// An S3 bucket's endpoint and credentials; without credentials the usual AWS environment
/// variables are used.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct S3Config {
    /// A custom endpoint (MinIO, moto, …); AWS when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// The region.
    #[serde(default = "default_region")]
    pub region: String,
    /// Access key id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_key_id: Option<String>,
    /// Secret access key; never serialized back.
    #[serde(default, skip_serializing)]
    pub secret_access_key: Option<Secret>,
}

impl S3Config {
    /// The DuckDB statement that makes this account the S3 secret `name` (for the lake
    /// formats DuckDB writes through httpfs).
    pub(crate) fn duckdb_secret(&self, name: &str) -> String {
        let literal = |text: &str| text.replace('\'', "''");
        let mut secret = format!("CREATE OR REPLACE SECRET {name} (TYPE s3, REGION '{}'", literal(&self.region));
        if let Some(key) = &self.access_key_id {
            secret.push_str(&format!(", KEY_ID '{}'", literal(key)));
        }
        if let Some(value) = &self.secret_access_key {
            secret.push_str(&format!(", SECRET '{}'", literal(value.expose())));
        }
        if let Some(endpoint) = &self.endpoint {
            let (ssl, host) = match endpoint.split_once("://") {
                Some(("http", host)) => (false, host),
                Some((_, host)) => (true, host),
                None => (true, endpoint.as_str()),
            };
            secret.push_str(&format!(", ENDPOINT '{}', URL_STYLE 'path', USE_SSL {ssl}", literal(host)));
        }
        secret.push_str("); ");
        secret
    }
}

pub(crate) fn default_region() -> String {
    "us-east-1".into()
}

/// An Azure storage account; without a key the `AZURE_STORAGE_*` environment variables are
/// used.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AzureConfig {
    /// The storage account's name.
    pub account: String,
    /// The account's access key; never serialized back.
    #[serde(default, skip_serializing)]
    pub access_key: Option<Secret>,
    /// The blob endpoint with the account, for Azurite or a private endpoint
    /// (`http://127.0.0.1:10000/devstoreaccount1`); `https://<account>.blob.core.windows.net`
    /// when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
}

/// The store a location names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scheme {
    Local,
    S3,
    Azure,
    Gcs,
}

impl FilesConfig {
    /// Stamps in its spool; a change file's row is the whole row, so no column is kept.
    pub fn capabilities(&self) -> sluice_core::Capabilities {
        sluice_core::Capabilities { keeps_columns: false, ..Default::default() }
    }

    /// The store, its bucket or container, and the prefix inside it.
    pub(crate) fn parts(&self) -> (Scheme, &str, &str) {
        for (prefix, scheme) in [("s3://", Scheme::S3), ("az://", Scheme::Azure), ("gs://", Scheme::Gcs)] {
            if let Some(rest) = self.location.strip_prefix(prefix) {
                let (bucket, path) = rest.split_once('/').unwrap_or((rest, ""));
                return (scheme, bucket, path.trim_matches('/'));
            }
        }
        (Scheme::Local, "", "")
    }

    /// The compression in effect.
    pub(crate) fn compression(&self) -> Compression {
        self.compression.unwrap_or(match self.format {
            FileFormat::Parquet => Compression::Snappy,
            FileFormat::Csv | FileFormat::Jsonl => Compression::None,
        })
    }

    /// The extension of every file: `csv.gz` for gzipped CSV.
    pub(crate) fn extension(&self) -> String {
        match (self.format, self.compression()) {
            (FileFormat::Csv | FileFormat::Jsonl, Compression::Gzip) => format!("{}.gz", self.format.extension()),
            (format, _) => format.extension().to_string(),
        }
    }

    /// A stream's name template.
    pub(crate) fn template(&self) -> Result<Template> {
        Template::parse(self.path.as_deref().unwrap_or(super::names::DEFAULT_PATH))
    }

    /// Check the fields; pure.
    pub fn validate(&self) -> Result<()> {
        if self.location.trim().is_empty() {
            return Err(Error::config(
                "destination.location",
                "a folder, s3://bucket/prefix, az://container/prefix or gs://bucket/prefix is needed",
            ));
        }
        let (scheme, bucket, _) = self.parts();
        if scheme == Scheme::Local && self.location.contains("://") {
            return Err(Error::config(
                "destination.location",
                "only local folders, s3://, az:// and gs:// are supported",
            ));
        }
        if scheme != Scheme::Local && bucket.is_empty() {
            return Err(Error::config("destination.location", "needs a bucket or container name after ://"));
        }
        let settings = [
            ("destination.s3", self.s3.is_some(), Scheme::S3, "s3://"),
            ("destination.azure", self.azure.is_some(), Scheme::Azure, "az://"),
            ("destination.gcs", self.gcs.is_some(), Scheme::Gcs, "gs://"),
        ];
        for (field, set, wanted, prefix) in settings {
            if set && scheme != wanted {
                return Err(Error::config(field, format!("only for a {prefix} location")));
            }
        }
        if scheme == Scheme::Azure && self.azure.is_none() {
            return Err(Error::config("destination.azure", "an az:// location needs `azure: {account: …}`"));
        }
        if self.format != FileFormat::Parquet && self.compression() == Compression::Snappy {
            return Err(Error::config("destination.compression", "snappy is for Parquet; use gzip or none"));
        }
        if let Some(name) = &self.name
            && (name.is_empty() || name.contains('/'))
        {
            return Err(Error::config("destination.name", "a file name without '/'"));
        }
        self.template()?;
        if let Some(rotate) = &self.rotate
            && (rotate.rows == 0 || rotate.bytes == 0 || rotate.seconds == 0)
        {
            return Err(Error::config("destination.rotate", "rows, bytes and seconds must be above 0"));
        }
        Ok(())
    }
}
