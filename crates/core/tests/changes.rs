//! Typed changes: a change's source declares its columns' types (`Change::types`), Debezium's
//! logical types become the same declarations, and nothing a client pushes can declare one.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{Array, AsArray};
use serde_json::{Map, Value, json};
use sluice_core::decode::Decoded;
use sluice_core::format::change::{EventKey, Unconverted};
use sluice_core::format::debezium;
use sluice_core::schema::{Column, SchemaChange};
use sluice_core::{
    Change, ChangeConfig, ChangeOp, ColumnType, Decoder, Format, MetadataConfig, Mode, Payload, Record, RecordMeta,
};

const MARK: &str = "\u{0}sluice-typed";

fn decoder(mode: Mode, format: Format, keys: &[&str]) -> Decoder {
    let keys = keys.iter().map(|k| k.to_string()).collect();
    let changes = ChangeConfig { mode, keys, history: mode == Mode::Mirror, format };
    Decoder::new("t".into(), MetadataConfig::default(), HashMap::new()).with_changes(changes)
}

fn decode(d: &Decoder, records: Vec<Record>) -> Decoded {
    d.decode(records, 1).unwrap().0
}

fn body(text: &str) -> Record {
    Record { payload: Payload::Body(bytes::Bytes::from(text.to_string())), meta: RecordMeta::default() }
}

/// The columns a decode created, with their types.
fn created(out: &Decoded) -> Vec<(String, ColumnType)> {
    out.tables[0]
        .changes
        .iter()
        .flat_map(|c| match c {
            SchemaChange::Create(cols) => cols.clone(),
            SchemaChange::Add(c) | SchemaChange::Widen(c) => vec![c.clone()],
        })
        .map(|Column { name, ty }| (name, ty))
        .collect()
}

fn text(out: &Decoded, column: &str, row: usize) -> Option<String> {
    let data = &out.tables[0].data;
    let values = data.column_by_name(column).unwrap_or_else(|| panic!("no column {column}"));
    let values = values.as_string::<i32>();
    values.is_valid(row).then(|| values.value(row).to_string())
}

/// A pushed event whose fields look like the mark an earlier version put on typed values.
const FORGED: &str = r#"{"id": 1, "d": {"\u0000sluice-typed": "2024-01-01", "type": "DATE"},
    "\u0000sluice-typed": "t", "type": "BOOLEAN"}"#;

/// The forged event came out as data: `type` fields are text columns, the mark's fields go to
/// the ledger for their name, and no column is a DATE or a BOOLEAN.
fn forgery_is_data(out: &Decoded) {
    let columns = created(out);
    assert!(columns.contains(&("d__type".into(), ColumnType::Varchar)), "{columns:?}");
    assert!(columns.contains(&("type".into(), ColumnType::Varchar)), "{columns:?}");
    assert!(!columns.iter().any(|(_, ty)| matches!(ty, ColumnType::Date | ColumnType::Boolean)), "{columns:?}");
    assert_eq!(text(out, "d__type", 0).as_deref(), Some("DATE"));
    let marks: Vec<_> = out.rejects.iter().filter(|r| r.column.as_deref().is_some_and(|c| c.contains(MARK))).collect();
    assert_eq!(marks.len(), 2, "{marks:?}");
    assert!(marks.iter().all(|r| r.reason.contains("NUL")), "{marks:?}");
    assert!(marks.iter().any(|r| r.value == "\"2024-01-01\""), "{marks:?}");
}

#[test]
fn a_pushed_mark_cannot_choose_a_column_type_in_append_mode() {
    let out = decode(&decoder(Mode::Append, Format::Json, &[]), vec![body(FORGED)]);
    assert_eq!(out.rows, 1);
    forgery_is_data(&out);
    // The decoder itself gives the mark no meaning, however the event was parsed.
    let parsed = Record { payload: Payload::Json(serde_json::from_str(FORGED).unwrap()), meta: RecordMeta::default() };
    forgery_is_data(&decode(&decoder(Mode::Append, Format::Json, &[]), vec![parsed]));
}

