//! Field rules applied to each event before it is decoded: rename, drop, declared types; and
//! masks, which the decoder applies per column and the ledger's copies of events take too.

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

/// The field rules of a stream, ready to apply. Every rule acts on the column a field becomes,
/// whatever spelling brings it: nested (`user.password`), flattened (`user__password`), in any
/// letter case, or below a parent the rule names.
#[derive(Debug, Clone, Default)]
pub struct Mapping {
    /// Masks by the column they are written to (lower case), and by the field's own path
    /// flattened (lower case), for a duplicate's ledger copy.
    masks: Vec<(String, String, Mask, usize)>,
    /// Renames: the field as written, its path flattened (lower case), and the new name.
    renames: Vec<(String, String, String)>,
    /// Drops: the field as written and its path flattened (lower case).
    drops: Vec<(String, String)>,
    /// Declared types by output column, lower case.
    types: HashMap<String, ColumnType>,
}

/// Whether column `column` (a flattened path, any letter case) is the column `rule` (flattened,
/// lower case) names, or one below it (`rule__…`).
fn covers(rule: &str, column: &str) -> bool {
    column.len() >= rule.len()
        && column.get(..rule.len()).is_some_and(|head| head.eq_ignore_ascii_case(rule))
        && (column.len() == rule.len() || column[rule.len()..].starts_with(crate::decode::SEPARATOR))
}

/// Whether a rule for `rule` may name something below the object at `path`.
fn reaches(rule: &str, path: &str) -> bool {
    rule.len() > path.len() + 1
        && rule.get(..path.len()).is_some_and(|head| head.eq_ignore_ascii_case(path))
        && rule[path.len()..].starts_with(crate::decode::SEPARATOR)
}

fn flat(field: &str) -> String {
    field.replace('.', crate::decode::SEPARATOR).to_ascii_lowercase()
}

impl Mapping {
    /// The field rules of `config` (computed columns are not field rules).
    pub fn new(config: &TransformConfig) -> Self {
        let mut m = Self::default();
        for f in config.fields.iter().filter(|f| f.sql.is_none()) {
            if f.drop {
                m.drops.push((f.field.clone(), flat(&f.field)));
                continue;
            }
            if let Some(mask) = f.mask {
                m.masks.push((f.output().to_ascii_lowercase(), flat(&f.field), mask, f.keep.unwrap_or(4)));
            }
            if let Some(to) = &f.rename {
                m.renames.push((f.field.clone(), flat(&f.field), to.clone()));
            }
            let ty = match (f.mask, f.ty) {
                (Some(_), _) => Some(ColumnType::Varchar),
                (None, ty) => ty.map(|t| t.column()),
            };
            if let Some(ty) = ty {
                m.types.insert(f.output().to_ascii_lowercase(), ty);
            }
        }
        // A mask follows its field wherever a rename takes it: a field below a renamed parent
        // (`user.email` under `user` → `person`) is masked as `person__email` too, and a field
        // renamed out of a masked parent (`user.name` → `username` under a mask on `user`)
        // keeps that mask.
        let mut moved = Vec::new();
        for (c, field, mask, keep) in &m.masks {
            if let Some(to) = m.renamed(field).map(|t| t.to_ascii_lowercase()).filter(|to| to != c) {
                moved.push((to, field.clone(), *mask, *keep));
            }
        }
        for (_, flat, to) in &m.renames {
            if let Some((_, _, mask, keep)) =
                m.masks.iter().find(|(c, field, ..)| covers(c, flat) || covers(field, flat))
            {
                moved.push((to.to_ascii_lowercase(), flat.clone(), *mask, *keep));
            }
        }
        m.masks.extend(moved);
        m
    }

    /// Whether there are no field rules.
    pub fn is_empty(&self) -> bool {
        self.masks.is_empty() && self.renames.is_empty() && self.drops.is_empty() && self.types.is_empty()
    }

