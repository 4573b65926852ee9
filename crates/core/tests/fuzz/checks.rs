//! What must hold for any input, shared by the property tests (`cargo test`) and the cargo-fuzz
//! targets (`fuzz/`, which include this file by path). A check panics when Sluice breaks a rule;
//! Sluice itself must never panic on input.
//!
//! Input layouts (the seed corpus under `tests/fuzz_corpus/` follows them):
//! - body: the bytes of a push body or of one message.
//! - decoder: a flags byte, then (if flagged) a message key up to the first `\n`, then the
//!   payload. Flags (`byte & 0x3f`, so letters are readable): bits 0-1 pick append/message (0),
//!   append/body (1), mirror/Debezium (2) or mirror/JSON keyed by `id` (3); bit 2 turns metadata
//!   columns on, bit 3 history, bit 4 a key line, bit 5 (lower case) the table template
//!   `[table]`. So `@` is a plain message, `A` a body, `R` a Debezium event with its key.
//! - copy: a first line of tab-separated column types (`BIGINT\tDATE`; unknown names are
//!   VARCHAR; a leading `+` keeps a history and adds a Debezium change after the rows), then
//!   one `COPY` text row per line.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::Value;
use sluice_core::batch::{CopyRows, TableWrite};
use sluice_core::decode::{Decoded, MAX_NAME_BYTES};
use sluice_core::format::json::{body_events, check_body, decode_bytes, message_events, parse_body, split_body};
use sluice_core::{ChangeConfig, ColumnType, Decoder, Format, MetadataConfig, Mode, Payload, Record, RecordMeta};

/// The body parser: no panic, and the checked summary matches the events handed out.
pub fn body(data: &[u8]) {
    let bytes = bytes::Bytes::copy_from_slice(data);
    // The one-pass parse of small bodies says what the check and the lazy events say.
    match (parse_body(&bytes), check_body(data)) {
        (Ok((events, summary)), Ok(checked)) => {
            assert_eq!(summary, checked, "parse_body and check_body disagree");
            let lazy: Vec<Payload> = body_events(bytes.clone()).map(|e| e.payload).collect();
            assert_eq!(
                format!("{:?}", events.iter().map(|e| &e.payload).collect::<Vec<_>>()),
                format!("{:?}", lazy.iter().collect::<Vec<_>>())
            );
        }
        (Err(a), Err(b)) => assert_eq!(a, b, "parse_body and check_body place the error differently"),
        (a, b) => panic!("parse_body {:?} but check_body {:?}", a.map(|(_, s)| s), b),
    }
    match check_body(data) {
        Ok(summary) => {
            let payloads: Vec<Payload> = body_events(bytes.clone()).map(|e| e.payload).collect();
            assert_eq!(payloads.len(), summary.events, "check_body and body_events disagree on events");
            let invalid = payloads.iter().filter(|p| matches!(p, Payload::Invalid { .. })).count();
            assert_eq!(invalid, summary.invalid, "check_body and body_events disagree on invalid events");
            assert!(summary.events > 0 || data.trim_ascii_start().starts_with(b"["), "an Ok body with no events");
            for p in &payloads {
                assert!(matches!(p, Payload::Json(Value::Object(_)) | Payload::Invalid { .. }), "{p:?}");
            }
            // A body that is one JSON value is parsed as serde_json parses it.
            if let Ok(whole) = serde_json::from_slice::<Value>(data) {
                let expected = match whole {
                    Value::Array(items) => items,
                    other => vec![other],
                };
                assert_eq!(expected.len(), payloads.len());
                for (want, got) in expected.iter().zip(&payloads) {
                    match got {
                        Payload::Json(v) => assert_eq!(v, want),
                        _ => assert!(!want.is_object(), "an object became invalid: {want}"),
                    }
                }
            }
            let split = split_body(data).expect("split_body refuses what check_body accepted");
            assert_eq!(split.len(), payloads.len());
        }
        Err(e) => {
            assert!(e.line >= 1 && e.column >= 1, "{e:?}");
            assert!(e.byte <= data.len(), "error byte {} past the body's {} bytes", e.byte, data.len());
            assert!(split_body(data).is_err());
            // An unchecked body still ends, without panicking.
            let _ = body_events(bytes.clone()).take(data.len() + 2).count();
        }
    }
    message(data);
    for schemas in [HashMap::new(), known_columns()] {
        from_bytes(&bytes, schemas.clone());
        spread(data, schemas);
    }
}

