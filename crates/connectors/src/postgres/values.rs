//! Postgres values (text format) to JSON values typed for the decoder: numeric keeps its scale,
//! timestamptz, uuid, jsonb, dates and times get their own column types, one-dimensional
//! arrays of scalars become lists (other arrays JSON), enums text, and domains their base type.

use std::collections::HashMap;

use serde_json::{Value, json};
use sluice_core::ColumnType;
use sluice_core::format::logical::TYPED_MARK;
use sluice_core::schema::Scalar;

/// A column type, resolved through domains.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TypeInfo {
    /// Base type name (`int4`, `numeric`, `timestamptz`, …).
    pub name: String,
    /// `typcategory`: `A` array, `E` enum, …
    pub category: char,
    /// The element type of an array.
    pub element: Option<Box<TypeInfo>>,
    /// The type modifier a domain carries (for `numeric(p,s)` domains).
    pub typmod: i32,
}

/// Type lookups, cached per OID.
#[derive(Default)]
pub(crate) struct Types {
    known: HashMap<u32, TypeInfo>,
}

impl Types {
    pub async fn get(&mut self, client: &tokio_postgres::Client, oid: u32) -> Result<TypeInfo, tokio_postgres::Error> {
        if let Some(t) = self.known.get(&oid) {
            return Ok(t.clone());
        }
        let info = resolve(client, oid, 0).await?;
        self.known.insert(oid, info.clone());
        Ok(info)
    }
}

async fn resolve(client: &tokio_postgres::Client, oid: u32, depth: u8) -> Result<TypeInfo, tokio_postgres::Error> {
    let row = client
        .query_one(
            "SELECT typname::text, typtype::text, typbasetype, typcategory::text, typelem, typtypmod FROM pg_type WHERE oid = $1",
            &[&oid],
        )
        .await?;
    let (name, kind, base, category, element, typmod): (String, String, u32, String, u32, i32) =
        (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4), row.get(5));
    if kind == "d" && depth < 8 {
        let mut info = Box::pin(resolve(client, base, depth + 1)).await?;
        if info.typmod < 0 {
            info.typmod = typmod;
        }
        return Ok(info);
    }
    let category = category.chars().next().unwrap_or('U');
    let element = if category == 'A' && element != 0 && depth < 8 {
        Some(Box::new(Box::pin(resolve(client, element, depth + 1)).await?))
    } else {
        None
    };
    Ok(TypeInfo { name, category, element, typmod })
}

fn typed(value: Value, ty: &str) -> Value {
    json!({ TYPED_MARK: value, "type": ty })
}

/// The decoder's value for `text` of type `info` with column modifier `typmod`.
pub(crate) fn value(info: &TypeInfo, typmod: i32, text: &str) -> Value {
    let typmod = if typmod >= 0 { typmod } else { info.typmod };
    if info.category == 'A' {
        return match (&info.element, parse_array(text)) {
            (Some(element), Some(items)) => {
                let items = items.into_iter().map(|i| i.map_or(Value::Null, |t| plain(element, &t))).collect();
                let ty =
                    array_item(info).map_or_else(|| "JSON".to_string(), |item| ColumnType::List(item).sql().into());
                typed(Value::Array(items), &ty)
            }
            _ => Value::String(text.to_string()),
        };
    }
    match info.name.as_str() {
        "numeric" if typmod >= 4 => {
            let scale = (typmod - 4) & 0xffff;
            let precision = ((typmod - 4) >> 16) & 0xffff;
            // A scale above the precision, or below zero (PostgreSQL 15 allows both; a negative
            // one reads as 2000 and more here), has no DECIMAL: such a column is text.
            if (1..=38).contains(&precision) && scale <= precision && text.parse::<f64>().is_ok_and(f64::is_finite) {
                typed(Value::String(text.to_string()), &format!("DECIMAL({precision},{scale})"))
            } else {
                Value::String(text.to_string())
            }
        }
        "uuid" => typed(Value::String(text.to_string()), "UUID"),
        "json" | "jsonb" => match serde_json::from_str(text) {
            Ok(v) => typed(v, "JSON"),
            Err(_) => Value::String(text.to_string()),
        },
        "date" if text.len() == 10 => typed(Value::String(text.to_string()), "DATE"),
        "timestamp" => typed(Value::String(text.replacen(' ', "T", 1)), "TIMESTAMP"),
        "timestamptz" => match chrono::DateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S%.f%#z") {
            Ok(t) => typed(Value::String(t.to_rfc3339()), "TIMESTAMPTZ"),
            Err(_) => Value::String(text.to_string()),
        },
        "time" => typed(Value::String(text.to_string()), "TIME"),
        "bytea" => typed(Value::String(text.to_string()), "BLOB"),
        _ => plain(info, text),
    }
}

/// The list item type of a one-dimensional array of booleans, integers, floats, text, enums or
/// UUIDs; other arrays are kept as JSON.
pub(crate) fn array_item(info: &TypeInfo) -> Option<Scalar> {
    let element = info.element.as_ref()?;
    if element.category == 'E' {
        return Some(Scalar::Varchar);
    }
    Some(match element.name.as_str() {
        "bool" => Scalar::Boolean,
        "int2" | "int4" | "int8" | "oid" => Scalar::Bigint,
        "float4" | "float8" => Scalar::Double,
        "text" | "varchar" | "bpchar" | "name" | "citext" | "uuid" => Scalar::Varchar,
        _ => return None,
    })
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