    /// Whether any field is masked or dropped: then no raw text of an event that cannot be read
    /// goes to the ledger (the rules could not act on it).
    pub fn hides(&self) -> bool {
        !self.masks.is_empty() || !self.drops.is_empty()
    }

    /// The mask of `column` (as written: flattened, renamed; any letter case), if it or a
    /// parent of it has one. The decoder masks every value bound for such a column, whatever
    /// field name brought it (`EMAIL`, a flattened `user__email`), so no spelling of a field
    /// gets past its mask.
    pub fn mask_for(&self, column: &str) -> Option<(Mask, usize)> {
        self.masks.iter().find(|(c, _, _, _)| covers(c, column)).map(|(_, _, m, k)| (*m, *k))
    }

    /// Whether column `column` (a flattened path as it comes, any letter case) is dropped.
    fn dropped(&self, column: &str) -> bool {
        self.drops.iter().any(|(field, flat)| covers(flat, column) || field.eq_ignore_ascii_case(column))
    }

    /// The name column `column` is renamed to: `to`, or `to__rest` below a renamed parent. The
    /// most specific rule wins (`user.name` over `user`), whatever their order.
    fn renamed(&self, column: &str) -> Option<String> {
        if let Some((_, _, to)) = self.renames.iter().find(|(field, ..)| field.eq_ignore_ascii_case(column)) {
            return Some(to.clone());
        }
        let (_, flat, to) =
            self.renames.iter().filter(|(_, flat, _)| covers(flat, column)).max_by_key(|r| r.1.len())?;
        Some(format!("{to}{}", &column[flat.len()..]))
    }

    /// The type a new column gets, when a rule sets one.
    pub fn declared(&self, column: &str) -> Option<ColumnType> {
        if self.types.is_empty() {
            return None;
        }
        self.types.get(column).or_else(|| self.types.get(&column.to_ascii_lowercase())).copied()
    }

    /// Rename and drop one event's fields by the column each would become: nested, flattened or
    /// in any letter case. A renamed field moves to the top level under its new name. Masks are
    /// applied by the decoder, per column ([`Mapping::mask_for`]).
    pub fn apply(&self, map: &mut Map<String, Value>) {
        if self.renames.is_empty() && self.drops.is_empty() {
            return;
        }
        let mut moved = Vec::new();
        self.visit(map, &mut String::new(), &mut moved);
        for (to, value) in moved {
            if !self.dropped(&to) {
                map.insert(to, value);
            }
        }
    }

    fn visit(&self, map: &mut Map<String, Value>, path: &mut String, moved: &mut Vec<(String, Value)>) {
        map.retain(|key, value| {
            let mark = path.len();
            if mark > 0 {
                path.push_str(crate::decode::SEPARATOR);
            }
            path.push_str(key);
            let keep = if self.dropped(path) {
                false
            } else if let Some(to) = self.renamed(path) {
                // A renamed object's own fields meet their rules first (a drop or a more
                // specific rename below it).
                if let Value::Object(inner) = value
                    && self.reaches_below(path)
                {
                    let mut inner_moved = Vec::new();
                    self.visit(inner, path, &mut inner_moved);
                    moved.extend(inner_moved);
                    // Its fields all moved out (each under the renamed path): nothing is left.
                    if inner.is_empty() {
                        path.truncate(mark);
                        return false;
                    }
                }
                moved.push((to, std::mem::take(value)));
                false
            } else {
                if let Value::Object(inner) = value
                    && self.reaches_below(path)
                {
                    let before = inner.len();
                    self.visit(inner, path, moved);
                    // An object the rules emptied leaves nothing, not an empty JSON column.
                    if inner.is_empty() && before > 0 {
                        path.truncate(mark);
                        return false;
                    }
                }
                true
            };
            path.truncate(mark);
            keep
        });
    }

    /// Whether a drop or rename may name a field below the object at `path`.
    fn reaches_below(&self, path: &str) -> bool {
        self.drops.iter().any(|(_, flat)| reaches(flat, path))
            || self.renames.iter().any(|(_, flat, _)| reaches(flat, path))
    }

