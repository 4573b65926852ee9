//! Files as a reverse ETL destination.
//!
//! - `replace` writes `<location>/<name>.<ext>`; a put is atomic both on a local disk
//!   (`object_store` writes a temporary file and renames it) and on S3, so a reader sees the
//!   old file or the new one.
//! - `append` adds `<location>/<name>/<time>-<run>.<ext>` per run.
//! - `upsert` and `mirror` add a change file per run in the same folder, with an `_sluice_op`
//!   column (`upsert` or `delete`): files cannot be updated in place.

use std::sync::Arc;

use async_trait::async_trait;
use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, PutPayload};
use serde::{Deserialize, Serialize};
use sluice_core::{Delivery, Destination, Error, ErrorKind, Result, Secret, SyncMode};

use super::encode::{change_batches, encode};

/// The file format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FileFormat {
    /// Apache Parquet, Snappy-compressed.
    #[default]
    Parquet,
    /// CSV with a header row.
    Csv,
    /// One JSON object per line.
    Jsonl,
}

impl FileFormat {
    fn extension(self) -> &'static str {
        match self {
            Self::Parquet => "parquet",
            Self::Csv => "csv",
            Self::Jsonl => "jsonl",
        }
    }
}

/// Where and how files are written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FilesConfig {
    /// A local folder, or `s3://bucket/prefix`.
    pub location: String,
    /// `parquet`, `csv` or `jsonl`.
    #[serde(default)]
    pub format: FileFormat,
    /// The file name (without extension); the sync's name by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// S3 settings, for an `s3://` location.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3: Option<S3Config>,
}

/// An S3 bucket's endpoint and credentials; without credentials the usual AWS environment
/// variables are used.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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

fn default_region() -> String {
    "us-east-1".into()
}

impl FilesConfig {
    /// Check the fields; pure.
    pub fn validate(&self) -> Result<()> {
        if self.location.trim().is_empty() {
            return Err(Error::config("destination.location", "a folder or s3://bucket/prefix is needed"));
        }
        if let Some(rest) = self.location.strip_prefix("s3://") {
            if rest.split('/').next().is_none_or(str::is_empty) {
                return Err(Error::config("destination.location", "s3:// needs a bucket name"));
            }
        } else if self.location.contains("://") {
            return Err(Error::config("destination.location", "only local folders and s3:// are supported"));
        } else if self.s3.is_some() {
            return Err(Error::config("destination.s3", "only for an s3:// location"));
        }
        if let Some(name) = &self.name
            && (name.is_empty() || name.contains('/'))
        {
            return Err(Error::config("destination.name", "a file name without '/'"));
        }
        Ok(())
    }

    /// The store and the prefix inside it.
    fn store(&self) -> Result<(Arc<dyn ObjectStore>, String)> {
        if let Some(rest) = self.location.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            let s3 = self.s3.clone().unwrap_or(S3Config {
                endpoint: None,
                region: default_region(),
                access_key_id: None,
                secret_access_key: None,
            });
            let mut builder = AmazonS3Builder::from_env().with_bucket_name(bucket).with_region(&s3.region);
            if let Some(endpoint) = &s3.endpoint {
                builder = builder.with_endpoint(endpoint).with_allow_http(endpoint.starts_with("http://"));
            }
            if let Some(id) = &s3.access_key_id {
                builder = builder.with_access_key_id(id);
            }
            if let Some(secret) = &s3.secret_access_key {
                builder = builder.with_secret_access_key(secret.expose());
            }
            let store = builder.build().map_err(|e| Error::config("destination.s3", e))?;
            return Ok((Arc::new(store), prefix.trim_matches('/').to_string()));
        }
        std::fs::create_dir_all(&self.location).map_err(|e| {
            Error::new(ErrorKind::Config, format!("destination.location: cannot create {}: {e}", self.location))
        })?;
        let store =
            LocalFileSystem::new_with_prefix(&self.location).map_err(|e| Error::config("destination.location", e))?;
        Ok((Arc::new(store), String::new()))
    }
}

/// Writes files.
pub struct FilesTarget {
    config: FilesConfig,
}

impl FilesTarget {
    /// A destination for `config`.
    pub fn new(config: FilesConfig) -> Self {
        Self { config }
    }
}

fn join(prefix: &str, name: &str) -> StorePath {
    if prefix.is_empty() { StorePath::from(name) } else { StorePath::from(format!("{prefix}/{name}")) }
}

#[async_trait]
impl Destination for FilesTarget {
    async fn check(&mut self) -> Result<()> {
        let (store, prefix) = self.config.store()?;
        let probe = join(&prefix, &format!(".sluice-check-{}", rand::random::<u32>()));
        store.put(&probe, PutPayload::from_static(b"")).await.map_err(store_error)?;
        store.delete(&probe).await.map_err(store_error)
    }

    async fn deliver(&mut self, delivery: &Delivery) -> Result<()> {
        let (store, prefix) = self.config.store()?;
        let format = self.config.format;
        let name = self.config.name.clone().unwrap_or_else(|| delivery.sync.clone());
        let ext = format.extension();
        let (path, schema, batches) = match delivery.mode {
            SyncMode::Replace => {
                (join(&prefix, &format!("{name}.{ext}")), delivery.schema.clone(), delivery.rows.clone())
            }
            SyncMode::Append => {
                (run_file(&prefix, &name, delivery, ext), delivery.schema.clone(), delivery.rows.clone())
            }
            SyncMode::Upsert | SyncMode::Mirror => {
                let (schema, batches) = change_batches(&delivery.schema, &delivery.rows, &delivery.deletes)?;
                (run_file(&prefix, &name, delivery, ext), schema, batches)
            }
        };
        if delivery.mode.keyed() && batches.is_empty() {
            return Ok(());
        }
        let bytes = tokio::task::spawn_blocking(move || encode(format, &schema, &batches))
            .await
            .map_err(|e| Error::new(ErrorKind::Fatal, "file encoding panicked").with_source(e))??;
        store.put(&path, PutPayload::from(bytes)).await.map_err(store_error)?;
        Ok(())
    }
}

/// `<prefix>/<name>/<UTC time>-<run>.<ext>`: names sort by time.
fn run_file(prefix: &str, name: &str, delivery: &Delivery, ext: &str) -> StorePath {
    let time = chrono::Utc::now().format("%Y%m%dT%H%M%S%.3fZ");
    join(prefix, &format!("{name}/{time}-{}.{ext}", delivery.run_id))
}

fn store_error(e: object_store::Error) -> Error {
    let kind = match &e {
        object_store::Error::Generic { .. } => ErrorKind::Connect,
        _ => ErrorKind::Fatal,
    };
    Error::new(kind, format!("files: {e}"))
}
