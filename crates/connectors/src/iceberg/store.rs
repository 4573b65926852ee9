//! Where an Iceberg table's files are: a local folder (`file://`) or S3, read and written by
//! the compaction and by the SQL catalog's front (metadata files).

use std::sync::Arc;

use sluice_core::{Error, ErrorKind, Result};

use super::IcebergConfig;
use crate::files::S3Config;

/// Where the table's files are: a local folder (`file://`) or S3 (the destination's account).
#[derive(Clone)]
pub(crate) enum Store {
    Local,
    S3(Arc<dyn object_store::ObjectStore>),
}

impl Store {
    pub(crate) fn new(config: &IcebergConfig, location: &str) -> Result<Self> {
        Self::for_files(location, config.s3.as_ref())
    }

    /// The store of `location`, S3 through `s3` (the destination's account).
    pub(crate) fn for_files(location: &str, s3: Option<&S3Config>) -> Result<Self> {
        if let Some(rest) = location.strip_prefix("s3://") {
            let bucket = rest.split('/').next().unwrap_or_default();
            return Ok(Self::S3(crate::files::s3_store(bucket, s3, "destination.s3")?));
        }
        if location.starts_with("file:") || location.starts_with('/') {
            return Ok(Self::Local);
        }
        Err(Error::new(ErrorKind::Fatal, format!("Iceberg: files at '{location}' are not reachable")))
    }

    /// What DuckDB writes to: a local path, or the URL.
    pub(crate) fn local_or_url(&self, url: &str) -> String {
        match self {
            Self::Local => local_path(url),
            Self::S3(_) => url.to_string(),
        }
    }

    pub(crate) fn object(url: &str) -> object_store::path::Path {
        let rest = url.strip_prefix("s3://").unwrap_or(url);
        object_store::path::Path::from(rest.split_once('/').map_or("", |(_, key)| key))
    }

    pub(crate) async fn put(&self, url: &str, bytes: Vec<u8>) -> Result<()> {
        match self {
            Self::Local => {
                let path = local_path(url);
                if let Some(parent) = std::path::Path::new(&path).parent() {
                    std::fs::create_dir_all(parent).map_err(|e| io_error(&path, &e))?;
                }
                std::fs::write(&path, bytes).map_err(|e| io_error(&path, &e))
            }
            Self::S3(store) => store
                .put(&Self::object(url), bytes.into())
                .await
                .map(|_| ())
                .map_err(|e| Error::new(ErrorKind::Connect, format!("Iceberg: writing {url}: {e}"))),
        }
    }

    /// The bytes of the file at `url`; `None` when there is none.
    pub(crate) async fn get(&self, url: &str) -> Result<Option<Vec<u8>>> {
        match self {
            Self::Local => {
                let path = local_path(url);
                match std::fs::read(&path) {
                    Ok(bytes) => Ok(Some(bytes)),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                    Err(e) => Err(io_error(&path, &e)),
                }
            }
            Self::S3(store) => match store.get(&Self::object(url)).await {
                Ok(got) => got
                    .bytes()
                    .await
                    .map(|b| Some(b.to_vec()))
                    .map_err(|e| Error::new(ErrorKind::Connect, format!("Iceberg: reading {url}: {e}"))),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(Error::new(ErrorKind::Connect, format!("Iceberg: reading {url}: {e}"))),
            },
        }
    }

    pub(crate) async fn delete(&self, url: &str) -> Result<()> {
        match self {
            Self::Local => std::fs::remove_file(local_path(url)).map_err(|e| io_error(url, &e)),
            Self::S3(store) => store
                .delete(&Self::object(url))
                .await
                .map_err(|e| Error::new(ErrorKind::Connect, format!("Iceberg: removing {url}: {e}"))),
        }
    }

    pub(crate) async fn size(&self, url: &str) -> Result<u64> {
        match self {
            Self::Local => {
                let path = local_path(url);
                std::fs::metadata(&path).map(|m| m.len()).map_err(|e| io_error(&path, &e))
            }
            Self::S3(store) => store
                .head(&Self::object(url))
                .await
                .map(|m| m.size)
                .map_err(|e| Error::new(ErrorKind::Connect, format!("Iceberg: reading {url}: {e}"))),
        }
    }
}

/// `file:///a/b` (or `file:/a/b`) as `/a/b`.
fn local_path(url: &str) -> String {
    let rest = url.strip_prefix("file://").or_else(|| url.strip_prefix("file:")).unwrap_or(url);
    rest.to_string()
}

fn io_error(path: &str, e: &std::io::Error) -> Error {
    Error::new(ErrorKind::Connect, format!("Iceberg: {path}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_locations_become_paths() {
        assert_eq!(local_path("file:///tmp/w/t"), "/tmp/w/t");
        assert_eq!(local_path("file:/tmp/w/t"), "/tmp/w/t");
        assert_eq!(Store::object("s3://bucket/w/t/data/x.parquet").as_ref(), "w/t/data/x.parquet");
    }
}
