//! Files as a reverse ETL destination.
//!
//! - `replace` writes `<location>/<name>.<ext>`; a put is atomic both on a local disk
//!   (`object_store` writes a temporary file and renames it) and on S3, so a reader sees the
//!   old file or the new one.
//! - `append` adds `<location>/<name>/<time>-<run>.<ext>` per run.
//! - `upsert` and `mirror` add a change file per run in the same folder, with an `_sluice_op`
//!   column (`upsert` or `delete`): files cannot be updated in place.

use async_trait::async_trait;
use sluice_core::{Delivery, Destination, Error, ErrorKind, Result, SyncMode};

use super::config::FilesConfig;
use super::encode::{change_batches, encode};
use super::store::Store;

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

#[async_trait]
impl Destination for FilesTarget {
    async fn check(&mut self) -> Result<()> {
        Store::open(&self.config)?.check().await
    }

    async fn deliver(&mut self, delivery: &Delivery) -> Result<()> {
        let store = Store::open(&self.config)?;
        let (format, compression) = (self.config.format, self.config.compression());
        let name = self.config.name.clone().unwrap_or_else(|| delivery.sync.clone());
        let ext = &self.config.extension();
        let (path, schema, batches): (String, _, _) = match delivery.mode {
            SyncMode::Replace => (format!("{name}.{ext}"), delivery.schema.clone(), delivery.rows.clone()),
            SyncMode::Append => (run_file(&name, delivery, ext), delivery.schema.clone(), delivery.rows.clone()),
            SyncMode::Upsert | SyncMode::Mirror => {
                let (schema, batches) = change_batches(&delivery.schema, &delivery.rows, &delivery.deletes)?;
                (run_file(&name, delivery, ext), schema, batches)
            }
        };
        if delivery.mode.keyed() && batches.is_empty() {
            return Ok(());
        }
        let bytes = tokio::task::spawn_blocking(move || encode(format, compression, &schema, &batches))
            .await
            .map_err(|e| Error::new(ErrorKind::Fatal, "file encoding panicked").with_source(e))??;
        store.put(&path, bytes).await
    }
}

/// `<name>/<UTC time>-<run>.<ext>`: names sort by time.
fn run_file(name: &str, delivery: &Delivery, ext: &str) -> String {
    let time = chrono::Utc::now().format("%Y%m%dT%H%M%S%.3fZ");
    format!("{name}/{time}-{}.{ext}", delivery.run_id)
}