/// The data's lines as messages (Kafka, Kinesis), each with its own key and offset, decoded on
/// several threads, give what the serial decode gives, and move the schemas to the same place:
/// runs that fit the table are joined, and a run that moves it is decoded again after them.
fn spread(data: &[u8], schemas: HashMap<String, sluice_core::TableSchema>) {
    let metadata = MetadataConfig { received_at: true, key: true, ..MetadataConfig::default() };
    // The metadata columns exist already, so runs of events that fit the table are taken.
    let schemas: HashMap<_, _> = schemas
        .into_iter()
        .map(|(table, schema)| {
            let mut columns = schema.columns().to_vec();
            columns.push(sluice_core::schema::Column { name: "_received_at".into(), ty: ColumnType::Timestamptz });
            columns.push(sluice_core::schema::Column { name: "_key".into(), ty: ColumnType::Varchar });
            (table, sluice_core::TableSchema::existing(columns))
        })
        .collect();
    let decoder = Decoder::new("t".into(), metadata, schemas);
    let records = || -> Vec<Record> {
        let lines = data.split(|b| *b == b'\n').filter(|l| !l.is_empty());
        let meta = |i: usize| RecordMeta {
            key: Some(format!("k{i}")),
            offset: Some(i as i64),
            received_us: 1_700_000_000_000_000 + i as i64,
            ..RecordMeta::default()
        };
        lines
            .enumerate()
            .map(|(i, l)| Record { payload: Payload::Bytes(bytes::Bytes::copy_from_slice(l)), meta: meta(i) })
            .collect()
    };
    let (serial, serial_pending) = decoder.decode(records(), 100).expect("serial decode");
    for threads in [2, 3, 7] {
        let (spread, pending) = decoder.decode_spread(records(), 100, threads, 1).expect("spread decode");
        same_decode(&spread, &serial);
        let tables = |p: &sluice_core::decode::Pending| {
            p.schemas().map(|(t, s)| (t.to_string(), s.columns().to_vec(), s.exists())).collect::<Vec<_>>()
        };
        assert_eq!(tables(&pending), tables(&serial_pending), "the schemas committed after the decode differ");
    }
}

/// A table that exists with a few columns, so values can misfit, widen and add columns.
fn known_columns() -> HashMap<String, sluice_core::TableSchema> {
    let columns = [("a", ColumnType::Bigint), ("b", ColumnType::Varchar), ("c", ColumnType::Timestamptz)]
        .map(|(name, ty)| sluice_core::schema::Column { name: name.into(), ty });
    HashMap::from([("t".to_string(), sluice_core::TableSchema::existing(columns.to_vec()))])
}

/// A body decoded from its bytes (the push edge's path) gives what decoding its parsed events
/// gives: the same answer, rows, schema changes and ledger rows.
fn from_bytes(bytes: &bytes::Bytes, schemas: HashMap<String, sluice_core::TableSchema>) {
    let metadata = MetadataConfig { received_at: true, key: true, ..MetadataConfig::default() };
    let decoder = Decoder::new("t".into(), metadata.clone(), schemas.clone());
    let meta = RecordMeta { key: Some("k".into()), received_us: 1_700_000_000_000_000, ..RecordMeta::default() };
    let direct = decoder.decode_body(bytes, &meta, 100);
    taken_from_the_edge(bytes, &meta, metadata, schemas);
    let (events, (direct, _)) = match (parse_body(bytes), direct) {
        (Err(a), Err(b)) => return assert_eq!(a, b, "the two paths refuse the body differently"),
        (Ok((events, summary)), Ok((direct, direct_summary))) => {
            assert_eq!(summary, direct_summary, "the two paths count the body differently");
            (events, direct.expect("decode from bytes"))
        }
        (a, b) => panic!("parse_body {:?} but decode_body {:?}", a.map(|(_, s)| s), b.map(|(_, s)| s)),
    };
    let record = Record { payload: Payload::Events(events), meta: meta.clone() };
    let (parsed, _) = decoder.decode(vec![record], 100).expect("decode of parsed events");
    let record = Record { payload: Payload::Body(bytes.clone()), meta };
    let (streamed, _) = decoder.decode(vec![record], 100).expect("decode of the body by the stream");
    same_decode(&direct, &parsed);
    same_decode(&streamed, &parsed);
}

