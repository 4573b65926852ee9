//! A compaction's manifests (Iceberg v2): the files a snapshot holds, read with DuckDB's
//! `read_avro`, and the manifests and manifest list of the `replace` snapshot that swaps them
//! for the compacted file: the new file ADDED, every file it replaces DELETED (so that snapshot
//! expiry elsewhere finds them to remove).

use duckdb::Connection;
use serde_json::Value;
use sluice_core::Result;

use super::avro::{Record, container};
use crate::lakehouse::{lake_error, literal};

/// A data or delete file, as a manifest entry describes it.
pub struct DataFile {
    /// 0 data, 1 position deletes, 2 equality deletes.
    pub content: i64,
    pub path: String,
    pub format: String,
    pub records: i64,
    pub size: i64,
}

/// A live file of a snapshot with its sequence numbers (inherited ones filled in).
pub struct Entry {
    pub file: DataFile,
    pub sequence: i64,
    pub file_sequence: i64,
}

/// The live files (ADDED or EXISTING) of the snapshot whose manifest list is at `list`.
pub fn live_entries(conn: &Connection, list: &str) -> Result<Vec<Entry>> {
    let mut manifests = conn
        .prepare(&format!("SELECT manifest_path, sequence_number FROM read_avro('{}')", literal(list)))
        .map_err(lake_error)?;
    let manifests: Vec<(String, i64)> = manifests
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .map_err(lake_error)?
        .collect::<std::result::Result<_, _>>()
        .map_err(lake_error)?;
    let mut entries = Vec::new();
    for (path, sequence) in manifests {
        let sql = format!(
            "SELECT coalesce(sequence_number, {sequence}), coalesce(file_sequence_number, {sequence}), \
             data_file.content, data_file.file_path, data_file.file_format, data_file.record_count, \
             data_file.file_size_in_bytes FROM read_avro('{}') WHERE status <> 2",
            literal(&path)
        );
        let mut statement = conn.prepare(&sql).map_err(lake_error)?;
        let rows = statement
            .query_map([], |r| {
                Ok(Entry {
                    sequence: r.get(0)?,
                    file_sequence: r.get(1)?,
                    file: DataFile {
                        content: r.get(2)?,
                        path: r.get(3)?,
                        format: r.get(4)?,
                        records: r.get(5)?,
                        size: r.get(6)?,
                    },
                })
            })
            .map_err(lake_error)?;
        for row in rows {
            entries.push(row.map_err(lake_error)?);
        }
    }
    Ok(entries)
}

const MANIFEST_SCHEMA: &str = r#"{"type":"record","name":"manifest_entry","fields":[{"name":"status","type":"int","field-id":0},{"name":"snapshot_id","type":["null","long"],"default":null,"field-id":1},{"name":"sequence_number","type":["null","long"],"default":null,"field-id":3},{"name":"file_sequence_number","type":["null","long"],"default":null,"field-id":4},{"name":"data_file","type":{"type":"record","name":"r2","fields":[{"name":"content","type":"int","field-id":134},{"name":"file_path","type":"string","field-id":100},{"name":"file_format","type":"string","field-id":101},{"name":"partition","type":{"type":"record","name":"r102","fields":[]},"field-id":102},{"name":"record_count","type":"long","field-id":103},{"name":"file_size_in_bytes","type":"long","field-id":104}]},"field-id":2}]}"#;

const MANIFEST_LIST_SCHEMA: &str = r#"{"type":"record","name":"manifest_file","fields":[{"name":"manifest_path","type":"string","field-id":500},{"name":"manifest_length","type":"long","field-id":501},{"name":"partition_spec_id","type":"int","field-id":502},{"name":"content","type":"int","field-id":517},{"name":"sequence_number","type":"long","field-id":515},{"name":"min_sequence_number","type":"long","field-id":516},{"name":"added_snapshot_id","type":"long","field-id":503},{"name":"added_files_count","type":"int","field-id":504},{"name":"existing_files_count","type":"int","field-id":505},{"name":"deleted_files_count","type":"int","field-id":506},{"name":"added_rows_count","type":"long","field-id":512},{"name":"existing_rows_count","type":"long","field-id":513},{"name":"deleted_rows_count","type":"long","field-id":514}]}"#;

fn entry(status: i64, snapshot: u64, sequences: Option<(i64, i64)>, file: &DataFile) -> Record {
    let mut r = Record::default();
    r.long(status);
    r.some().long(snapshot as i64);
    match sequences {
        Some((sequence, file_sequence)) => r.some().long(sequence).some().long(file_sequence),
        // An added file takes the snapshot's sequence number.
        None => r.null().null(),
    };
    r.long(file.content).bytes(file.path.as_bytes()).bytes(file.format.as_bytes());
    r.long(file.records).long(file.size);
    r
}

/// A manifest of `snapshot`: `added` as ADDED, `deleted` as DELETED. `deletes` says it lists
/// delete files.
pub fn manifest(
    schema: &Value,
    schema_id: i64,
    snapshot: u64,
    added: Option<&DataFile>,
    deleted: &[&Entry],
    deletes: bool,
) -> Vec<u8> {
    let mut records: Vec<Record> = added.map(|f| entry(1, snapshot, None, f)).into_iter().collect();
    records.extend(deleted.iter().map(|e| entry(2, snapshot, Some((e.sequence, e.file_sequence)), &e.file)));
    let meta = [
        ("schema", schema.to_string()),
        ("schema-id", schema_id.to_string()),
        ("partition-spec", "[]".to_string()),
        ("partition-spec-id", "0".to_string()),
        ("format-version", "2".to_string()),
        ("content", if deletes { "deletes" } else { "data" }.to_string()),
    ];
    container(MANIFEST_SCHEMA, &meta, &records)
}

/// One manifest of a manifest list, with its counts.
pub struct Listed {
    pub path: String,
    pub length: u64,
    pub deletes: bool,
    pub added_files: i64,
    pub deleted_files: i64,
    pub added_rows: i64,
    pub deleted_rows: i64,
}

/// The manifest list of `snapshot` (sequence number `sequence`, after `parent`).
pub fn manifest_list(snapshot: u64, parent: i64, sequence: i64, manifests: &[Listed]) -> Vec<u8> {
    let records: Vec<Record> = manifests
        .iter()
        .map(|m| {
            let mut r = Record::default();
            r.bytes(m.path.as_bytes()).long(m.length as i64).long(0).long(i64::from(m.deletes));
            r.long(sequence).long(sequence).long(snapshot as i64);
            r.long(m.added_files).long(0).long(m.deleted_files);
            r.long(m.added_rows).long(0).long(m.deleted_rows);
            r
        })
        .collect();
    let meta = [
        ("snapshot-id", snapshot.to_string()),
        ("parent-snapshot-id", parent.to_string()),
        ("sequence-number", sequence.to_string()),
        ("format-version", "2".to_string()),
    ];
    container(MANIFEST_LIST_SCHEMA, &meta, &records)
}
