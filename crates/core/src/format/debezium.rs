//! Debezium change events (2.x): `op`, `before`, `after`, `source`, with or without the
//! `schema`/`payload` wrapper. Covers the Postgres, MySQL, SQL Server, Oracle and MongoDB
//! connectors; MongoDB's images are extended-JSON strings.

use serde_json::{Map, Value};

use crate::batch::ChangeOp;
use crate::decode::change::{Change, Route};

/// The change in `event`; `Ok(None)` for a tombstone or an event that changes no row.
pub fn change(event: Value, key: Option<&str>) -> Result<Option<Change>, String> {
    let (payload, schema) = unwrap(event);
    let mut payload = match payload {
        Value::Null => return Ok(None),
        Value::Object(p) => p,
        other => return Err(format!("a Debezium event is a JSON object, not {}", kind(&other))),
    };
    let op = match payload.get("op").and_then(Value::as_str) {
        Some("c") => ChangeOp::Insert,
        Some("u") => ChangeOp::Update,
        Some("d") => ChangeOp::Delete,
        Some("r") => ChangeOp::Snapshot,
        // Truncates and logical-decoding messages change no row by key.
        Some("t" | "m") => return Ok(None),
        Some(other) => return Err(format!("unknown Debezium op '{other}'")),
        None => return Err("not a Debezium change event: no \"op\" field".into()),
    };
    let source = payload.remove("source").filter(|s| s.is_object());
    let mongo = source.as_ref().and_then(|s| s.get("connector")).and_then(Value::as_str) == Some("mongodb");
    let before = image(payload.remove("before"), schema.as_ref(), "before")?;
    let after = image(payload.remove("after"), schema.as_ref(), "after")?;
    let keyed = key.map(|k| key_fields(k, mongo)).transpose()?.unwrap_or_default();
    let keys: Vec<String> = keyed.keys().cloned().collect();
    let (image, before) = match op {
        ChangeOp::Delete => {
            let image = before.or_else(|| (!keyed.is_empty()).then(|| keyed.clone()));
            let Some(image) = image else {
                return Err("a delete with no `before` image and no key: send the Debezium key".into());
            };
            (image, None)
        }
        _ => {
            let Some(after) = after else {
                let hint =
                    if mongo { ": set the MongoDB connector's capture.mode to change_streams_update_full" } else { "" };
                return Err(format!("a {} with no `after` image{hint}", op.name()));
            };
            (after, before)
        }
    };
    // A time too far out for microseconds in an i64 is no time at all.
    let change_us = source.as_ref().and_then(change_time).or_else(|| payload.get("ts_ms")?.as_i64()?.checked_mul(1000));
    let route = source.as_ref().map(route).unwrap_or_default();
    let source_order = source.as_ref().and_then(source_order);
    Ok(Some(Change { op, image, before, keys, change_us, source, source_order, route }))
}

/// The payload and schema of a wrapped event, or the event itself.
fn unwrap(event: Value) -> (Value, Option<Value>) {
    match event {
        Value::Object(mut m) if m.contains_key("payload") && m.contains_key("schema") && m.len() == 2 => {
            let schema = m.remove("schema");
            (m.remove("payload").unwrap_or(Value::Null), schema)
        }
        other => (other, None),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Array(_) => "an array",
        Value::String(_) => "a string",
        Value::Number(_) => "a number",
        Value::Bool(_) => "a boolean",
        _ => "null",
    }
}

/// A row image: an object, or MongoDB's extended-JSON string; with a schema, logical types
/// become their values.
fn image(v: Option<Value>, schema: Option<&Value>, field: &str) -> Result<Option<Map<String, Value>>, String> {
    let mut image = match v {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(m)) => m,
        Some(Value::String(s)) => match serde_json::from_str::<Value>(&s) {
            Ok(Value::Object(m)) => m,
            _ => return Err(format!("`{field}` is a string that is not a JSON document")),
        },
        Some(other) => return Err(format!("`{field}` must be an object, not {}", kind(&other))),
    };
    for value in image.values_mut() {
        super::extended_json::simplify(value);
    }
    if let Some(fields) = schema.and_then(|s| super::logical::fields_of(s, field)) {
        super::logical::apply(&mut image, fields)?;
    }
    Ok(Some(image))
}

/// The key's fields: the message key (JSON, maybe wrapped). MongoDB keys name `id` and hold
/// the document's `_id` as extended JSON.
fn key_fields(key: &str, mongo: bool) -> Result<Map<String, Value>, String> {
    let parsed: Value = serde_json::from_str(key).map_err(|_| format!("the message key is not JSON: {key}"))?;
    let (payload, _) = unwrap(parsed);
    let Value::Object(mut fields) = payload else {
        return Err("the Debezium key must be a JSON object".into());
    };
    if mongo && let Some(id) = fields.remove("id") {
        let mut id = match id {
            Value::String(s) => serde_json::from_str(&s).unwrap_or(Value::String(s)),
            other => other,
        };
        super::extended_json::simplify(&mut id);
        fields.insert("_id".into(), id);
    }
    Ok(fields)
}

/// The source's change time: `ts_us`, `ts_ns` or `ts_ms` of the source block.
fn change_time(source: &Value) -> Option<i64> {
    if let Some(us) = source.get("ts_us").and_then(Value::as_i64) {
        return Some(us);
    }
    if let Some(ns) = source.get("ts_ns").and_then(Value::as_i64) {
        return Some(ns / 1000);
    }
    source.get("ts_ms").and_then(Value::as_i64).and_then(|ms| ms.checked_mul(1000))
}

/// The source position as text that sorts in source order, per connector.
fn source_order(source: &Value) -> Option<String> {
    let number = |k: &str| match source.get(k)? {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.parse::<u64>().ok(),
        _ => None,
    };
    let text = |k: &str| source.get(k).and_then(Value::as_str);
    match source.get("connector").and_then(Value::as_str)? {
        // Sluice's own Postgres source adds `txSeq`: the commit LSN, then the order within it.
        "postgresql" => Some(format!("{:020}{:010}", number("lsn")?, number("txSeq").unwrap_or(0))),
        "mysql" | "mariadb" => {
            let file = text("file")?;
            let index: u64 = file.rsplit('.').next()?.parse().ok()?;
            Some(format!("{index:010}{:020}{:010}", number("pos")?, number("row").unwrap_or(0)))
        }
        "sqlserver" => {
            let serial = number("event_serial_no").unwrap_or(0);
            Some(format!("{}{}{serial:010}", text("commit_lsn")?, text("change_lsn").unwrap_or("")))
        }
        "oracle" => Some(format!("{:024}", number("scn")?)),
        "mongodb" => Some(format!("{:015}{:010}", number("ts_ms")?, number("ord").unwrap_or(0))),
        _ => None,
    }
}

fn route(source: &Value) -> Route {
    let text = |k: &str| source.get(k).and_then(Value::as_str).filter(|s| !s.is_empty()).map(str::to_string);
    Route { db: text("db"), schema: text("schema"), table: text("table").or_else(|| text("collection")) }
}