/// A batch the edge decoded, taken by the stream (once the table has the columns the body
/// needs), gives what the stream's own decode of the body gives.
fn taken_from_the_edge(
    bytes: &bytes::Bytes,
    meta: &RecordMeta,
    metadata: MetadataConfig,
    schemas: HashMap<String, sluice_core::TableSchema>,
) {
    let Ok((events, _)) = parse_body(bytes) else { return };
    let edge = sluice_core::decode::Edge::new();
    let mut stream = Decoder::new("t".into(), metadata, schemas).with_edge(Some(edge.clone()));
    let first = Record { payload: Payload::Body(bytes.clone()), meta: meta.clone() };
    let (_, pending) = stream.decode(vec![first], 1).expect("decode");
    stream.commit(pending);
    let Some(Ok((payload, _))) = edge.decode_body(bytes, meta) else { panic!("the edge refused a body it had taken") };
    let (taken, _) = stream.decode(vec![Record { payload, meta: meta.clone() }], 100).expect("decode");
    let parsed = Record { payload: Payload::Events(events), meta: meta.clone() };
    let (expected, _) = stream.decode(vec![parsed], 100).expect("decode");
    same_decode(&taken, &expected);
}

/// One message decoded from its bytes (Kafka, Kinesis) gives what decoding its parsed events
/// gives, `_position` included.
fn message_from_bytes(data: &[u8]) {
    let metadata = MetadataConfig { received_at: true, key: true, position: true, ..MetadataConfig::default() };
    for schemas in [HashMap::new(), known_columns()] {
        let decoder = Decoder::new("t".into(), metadata.clone(), schemas);
        let meta = RecordMeta { key: Some("k".into()), received_us: 1_700_000_000_000_000, ..RecordMeta::default() };
        let raw = bytes::Bytes::copy_from_slice(data);
        let events: Vec<_> = message_events(raw.clone()).collect();
        let parsed = Record { payload: Payload::Events(events), meta: meta.clone() };
        let (parsed, _) = decoder.decode(vec![parsed], 100).expect("decode of parsed events");
        let (direct, _) = decoder.decode(vec![Record { payload: Payload::Bytes(raw), meta }], 100).expect("decode");
        same_decode(&direct, &parsed);
    }
}

fn same_decode(direct: &Decoded, parsed: &Decoded) {
    assert_eq!(format!("{:?}", direct.tables), format!("{:?}", parsed.tables), "rows or schema changes differ");
    assert_eq!(direct.rejects.iter().collect::<Vec<_>>(), parsed.rejects.iter().collect::<Vec<_>>());
    assert_eq!(
        (direct.events, direct.rows, direct.last_sequence, &direct.record_ends),
        (parsed.events, parsed.rows, parsed.last_sequence, &parsed.record_ends)
    );
}

