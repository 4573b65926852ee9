//! Decoding at the push edge gives exactly what the stream's serial decode gives: the same rows,
//! columns and ledger rows, whatever moved between the edge's decode and the stream's.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::RecordBatch;
use sluice_core::batch::Reject;
use sluice_core::decode::Edge;
use sluice_core::format::json::parse_body;
use sluice_core::schema::{Column, SchemaChange};
use sluice_core::{ColumnType, Decoder, MetadataConfig, Payload, Record, RecordMeta, TableSchema};

fn meta() -> RecordMeta {
    RecordMeta { received_us: 11, key: Some("k".into()), ..RecordMeta::default() }
}

fn table() -> HashMap<String, TableSchema> {
    let columns = vec![
        Column { name: "id".into(), ty: ColumnType::Bigint },
        Column { name: "name".into(), ty: ColumnType::Varchar },
        Column { name: "at".into(), ty: ColumnType::Timestamptz },
    ];
    HashMap::from([("t".to_string(), TableSchema::existing(columns))])
}

/// A stream decoder on `t` sharing its schemas with a new edge.
fn stream(metadata: MetadataConfig) -> (Decoder, Arc<Edge>) {
    let edge = Edge::new();
    let decoder = Decoder::new("t".into(), metadata, table()).with_edge(Some(edge.clone()));
    (decoder, edge)
}

/// What the edge makes of `body`.
fn at_edge(edge: &Edge, body: &str) -> Record {
    let raw = bytes::Bytes::copy_from_slice(body.as_bytes());
    let (payload, summary) = edge.decode_body(&raw, &meta()).expect("a published decoder").expect("JSON");
    assert_eq!(summary, parse_body(&raw).unwrap().1, "the edge counts the body as the parser does");
    Record { payload, meta: meta() }
}

fn serial(body: &str) -> Record {
    Record { payload: Payload::Body(bytes::Bytes::copy_from_slice(body.as_bytes())), meta: meta() }
}

/// Rows, schema changes and ledger rows of decoding `records` from sequence 5.
fn outcome(decoder: &Decoder, records: Vec<Record>) -> (Vec<RecordBatch>, Vec<Vec<SchemaChange>>, Vec<Reject>, i64) {
    let (out, _) = decoder.decode(records, 5).unwrap();
    let rejects = out.rejects.iter().collect();
    let batches = out.tables.iter().map(|t| t.data.clone()).collect();
    let changes = out.tables.iter().map(|t| t.changes.clone()).collect();
    (batches, changes, rejects, out.last_sequence)
}

const STEADY: &str = r#"{"id": 1, "name": "a", "at": "2025-01-01T00:00:00Z"}
{"id": "two", "name": "b"}
[1, 2]
{"id": 3, "name": "c", "name": "d"}
"#;

