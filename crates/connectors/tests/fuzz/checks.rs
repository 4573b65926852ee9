//! What must hold for any replication-stream input, shared by the property tests and the
//! cargo-fuzz target `pgoutput` (`fuzz/`, which includes this file by path). The parsers are
//! `super::api`: `sluice_connectors::postgres::fuzz` here, the same file built alone there.
//!
//! Input layout: the bytes of one `pgoutput` message. The same bytes also feed the value
//! parser: the first four are a column modifier (big-endian), the rest the column's text.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{Value, json};
use sluice_core::{
    Change, ChangeConfig, ChangeOp, ColumnType, Decoder, Format, MetadataConfig, Mode, Payload, Record, RecordMeta,
};

/// Base types (and arrays of them) whose text the value parser reads.
const TYPES: &[(&str, Option<&str>)] = &[
    ("int4", None),
    ("int8", None),
    ("float8", None),
    ("numeric", None),
    ("bool", None),
    ("text", None),
    ("uuid", None),
    ("json", None),
    ("jsonb", None),
    ("date", None),
    ("time", None),
    ("timestamp", None),
    ("timestamptz", None),
    ("bytea", None),
    ("_int4", Some("int4")),
    ("_text", Some("text")),
    ("_numeric", Some("numeric")),
    ("_bool", Some("bool")),
    ("_mood", Some("mood")),
    ("_jsonb", Some("jsonb")),
];

/// No panic on any message, and every column value the stream can carry lands in a column or
/// on the ledger, never silently nowhere.
pub fn pgoutput(data: &[u8]) {
    let _ = super::api::pgoutput(data);
    let (typmod, text) = match data {
        [a, b, c, d, rest @ ..] => (i32::from_be_bytes([*a, *b, *c, *d]), rest),
        _ => (-1, data),
    };
    let text = String::from_utf8_lossy(text);
    for (name, element) in TYPES {
        let (value, ty) = super::api::value(name, *element, typmod, &text);
        value_lands(&value, ty, &format!("{name} ({typmod}) {text:?}"));
    }
}

/// Decode an insert of `{"c": value, "k": 1}`, `c` declared `ty`, and find the value: a column
/// `c` of that type holding it, or a ledger row for `c`.
fn value_lands(value: &Value, ty: ColumnType, what: &str) {
    let changes = ChangeConfig { mode: Mode::Mirror, keys: Vec::new(), history: false, format: Format::Json };
    let decoder = Decoder::new("t".into(), MetadataConfig::default(), HashMap::new()).with_changes(changes);
    let Value::Object(image) = json!({"c": value, "k": 1}) else { unreachable!("an object literal") };
    let types = Arc::new(vec![("c".to_string(), ty), ("k".to_string(), ColumnType::Bigint)]);
    let change = Change { op: ChangeOp::Insert, keys: vec!["k".into()], types, ..Change::upsert(image) };
    let record = Record { payload: Payload::Change(Box::new(change)), meta: RecordMeta::default() };
    let (out, _) = decoder.decode(vec![record], 1).unwrap_or_else(|e| panic!("{what}: decode failed: {e}"));
    let rejected = out.rejects.iter().any(|r| r.column.as_deref() == Some("c"));
    let stored = out.tables.iter().any(|t| {
        t.data.schema().fields().iter().enumerate().any(|(i, f)| {
            f.name() == "c" && f.data_type() == &ty.arrow() && arrow::array::Array::is_valid(t.data.column(i), 0)
        })
    });
    assert!(stored || rejected || value.is_null(), "{what}: {value} went nowhere: {out:?}");
    if ty == ColumnType::Json && !value.is_null() {
        let text = value.as_str().unwrap_or_else(|| panic!("{what}: a JSON column's value is its text: {value}"));
        assert!(serde_json::from_str::<Value>(text).is_ok(), "{what}: not JSON text: {text}");
    }
}