/// One message (Kafka, Kinesis): an object, or an array whose elements are events.
pub fn message(data: &[u8]) {
    let events: Vec<Payload> = message_events(bytes::Bytes::copy_from_slice(data)).map(|e| e.payload).collect();
    // An array is split when it is JSON in shape (its strings are checked one element at a time).
    let expected = match serde_json::from_slice::<Vec<serde::de::IgnoredAny>>(data) {
        Ok(items) if data.trim_ascii_start().starts_with(b"[") => items.len(),
        _ => 1,
    };
    // An element that is not UTF-8 stops the split there: the rest is one ledger row.
    let stopped = events.len() < expected && matches!(events.last(), Some(Payload::Invalid { .. }));
    assert!(events.len() == expected || stopped, "{} message events, {expected} expected", events.len());
    assert_eq!(decode_bytes(data).len(), events.len());
    message_from_bytes(data);
}

/// The decoder, append or mirror: no panic, no error, and every event accounted for.
pub fn decoder(data: &[u8]) {
    let Some((&flags, rest)) = data.split_first() else { return };
    let flags = flags & 0x3f;
    let (key, payload) = if flags & 16 != 0 {
        match rest.iter().position(|b| *b == b'\n') {
            Some(i) => (Some(String::from_utf8_lossy(&rest[..i]).into_owned()), &rest[i + 1..]),
            None => (Some(String::from_utf8_lossy(rest).into_owned()), &[][..]),
        }
    } else {
        (None, rest)
    };
    let (mode, format, keys) = match flags & 3 {
        0 | 1 => (Mode::Append, Format::Json, vec![]),
        2 => (Mode::Mirror, Format::Debezium, vec![]),
        _ => (Mode::Mirror, Format::Json, vec!["id".to_string()]),
    };
    let history = flags & 8 != 0 && mode == Mode::Mirror;
    let metadata = if flags & 4 != 0 {
        MetadataConfig { received_at: true, position: true, key: true, ..MetadataConfig::default() }
    } else {
        MetadataConfig::default()
    };
    let template = if flags & 32 != 0 { "[table]" } else { "t" };
    let raw = bytes::Bytes::copy_from_slice(payload);
    let (record_payload, events, invalid) = if flags & 3 == 1 {
        let events: Vec<Payload> = body_events(raw.clone()).map(|e| e.payload).collect();
        let invalid = events.iter().filter(|p| !matches!(p, Payload::Json(_))).count();
        (Payload::Body(raw), events.len(), invalid)
    } else {
        let events: Vec<Payload> = message_events(raw.clone()).map(|e| e.payload).collect();
        let invalid = events.iter().filter(|p| !matches!(p, Payload::Json(_))).count();
        (Payload::Bytes(raw), events.len(), invalid)
    };
    let meta = RecordMeta { key, received_us: 1_700_000_000_000_000, ..RecordMeta::default() };
    let changes = ChangeConfig { mode, keys, history, format };
    let decoder = Decoder::new(template.into(), metadata, HashMap::new()).with_changes(changes);
    let first = 100;
    let (out, _) = decoder
        .decode(vec![Record { payload: record_payload, meta }], first)
        .unwrap_or_else(|e| panic!("decode failed: {e}"));
    common(&out, first, events as u64);
    let whole = out.rejects.iter().filter(|r| r.column.is_none()).count() as u64;
    match (mode, format) {
        (Mode::Append, _) => {
            // Each object is one row, or (while the table has no column at all) a ledger row.
            let empty = out.rejects.iter().filter(|r| r.reason.starts_with("event has no non-null fields")).count();
            assert_eq!(out.rows + empty as u64, (events - invalid) as u64, "objects vs rows: {out:?}");
            assert!(out.rows + whole >= out.events, "{out:?}");
        }
        (Mode::Mirror, Format::Json) => assert!(out.rows + whole >= out.events, "{out:?}"),
        // Tombstones and truncates change nothing; a key change is a delete and an insert.
        (Mode::Mirror, Format::Debezium) => assert!(out.rows <= 2 * out.events, "{out:?}"),
    }
}

