//! A stream's open files, kept on the local disk until they are closed: each unit's rows are
//! written as Arrow IPC parts and then `state.json` (written to a temporary file and renamed)
//! records the parts with the unit's checkpoint, so the rows and the position become durable
//! together. A pushed event is on disk before its 202; a file closes by its rotation limits,
//! and a restart resumes from the checkpoint in `state.json`. Parts that no state names (a
//! unit cut short by a crash) are removed on open.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use arrow::record_batch::RecordBatch;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use sluice_core::{Error, ErrorKind, Result};

use crate::local_files::{io_error, read_ipc, remove, write_ipc, write_json};

/// One table's open file: the parts it is made of so far.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct OpenFile {
    /// The unit that opened it: the file's identity, and so its name.
    pub seq: u64,
    /// When it opened (microseconds since the epoch, UTC).
    pub opened_us: i64,
    /// Rows so far.
    pub rows: u64,
    /// Bytes of Arrow data so far.
    pub bytes: u64,
    /// A fingerprint of its columns: a file holds one schema.
    pub schema: String,
    /// Part files in the spool folder, in order.
    pub parts: Vec<String>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct State {
    /// The last unit written.
    seq: u64,
    /// That unit's checkpoint.
    checkpoint: Option<String>,
    /// Open files by table.
    tables: BTreeMap<String, OpenFile>,
}

/// A stream's spool folder.
pub(crate) struct Spool {
    dir: PathBuf,
    state: State,
}

/// A fingerprint of a batch's columns (names, types, nullability).
pub(crate) fn fingerprint(batch: &RecordBatch) -> String {
    hex::encode(&Sha256::digest(format!("{:?}", batch.schema().fields()))[..8])
}