    /// A copy of `map` for the ledger, after [`Mapping::apply`]: every value bound for a masked
    /// column masked, at any depth.
    pub fn hidden(&self, map: &Map<String, Value>) -> Map<String, Value> {
        let mut copy = map.clone();
        if !self.masks.is_empty() {
            self.mask_in(&mut copy, &mut String::new());
        }
        copy
    }

    fn mask_in(&self, map: &mut Map<String, Value>, path: &mut String) {
        for (key, value) in map.iter_mut() {
            let mark = path.len();
            if mark > 0 {
                path.push_str(crate::decode::SEPARATOR);
            }
            path.push_str(key);
            match self.mask_for(path) {
                Some((mask, keep)) => *value = masked(value, mask, keep),
                None => {
                    if let Value::Object(inner) = value {
                        self.mask_in(inner, path);
                    }
                }
            }
            path.truncate(mark);
        }
    }

    /// A change's JSON for the ledger, its images masked as [`Mapping::hidden`] masks events.
    pub fn hidden_change(&self, change: &Change) -> Value {
        let mut change = change.clone();
        change.image = self.hidden(&change.image);
        change.before = change.before.as_ref().map(|b| self.hidden(b));
        change.to_json()
    }

    /// The same rules over a change's images, keys and declared types.
    pub fn change(&self, mut change: Change) -> Change {
        self.apply(&mut change.image);
        if let Some(before) = change.before.as_mut() {
            self.apply(before);
        }
        for key in &mut change.keys {
            if let Some(to) = self.renamed(key) {
                *key = to;
            }
        }
        change.unavailable.retain(|c| !self.dropped(c));
        for column in &mut change.unavailable {
            if let Some(to) = self.renamed(column) {
                *column = to;
            }
        }
        change.unconverted.retain(|u| !self.dropped(&u.column));
        for u in &mut change.unconverted {
            if let Some(to) = self.renamed(&u.column) {
                u.column = to;
            }
        }
        let types = change
            .types
            .iter()
            .filter(|(name, _)| !self.dropped(name))
            .map(|(name, ty)| {
                let name = self.renamed(name).unwrap_or_else(|| name.clone());
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
        if self.dropped(name) {
            return None;
        }
        let out = self.renamed(name).unwrap_or_else(|| name.to_string());
        let mask = self.mask_for(&out);
        let ty = self.declared(&out).unwrap_or(ty);
        Some((out, ty, mask))
    }

    /// A ledger copy of `value`, the earlier value of duplicated field `column`; `None` when
    /// the field is dropped.
    pub fn ledger_value(&self, column: &str, value: &Value) -> Option<String> {
        let flat = column.replace('.', crate::decode::SEPARATOR);
        let found = self.masks.iter().find(|(out, field, _, _)| covers(out, &flat) || covers(field, &flat));
        if let Some((_, _, mask, keep)) = found {
            return Some(masked(value, *mask, *keep).to_string());
        }
        let mut one = Map::new();
        one.insert(flat, value.clone());
        self.apply(&mut one);
        self.hidden(&one).into_iter().next().map(|(_, v)| v.to_string())
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
        assert!(shouting.is_empty(), "a drop matches in any letter case, and the emptied object goes: {shouting:?}");
        assert_eq!(event["amount_usd"], json!(3));
        assert!(event.get("amount").is_none() && event.get("pan").is_none());
        assert_eq!(m.declared("AMOUNT_USD"), Some(ColumnType::Double));
        assert_eq!(m.declared("user__email"), Some(ColumnType::Varchar));
        assert!(
            m.mask_for("user__email").is_some() && m.mask_for("card").is_some() && m.mask_for("amount_usd").is_none()
        );
        assert!(!m.ledger_value("ssn", &json!("123-45")).unwrap().contains("123"));
        assert!(!m.ledger_value("user.email", &json!("a@b.c")).unwrap().contains("a@b"), "a nested duplicate too");
    }

    #[test]
    fn drops_renames_and_masks_take_every_spelling_of_a_column() {
        let config = TransformConfig {
            fields: vec![
                FieldRule { drop: true, ..rule("user.password") },
                FieldRule { rename: Some("username".into()), ..rule("user.name") },
                FieldRule { mask: Some(Mask::Redact), ..rule("email") },
            ],
            ..TransformConfig::default()
        };
        let m = Mapping::new(&config);
        let mut event = json!({"user__password": "a", "USER__PASSWORD": "b", "User": {"PassWord": "c", "id": 1},
                               "user": {"password": {"old": "d"}}, "user__password__old": "e",
                               "user__name": "ann", "kind": "x"})
        .as_object()
        .cloned()
        .unwrap();
        m.apply(&mut event);
        assert_eq!(
            Value::Object(event.clone()),
            json!({"User": {"id": 1}, "kind": "x", "username": "ann"}),
            "every spelling of the dropped column is gone (an object it emptied too), the rest keeps its order"
        );
        let hidden = m.hidden(&json!({"EMAIL": "a@b.c", "x": {"email": "kept"}}).as_object().cloned().unwrap());
        assert_eq!(Value::Object(hidden), json!({"EMAIL": REDACTED, "x": {"email": "kept"}}));
        assert_eq!(m.ledger_value("user.password", &json!("p")), None, "a dropped duplicate leaves nothing");
        assert_eq!(m.ledger_value("User__PassWord", &json!("p")), None);
        assert_eq!(m.ledger_value("user", &json!({"password": "p", "id": 2})), Some(r#"{"id":2}"#.into()));
        assert_eq!(m.column("USER__PASSWORD", ColumnType::Varchar), None);
        assert!(m.hides());
    }

    #[test]
    fn rules_below_a_renamed_or_masked_parent_still_hold() {
        let config = TransformConfig {
            fields: vec![
                FieldRule { rename: Some("person".into()), ..rule("user") },
                FieldRule { mask: Some(Mask::Redact), ..rule("user.email") },
                FieldRule { drop: true, ..rule("user.password") },
                FieldRule { rename: Some("nick".into()), ..rule("user.name") },
                FieldRule { mask: Some(Mask::Redact), ..rule("Émail") },
                FieldRule { drop: true, ..rule("Ünit.x") },
            ],
            ..TransformConfig::default()
        };
        let m = Mapping::new(&config);
        for spelling in [
            json!({"user": {"email": "a", "password": "p", "name": "n", "id": 1}}),
            json!({"user__email": "a", "user__password": "p", "USER__NAME": "n", "user__id": 1}),
        ] {
            let mut event = spelling.as_object().cloned().unwrap();
            m.apply(&mut event);
            let event = Value::Object(event);
            assert!(!event.to_string().contains("\"p\""), "dropped below a renamed parent: {event}");
            assert!(event.get("nick") == Some(&json!("n")), "the more specific rename wins: {event}");
            let email = event.get("person").and_then(|p| p.get("email")).or_else(|| event.get("person__email"));
            assert_eq!(email, Some(&json!("a")), "{event}");
            assert!(event.get("person").is_none_or(|p| p.as_object().is_some_and(|p| !p.is_empty())), "{event}");
        }
        assert!(m.mask_for("person__email").is_some(), "a mask follows its field through a parent's rename");
        assert!(m.mask_for("Émail").is_some(), "a name with a capital beyond ASCII is masked as written");
        let mut unit = json!({"Ünit": {"x": 1, "y": 2}, "Ünit__x": 3}).as_object().cloned().unwrap();
        m.apply(&mut unit);
        assert_eq!(Value::Object(unit), json!({"Ünit": {"y": 2}}));
        let masked_parent = TransformConfig {
            fields: vec![
                FieldRule { mask: Some(Mask::Hash), ..rule("user") },
                FieldRule { rename: Some("username".into()), ..rule("user.name") },
            ],
            ..TransformConfig::default()
        };
        let m = Mapping::new(&masked_parent);
        assert!(m.mask_for("username").is_some(), "renamed out of a masked parent, still masked");
    }
}