/// A `COPY` chunk of a snapshot: no panic, no error, and each line is a row or a ledger row.
pub fn copy(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let (header, body) = text.split_once('\n').unwrap_or((&text, ""));
    let (history, header) = match header.strip_prefix('+') {
        Some(h) => (true, h),
        None => (false, header),
    };
    let columns: Vec<(String, ColumnType)> = header
        .split('\t')
        .take(64)
        .enumerate()
        .map(|(i, t)| (format!("c{i}"), ColumnType::from_sql(t).unwrap_or(ColumnType::Varchar)))
        .collect();
    let n = columns.len();
    let lines: Vec<&[u8]> = if body.is_empty() { vec![] } else { body.split('\n').map(str::as_bytes).collect() };
    let rows = CopyRows {
        columns: Arc::new(columns),
        keys: vec!["c0".into()],
        whole_row: false,
        db: "d".into(),
        schema: "public".into(),
        table: "t".into(),
        clear: true,
        last: false,
        rows: lines.iter().map(|l| bytes::Bytes::from([*l, b"\n"].concat())).collect(),
        binary: None,
    };
    let meta = RecordMeta { route: Some("t".into()), ..RecordMeta::default() };
    let mut records = vec![Record { payload: Payload::Copy(rows), meta: meta.clone() }];
    if history {
        let event = serde_json::json!({"op": "u", "after": {"c0": 1, "extra": "x"}, "source": {"table": "t"}});
        let key = Some(r#"{"c0":1}"#.to_string());
        records.push(Record { payload: Payload::Json(event), meta: RecordMeta { key, ..meta } });
    }
    let changes = ChangeConfig { mode: Mode::Mirror, keys: vec![], history, format: Format::Debezium };
    let decoder = Decoder::new("[table]".into(), MetadataConfig::default(), HashMap::new()).with_changes(changes);
    let (out, _) = decoder.decode(records, 1).unwrap_or_else(|e| panic!("decode failed: {e}"));
    common(&out, 1, (lines.len() + usize::from(history)) as u64);
    let short = out.rejects.iter().filter(|r| r.column.is_none()).count();
    assert!(out.rejects.iter().filter(|r| r.column.is_none()).all(|r| r.reason.contains("COPY row with")));
    let write = out.tables.first().expect("a snapshot always writes its table");
    assert!(write.snapshot.as_ref().is_some_and(|s| s.clear));
    assert_eq!(write.data.num_rows(), lines.len() - short + usize::from(history), "{out:?}");
    assert!(write.data.num_columns() >= n);
}

/// What holds for every decode.
fn common(out: &Decoded, first: i64, events: u64) {
    assert_eq!(out.events, events, "events counted");
    assert_eq!(out.last_sequence, first + events as i64 - 1);
    assert_eq!(out.rows, out.tables.iter().map(|t| t.data.num_rows() as u64).sum::<u64>());
    for r in out.rejects.iter() {
        assert!((first..=out.last_sequence).contains(&r.sequence), "reject sequence {}", r.sequence);
    }
    for t in &out.tables {
        table(t);
    }
}

fn table(t: &TableWrite) {
    let rows = t.data.num_rows();
    for field in t.data.schema().fields() {
        let name = field.name();
        assert!(!name.is_empty() && !name.contains('\0') && name.len() <= MAX_NAME_BYTES, "column name {name:?}");
    }
    let mut lower: Vec<String> = t.data.schema().fields().iter().map(|f| f.name().to_lowercase()).collect();
    lower.sort();
    lower.dedup();
    assert_eq!(lower.len(), t.data.num_columns(), "two columns differ only in letter case");
    if let Some(m) = &t.mirror {
        assert_eq!(m.ops.len(), rows, "mirror ops vs rows");
        assert_eq!(m.orders.len(), rows);
        assert_eq!(m.recorded.len(), rows);
        assert_eq!(m.change_us.len(), rows);
        assert_eq!(m.sources.len(), rows);
        assert_eq!(m.source_orders.len(), rows);
        assert_eq!(m.unavailable.len(), rows);
        // Only a write of truncates alone (they name no key) may have none.
        let only_truncates = m.ops.iter().all(|o| *o == sluice_core::ChangeOp::Truncate);
        assert!(!m.keys.is_empty() || only_truncates, "a mirror write without keys");
    }
}
