//! What must hold for any replication-stream input, shared by the property tests and the
//! cargo-fuzz target `pgoutput` (`fuzz/`, which includes this file by path). The parsers are
//! `super::api`: `sluice_connectors::postgres::fuzz` here, the same file built alone there.
//!
//! Input layout: the bytes of one `pgoutput` message. The same bytes also feed the value
//! parser: the first four are a column modifier (big-endian), the rest the column's text.

use std::collections::HashMap;

use serde_json::{Value, json};
use sluice_core::format::logical::TYPED_MARK;
use sluice_core::{ColumnType, Decoder, MetadataConfig, Payload, Record, RecordMeta};

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
        let value = super::api::value(name, *element, typmod, &text);
        value_lands(&value, &format!("{name} ({typmod}) {text:?}"));
    }
}

/// Decode `{"c": value}` and find the value: a column `c` holding it, or a ledger row for `c`.
fn value_lands(value: &Value, what: &str) {
    let inner = match value {
        Value::Object(m) if m.contains_key(TYPED_MARK) => {
            let ty = m.get("type").and_then(Value::as_str).unwrap_or_default();
            assert!(ColumnType::from_sql(ty).is_some(), "{what}: typed as {ty:?}, which no column type is");
            &m[TYPED_MARK]
        }
        other => other,
    };
    let decoder = Decoder::new("t".into(), MetadataConfig::default(), HashMap::new());
    let record = Record { payload: Payload::Json(json!({"c": value, "k": 1})), meta: RecordMeta::default() };
    let (out, _) = decoder.decode(vec![record], 1).unwrap_or_else(|e| panic!("{what}: decode failed: {e}"));
    let rejected = out.rejects.iter().any(|r| r.column.as_deref().is_some_and(|c| c == "c" || c.starts_with("c__")));
    let stored = out.tables.iter().any(|t| {
        t.data.schema().fields().iter().enumerate().any(|(i, f)| {
            (f.name() == "c" || f.name().starts_with("c__")) && arrow::array::Array::is_valid(t.data.column(i), 0)
        })
    });
    let nothing = inner.is_null() || inner.as_object().is_some_and(|m| m.values().all(Value::is_null));
    assert!(stored || rejected || nothing, "{what}: {value} went nowhere: {out:?}");
}
