//! Files as a stream's destination. Each unit's rows join the open file of their table in the
//! local spool (durable with the unit's checkpoint, see `spool.rs`); a file closes when it
//! reaches its rotation limits (rows, bytes, age) or its table's columns change, and is then
//! encoded and put in the store under a name from the template. A file's name comes from the
//! unit that opened it, so a crash between the put and the spool's update writes the same name
//! again: a reader listing the folder never sees a row twice. Mirrored tables become change
//! files with an `_sluice_op` column (`upsert`, `delete`, or `truncate` before a new copy).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use arrow::array::{ArrayRef, StringArray, new_null_array};
use arrow::record_batch::RecordBatch;
use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sluice_core::{Delivery, Destination, Error, ErrorKind, Result, Stamp, SyncMode};

use super::config::{FilesConfig, Rotate};
use super::encode::{change_batches, encode};
use super::names::{FileName, Template};
use super::spool::{Spool, fingerprint};
use super::store::Store;

/// A stream's files destination.
pub struct FilesStream {
    stream: String,
    config: FilesConfig,
    template: Template,
    rotate: Rotate,
    store: Option<Store>,
    spool: Spool,
    /// After a failed put, no file closes before this.
    retry_at: Option<std::time::Instant>,
}

impl FilesStream {
    /// The destination of `stream`, spooling in `spool_dir` (a folder of its own).
    pub fn open(stream: &str, config: &FilesConfig, spool_dir: &Path) -> Result<Self> {
        config.validate()?;
        Ok(Self {
            stream: stream.to_string(),
            config: config.clone(),
            template: config.template()?,
            rotate: config.rotate.unwrap_or_default(),
            store: None,
            spool: Spool::open(spool_dir)?,
            retry_at: None,
        })
    }

    fn store(&mut self) -> Result<&Store> {
        if self.store.is_none() {
            self.store = Some(Store::open(&self.config)?);
        }
        self.store.as_ref().ok_or_else(|| Error::new(ErrorKind::Fatal, "files: no store"))
    }

    /// Encode `table`'s open file, put it in the store, and forget it in the spool.
    async fn close_file(&mut self, table: &str) -> Result<()> {
        let Some(open) = self.spool.open_file(table).cloned() else { return Ok(()) };
        let batches = self.spool.read(table)?;
        let opened = DateTime::<Utc>::from_timestamp_micros(open.opened_us).unwrap_or_default();
        let ext = self.config.extension();
        let name = self.template.render(&FileName { stream: &self.stream, table, seq: open.seq, opened, ext: &ext })?;
        let (format, compression) = (self.config.format, self.config.compression());
        let started = std::time::Instant::now();
        let bytes = tokio::task::spawn_blocking(move || match batches.first() {
            Some(first) => encode(format, compression, &first.schema(), &batches),
            None => Ok(Vec::new()),
        })
        .await
        .map_err(|e| Error::new(ErrorKind::Fatal, "file encoding panicked").with_source(e))??;
        let size = bytes.len();
        self.store()?.put(&name, bytes).await?;
        self.spool.close(table)?;
        tracing::info!(stream = %self.stream, file = %name, rows = open.rows, bytes = size,
            ms = started.elapsed().as_millis() as u64, "File written.");
        Ok(())
    }

    /// Close every file whose rotation limit is reached; all of them with `all`. After a
    /// failure the store gets 5 s before the next try (the spool keeps the rows meanwhile).
    async fn close_due(&mut self, all: bool) -> Result<()> {
        if !all && self.retry_at.is_some_and(|at| std::time::Instant::now() < at) {
            return Ok(());
        }
        let result = self.close_due_now(all).await;
        self.retry_at = result.is_err().then(|| std::time::Instant::now() + Duration::from_secs(5));
        result
    }

    async fn close_due_now(&mut self, all: bool) -> Result<()> {
        let now = Utc::now().timestamp_micros();
        let age = Duration::from_secs(self.rotate.seconds).as_micros() as i64;
        for table in self.spool.tables() {
            let Some(open) = self.spool.open_file(&table) else { continue };
            if all || open.rows >= self.rotate.rows || open.bytes >= self.rotate.bytes || now - open.opened_us >= age {
                self.close_file(&table).await?;
            }
        }
        Ok(())
    }
}

/// The rows a delivery adds to its table's file.
fn file_rows(delivery: &Delivery) -> Result<Vec<RecordBatch>> {
    let rows = || delivery.rows.iter().filter(|b| b.num_rows() > 0).cloned().collect::<Vec<_>>();
    Ok(match delivery.mode {
        SyncMode::Append => rows(),
        SyncMode::Replace if delivery.keys.is_empty() => rows(),
        SyncMode::Replace => {
            // A mirrored table starts over (a truncate, or a new snapshot copy).
            let (schema, mut batches) = change_batches(&delivery.schema, &delivery.rows, &[])?;
            let mut columns: Vec<ArrayRef> = schema
                .fields()
                .iter()
                .take(schema.fields().len() - 1)
                .map(|f| new_null_array(f.data_type(), 1))
                .collect();
            columns.push(Arc::new(StringArray::from(vec!["truncate"])));
            let truncate = RecordBatch::try_new(schema, columns)
                .map_err(|e| Error::new(ErrorKind::Fatal, "cannot build a truncate row").with_source(e))?;
            batches.insert(0, truncate);
            batches.retain(|b| b.num_rows() > 0);
            batches
        }
        SyncMode::Upsert | SyncMode::Mirror => {
            let (_, batches) = change_batches(&delivery.schema, &delivery.rows, &delivery.deletes)?;
            batches.into_iter().filter(|b| b.num_rows() > 0).collect()
        }
    })
}

