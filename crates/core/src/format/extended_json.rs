//! MongoDB extended JSON (relaxed and canonical) to plain values: `{"$oid": …}` becomes the
//! hex string, `{"$date": …}` an RFC 3339 time, `{"$numberLong": "…"}` a number.

use serde_json::{Map, Value};

/// Replace extended-JSON wrappers in `value`, recursively.
pub fn simplify(value: &mut Value) {
    match value {
        Value::Array(items) => items.iter_mut().for_each(simplify),
        Value::Object(map) => {
            if let Some(plain) = wrapper(map) {
                *value = plain;
            } else {
                map.values_mut().for_each(simplify);
            }
        }
        _ => {}
    }
}

fn wrapper(map: &Map<String, Value>) -> Option<Value> {
    if map.len() != 1 {
        return None;
    }
    let (k, v) = map.iter().next()?;
    Some(match (k.as_str(), v) {
        ("$oid", Value::String(s)) | ("$symbol", Value::String(s)) => Value::String(s.clone()),
        ("$numberLong" | "$numberInt", Value::String(s)) => s.parse::<i64>().ok().map(Value::from)?,
        ("$numberDouble", Value::String(s)) => {
            s.parse::<f64>().ok().and_then(serde_json::Number::from_f64).map(Value::Number)?
        }
        ("$numberDecimal", Value::String(s)) => Value::String(s.clone()),
        ("$date", Value::String(s)) => Value::String(s.clone()),
        ("$date", Value::Number(n)) => millis(n.as_i64()?)?,
        ("$date", Value::Object(inner)) => match inner.get("$numberLong") {
            Some(Value::String(s)) => millis(s.parse().ok()?)?,
            _ => return None,
        },
        ("$uuid", Value::String(s)) => Value::String(s.clone()),
        _ => return None,
    })
}

fn millis(ms: i64) -> Option<Value> {
    let t = chrono::DateTime::from_timestamp_millis(ms)?;
    Some(Value::String(t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)))
}