#[test]
fn a_body_that_fits_the_table_is_taken_as_the_edge_decoded_it() {
    let metadata = MetadataConfig { received_at: true, key: true, ..MetadataConfig::default() };
    let (mut decoder, edge) = stream(metadata.clone());
    // The metadata columns exist already: the table has had a unit before.
    let (_, pending) = decoder.decode(vec![serial(r#"{"id": 0}"#)], 1).unwrap();
    decoder.commit(pending);
    let record = at_edge(&edge, STEADY);
    assert!(matches!(record.payload, Payload::Decoded(_)), "decoded at the edge");
    let (reference, _) = stream(metadata);
    let mut reference = reference;
    let (_, pending) = reference.decode(vec![serial(r#"{"id": 0}"#)], 1).unwrap();
    reference.commit(pending);
    let expected = outcome(&reference, vec![serial(STEADY), serial(STEADY)]);
    let got = outcome(&decoder, vec![record.clone(), record]);
    assert_eq!(got.0.len(), 1);
    assert_eq!(got, expected);
    // The misfit, the array and the duplicate name are ledger rows with the stream's sequences.
    let sequences: Vec<i64> = got.2.iter().map(|r| r.sequence).collect();
    assert_eq!(sequences, vec![6, 7, 8, 10, 11, 12]);
    assert_eq!(got.3, 12);
}

#[test]
fn a_body_that_changes_the_table_is_decoded_by_the_stream() {
    let (decoder, edge) = stream(MetadataConfig::default());
    let body = r#"{"id": 1, "extra": true}"#;
    let record = at_edge(&edge, body);
    assert!(matches!(record.payload, Payload::Body(_)), "a new column is the stream's to add");
    let (reference, _) = stream(MetadataConfig::default());
    assert_eq!(outcome(&decoder, vec![record]), outcome(&reference, vec![serial(body)]));
}

#[test]
fn a_batch_decoded_before_the_table_moved_is_decoded_again() {
    let (mut decoder, edge) = stream(MetadataConfig::default());
    let stale = at_edge(&edge, r#"{"id": 1.5}"#);
    assert!(matches!(stale.payload, Payload::Body(_)), "a widening is the stream's");
    let stale = at_edge(&edge, r#"{"id": 2, "name": "x"}"#);
    assert!(matches!(stale.payload, Payload::Decoded(_)));
    // Another body widens `id` and adds a column before the stale one reaches the stream.
    let (_, pending) = decoder.decode(vec![serial(r#"{"id": 1.5, "more": 1}"#)], 1).unwrap();
    decoder.commit(pending);
    let (out, _) = decoder.decode(vec![stale], 2).unwrap();
    let data = &out.tables[0].data;
    assert_eq!(data.schema().field_with_name("id").unwrap().data_type(), &arrow::datatypes::DataType::Float64);
    assert_eq!(data.num_columns(), 4);
    assert_eq!(out.last_sequence, 2);
}

#[test]
fn rows_decoded_later_in_the_unit_join_the_edge_batch_with_their_new_columns() {
    let (decoder, edge) = stream(MetadataConfig::default());
    let first = r#"[{"id": 1, "name": "a"}, {"id": 2}]"#;
    let later = r#"{"id": 3.5, "added": "x"}"#;
    let early = at_edge(&edge, first);
    assert!(matches!(early.payload, Payload::Decoded(_)));
    let (reference, _) = stream(MetadataConfig::default());
    let expected = outcome(&reference, vec![serial(first), serial(later)]);
    let got = outcome(&decoder, vec![early, serial(later)]);
    assert_eq!(got, expected);
    assert_eq!(got.0[0].num_rows(), 3);
    assert_eq!(
        got.1[0],
        vec![
            SchemaChange::Widen(Column { name: "id".into(), ty: ColumnType::Double }),
            SchemaChange::Add(Column { name: "added".into(), ty: ColumnType::Varchar })
        ]
    );
}

#[test]
fn a_stream_the_edge_cannot_decode_for_gets_bodies_as_they_are() {
    let metadata = MetadataConfig { position: true, ..MetadataConfig::default() };
    let (_decoder, edge) = stream(metadata);
    let body = bytes::Bytes::from_static(STEADY.as_bytes());
    assert!(edge.decode_body(&body, &meta()).is_none(), "`_position` is known only to the stream");
    let edge = Edge::new();
    let _decoder = Decoder::new("t".into(), MetadataConfig::default(), table())
        .with_changes(sluice_core::ChangeConfig {
            mode: sluice_core::Mode::Mirror,
            keys: vec!["id".into()],
            ..Default::default()
        })
        .with_edge(Some(edge.clone()));
    assert!(edge.decode_body(&body, &meta()).is_none(), "mirror mode");
}

/// Messages (Kafka, Kinesis) on `t`, one per line, with their own keys.
fn messages(lines: &[&str]) -> Vec<Record> {
    let meta = |i: usize| RecordMeta { key: Some(format!("k{i}")), offset: Some(i as i64), ..meta() };
    lines
        .iter()
        .enumerate()
        .map(|(i, l)| Record { payload: Payload::Bytes(bytes::Bytes::copy_from_slice(l.as_bytes())), meta: meta(i) })
        .collect()
}

/// Decoded on three threads, runs of one message each, against serially.
fn spread_and_serial(lines: &[&str]) -> (sluice_core::decode::Decoded, sluice_core::decode::Decoded) {
    let metadata = MetadataConfig { key: true, ..MetadataConfig::default() };
    let mut schemas = table();
    let mut columns = schemas["t"].columns().to_vec();
    columns.push(Column { name: "_key".into(), ty: ColumnType::Varchar });
    schemas.insert("t".into(), TableSchema::existing(columns));
    let decoder = Decoder::new("t".into(), metadata, schemas);
    let (spread, _) = decoder.decode_spread(messages(lines), 5, 3, 1).unwrap();
    let (serial, _) = decoder.decode(messages(lines), 5).unwrap();
    (spread, serial)
}

fn same(a: &sluice_core::decode::Decoded, b: &sluice_core::decode::Decoded) {
    assert_eq!(format!("{:?}", a.tables), format!("{:?}", b.tables));
    assert_eq!(a.rejects.iter().collect::<Vec<_>>(), b.rejects.iter().collect::<Vec<_>>());
    assert_eq!(
        (a.events, a.rows, a.last_sequence, &a.record_ends),
        (b.events, b.rows, b.last_sequence, &b.record_ends)
    );
}

#[test]
fn messages_decoded_on_threads_that_fit_the_table_are_joined_in_order() {
    let (spread, serial) = spread_and_serial(&[
        r#"{"id": 1, "name": "a"}"#,
        r#"[{"id": "x"}, {"id": 2}]"#,
        r#"{"id": 3, "at": "2025-01-01T00:00:00Z"}"#,
    ]);
    same(&spread, &serial);
    assert_eq!(spread.rows, 4);
    assert!(spread.tables[0].changes.is_empty());
    // The misfit of the second message keeps its place in the stream's numbering.
    assert_eq!(spread.rejects.iter().map(|r| r.sequence).collect::<Vec<_>>(), vec![6]);
    assert_eq!(spread.record_ends, vec![5, 7, 8]);
}

#[test]
fn a_message_that_moves_the_table_on_a_thread_is_decoded_again_after_the_ones_before() {
    // The second message adds a column, the third widens `id`: the first is joined to the rows
    // decoded again, with the new column NULL and its `id` cast.
    let (spread, serial) = spread_and_serial(&[r#"{"id": 1}"#, r#"{"id": 2, "added": true}"#, r#"{"id": 2.5}"#]);
    same(&spread, &serial);
    assert_eq!(
        spread.tables[0].changes,
        vec![
            SchemaChange::Add(Column { name: "added".into(), ty: ColumnType::Boolean }),
            SchemaChange::Widen(Column { name: "id".into(), ty: ColumnType::Double })
        ]
    );
    assert_eq!(spread.rows, 3);
}
