//! Secrets: deserialized from config, never serialized back, never printed.

use std::fmt;

use serde::{Deserialize, Deserializer};

/// What the API shows in place of a secret that sits inside an otherwise visible value (a
/// librdkafka property, the password of a URL). Sent back unchanged, it keeps the stored secret.
pub const REDACTED: &str = "***";

/// A secret string. It implements `Deserialize` but not `Serialize`, so a config that holds one
/// cannot be written out by accident; `Debug` and `Display` print a placeholder.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wrap a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret itself, for the one place that must use it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// A string the API takes and never gives back: forms show it as a password field.
impl schemars::JsonSchema for Secret {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Secret".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({ "type": "string", "format": "password", "writeOnly": true })
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(Secret)
    }
}

/// Put `secret` (if any) into `out` at `path`: the secrets a config keeps apart, by field path.
pub fn keep(out: &mut std::collections::BTreeMap<String, String>, path: &str, secret: Option<&Secret>) {
    if let Some(s) = secret {
        out.insert(path.to_string(), s.expose().to_string());
    }
}

/// Put back into `slot` the secret `secrets` keeps at `path`, when `slot` has none (a config
/// read from storage, or sent without it).
pub fn restore(slot: &mut Option<Secret>, secrets: &std::collections::BTreeMap<String, String>, path: &str) {
    if slot.is_none()
        && let Some(s) = secrets.get(path)
    {
        *slot = Some(Secret::new(s.clone()));
    }
}
