//! Durable files on the local disk, for the spools streams keep beside a destination (the open
//! files of a files destination, the stage of a staged load): Arrow IPC parts written and
//! fsynced, JSON state renamed into place (the commit), and removal that accepts a file already
//! gone.

use std::fs::File;
use std::io::Write;
use std::path::Path;

use arrow::datatypes::SchemaRef;
use arrow::ipc::reader::FileReader;
use arrow::ipc::writer::FileWriter;
use arrow::record_batch::RecordBatch;
use serde::Serialize;
use sluice_core::{Error, ErrorKind, Result};

/// An I/O failure on `path` while trying to `what`.
pub(crate) fn io_error(what: &str, path: &Path, e: std::io::Error) -> Error {
    Error::new(ErrorKind::Fatal, format!("spool: cannot {what} {}: {e}", path.display()))
}

fn arrow_error(e: arrow::error::ArrowError) -> Error {
    Error::new(ErrorKind::Fatal, "spool: Arrow IPC").with_source(e)
}

/// Write `batches` (all of `schema`) as an Arrow IPC file and fsync it; its size in bytes.
pub(crate) fn write_ipc(path: &Path, schema: &SchemaRef, batches: &[RecordBatch]) -> Result<u64> {
    let file = File::create(path).map_err(|e| io_error("create", path, e))?;
    let mut writer = FileWriter::try_new(file, schema).map_err(arrow_error)?;
    for batch in batches {
        writer.write(batch).map_err(arrow_error)?;
    }
    let file = writer.into_inner().map_err(arrow_error)?;
    file.sync_all().map_err(|e| io_error("sync", path, e))?;
    Ok(file.metadata().map_err(|e| io_error("stat", path, e))?.len())
}

/// The schema and batches of an Arrow IPC file.
pub(crate) fn read_ipc(path: &Path) -> Result<(SchemaRef, Vec<RecordBatch>)> {
    let file = File::open(path).map_err(|e| io_error("open", path, e))?;
    let reader = FileReader::try_new(file, None).map_err(arrow_error)?;
    let schema = reader.schema();
    let batches = reader.collect::<std::result::Result<Vec<_>, _>>().map_err(arrow_error)?;
    Ok((schema, batches))
}

/// Write `value` as JSON to `dir/name` durably: a temporary file, fsync, rename, fsync of the
/// folder. A crash leaves the old file or the new one.
pub(crate) fn write_json(dir: &Path, name: &str, value: &impl Serialize) -> Result<()> {
    let path = dir.join(name);
    let tmp = dir.join(format!("{name}.tmp"));
    let bytes = serde_json::to_vec(value)
        .map_err(|e| Error::new(ErrorKind::Fatal, format!("spool: cannot encode {name}")).with_source(e))?;
    let mut file = File::create(&tmp).map_err(|e| io_error("create", &tmp, e))?;
    file.write_all(&bytes).and_then(|()| file.sync_all()).map_err(|e| io_error("write", &tmp, e))?;
    std::fs::rename(&tmp, &path).map_err(|e| io_error("rename", &tmp, e))?;
    File::open(dir).and_then(|d| d.sync_all()).map_err(|e| io_error("sync", dir, e))
}

/// Remove `path`; one already gone is fine.
pub(crate) fn remove(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io_error("remove", path, e)),
        _ => Ok(()),
    }
}
