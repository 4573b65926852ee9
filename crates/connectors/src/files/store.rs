//! The place files go: a local folder, S3 or Azure Blob through `object_store`, or Google
//! Cloud Storage through its JSON API (`gcs.rs`: `object_store` uploads to GCS through the
//! XML API, which the fake-gcs-server emulator does not take). Every put is atomic: a reader
//! sees a whole file or none.

use std::sync::Arc;

use object_store::aws::AmazonS3Builder;
use object_store::azure::MicrosoftAzureBuilder;
use object_store::local::LocalFileSystem;
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, PutPayload, RetryConfig};
use sluice_core::{Error, ErrorKind, Result};

use super::config::{FilesConfig, S3Config, Scheme, default_region};
use super::gcs::{GcsClient, GcsConfig};

/// A built store and the prefix of every name inside it.
pub(crate) struct Store {
    backend: Backend,
    prefix: String,
}

enum Backend {
    Object(Arc<dyn ObjectStore>),
    Gcs(GcsClient),
}

impl Store {
    /// The store `config` names; a local folder is created.
    pub(crate) fn open(config: &FilesConfig) -> Result<Self> {
        let (scheme, bucket, prefix) = config.parts();
        let backend = match scheme {
            Scheme::Local => {
                std::fs::create_dir_all(&config.location).map_err(|e| {
                    Error::new(
                        ErrorKind::Config,
                        format!("destination.location: cannot create {}: {e}", config.location),
                    )
                })?;
                let store = LocalFileSystem::new_with_prefix(&config.location)
                    .map_err(|e| Error::config("destination.location", e))?;
                Backend::Object(Arc::new(store))
            }
            Scheme::S3 => Backend::Object(s3_store(bucket, config.s3.as_ref(), "destination.s3")?),
            Scheme::Azure => {
                let azure = config.azure.as_ref().ok_or_else(|| Error::config("destination.azure", "needed"))?;
                let mut builder = MicrosoftAzureBuilder::from_env()
                    .with_account(&azure.account)
                    .with_container_name(bucket)
                    .with_retry(retry());
                if let Some(key) = &azure.access_key {
                    builder = builder.with_access_key(key.expose());
                }
                if let Some(endpoint) = &azure.endpoint {
                    builder = builder.with_endpoint(endpoint.clone()).with_allow_http(endpoint.starts_with("http://"));
                }
                Backend::Object(Arc::new(builder.build().map_err(|e| Error::config("destination.azure", e))?))
            }
            Scheme::Gcs => {
                let gcs = config.gcs.clone().unwrap_or(GcsConfig { endpoint: None, token: None });
                Backend::Gcs(GcsClient::new(&gcs, bucket)?)
            }
        };
        Ok(Self { backend, prefix: prefix.to_string() })
    }

    fn full(&self, name: &str) -> String {
        if self.prefix.is_empty() { name.to_string() } else { format!("{}/{name}", self.prefix) }
    }

    /// Write `bytes` as `name`, replacing what was there.
    pub(crate) async fn put(&self, name: &str, bytes: Vec<u8>) -> Result<()> {
        let full = self.full(name);
        match &self.backend {
            Backend::Object(store) => {
                store.put(&StorePath::from(full), PutPayload::from(bytes)).await.map(|_| ()).map_err(store_error)
            }
            Backend::Gcs(client) => client.put(&full, bytes.into()).await,
        }
    }

    /// Remove `name`; a missing file is fine.
    pub(crate) async fn delete(&self, name: &str) -> Result<()> {
        let full = self.full(name);
        match &self.backend {
            Backend::Object(store) => match store.delete(&StorePath::from(full)).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(e) => Err(store_error(e)),
            },
            Backend::Gcs(client) => client.delete(&full).await,
        }
    }

    /// Whether the store takes a write: a probe file, put and removed.
    pub(crate) async fn check(&self) -> Result<()> {
        let probe = format!(".sluice-check-{}", rand::random::<u32>());
        self.put(&probe, Vec::new()).await?;
        self.delete(&probe).await
    }
}

/// The S3 bucket `bucket` with the account of `s3` (the usual AWS environment variables fill
/// what it leaves out); `field` names the settings in errors.
pub(crate) fn s3_store(bucket: &str, s3: Option<&S3Config>, field: &str) -> Result<Arc<dyn ObjectStore>> {
    let region = s3.map_or_else(default_region, |s| s.region.clone());
    let mut builder = AmazonS3Builder::from_env().with_bucket_name(bucket).with_region(region).with_retry(retry());
    if let Some(endpoint) = s3.and_then(|s| s.endpoint.as_ref()) {
        builder = builder.with_endpoint(endpoint).with_allow_http(endpoint.starts_with("http://"));
    }
    if let Some(id) = s3.and_then(|s| s.access_key_id.as_ref()) {
        builder = builder.with_access_key_id(id);
    }
    if let Some(secret) = s3.and_then(|s| s.secret_access_key.as_ref()) {
        builder = builder.with_secret_access_key(secret.expose());
    }
    Ok(Arc::new(builder.build().map_err(|e| Error::config(field, e))?))
}

/// A few quick retries: a put that keeps failing is tried again later by its caller, while the
/// rows wait in the spool, instead of holding the stream for minutes.
fn retry() -> RetryConfig {
    RetryConfig { max_retries: 3, retry_timeout: std::time::Duration::from_secs(20), ..RetryConfig::default() }
}

fn store_error(e: object_store::Error) -> Error {
    let kind = match &e {
        object_store::Error::Generic { .. } => ErrorKind::Connect,
        _ => ErrorKind::Fatal,
    };
    Error::new(kind, format!("files: {e}"))
}
