//! Debezium message keys in mirror mode: a given key names the key columns; an absent one (a
//! Kafka message without a key, a pushed `{"key": null, …}` pair) makes the whole row the
//! identity; an unknown one (a bare pushed value) needs keys on the stream.

use std::collections::HashMap;

use serde_json::{Value, json};
use sluice_core::batch::ChangeOp;
use sluice_core::decode::Decoded;
use sluice_core::{ChangeConfig, Decoder, Format, MetadataConfig, Mode, Payload, Record, RecordMeta};

fn decoder(keys: &[&str]) -> Decoder {
    let changes = ChangeConfig {
        mode: Mode::Mirror,
        keys: keys.iter().map(|k| k.to_string()).collect(),
        history: true,
        format: Format::Debezium,
    };
    Decoder::new("t".into(), MetadataConfig::default(), HashMap::new()).with_changes(changes)
}

fn event(op: &str, before: Value, after: Value, pos: u64) -> Value {
    json!({"op": op, "before": before, "after": after,
           "source": {"connector": "mysql", "db": "d", "table": "t", "file": "bin.000001", "pos": pos}})
}

/// A Kafka record: `key` is the message key, `None` a message without one.
fn kafka(value: Value, key: Option<&str>) -> Record {
    let meta = RecordMeta { key: key.map(str::to_string), no_key: key.is_none(), ..RecordMeta::default() };
    Record { payload: Payload::Json(value), meta }
}

/// A bare pushed value: no key, and no word on whether there is one.
fn bare(value: Value) -> Record {
    Record { payload: Payload::Json(value), meta: RecordMeta::default() }
}

fn decode(d: &Decoder, records: Vec<Record>) -> Decoded {
    d.decode(records, 1).unwrap().0
}

fn reasons(out: &Decoded) -> Vec<String> {
    out.rejects.iter().map(|r| r.reason.to_string()).collect()
}

#[test]
fn a_keyless_kafka_message_is_identified_by_its_whole_row() {
    let row = json!({"a": 1, "b": null, "c": "x"});
    let moved = json!({"a": 2, "b": null, "c": "x"});
    let out = decode(
        &decoder(&[]),
        vec![
            kafka(event("r", Value::Null, row.clone(), 1), None),
            kafka(event("u", row.clone(), moved.clone(), 2), None),
            kafka(event("d", moved, Value::Null, 3), None),
            kafka(Value::Null, None),
        ],
    );
    assert_eq!(reasons(&out), Vec::<String>::new());
    let mirror = out.tables[0].mirror.as_ref().unwrap();
    assert_eq!(mirror.keys, ["a", "b", "c"]);
    // The update changes the identity: the old row goes, the new one comes, then it is deleted.
    assert_eq!(mirror.ops, [ChangeOp::Snapshot, ChangeOp::Delete, ChangeOp::Update, ChangeOp::Delete]);
    assert_eq!(mirror.recorded, [true, false, true, true]);
}

#[test]
fn a_pushed_pair_with_a_null_key_is_keyless_and_a_given_key_names_the_key_columns() {
    let pair = |key: Value, value: Value| Record {
        payload: Payload::Json(json!({"key": key, "value": value})),
        meta: RecordMeta::default(),
    };
    let row = json!({"id": 1, "n": 2});
    let out = decode(
        &decoder(&[]),
        vec![
            pair(Value::Null, event("c", Value::Null, row.clone(), 1)),
            // The JSON converter's wrapped null is a null key too.
            pair(json!({"schema": null, "payload": null}), event("c", Value::Null, row.clone(), 2)),
        ],
    );
    assert_eq!(reasons(&out), Vec::<String>::new());
    assert_eq!(out.tables[0].mirror.as_ref().unwrap().keys, ["id", "n"]);
    let out = decode(&decoder(&[]), vec![pair(json!({"id": 1}), event("c", Value::Null, row, 1))]);
    assert_eq!(out.tables[0].mirror.as_ref().unwrap().keys, ["id"]);
}

#[test]
fn a_keyless_update_or_delete_without_the_old_image_goes_to_the_ledger() {
    let row = json!({"a": 1});
    let out = decode(
        &decoder(&[]),
        vec![
            kafka(event("u", Value::Null, row.clone(), 1), None),
            kafka(event("d", Value::Null, Value::Null, 2), None),
        ],
    );
    let reasons = reasons(&out);
    assert_eq!(reasons.len(), 2, "{reasons:?}");
    for reason in &reasons {
        assert!(reason.contains("REPLICA IDENTITY FULL"), "{reason}");
    }
    assert!(out.tables.is_empty() || out.tables[0].data.num_rows() == 0);
}

#[test]
fn a_bare_value_without_configured_keys_is_rejected_and_configured_keys_win() {
    let row = json!({"id": 7, "n": 1});
    let out = decode(&decoder(&[]), vec![bare(event("c", Value::Null, row.clone(), 1))]);
    let reasons = reasons(&out);
    assert_eq!(reasons.len(), 1);
    assert!(reasons[0].contains("no key columns"), "{reasons:?}");
    // With keys on the stream, a keyless message uses them: an update needs no old image.
    let out = decode(
        &decoder(&["id"]),
        vec![
            kafka(event("c", Value::Null, row.clone(), 1), None),
            kafka(event("u", Value::Null, json!({"id": 7, "n": 2}), 2), None),
        ],
    );
    assert_eq!(self::reasons(&out), Vec::<String>::new());
    let mirror = out.tables[0].mirror.as_ref().unwrap();
    assert_eq!(mirror.keys, ["id"]);
    assert_eq!(mirror.ops, [ChangeOp::Insert, ChangeOp::Update]);
}

#[test]
fn an_unchanged_value_the_old_image_carries_is_kept() {
    let placeholder = "__debezium_unavailable_value";
    let before = json!({"id": 1, "body": "long", "n": 1});
    let after = json!({"id": 1, "body": placeholder, "n": 2});
    let out = decode(&decoder(&[]), vec![kafka(event("u", before, after, 1), None)]);
    assert_eq!(reasons(&out), Vec::<String>::new());
    let mirror = out.tables[0].mirror.as_ref().unwrap();
    let mut keys = mirror.keys.clone();
    keys.sort();
    assert_eq!(keys, ["body", "id", "n"], "the kept value is part of the identity");
    assert_eq!(mirror.unavailable.last().unwrap(), &Vec::<String>::new());
}