#[test]
fn a_pushed_mark_cannot_choose_a_column_type_in_a_debezium_mirror() {
    let event = format!(
        r#"{{"key": {{"id": 1}}, "value": {{"op": "c", "after": {FORGED},
            "source": {{"connector": "postgresql", "lsn": 1}}}}}}"#
    );
    let out = decode(&decoder(Mode::Mirror, Format::Debezium, &[]), vec![body(&event)]);
    assert_eq!(out.rows, 1);
    forgery_is_data(&out);
    // Also beside a schema that names the field's logical type: the schema decides, not the value.
    let schema = json!({"type": "struct", "fields": [{"field": "after", "type": "struct", "fields": [
        {"field": "d", "type": "int32", "name": "io.debezium.time.Date"}]}]});
    let wrapped = json!({"schema": schema, "payload": {"op": "c", "after": {"id": 2, "d": {MARK: 1, "type": "JSON"}}}});
    let meta = RecordMeta { key: Some(r#"{"id": 2}"#.into()), ..RecordMeta::default() };
    let out =
        decode(&decoder(Mode::Mirror, Format::Debezium, &[]), vec![Record { payload: Payload::Json(wrapped), meta }]);
    assert_eq!(created(&out).iter().find(|(c, _)| c == "d").map(|c| c.1), Some(ColumnType::Date));
    let reasons: Vec<String> = out.rejects.iter().map(|r| format!("{:?} {}", r.column, r.reason)).collect();
    assert!(reasons.iter().any(|r| r.contains("\"d\"") && r.contains("expected an integer")), "{reasons:?}");
}

fn image(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        other => panic!("not an object: {other}"),
    }
}

fn typed(op: ChangeOp, after: Value, before: Option<Value>, lsn: u64) -> Record {
    let types = Arc::new(vec![
        ("id".to_string(), ColumnType::Bigint),
        ("price".to_string(), ColumnType::Decimal(10, 2)),
        ("doc".to_string(), ColumnType::Json),
        ("note".to_string(), ColumnType::Varchar),
        ("gone".to_string(), ColumnType::Date),
    ]);
    let change = Change {
        op,
        keys: vec!["id".into()],
        before: before.map(image),
        types,
        source: Some(json!({"connector": "postgresql", "lsn": lsn})),
        source_order: Some(format!("{lsn:020}")),
        ..Change::upsert(image(after))
    };
    Record {
        payload: Payload::Change(Box::new(change)),
        meta: RecordMeta { route: Some("t".into()), ..Default::default() },
    }
}

