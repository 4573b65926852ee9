//! Postgres values (text format) to the JSON values the decoder fits to their columns' types
//! (`types.rs`): numbers and booleans as JSON scalars, timestamptz in RFC 3339, timestamps with
//! a `T`, one-dimensional arrays as lists, JSON documents (jsonb, and arrays that are no list)
//! as their compact JSON text, everything else as the text Postgres prints.

use serde_json::Value;
use sluice_core::ColumnType;

use super::types::TypeInfo;

/// The decoder's value for `text`, in a column of type `info` that Sluice types `ty`.
pub(crate) fn value(ty: ColumnType, info: &TypeInfo, text: &str) -> Value {
    if info.category == 'A' {
        let items = match (&info.element, parse_array(text)) {
            (Some(element), Some(items)) => {
                Value::Array(items.into_iter().map(|i| i.map_or(Value::Null, |t| plain(element, &t))).collect())
            }
            // Another shape (more dimensions): the text, which no list holds.
            _ => Value::String(text.to_string()),
        };
        return match ty {
            ColumnType::Json => json_text(&items),
            _ => items,
        };
    }
    match ty {
        ColumnType::Boolean | ColumnType::Bigint | ColumnType::Double => plain(info, text),
        ColumnType::Json => match serde_json::from_str::<Value>(text) {
            Ok(document) => json_text(&document),
            Err(_) => json_text(&Value::String(text.to_string())),
        },
        ColumnType::Timestamp => Value::String(text.replacen(' ', "T", 1)),
        ColumnType::Timestamptz => match chrono::DateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S%.f%#z") {
            Ok(t) => Value::String(t.to_rfc3339()),
            Err(_) => Value::String(text.to_string()),
        },
        _ => Value::String(text.to_string()),
    }
}

/// A JSON document as the text a JSON column holds (compact, as the snapshot's rows are).
fn json_text(document: &Value) -> Value {
    Value::String(document.to_string())
}

/// Numbers and booleans as JSON scalars; everything else (text, enums) as text.
fn plain(info: &TypeInfo, text: &str) -> Value {
    match info.name.as_str() {
        "bool" => Value::Bool(text == "t" || text == "true"),
        "int2" | "int4" | "int8" | "oid" => {
            text.parse::<i64>().map_or_else(|_| Value::String(text.into()), Value::from)
        }
        "float4" | "float8" => text
            .parse::<f64>()
            .ok()
            .and_then(serde_json::Number::from_f64)
            .map_or_else(|| Value::String(text.into()), Value::Number),
        "numeric" => text
            .parse::<f64>()
            .ok()
            .filter(|_| info.category != 'A')
            .and_then(serde_json::Number::from_f64)
            .map_or_else(|| Value::String(text.into()), Value::Number),
        "json" | "jsonb" => serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.into())),
        _ => Value::String(text.to_string()),
    }
}

/// A one-dimensional array literal (`{1,2,"a b",NULL}`); `None` for other shapes.
fn parse_array(text: &str) -> Option<Vec<Option<String>>> {
    let inner = text.strip_prefix('{')?.strip_suffix('}')?;
    if inner.starts_with('{') {
        return None;
    }
    let mut out = Vec::new();
    if inner.is_empty() {
        return Some(out);
    }
    let mut chars = inner.chars().peekable();
    loop {
        let mut item = String::new();
        let quoted = chars.peek() == Some(&'"');
        if quoted {
            chars.next();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => item.push(chars.next()?),
                    '"' => break,
                    c => item.push(c),
                }
            }
        } else {
            while let Some(c) = chars.peek() {
                if *c == ',' {
                    break;
                }
                item.push(*c);
                chars.next();
            }
        }
        out.push(if !quoted && item == "NULL" { None } else { Some(item) });
        match chars.next() {
            Some(',') => continue,
            None => return Some(out),
            Some(_) => return None,
        }
    }
}
