//! Mirror mode's configuration: events as changes to keyed rows. A plain JSON event is the
//! latest version of its key; a Debezium event says insert, update, delete or snapshot read.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::batch::Payload;
use crate::error::{Error, Result};
use crate::format::change::Route;

/// How a stream writes its tables.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Every event is a new row.
    #[default]
    Append,
    /// Each key has one row: inserts and updates replace it, deletes remove it.
    Mirror,
}

/// What the payloads are.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    /// JSON objects (or arrays of them).
    #[default]
    Json,
    /// Debezium change events, with or without the `schema`/`payload` wrapper.
    Debezium,
}

/// A stream's mode, keys, history and format.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChangeConfig {
    /// Append or mirror.
    pub mode: Mode,
    /// Key columns; for Debezium they default to the event key's fields.
    pub keys: Vec<String>,
    /// Also append every change to `<table>__changes`.
    pub history: bool,
    /// Payload format.
    pub format: Format,
}

impl ChangeConfig {
    /// Check the combination; pure. Errors name the field.
    pub fn validate(&self) -> Result<()> {
        match (self.mode, self.format) {
            (Mode::Append, Format::Debezium) => {
                return Err(Error::config("mode", "Debezium events need mode: mirror (history keeps every change)"));
            }
            (Mode::Mirror, Format::Json) if self.keys.is_empty() => {
                return Err(Error::config("keys", "mirror mode on a JSON feed needs key columns"));
            }
            (Mode::Append, _) if self.history => {
                return Err(Error::config(
                    "history",
                    "history is for mode: mirror; an append table is its own history",
                ));
            }
            (Mode::Append, _) if !self.keys.is_empty() => {
                return Err(Error::config("keys", "keys are for mode: mirror"));
            }
            _ => {}
        }
        if self.keys.iter().any(|k| k.is_empty()) {
            return Err(Error::config("keys", "key column names must not be empty"));
        }
        Ok(())
    }
}

/// Render a destination template: `*` is the record's route (topic), `[db]`, `[schema]` and
/// `[table]` come from the change.
pub fn render(template: &str, star: Option<&str>, route: &Route) -> std::result::Result<String, String> {
    let mut out = template.to_string();
    for (token, value) in [("[db]", &route.db), ("[schema]", &route.schema), ("[table]", &route.table)] {
        if out.contains(token) {
            let Some(v) = value else {
                return Err(format!("the table template uses {token}, and the event does not name one"));
            };
            out = out.replace(token, v);
        }
    }
    if let Some(star) = star {
        out = out.replace('*', star);
    }
    Ok(out)
}

/// A Debezium event pushed with its message key, as Kafka Connect's JSON converter writes the
/// pair: `{"key": …, "value": …}` (the key as JSON, or as its text; `null` for a table without
/// a primary key, `Some(None)`). Anything else is handed back as it is.
pub(super) fn keyed_pair(format: Format, payload: Payload) -> (Option<Option<String>>, Payload) {
    match payload {
        Payload::Json(Value::Object(mut pair))
            if format == Format::Debezium
                && pair.len() == 2
                && pair.contains_key("key")
                && pair.contains_key("value") =>
        {
            let value = pair.remove("value").unwrap_or(Value::Null);
            let key = match pair.remove("key") {
                Some(Value::String(text)) => Some(text),
                None | Some(Value::Null) => None,
                Some(other) => Some(other.to_string()),
            };
            (Some(key), Payload::Json(value))
        }
        other => (None, other),
    }
}
