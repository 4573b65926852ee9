//! Field rules applied to each event before it is decoded: mask, rename, drop, declared types.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use super::config::{Mask, TransformConfig};
use crate::format::change::Change;
use crate::schema::ColumnType;

/// What a redacted value becomes.
pub const REDACTED: &str = "[redacted]";

/// What a flat column becomes: its name and type as written, and the mask its text takes.
pub type ColumnPlan = (String, ColumnType, Option<(Mask, usize)>);

/// The field rules of a stream, ready to apply.
#[derive(Debug, Clone, Default)]
pub struct Mapping {
    masks: Vec<(String, Mask, usize)>,
    renames: Vec<(String, String)>,
    drops: Vec<String>,
    /// Declared types by output column, lower case.
    types: HashMap<String, ColumnType>,
    /// Masked columns as written (flattened, renamed), lower case.
    masked_columns: Vec<String>,
}

impl Mapping {
    /// The field rules of `config` (computed columns are not field rules).
    pub fn new(config: &TransformConfig) -> Self {
        let mut m = Self::default();
        for f in config.fields.iter().filter(|f| f.sql.is_none()) {
            if f.drop {
                m.drops.push(f.field.clone());
                continue;
            }
            if let Some(mask) = f.mask {
                m.masks.push((f.field.clone(), mask, f.keep.unwrap_or(4)));
                m.masked_columns.push(f.output().to_lowercase());
            }
            if let Some(to) = &f.rename {
                m.renames.push((f.field.clone(), to.clone()));
            }
            let ty = match (f.mask, f.ty) {
                (Some(_), _) => Some(ColumnType::Varchar),
                (None, ty) => ty.map(|t| t.column()),
            };
            if let Some(ty) = ty {
                m.types.insert(f.output().to_lowercase(), ty);
            }
        }
        m
    }

    /// Whether there are no field rules.
    pub fn is_empty(&self) -> bool {
        self.masks.is_empty() && self.renames.is_empty() && self.drops.is_empty() && self.types.is_empty()
    }

    /// Whether any field is masked: then no raw text of an event goes to the ledger.
    pub fn masks(&self) -> bool {
        !self.masks.is_empty()
    }

    /// Whether `column` (as written) holds a masked value.
    pub fn is_masked(&self, column: &str) -> bool {
        self.masked_columns.iter().any(|c| c.eq_ignore_ascii_case(column))
    }

    /// The type a new column gets, when a rule sets one.
    pub fn declared(&self, column: &str) -> Option<ColumnType> {
        if self.types.is_empty() {
            return None;
        }
        self.types.get(column).or_else(|| self.types.get(&column.to_lowercase())).copied()
    }

    /// Mask, rename and drop one event's fields, in that order.
    pub fn apply(&self, map: &mut Map<String, Value>) {
        for (field, mask, keep) in &self.masks {
            if let Some(value) = lookup_mut(map, field) {
                *value = masked(value, *mask, *keep);
            }
        }
        for (field, to) in &self.renames {
            if let Some(value) = take(map, field) {
                map.insert(to.clone(), value);
            }
        }
        for field in &self.drops {
            take(map, field);
        }
    }

    /// The same rules over a change's images, keys and declared types.
    pub fn change(&self, mut change: Change) -> Change {
        self.apply(&mut change.image);
        if let Some(before) = change.before.as_mut() {
            self.apply(before);
        }
        let renamed = |name: &str| self.renames.iter().find(|(from, _)| from == name).map(|(_, to)| to.clone());
        for key in &mut change.keys {
            if let Some(to) = renamed(key) {
                *key = to;
            }
        }
        for column in &mut change.unavailable {
            if let Some(to) = renamed(column) {
                *column = to;
            }
        }
        change.unconverted.retain(|u| !self.drops.contains(&u.column));
        for u in &mut change.unconverted {
            if let Some(to) = renamed(&u.column) {
                u.column = to;
            }
        }
        let types = change
            .types
            .iter()
            .filter(|(name, _)| !self.drops.contains(name))
            .map(|(name, ty)| {
                let name = renamed(name).unwrap_or_else(|| name.clone());
                let ty = self.declared(&name).unwrap_or(*ty);
                (name, ty)
            })
            .collect();
        change.types = Arc::new(types);
        change
    }

    /// What becomes of a flat column `name` of type `ty` (a snapshot's `COPY` column): `None`
    /// when it is dropped, else its name and type as written and the mask its text takes.
    pub fn column(&self, name: &str, ty: ColumnType) -> Option<ColumnPlan> {
        if self.drops.iter().any(|d| d == name) {
            return None;
        }
        let out =
            self.renames.iter().find(|(from, _)| from == name).map_or_else(|| name.to_string(), |(_, to)| to.clone());
        let mask = self.masks.iter().find(|(field, _, _)| field == name).map(|(_, m, keep)| (*m, *keep));
        let ty = self.declared(&out).unwrap_or(ty);
        Some((out, ty, mask))
    }