#[async_trait]
impl Destination for FilesStream {
    async fn check(&mut self) -> Result<()> {
        self.store()?.check().await
    }

    async fn deliver(&mut self, delivery: &Delivery) -> Result<()> {
        self.write(std::slice::from_ref(delivery), None).await
    }

    async fn write(&mut self, deliveries: &[Delivery], stamp: Option<&Stamp>) -> Result<()> {
        let mut unit: Vec<(String, Vec<RecordBatch>)> = Vec::new();
        for delivery in deliveries {
            let table = delivery.table.clone().unwrap_or_else(|| delivery.sync.clone());
            let batches = file_rows(delivery)?;
            if batches.is_empty() {
                continue;
            }
            match unit.iter_mut().find(|(t, _)| *t == table) {
                Some((_, existing)) if fingerprint(&existing[0]) == fingerprint(&batches[0]) => {
                    existing.extend(batches)
                }
                Some(_) => {
                    return Err(Error::new(
                        ErrorKind::Fatal,
                        format!("files: one unit brought table '{table}' with two sets of columns"),
                    ));
                }
                None => unit.push((table, batches)),
            }
        }
        // A file holds one schema: a table whose columns changed closes its file first.
        for (table, batches) in &unit {
            if self.spool.open_file(table).is_some_and(|open| open.schema != fingerprint(&batches[0])) {
                self.close_file(table).await?;
            }
        }
        let checkpoint = stamp.map(|s| s.checkpoint.clone()).or_else(|| self.spool.checkpoint().map(str::to_string));
        self.spool.append(&unit, checkpoint.as_deref())?;
        // The unit is durable; a store that fails now is retried on the next tick.
        if let Err(e) = self.close_due(false).await {
            tracing::warn!(stream = %self.stream, error = %e, "Cannot close a file yet; retrying.");
        }
        Ok(())
    }

    async fn stamp(&mut self, _owner: &str) -> Result<Option<String>> {
        Ok(self.spool.checkpoint().map(str::to_string))
    }

    async fn tick(&mut self) -> Result<()> {
        self.close_due(false).await
    }

    fn gauges(&self) -> Vec<(&'static str, f64)> {
        let now = Utc::now().timestamp_micros();
        let tables = self.spool.tables();
        let open: Vec<_> = tables.iter().filter_map(|t| self.spool.open_file(t)).collect();
        let rows: u64 = open.iter().map(|f| f.rows).sum();
        let oldest = open.iter().map(|f| f.opened_us).min().map_or(0.0, |us| (now - us).max(0) as f64 / 1e6);
        vec![("pending_rows", rows as f64), ("pending_seconds", oldest)]
    }

    async fn finish(&mut self) -> Result<()> {
        self.close_due(true).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::FileFormat;
    use crate::test_rows::unit;

    fn files(dir: &Path) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    stack.push(p);
                } else {
                    let name = p.strip_prefix(dir).unwrap().display().to_string();
                    out.push((name, std::fs::read_to_string(&p).unwrap()));
                }
            }
        }
        out.sort();
        out
    }

    fn copy_dir(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for e in std::fs::read_dir(from).unwrap() {
            let p = e.unwrap().path();
            std::fs::copy(&p, to.join(p.file_name().unwrap())).unwrap();
        }
    }

    #[tokio::test]
    async fn a_file_written_again_after_a_crash_replaces_itself() {
        let root = std::env::temp_dir().join(format!("sluice-files-{}", rand::random::<u64>()));
        let (out, spool, saved) = (root.join("out"), root.join("spool"), root.join("saved"));
        let config = FilesConfig {
            connection: None,
            location: out.display().to_string(),
            format: FileFormat::Jsonl,
            compression: None,
            name: None,
            path: None,
            rotate: None,
            s3: None,
            azure: None,
            gcs: None,
        };
        let mut files_stream = FilesStream::open("s", &config, &spool).unwrap();
        let stamp = |n: u32| Stamp { owner: "s".into(), checkpoint: format!("cp{n}") };
        files_stream.write(&unit(&[1, 2]), Some(&stamp(1))).await.unwrap();
        files_stream.write(&unit(&[3]), Some(&stamp(2))).await.unwrap();
        // The spool as it was just before the file was put; then the put and the spool's update.
        copy_dir(&spool, &saved);
        files_stream.finish().await.unwrap();
        let written = files(&out);
        assert_eq!(written.len(), 1, "{written:?}");
        assert_eq!(written[0].1.lines().count(), 3);
        // A crash right after the put: the spool still names the file's rows.
        drop(files_stream);
        std::fs::remove_dir_all(&spool).unwrap();
        copy_dir(&saved, &spool);
        let mut again = FilesStream::open("s", &config, &spool).unwrap();
        assert_eq!(again.stamp("s").await.unwrap().as_deref(), Some("cp2"), "resumes after the spooled units");
        again.finish().await.unwrap();
        assert_eq!(files(&out), written, "the same name, the same rows: no file twice");
        std::fs::remove_dir_all(root).unwrap();
    }
}
