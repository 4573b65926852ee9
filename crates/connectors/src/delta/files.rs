//! A Delta table's data files: Parquet written from batches conformed to the table's columns,
//! read back (older files lack later columns: those read as null), and rows' keys as bytes
//! (arrow's row format) so a merge finds the files that hold the keys it changes.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch};
use arrow::datatypes::SchemaRef;
use arrow::row::{RowConverter, SortField};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use sluice_core::{Error, ErrorKind, Result};

use super::log::{Add, Log, now_ms};
use super::schema::conform;
use crate::files::{Compression, FileFormat};

fn failed(what: &str, e: &dyn std::fmt::Display) -> Error {
    Error::new(ErrorKind::Fatal, format!("delta: {what}: {e}"))
}

/// Parquet work off the async threads.
async fn blocking<T: Send + 'static>(work: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| Error::new(ErrorKind::Fatal, "delta: Parquet work panicked").with_source(e))?
}

/// Write `batches` (already of the table's columns) as a new data file; its `add` action.
pub(crate) async fn write(log: &Log, schema: &SchemaRef, batches: &[RecordBatch]) -> Result<Add> {
    let rows: usize = batches.iter().map(RecordBatch::num_rows).sum();
    let (schema, batches) = (schema.clone(), batches.to_vec());
    let bytes =
        blocking(move || crate::files::encode(FileFormat::Parquet, Compression::Snappy, &schema, &batches)).await?;
    let path = format!("part-{:032x}.snappy.parquet", rand::random::<u128>());
    let size = i64::try_from(bytes.len()).unwrap_or(i64::MAX);
    log.put(&path, bytes).await?;
    Ok(Add {
        path,
        partition_values: Default::default(),
        size,
        modification_time: now_ms(),
        data_change: true,
        stats: Some(format!(r#"{{"numRecords":{rows}}}"#)),
        deletion_vector: None,
    })
}

/// The rows of data file `path`, as the table's columns `schema`; only the columns `only`
/// names (and in that order) when given.
pub(crate) async fn read(
    log: &Log,
    path: &str,
    schema: &SchemaRef,
    only: Option<&[String]>,
) -> Result<Vec<RecordBatch>> {
    let bytes = log
        .get(path)
        .await?
        .ok_or_else(|| Error::new(ErrorKind::Fatal, format!("delta: data file {path} the log lists is missing")))?;
    let schema = match only {
        Some(names) => Arc::new(
            schema
                .project(&names.iter().filter_map(|n| schema.index_of(n).ok()).collect::<Vec<_>>())
                .map_err(|e| failed(path, &e))?,
        ),
        None => schema.clone(),
    };
    let path = path.to_string();
    blocking(move || {
        let builder = ParquetRecordBatchReaderBuilder::try_new(bytes).map_err(|e| failed(&path, &e))?;
        // Only the columns wanted, matched by name (a file may lack later columns).
        let wanted: Vec<usize> = builder
            .parquet_schema()
            .columns()
            .iter()
            .enumerate()
            .filter(|(_, c)| {
                let top = c.path().parts().first().map(String::as_str).unwrap_or_default();
                schema.fields().iter().any(|f| f.name().eq_ignore_ascii_case(top))
            })
            .map(|(i, _)| i)
            .collect();
        let mask = parquet::arrow::ProjectionMask::leaves(builder.parquet_schema(), wanted);
        let reader = builder.with_projection(mask).with_batch_size(65_536).build().map_err(|e| failed(&path, &e))?;
        reader.map(|batch| conform(&batch.map_err(|e| failed(&path, &e))?, &schema)).collect()
    })
    .await
}

/// Rows' key values as comparable bytes, for key columns `columns` of one fixed set of types.
pub(crate) struct KeyCodec {
    pub columns: Vec<String>,
    converter: RowConverter,
}

impl KeyCodec {
    /// A codec of `columns` as `schema` (the table's) types them.
    pub(crate) fn new(schema: &SchemaRef, columns: &[String]) -> Result<Self> {
        let fields = columns
            .iter()
            .map(|c| {
                let field = schema.field_with_name(c).map_err(|_| {
                    Error::new(ErrorKind::Fatal, format!("delta: key column '{c}' is not in the table"))
                })?;
                Ok(SortField::new(field.data_type().clone()))
            })
            .collect::<Result<Vec<_>>>()?;
        let converter = RowConverter::new(fields).map_err(|e| failed("key columns", &e))?;
        Ok(Self { columns: columns.to_vec(), converter })
    }

    /// Each row's key (`batch` has at least the key columns, of the table's types).
    pub(crate) fn keys(&self, batch: &RecordBatch) -> Result<Vec<Vec<u8>>> {
        let columns = self
            .columns
            .iter()
            .map(|c| {
                batch
                    .column_by_name(c)
                    .cloned()
                    .ok_or_else(|| Error::new(ErrorKind::Fatal, format!("delta: rows lack the key column '{c}'")))
            })
            .collect::<Result<Vec<ArrayRef>>>()?;
        let rows = self.converter.convert_columns(&columns).map_err(|e| failed("key columns", &e))?;
        Ok(rows.iter().map(|r| r.as_ref().to_vec()).collect())
    }
}

/// Which data files hold each key of a keyed table, so a merge rewrites only those files.
/// Built once by reading every file's key columns, then kept up to date by each commit. A key
/// is usually in one file; appends and other writers can put it in several.
pub(crate) struct KeyIndex {
    pub codec: KeyCodec,
    pub files: HashMap<Vec<u8>, Vec<Arc<str>>>,
}

impl KeyIndex {
    /// The keys of `batches` are (also) in `path`.
    pub(crate) fn point(&mut self, batches: &[RecordBatch], path: &str) -> Result<()> {
        let path: Arc<str> = Arc::from(path);
        for batch in batches {
            for key in self.codec.keys(batch)? {
                let files = self.files.entry(key).or_default();
                if !files.contains(&path) {
                    files.push(path.clone());
                }
            }
        }
        Ok(())
    }

    /// `path` no longer holds `keys`.
    pub(crate) fn forget(&mut self, keys: &[Vec<u8>], path: &str) {
        for key in keys {
            if let Some(files) = self.files.get_mut(key) {
                files.retain(|f| f.as_ref() != path);
                if files.is_empty() {
                    self.files.remove(key);
                }
            }
        }
    }

    /// Keys that were in one of `old` are in `new` (files merged into one).
    pub(crate) fn move_files(&mut self, old: &std::collections::HashSet<String>, new: &str) {
        let new: Arc<str> = Arc::from(new);
        for files in self.files.values_mut() {
            if files.iter().any(|f| old.contains(f.as_ref())) {
                files.retain(|f| !old.contains(f.as_ref()));
                files.push(new.clone());
            }
        }
    }
}