    /// A ledger copy of `value`, the earlier value of duplicated field `column`.
    pub fn ledger_value(&self, column: &str, value: &Value) -> String {
        match self.masks.iter().find(|(field, _, _)| field.eq_ignore_ascii_case(column)) {
            Some((_, mask, keep)) => masked(value, *mask, *keep).to_string(),
            None => value.to_string(),
        }
    }
}

/// The text a mask leaves of `text`.
pub fn mask_text(text: &str, mask: Mask, keep: usize) -> String {
    match masked(&Value::String(text.to_string()), mask, keep) {
        Value::String(s) => s,
        _ => String::new(),
    }
}

/// The value a mask leaves: text, or NULL for NULL.
fn masked(value: &Value, mask: Mask, keep: usize) -> Value {
    let text = match value {
        Value::Null => return Value::Null,
        Value::String(s) => std::borrow::Cow::Borrowed(s.as_str()),
        other => std::borrow::Cow::Owned(other.to_string()),
    };
    Value::String(match mask {
        Mask::Hash => {
            let digest = Sha256::digest(text.as_bytes());
            let mut hex = String::with_capacity(64);
            for byte in digest {
                hex.push(char::from(b"0123456789abcdef"[usize::from(byte >> 4)]));
                hex.push(char::from(b"0123456789abcdef"[usize::from(byte & 15)]));
            }
            hex
        }
        Mask::Redact => REDACTED.to_string(),
        Mask::Truncate => text.chars().take(keep).collect(),
    })
}

/// The value at `path`: a top-level field of that exact name, else `a.b` into nested objects.
pub fn lookup<'a>(map: &'a Map<String, Value>, path: &str) -> Option<&'a Value> {
    if let Some(v) = map.get(path) {
        return Some(v);
    }
    let (head, rest) = path.split_once('.')?;
    match map.get(head)? {
        Value::Object(inner) => lookup(inner, rest),
        _ => None,
    }
}

fn lookup_mut<'a>(map: &'a mut Map<String, Value>, path: &str) -> Option<&'a mut Value> {
    if map.contains_key(path) {
        return map.get_mut(path);
    }
    let (head, rest) = path.split_once('.')?;
    match map.get_mut(head)? {
        Value::Object(inner) => lookup_mut(inner, rest),
        _ => None,
    }
}

fn take(map: &mut Map<String, Value>, path: &str) -> Option<Value> {
    if let Some(v) = map.remove(path) {
        return Some(v);
    }
    let (head, rest) = path.split_once('.')?;
    match map.get_mut(head)? {
        Value::Object(inner) => take(inner, rest),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transform::config::{FieldRule, FieldType};
    use serde_json::json;

    fn rule(field: &str) -> FieldRule {
        FieldRule { field: field.into(), ..FieldRule::default() }
    }

    #[test]
    fn masks_renames_and_drops_nested_fields() {
        let config = TransformConfig {
            fields: vec![
                FieldRule { mask: Some(Mask::Hash), ..rule("user.email") },
                FieldRule { mask: Some(Mask::Truncate), keep: Some(2), rename: Some("card".into()), ..rule("pan") },
                FieldRule { mask: Some(Mask::Redact), ..rule("ssn") },
                FieldRule { drop: true, ..rule("user.password") },
                FieldRule { rename: Some("amount_usd".into()), ty: Some(FieldType::Double), ..rule("amount") },
            ],
            ..TransformConfig::default()
        };
        let m = Mapping::new(&config);
        let mut event = json!({"user": {"email": "a@b.c", "password": "p"}, "pan": 4111, "ssn": null, "amount": 3})
            .as_object()
            .cloned()
            .unwrap();
        m.apply(&mut event);
        let hash = event["user"]["email"].as_str().unwrap();
        assert_eq!(hash.len(), 64);
        assert_ne!(hash, "a@b.c");
        assert_eq!(event["user"].as_object().unwrap().len(), 1, "password dropped");
        assert_eq!(event["card"], json!("41"));
        assert_eq!(event["ssn"], Value::Null, "NULL stays NULL");
        assert_eq!(event["amount_usd"], json!(3));
        assert!(event.get("amount").is_none() && event.get("pan").is_none());
        assert_eq!(m.declared("AMOUNT_USD"), Some(ColumnType::Double));
        assert_eq!(m.declared("user__email"), Some(ColumnType::Varchar));
        assert!(m.is_masked("user__email") && m.is_masked("card") && !m.is_masked("amount_usd"));
        assert!(!m.ledger_value("ssn", &json!("123-45")).contains("123"));
    }
}
