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
    /// Masks by the column they are written to (lower case), and by the field's own path
    /// flattened (lower case), for a duplicate's ledger copy.
    masks: Vec<(String, String, Mask, usize)>,
    renames: Vec<(String, String)>,
    drops: Vec<String>,
    /// Declared types by output column, lower case.
    types: HashMap<String, ColumnType>,
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
                let field = f.field.replace('.', crate::decode::SEPARATOR).to_lowercase();
                m.masks.push((f.output().to_lowercase(), field, mask, f.keep.unwrap_or(4)));
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

    /// The mask of `column` (as written: flattened, renamed; any letter case), if it has one.
    /// The decoder masks every value bound for such a column, whatever field name brought it
    /// (`EMAIL`, a flattened `user__email`), so no spelling of a field gets past its mask.
    pub fn mask_for(&self, column: &str) -> Option<(Mask, usize)> {
        self.masks.iter().find(|(c, _, _, _)| c.eq_ignore_ascii_case(column)).map(|(_, _, m, k)| (*m, *k))
    }

    /// The type a new column gets, when a rule sets one.
    pub fn declared(&self, column: &str) -> Option<ColumnType> {
        if self.types.is_empty() {
            return None;
        }
        self.types.get(column).or_else(|| self.types.get(&column.to_lowercase())).copied()
    }

    /// Rename and drop one event's fields (field names match in any letter case). Masks are
    /// applied by the decoder, per column ([`Mapping::mask_for`]).
    pub fn apply(&self, map: &mut Map<String, Value>) {
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
        let mask = self.mask_for(&out);
        let ty = self.declared(&out).unwrap_or(ty);
        Some((out, ty, mask))
    }

    /// A ledger copy of `value`, the earlier value of duplicated field `column`.
    pub fn ledger_value(&self, column: &str, value: &Value) -> String {
        let flat = column.replace('.', crate::decode::SEPARATOR);
        let found = self
            .masks
            .iter()
            .find(|(out, field, _, _)| out.eq_ignore_ascii_case(&flat) || field.eq_ignore_ascii_case(&flat));
        match found {
            Some((_, _, mask, keep)) => masked(value, *mask, *keep).to_string(),
            None => value.to_string(),
        }
    }
}

/// The text a mask leaves of `text`.
pub fn mask_text(text: &str, mask: Mask, keep: usize) -> String {
    match mask {
        Mask::Hash => format!("{:x}", Sha256::digest(text.as_bytes())),
        Mask::Redact => REDACTED.to_string(),
        Mask::Truncate => text.chars().take(keep).collect(),
    }
}

/// The value a mask leaves: text, or NULL for NULL.
pub fn masked(value: &Value, mask: Mask, keep: usize) -> Value {
    match value {
        Value::Null => Value::Null,
        Value::String(s) => Value::String(mask_text(s, mask, keep)),
        other => Value::String(mask_text(&other.to_string(), mask, keep)),
    }
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

/// The key of `map` that is `name` in any letter case (the exact spelling first).
fn key_of(map: &Map<String, Value>, name: &str) -> Option<String> {
    if map.contains_key(name) {
        return Some(name.to_string());
    }
    map.keys().find(|k| k.eq_ignore_ascii_case(name)).cloned()
}

/// Remove the value at `path` (every spelling of it in any letter case, as the columns
/// would merge them), and return the last one removed.
fn take(map: &mut Map<String, Value>, path: &str) -> Option<Value> {
    let mut found = None;
    while let Some(key) = key_of(map, path) {
        found = map.remove(&key);
    }
    if found.is_some() {
        return found;
    }
    let (head, rest) = path.split_once('.')?;
    let key = key_of(map, head)?;
    match map.get_mut(&key)? {
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
        assert_eq!(event["user"].as_object().unwrap().len(), 1, "password dropped");
        assert_eq!(event["card"], json!(4111), "renamed; the decoder masks it in its column");
        let (mask, keep) = m.mask_for("CARD").unwrap();
        assert_eq!(masked(&event["card"], mask, keep), json!("41"));
        let (mask, keep) = m.mask_for("user__email").unwrap();
        let hash = masked(&json!("a@b.c"), mask, keep);
        assert_eq!(hash.as_str().unwrap().len(), 64);
        assert_eq!(masked(&Value::Null, Mask::Hash, 4), Value::Null, "NULL stays NULL");
        let mut shouting = json!({"USER": {"Password": "p"}}).as_object().cloned().unwrap();
        m.apply(&mut shouting);
        assert_eq!(shouting["USER"], json!({}), "a drop matches in any letter case");
        assert_eq!(event["amount_usd"], json!(3));
        assert!(event.get("amount").is_none() && event.get("pan").is_none());
        assert_eq!(m.declared("AMOUNT_USD"), Some(ColumnType::Double));
        assert_eq!(m.declared("user__email"), Some(ColumnType::Varchar));
        assert!(
            m.mask_for("user__email").is_some() && m.mask_for("card").is_some() && m.mask_for("amount_usd").is_none()
        );
        assert!(!m.ledger_value("ssn", &json!("123-45")).contains("123"));
        assert!(!m.ledger_value("user.email", &json!("a@b.c")).contains("a@b"), "a nested duplicate too");
    }
}
