//! Log checkpoints: the table's whole state at a version as one Parquet file
//! (`<version>.checkpoint.parquet`), so a reader does not replay every commit and old commits
//! can go. Actions travel as JSON both ways: arrow's JSON reader builds the checkpoint's nested
//! columns from them, and its writer turns a checkpoint's rows back into them.

use std::io::Cursor;
use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Fields, Schema};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use sluice_core::{Error, ErrorKind, Result};

use super::log::{Action, Remove, Snapshot, Txn, parse};
use crate::files::{Compression, FileFormat};

fn text() -> Field {
    Field::new("", DataType::Utf8, true)
}

fn named(name: &str, data_type: DataType) -> Field {
    Field::new(name, data_type, true)
}

fn map() -> DataType {
    let entries =
        Fields::from(vec![Field::new("key", DataType::Utf8, false), Field::new("value", DataType::Utf8, true)]);
    DataType::Map(Arc::new(Field::new("key_value", DataType::Struct(entries), false)), false)
}

fn strings() -> DataType {
    DataType::List(Arc::new(text().with_name("element")))
}

fn structure(fields: Vec<Field>) -> DataType {
    DataType::Struct(Fields::from(fields))
}

/// The columns of a checkpoint, as the protocol lists them.
fn schema() -> Arc<Schema> {
    let long = || DataType::Int64;
    Arc::new(Schema::new(vec![
        named(
            "txn",
            structure(vec![named("appId", DataType::Utf8), named("version", long()), named("lastUpdated", long())]),
        ),
        named(
            "add",
            structure(vec![
                named("path", DataType::Utf8),
                named("partitionValues", map()),
                named("size", long()),
                named("modificationTime", long()),
                named("dataChange", DataType::Boolean),
                named("stats", DataType::Utf8),
                named("tags", map()),
            ]),
        ),
        named(
            "remove",
            structure(vec![
                named("path", DataType::Utf8),
                named("deletionTimestamp", long()),
                named("dataChange", DataType::Boolean),
                named("extendedFileMetadata", DataType::Boolean),
                named("partitionValues", map()),
                named("size", long()),
            ]),
        ),
        named(
            "metaData",
            structure(vec![
                named("id", DataType::Utf8),
                named("name", DataType::Utf8),
                named("description", DataType::Utf8),
                named("format", structure(vec![named("provider", DataType::Utf8), named("options", map())])),
                named("schemaString", DataType::Utf8),
                named("partitionColumns", strings()),
                named("configuration", map()),
                named("createdTime", long()),
            ]),
        ),
        named(
            "protocol",
            structure(vec![
                named("minReaderVersion", DataType::Int32),
                named("minWriterVersion", DataType::Int32),
                named("readerFeatures", strings()),
                named("writerFeatures", strings()),
            ]),
        ),
    ]))
}

fn failed(what: &str, e: &dyn std::fmt::Display) -> Error {
    Error::new(ErrorKind::Fatal, format!("delta: {what}: {e}"))
}

/// The state of `snapshot` as a checkpoint's Parquet bytes. Removed files are kept as
/// tombstones (readers of older versions may still need them; vacuum deletes them).
pub(crate) fn write(snapshot: &Snapshot) -> Result<Vec<u8>> {
    let mut actions = Vec::new();
    actions.extend(snapshot.protocol.clone().map(Action::Protocol));
    actions.extend(snapshot.metadata.clone().map(Action::MetaData));
    for (app_id, version) in &snapshot.txns {
        actions.push(Action::Txn(Txn { app_id: app_id.clone(), version: *version, last_updated: None }));
    }
    for add in snapshot.files.values() {
        actions.push(Action::Add(add.clone()));
    }
    for (path, at) in &snapshot.removed {
        actions.push(Action::Remove(Remove {
            path: path.clone(),
            deletion_timestamp: Some(*at),
            data_change: false,
            extended_file_metadata: None,
            size: None,
        }));
    }
    let mut lines = String::new();
    for action in &actions {
        lines.push_str(&serde_json::to_string(action).map_err(|e| failed("a checkpoint", &e))?);
        lines.push('\n');
    }
    let schema = schema();
    let reader = arrow::json::ReaderBuilder::new(schema.clone())
        .with_batch_size(8192)
        .build(Cursor::new(lines.into_bytes()))
        .map_err(|e| failed("a checkpoint", &e))?;
    let batches = reader.collect::<std::result::Result<Vec<_>, _>>().map_err(|e| failed("a checkpoint", &e))?;
    crate::files::encode(FileFormat::Parquet, Compression::Snappy, &schema, &batches)
}

/// The actions a checkpoint (ours or another writer's) holds.
pub(crate) fn read(bytes: bytes::Bytes, name: &str) -> Result<Vec<Action>> {
    let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)
        .and_then(|b| b.with_batch_size(8192).build())
        .map_err(|e| failed(name, &e))?;
    let mut lines = Vec::new();
    {
        let mut writer = arrow::json::LineDelimitedWriter::new(&mut lines);
        for batch in reader {
            writer.write(&batch.map_err(|e| failed(name, &e))?).map_err(|e| failed(name, &e))?;
        }
        writer.finish().map_err(|e| failed(name, &e))?;
    }
    parse(&String::from_utf8_lossy(&lines), name)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::super::log::{Add, Format, Metadata, Protocol};
    use super::*;

    #[test]
    fn a_checkpoint_reads_back_as_the_state_it_was_written_from() {
        let mut snapshot = Snapshot { version: 4, ..Snapshot::default() };
        snapshot.apply(&[
            Action::Protocol(Protocol {
                min_reader_version: 1,
                min_writer_version: 2,
                reader_features: None,
                writer_features: None,
            }),
            Action::MetaData(Metadata {
                id: "id".into(),
                name: None,
                description: None,
                format: Format { provider: "parquet".into(), options: BTreeMap::new() },
                schema_string: r#"{"type":"struct","fields":[]}"#.into(),
                partition_columns: Vec::new(),
                configuration: BTreeMap::from([("sluice.position.s".into(), r#"{"a":1}"#.into())]),
                created_time: Some(7),
            }),
            Action::Add(Add {
                path: "a.parquet".into(),
                partition_values: BTreeMap::new(),
                size: 10,
                modification_time: 3,
                data_change: false,
                stats: Some(r#"{"numRecords":2}"#.into()),
                deletion_vector: None,
            }),
            Action::Txn(Txn { app_id: "sluice-s".into(), version: 9, last_updated: None }),
            Action::Remove(Remove {
                path: "old.parquet".into(),
                deletion_timestamp: Some(5),
                data_change: true,
                extended_file_metadata: None,
                size: None,
            }),
        ]);
        let bytes = write(&snapshot).unwrap();
        let mut back = Snapshot::default();
        back.apply(&read(bytes.into(), "cp").unwrap());
        assert_eq!(back.files, snapshot.files);
        assert_eq!(back.metadata, snapshot.metadata);
        assert_eq!(back.protocol, snapshot.protocol);
        assert_eq!(back.txns, snapshot.txns);
        assert_eq!(back.removed, snapshot.removed);
    }
}