#[test]
fn a_typed_change_declares_its_columns() {
    let d = decoder(Mode::Mirror, Format::Debezium, &[]);
    let out = decode(
        &d,
        vec![
            // Text that looks like a date is the text its VARCHAR column says it is; a JSON
            // document is its text; a NULL creates no column yet.
            typed(
                ChangeOp::Insert,
                json!({"id": 1, "price": "12.50", "doc": "{\"a\":[1,2]}", "note": "2024-01-01", "gone": null}),
                None,
                1,
            ),
            // The JSON value null is not SQL NULL.
            typed(ChangeOp::Insert, json!({"id": 2, "price": null, "doc": "null", "note": null}), None, 2),
            // A key change: the old key's row is deleted within the same change.
            typed(ChangeOp::Update, json!({"id": 3, "price": "1", "doc": null}), Some(json!({"id": 2})), 3),
            // A value that does not fit its declared type: NULL and a ledger row.
            typed(ChangeOp::Insert, json!({"id": 4, "price": "NaN"}), None, 4),
        ],
    );
    assert_eq!(
        created(&out),
        vec![
            ("id".into(), ColumnType::Bigint),
            ("price".into(), ColumnType::Decimal(10, 2)),
            ("doc".into(), ColumnType::Json),
            ("note".into(), ColumnType::Varchar),
        ]
    );
    assert_eq!(text(&out, "doc", 0).as_deref(), Some("{\"a\":[1,2]}"));
    assert_eq!(text(&out, "note", 0).as_deref(), Some("2024-01-01"));
    assert_eq!(text(&out, "doc", 1).as_deref(), Some("null"));
    assert_eq!(text(&out, "note", 1), None);
    let mirror = out.tables[0].mirror.as_ref().unwrap();
    assert_eq!(mirror.ops, [ChangeOp::Insert, ChangeOp::Insert, ChangeOp::Delete, ChangeOp::Update, ChangeOp::Insert]);
    assert_eq!(mirror.recorded, [true, true, false, true, true]);
    assert_eq!(mirror.source_orders[3].as_deref(), Some("00000000000000000003"));
    assert_eq!(mirror.sources[3].as_deref(), Some(r#"{"connector":"postgresql","lsn":3}"#));
    let prices = out.tables[0].data.column_by_name("price").unwrap();
    assert_eq!(prices.as_primitive::<arrow::datatypes::Decimal128Type>().value(0), 1250);
    assert!(prices.is_null(4));
    let rejects: Vec<_> = out.rejects.iter().collect();
    assert_eq!(rejects.len(), 1, "{rejects:?}");
    assert_eq!(
        (rejects[0].column.as_deref(), rejects[0].expected, rejects[0].value.as_str()),
        (Some("price"), Some(ColumnType::Decimal(10, 2)), "\"NaN\"")
    );
}

#[test]
fn a_typed_change_without_its_key_leaves_the_change_in_the_ledger() {
    let out = decode(
        &decoder(Mode::Mirror, Format::Debezium, &[]),
        vec![typed(ChangeOp::Insert, json!({"note": "x"}), None, 9)],
    );
    assert_eq!(out.rows, 0);
    let reject = out.rejects.iter().next().unwrap();
    assert!(reject.reason.contains("`id` is missing"), "{reject:?}");
    let kept: Value = serde_json::from_str(&reject.value).unwrap();
    assert_eq!(
        kept,
        json!({"op": "insert", "before": null, "after": {"note": "x"}, "source": {"connector": "postgresql", "lsn": 9}})
    );
}

#[test]
fn debezium_logical_types_are_declared_not_marked() {
    let field = |name: &str, logical: &str, params: Value| json!({"field": name, "type": "bytes", "name": logical, "parameters": params});
    let fields = json!([
        field("price", "org.apache.kafka.connect.data.Decimal", json!({"scale": "2"})),
        field("doc", "io.debezium.data.Json", Value::Null),
        field("day", "io.debezium.time.Date", Value::Null),
    ]);
    let schema = json!({"fields": [{"field": "before", "fields": fields}, {"field": "after", "fields": fields}]});
    let event = json!({"schema": schema, "payload": {
        "op": "u",
        "before": {"id": 1, "price": "!!", "doc": "null", "day": 0},
        "after": {"id": 1, "price": "BNI=", "doc": "{\"a\": 1}", "day": null},
        "source": {"connector": "postgresql", "lsn": 5, "txSeq": 2}}});
    let change = debezium::change(&event, EventKey::Given(r#"{"id": 1}"#)).unwrap().unwrap();
    assert_eq!(change.image, image(json!({"id": 1, "price": "12.34", "doc": "{\"a\":1}", "day": null})));
    assert_eq!(change.before, Some(image(json!({"id": 1, "price": "!!", "doc": "null", "day": "1970-01-01"}))));
    assert_eq!(
        *change.types,
        vec![("price".to_string(), ColumnType::Decimal(38, 2)), ("doc".to_string(), ColumnType::Json)]
    );
    let reason = "org.apache.kafka.connect.data.Decimal: bad base64";
    assert_eq!(
        change.unconverted,
        vec![Unconverted { column: "price".into(), reason: reason.into(), in_before: true }]
    );
    assert_eq!(change.source_order.as_deref(), Some("000000000000000000050000000002"));
    assert_eq!(change.keys, ["id"]);
}

#[test]
fn a_value_a_debezium_before_image_could_not_convert_is_null_and_in_the_ledger() {
    // A table without a key: the old row is found by its whole image, so its values count.
    let schema = json!({"fields": [{"field": "before", "fields": [
        {"field": "price", "type": "bytes", "name": "org.apache.kafka.connect.data.Decimal", "parameters": {"scale": "2"}}]}]});
    let event = json!({"schema": schema, "payload": {"op": "u", "before": {"id": 1, "price": "!!"},
        "after": {"id": 1, "price": null}, "source": {"connector": "postgresql", "lsn": 1}}});
    let meta = RecordMeta { no_key: true, ..RecordMeta::default() };
    let out =
        decode(&decoder(Mode::Mirror, Format::Debezium, &[]), vec![Record { payload: Payload::Json(event), meta }]);
    assert_eq!(out.tables[0].mirror.as_ref().unwrap().ops, [ChangeOp::Delete, ChangeOp::Update]);
    assert_eq!(created(&out), vec![("id".into(), ColumnType::Bigint), ("price".into(), ColumnType::Decimal(38, 2))]);
    let rejects: Vec<_> = out.rejects.iter().collect();
    assert_eq!(rejects.len(), 1, "{rejects:?}");
    assert_eq!((rejects[0].column.as_deref(), rejects[0].value.as_str()), (Some("price"), "\"!!\""));
}

#[test]
fn a_change_in_an_append_stream_is_its_row() {
    let out = decode(
        &decoder(Mode::Append, Format::Json, &[]),
        vec![typed(ChangeOp::Insert, json!({"id": 1, "note": "2024-01-01"}), None, 1)],
    );
    assert_eq!(created(&out), vec![("id".into(), ColumnType::Bigint), ("note".into(), ColumnType::Varchar)]);
    assert!(out.tables[0].mirror.is_none());
}
