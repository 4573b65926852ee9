//! Debezium change events (2.x): `op`, `before`, `after`, `source`, with or without the
//! `schema`/`payload` wrapper. Covers the Postgres, MySQL, SQL Server, Oracle and MongoDB
//! connectors; MongoDB's images are extended-JSON strings.
//!
//! A truncate (`op: t`) is a change of its own: it empties the table it routes to. A column
//! holding Debezium's unavailable-value placeholder (an unchanged TOASTed Postgres value, an
//! Oracle LOB not logged) is left out of the image and named in [`Change::unavailable`]: the
//! mirror keeps the value it has.

use std::sync::Arc;

use serde_json::{Map, Value};

use super::change::{Change, EventKey, Route, Unconverted};
use super::logical::Typed;
use crate::batch::ChangeOp;

/// The change in `event`; `Ok(None)` for a tombstone or an event that changes no row. An
/// absent key (a table without a primary key) makes the whole image the row's identity. The
/// event is only read, so a ledger row can still keep it as it was sent.
pub fn change(event: &Value, key: EventKey<'_>) -> Result<Option<Change>, String> {
    let (payload, schema) = unwrap(event);
    let payload = match payload {
        Value::Null => return Ok(None),
        Value::Object(p) => p,
        other => return Err(format!("a Debezium event is a JSON object, not {}", kind(other))),
    };
    let op = match payload.get("op").and_then(Value::as_str) {
        Some("c") => ChangeOp::Insert,
        Some("u") => ChangeOp::Update,
        Some("d") => ChangeOp::Delete,
        Some("r") => ChangeOp::Snapshot,
        Some("t") => ChangeOp::Truncate,
        // Logical-decoding messages change no row.
        Some("m") => return Ok(None),
        Some(other) => return Err(format!("unknown Debezium op '{other}'")),
        None => return Err("not a Debezium change event: no \"op\" field".into()),
    };
    let source = payload.get("source").filter(|s| s.is_object()).cloned();
    let connector = source.as_ref().and_then(|s| s.get("connector")).and_then(Value::as_str);
    let mongo = connector == Some("mongodb");
    let binlog = matches!(connector, Some("mysql" | "mariadb"));
    // A truncate's time and position, for the table it routes to.
    let change_us = source.as_ref().and_then(change_time).or_else(|| payload.get("ts_ms")?.as_i64()?.checked_mul(1000));
    let route = source.as_ref().map(route).unwrap_or_default();
    let source_order = source.as_ref().and_then(source_order);
    if op == ChangeOp::Truncate {
        return Ok(Some(Change { op, change_us, source, source_order, route, ..Change::upsert(Map::new()) }));
    }
    let before = image(payload.get("before"), schema, "before", binlog)?;
    let mut after = image(payload.get("after"), schema, "after", binlog)?;
    let mut unavailable = after.as_mut().map(|a| std::mem::take(&mut a.held)).unwrap_or_default();
    // An unchanged value the old image carries (REPLICA IDENTITY FULL inlines it) is that value.
    if let (Some(after), Some(before)) = (after.as_mut(), before.as_ref()) {
        unavailable.retain(|name| match before.row.get(name) {
            Some(v) => {
                after.row.insert(name.clone(), v.clone());
                false
            }
            None => true,
        });
    }
    // `None`: no key, the whole row is the identity.
    let keyed = match key {
        EventKey::Given(k) => key_fields(k, mongo)?,
        EventKey::Absent => None,
        EventKey::Unknown => Some(Map::new()),
    };
    let whole_row = keyed.is_none();
    let keyed = keyed.unwrap_or_default();
    let (image, before) = match op {
        ChangeOp::Delete => {
            let image = before.or_else(|| (!keyed.is_empty()).then(|| Image::plain(keyed.clone())));
            let Some(image) = image else {
                if whole_row {
                    return Err(format!("a delete with no `before` image, of a table without a key{FULL}"));
                }
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
            if whole_row && op == ChangeOp::Update && before.is_none() {
                return Err(format!("an update with no `before` image, of a table without a key{FULL}"));
            }
            (after, before)
        }
    };
    let keys: Vec<String> =
        if whole_row { image.row.keys().cloned().collect() } else { keyed.keys().cloned().collect() };
    let mut types = image.typed.types;
    let unconverted = |typed: Vec<(String, String)>, in_before: bool| {
        typed.into_iter().map(move |(column, reason)| Unconverted { column, reason, in_before })
    };
    let mut failed: Vec<Unconverted> = unconverted(image.typed.unconverted, false).collect();
    let before = before.map(|b| {
        // Both images have one schema: a column null in one still has its type from the other.
        for (name, ty) in b.typed.types {
            if !types.iter().any(|(n, _)| *n == name) {
                types.push((name, ty));
            }
        }
        failed.extend(unconverted(b.typed.unconverted, true));
        b.row
    });
    Ok(Some(Change {
        op,
        image: image.row,
        before,
        keys,
        types: Arc::new(types),
        unconverted: failed,
        change_us,
        source,
        source_order,
        route,
        unavailable,
    }))
}

/// What a keyless table needs for its updates and deletes to find their rows.
const FULL: &str = " (no message key): its rows are found by their old image, so set REPLICA IDENTITY FULL on the \
                    Postgres table (binlog_row_image=FULL on MySQL and MariaDB)";

/// The payload and schema of a wrapped event, or the event itself.
fn unwrap(event: &Value) -> (&Value, Option<&Value>) {
    match event {
        Value::Object(m) if wrapped(m) => match (m.get("payload"), m.get("schema")) {
            (Some(payload), schema) => (payload, schema),
            (None, _) => (event, None),
        },
        other => (other, None),
    }
}

/// Whether an object is the `schema`/`payload` wrapper of Kafka Connect's JSON converter.
fn wrapped(m: &Map<String, Value>) -> bool {
    m.len() == 2 && m.contains_key("payload") && m.contains_key("schema")
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

/// Debezium's default `unavailable.value.placeholder`.
pub const PLACEHOLDER: &str = "__debezium_unavailable_value";
/// The placeholder in a binary column: its bytes, base64 as the JSON converter writes them.
const PLACEHOLDER_BASE64: &str = "X19kZWJleml1bV91bmF2YWlsYWJsZV92YWx1ZQ==";
/// The placeholder in a UUID array: Java's `UUID.nameUUIDFromBytes` of its bytes.
const PLACEHOLDER_UUID: &str = "b68a35a7-17ad-35b3-af2a-ae46edb4545a";

/// Whether `v` is the placeholder in one of the forms Debezium's Postgres connector gives it
/// (`UnchangedToastedPlaceholder`): text, bytes (base64), a text, bytea or UUID array holding
/// only it, an integer array of its bytes, an hstore map of it to itself.
fn is_placeholder(v: &Value) -> bool {
    match v {
        Value::String(s) => s == PLACEHOLDER || s == PLACEHOLDER_BASE64,
        Value::Array(items) => match items.as_slice() {
            [Value::String(s)] => s == PLACEHOLDER || s == PLACEHOLDER_BASE64 || s == PLACEHOLDER_UUID,
            items => {
                items.len() == PLACEHOLDER.len()
                    && items.iter().zip(PLACEHOLDER.bytes()).all(|(i, b)| i.as_u64() == Some(u64::from(b)))
            }
        },
        Value::Object(m) => m.len() == 1 && m.get(PLACEHOLDER).and_then(Value::as_str) == Some(PLACEHOLDER),
        _ => false,
    }
}

/// Take the placeholder columns out of an image; their names.
fn unavailable(image: &mut Map<String, Value>) -> Vec<String> {
    let names: Vec<String> = image.iter().filter(|(_, v)| is_placeholder(v)).map(|(k, _)| k.clone()).collect();
    for name in &names {
        image.remove(name);
    }
    names
}

/// A row image, the columns that held the placeholder, and what its logical types declared.
struct Image {
    row: Map<String, Value>,
    held: Vec<String>,
    typed: Typed,
}

impl Image {
    /// An image with no placeholder and no logical type (a key standing in for a row).
    fn plain(row: Map<String, Value>) -> Self {
        Self { row, held: Vec::new(), typed: Typed::default() }
    }
}

/// A row image: an object, or MongoDB's extended-JSON string; with a schema, logical types
/// become their values. Placeholder columns are taken out and named beside it.
fn image(v: Option<&Value>, schema: Option<&Value>, field: &str, binlog: bool) -> Result<Option<Image>, String> {
    let mut row = match v {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(m)) => m.clone(),
        Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
            Ok(Value::Object(m)) => m,
            _ => return Err(format!("`{field}` is a string that is not a JSON document")),
        },
        Some(other) => return Err(format!("`{field}` must be an object, not {}", kind(other))),
    };
    // The placeholder is not a value of the column's type: it goes before any conversion.
    let held = unavailable(&mut row);
    for value in row.values_mut() {
        super::extended_json::simplify(value);
    }
    let typed = match schema.and_then(|s| super::logical::fields_of(s, field)) {
        Some(fields) => super::logical::apply(&mut row, fields, binlog)?,
        None => Typed::default(),
    };
    Ok(Some(Image { row, held, typed }))
}

/// The key's fields: the message key (JSON, maybe wrapped); `None` for a JSON null key (a
/// table without a primary key). MongoDB keys name `id` and hold the document's `_id` as
/// extended JSON.
fn key_fields(key: &str, mongo: bool) -> Result<Option<Map<String, Value>>, String> {
    let parsed: Value = serde_json::from_str(key).map_err(|_| format!("the message key is not JSON: {key}"))?;
    let payload = match parsed {
        Value::Object(mut m) if wrapped(&m) => m.remove("payload").unwrap_or(Value::Null),
        other => other,
    };
    let mut fields = match payload {
        Value::Object(fields) => fields,
        Value::Null => return Ok(None),
        _ => return Err("the Debezium key must be a JSON object".into()),
    };
    if mongo && let Some(id) = fields.remove("id") {
        let mut id = match id {
            Value::String(s) => serde_json::from_str(&s).unwrap_or(Value::String(s)),
            other => other,
        };
        super::extended_json::simplify(&mut id);
        fields.insert("_id".into(), id);
    }
    Ok(Some(fields))
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