impl Spool {
    /// Open (or create) the spool in `dir`, dropping parts of a unit that never committed.
    pub(crate) fn open(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| io_error("create", dir, e))?;
        let path = dir.join("state.json");
        let state: State = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
                Error::new(ErrorKind::Fatal, format!("files spool: {} is unreadable", path.display())).with_source(e)
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => State::default(),
            Err(e) => return Err(io_error("read", &path, e)),
        };
        let named: std::collections::HashSet<&str> =
            state.tables.values().flat_map(|t| t.parts.iter().map(String::as_str)).collect();
        for entry in std::fs::read_dir(dir).map_err(|e| io_error("list", dir, e))? {
            let entry = entry.map_err(|e| io_error("list", dir, e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name != "state.json" && !named.contains(name.as_str()) {
                std::fs::remove_file(entry.path()).map_err(|e| io_error("remove", &entry.path(), e))?;
            }
        }
        Ok(Self { dir: dir.to_path_buf(), state })
    }

    /// The checkpoint of the last unit written.
    pub(crate) fn checkpoint(&self) -> Option<&str> {
        self.state.checkpoint.as_deref()
    }

    /// The open file of `table`.
    pub(crate) fn open_file(&self, table: &str) -> Option<&OpenFile> {
        self.state.tables.get(table)
    }

    /// Tables with an open file.
    pub(crate) fn tables(&self) -> Vec<String> {
        self.state.tables.keys().cloned().collect()
    }

    /// Add one unit: each table's batches (one schema per table) join its open file, opened
    /// now if it has none; then the checkpoint. Durable when this returns.
    pub(crate) fn append(&mut self, unit: &[(String, Vec<RecordBatch>)], checkpoint: Option<&str>) -> Result<()> {
        let seq = self.state.seq + 1;
        let now = chrono::Utc::now().timestamp_micros();
        let mut written = Vec::new();
        for (i, (table, batches)) in unit.iter().enumerate() {
            let Some(first) = batches.first() else { continue };
            let part = format!("{seq:012}-{i}.arrow");
            let bytes = self.write_part(&part, batches)?;
            written.push((
                table.clone(),
                part,
                bytes,
                fingerprint(first),
                batches.iter().map(|b| b.num_rows() as u64).sum::<u64>(),
            ));
        }
        let mut state = State { seq, checkpoint: checkpoint.map(str::to_string), tables: self.state.tables.clone() };
        for (table, part, bytes, schema, rows) in written {
            let file = state.tables.entry(table).or_insert_with(|| OpenFile {
                seq,
                opened_us: now,
                rows: 0,
                bytes: 0,
                schema: schema.clone(),
                parts: Vec::new(),
            });
            file.rows += rows;
            file.bytes += bytes;
            file.parts.push(part);
        }
        self.commit(state)
    }

    fn write_part(&self, name: &str, batches: &[RecordBatch]) -> Result<u64> {
        write_ipc(&self.dir.join(name), &batches[0].schema(), batches)
    }

    /// The rows of `table`'s open file.
    pub(crate) fn read(&self, table: &str) -> Result<Vec<RecordBatch>> {
        let mut out = Vec::new();
        for part in self.state.tables.get(table).map(|t| t.parts.as_slice()).unwrap_or_default() {
            out.extend(read_ipc(&self.dir.join(part))?.1);
        }
        Ok(out)
    }

    /// Forget `table`'s open file (it was written to the store) and remove its parts.
    pub(crate) fn close(&mut self, table: &str) -> Result<()> {
        let mut tables = self.state.tables.clone();
        let Some(file) = tables.remove(table) else { return Ok(()) };
        self.commit(State { seq: self.state.seq, checkpoint: self.state.checkpoint.clone(), tables })?;
        file.parts.iter().try_for_each(|part| remove(&self.dir.join(part)))
    }

    /// Write `state` durably (temporary file, fsync, rename, fsync of the folder), then keep it.
    fn commit(&mut self, state: State) -> Result<()> {
        write_json(&self.dir, "state.json", &state)?;
        self.state = state;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::Int64Array;
    use arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    fn batch(values: &[i64]) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
        RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(values.to_vec()))]).unwrap()
    }

    fn temp_dir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("sluice-spool-{}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn rows_and_checkpoint_survive_a_reopen_and_a_closed_file_is_gone() {
        let dir = temp_dir();
        let mut spool = Spool::open(&dir).unwrap();
        spool.append(&[("t".into(), vec![batch(&[1, 2])])], Some("cp1")).unwrap();
        spool.append(&[("t".into(), vec![batch(&[3])]), ("u".into(), vec![batch(&[9])])], Some("cp2")).unwrap();
        let spool = Spool::open(&dir).unwrap();
        assert_eq!(spool.checkpoint(), Some("cp2"));
        let rows: usize = spool.read("t").unwrap().iter().map(RecordBatch::num_rows).sum();
        assert_eq!(rows, 3);
        assert_eq!(spool.open_file("t").unwrap().seq, 1);
        assert_eq!(spool.open_file("u").unwrap().seq, 2);
        let mut spool = spool;
        spool.close("t").unwrap();
        let spool = Spool::open(&dir).unwrap();
        assert!(spool.open_file("t").is_none());
        assert_eq!(spool.tables(), vec!["u".to_string()]);
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 2, "state.json and u's part");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn a_part_no_state_names_is_dropped_on_open() {
        let dir = temp_dir();
        let mut spool = Spool::open(&dir).unwrap();
        spool.append(&[("t".into(), vec![batch(&[1])])], Some("cp1")).unwrap();
        // A crash after a part was written and before the state named it.
        spool.write_part("000000000002-0.arrow", &[batch(&[2])]).unwrap();
        let spool = Spool::open(&dir).unwrap();
        assert_eq!(spool.checkpoint(), Some("cp1"));
        assert_eq!(spool.read("t").unwrap().iter().map(RecordBatch::num_rows).sum::<usize>(), 1);
        assert!(!dir.join("000000000002-0.arrow").exists());
        std::fs::remove_dir_all(dir).unwrap();
    }
}
