//! Where Delta tables live: a local folder or `s3://bucket/prefix`, one table per folder under
//! it, and how often their small files are merged.

use std::sync::Arc;

use object_store::ObjectStore;
use object_store::local::LocalFileSystem;
use serde::{Deserialize, Serialize};
use sluice_core::{Error, ErrorKind, Result};

use crate::files::S3Config;

/// Delta tables under one location: the table `t` is the folder `<location>/t`, with its
/// `_delta_log` beside its Parquet files.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeltaConfig {
    /// A local folder, or `s3://bucket/prefix`.
    pub location: String,
    /// The S3 account of an `s3://` location (endpoint, region, keys).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3: Option<S3Config>,
    /// The table; created when missing. A stream leaves it out: its `table` names the table.
    #[serde(default)]
    pub table: String,
    /// Small-file upkeep.
    #[serde(default)]
    pub compaction: DeltaCompaction,
}

/// Each write is a commit with a Parquet file of its own, so a stream leaves many small files.
/// Between writes the writer merges them (a commit that changes no data), writes a log
/// checkpoint, and removes files no version within `keep_versions_s` reads.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeltaCompaction {
    /// Merge once this many files are smaller than `small_file_bytes`; 0 merges only on
    /// demand (`POST /api/streams/:id/compact`).
    #[serde(default = "default_small_files")]
    pub small_files: usize,
    /// A file under this size is small.
    #[serde(default = "default_small_bytes")]
    pub small_file_bytes: u64,
    /// Seconds a removed file stays for readers of older versions before it is deleted.
    #[serde(default = "default_keep")]
    pub keep_versions_s: u64,
}

impl Default for DeltaCompaction {
    fn default() -> Self {
        Self {
            small_files: default_small_files(),
            small_file_bytes: default_small_bytes(),
            keep_versions_s: default_keep(),
        }
    }
}

fn default_small_files() -> usize {
    64
}

fn default_small_bytes() -> u64 {
    16 << 20
}

fn default_keep() -> u64 {
    3600
}

impl DeltaConfig {
    /// One table per commit.
    pub fn capabilities(&self) -> sluice_core::Capabilities {
        sluice_core::Capabilities { multiset: true, ..Default::default() }
    }

    /// Check the fields; pure.
    pub fn validate(&self) -> Result<()> {
        if self.table.trim().is_empty() {
            return Err(Error::config("destination.table", "must not be empty"));
        }
        check_name("destination.table", &self.table)?;
        self.validate_connection()
    }

    /// Check every field but the table (a stream's destination takes the stream's); pure.
    pub fn validate_connection(&self) -> Result<()> {
        if self.location.trim().is_empty() {
            return Err(Error::config("destination.location", "a folder or s3://bucket/prefix"));
        }
        if self.location.contains("://") && !self.location.starts_with("s3://") {
            return Err(Error::config("destination.location", "a local folder or s3://bucket/prefix"));
        }
        if self.location.starts_with("s3://") && self.bucket().0.is_empty() {
            return Err(Error::config("destination.location", "s3://bucket/prefix needs a bucket"));
        }
        if self.s3.is_some() && !self.location.starts_with("s3://") {
            return Err(Error::config("destination.s3", "only for an s3:// location"));
        }
        Ok(())
    }

    /// Bucket and prefix of an `s3://` location.
    fn bucket(&self) -> (&str, &str) {
        let rest = self.location.strip_prefix("s3://").unwrap_or("");
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        (bucket, prefix.trim_matches('/'))
    }

    /// The store and the prefix of every table folder in it.
    pub(crate) fn store(&self) -> Result<(Arc<dyn ObjectStore>, String)> {
        if self.location.starts_with("s3://") {
            let (bucket, prefix) = self.bucket();
            let store = crate::files::s3_store(bucket, self.s3.as_ref(), "destination.s3")?;
            return Ok((store, prefix.to_string()));
        }
        std::fs::create_dir_all(&self.location).map_err(|e| {
            Error::new(ErrorKind::Config, format!("destination.location: cannot create {}: {e}", self.location))
        })?;
        let store =
            LocalFileSystem::new_with_prefix(&self.location).map_err(|e| Error::config("destination.location", e))?;
        Ok((Arc::new(store), String::new()))
    }
}

/// A table's folder name: what a stream's `table` or routing makes must stay one folder.
pub(crate) fn check_name(field: &str, table: &str) -> Result<()> {
    let ok = !table.is_empty()
        && table.len() <= 128
        && table != "."
        && table != ".."
        && table.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if ok {
        Ok(())
    } else {
        Err(Error::config(field, format!("'{table}': a Delta table is a folder; use letters, digits, '_', '-' or '.'")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(location: &str) -> DeltaConfig {
        DeltaConfig { location: location.into(), s3: None, table: "t".into(), compaction: DeltaCompaction::default() }
    }

    #[test]
    fn fields_are_named_when_wrong() {
        assert!(config("/tmp/x").validate().is_ok());
        assert!(config("s3://bucket/p").validate().is_ok());
        for (location, field) in [("", "location"), ("gs://b/p", "location"), ("s3:///p", "location")] {
            let e = config(location).validate().unwrap_err();
            assert!(e.message().contains(field), "{location}: {e}");
        }
        let mut c = config("/tmp/x");
        c.table = "../up".into();
        assert!(c.validate().unwrap_err().message().contains("destination.table"));
    }
}
