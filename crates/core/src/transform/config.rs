//! A stream's `transform` section: the same type in the YAML, the API and the page's forms.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::schema::ColumnType;

/// What happens to events between the source and the table.
///
/// Field rules (drop, rename, mask, type) act on each event before it is decoded, so a masked
/// value never reaches a table, the rejects ledger or the live feed. SQL expressions (`filter`,
/// `validate`, a computed field's `sql`) are DuckDB SQL, evaluated over each micro-batch's
/// columns as they will be written (renamed and masked).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TransformConfig {
    /// Per field: drop it, rename it, mask it, set its type, or compute it with `sql`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<FieldRule>,
    /// Keep only events for which this SQL expression is true (NULL counts as false). Skipped
    /// events still move the position and are counted as `filtered`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<String>,
    /// Rules every event must meet; an event for which a rule is not true (false or NULL)
    /// goes to the rejects ledger with the rule's name as the reason.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub validate: Vec<Rule>,
    /// The table each event goes to, instead of the stream's `table`: `{field}` is the
    /// event's value of that field (letters, digits, `_` and `-`, up to 64), `*` the record's
    /// route as in `table`. An event without a usable value goes to the ledger.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route: Option<String>,
    /// A DuckDB SELECT over each batch's events as the table `event`, run after the field
    /// rules and before `filter`, `validate` and computed fields: what it returns is what is
    /// written, so it can modify events (any expression as a column), skip them (`WHERE`) or
    /// add columns. One row in gives at most one row out (no joins or aggregates over events).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub script: Option<String>,
}

/// What happens to one field.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FieldRule {
    /// The event's field (`user.email` for a nested one), or the name of the column `sql`
    /// computes.
    pub field: String,
    /// Leave the field out.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub drop: bool,
    /// The column name to write it under.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rename: Option<String>,
    /// Hide the value before anything is written: `hash` (SHA-256, hex), `redact` or
    /// `truncate` (to `keep` characters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mask: Option<Mask>,
    /// With `mask: truncate`: how many characters stay (default 4).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep: Option<usize>,
    /// The column's type when the table gets it (a value that does not fit goes to the ledger).
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub ty: Option<FieldType>,
    /// Compute this column with a DuckDB SQL expression over the event's columns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sql: Option<String>,
}

/// How a masked value is hidden.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Mask {
    /// SHA-256 of the value's text, as 64 hex digits: the same value gives the same hash, so
    /// joins still work. A value of few possibilities (a birth year) can be guessed back from
    /// it; redact those.
    Hash,
    /// Replaced by `[redacted]`.
    Redact,
    /// Only the first `keep` characters stay.
    Truncate,
}

/// A named validation rule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// Named in the ledger's reason.
    pub name: String,
    /// A DuckDB SQL expression that must be true.
    pub sql: String,
}

/// The types a field can be given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum FieldType {
    /// true / false.
    Boolean,
    /// 64-bit integer.
    Bigint,
    /// 64-bit float.
    Double,
    /// Text.
    Varchar,
    /// An instant, stored as UTC.
    Timestamptz,
    /// A calendar date.
    Date,
    /// JSON text.
    Json,
}

impl FieldType {
    /// The column type.
    pub fn column(self) -> ColumnType {
        match self {
            Self::Boolean => ColumnType::Boolean,
            Self::Bigint => ColumnType::Bigint,
            Self::Double => ColumnType::Double,
            Self::Varchar => ColumnType::Varchar,
            Self::Timestamptz => ColumnType::Timestamptz,
            Self::Date => ColumnType::Date,
            Self::Json => ColumnType::Json,
        }
    }
}

/// Most characters an expression may have.
const MAX_SQL: usize = 4096;

impl TransformConfig {
    /// Whether anything is configured.
    pub fn is_empty(&self) -> bool {
        self.fields.is_empty()
            && self.filter.is_none()
            && self.validate.is_empty()
            && self.route.is_none()
            && self.script.is_none()
    }

    /// Whether a part that works on whole rows (filter, validation, computed columns, routes)
    /// is configured: those need append mode.
    pub fn has_row_rules(&self) -> bool {
        self.filter.is_some()
            || self.script.is_some()
            || !self.validate.is_empty()
            || self.route.is_some()
            || self.fields.iter().any(|f| f.sql.is_some())
    }

    /// Every SQL expression with the field that holds it, for the parser's check.
    pub fn expressions(&self) -> Vec<(String, &str)> {
        let mut out = Vec::new();
        for (i, f) in self.fields.iter().enumerate() {
            if let Some(sql) = &f.sql {
                out.push((format!("transform.fields[{i}].sql"), sql.as_str()));
            }
        }
        if let Some(filter) = &self.filter {
            out.push(("transform.filter".to_string(), filter.as_str()));
        }
        for (i, r) in self.validate.iter().enumerate() {
            out.push((format!("transform.validate[{i}].sql"), r.sql.as_str()));
        }
        out
    }

    /// Check the structure; pure. Expressions are parsed by the connector that evaluates them.
    pub fn validate(&self) -> Result<()> {
        let mut outputs: Vec<String> = Vec::new();
        for (i, f) in self.fields.iter().enumerate() {
            let at = |part: &str| format!("transform.fields[{i}]{part}");
            let field = f.field.trim();
            if field.is_empty() || field.len() > 255 || field.contains('\0') || field.split('.').any(str::is_empty) {
                return Err(Error::config(
                    &at(".field"),
                    "must name a field: 1-255 characters, `a.b` for a nested one",
                ));
            }
            if f.drop && (f.rename.is_some() || f.mask.is_some() || f.ty.is_some() || f.sql.is_some()) {
                return Err(Error::config(&at(".drop"), "a dropped field takes no other rule"));
            }
            if f.sql.is_some() && (f.rename.is_some() || f.mask.is_some()) {
                return Err(Error::config(
                    &at(".sql"),
                    "a computed column is named by `field`; it takes no rename or mask",
                ));
            }
            if f.sql.is_some() && field.contains('.') {
                return Err(Error::config(&at(".field"), "a computed column's name cannot contain `.`"));
            }
            if let Some(name) = &f.rename
                && (name.trim().is_empty() || name.len() > 255 || name.contains('\0') || name.starts_with("__"))
            {
                return Err(Error::config(
                    &at(".rename"),
                    "must be 1-255 characters without NUL, not starting with `__`",
                ));
            }
            if f.keep.is_some() && f.mask != Some(Mask::Truncate) {
                return Err(Error::config(&at(".keep"), "only goes with `mask: truncate`"));
            }
            if f.keep == Some(0) {
                return Err(Error::config(&at(".keep"), "must be at least 1 (use `mask: redact` to hide all)"));
            }
            if let Some(sql) = &f.sql
                && (sql.trim().is_empty() || sql.len() > MAX_SQL)
            {
                return Err(Error::config(&at(".sql"), format!("must be an expression of 1-{MAX_SQL} characters")));
            }
            if !f.drop {
                let output = f.output();
                if outputs.iter().any(|o| o.eq_ignore_ascii_case(&output)) {
                    return Err(Error::config(&at(""), format!("a second rule writes column `{output}`")));
                }
                outputs.push(output);
            }
        }
        if let Some(filter) = &self.filter
            && (filter.trim().is_empty() || filter.len() > MAX_SQL)
        {
            return Err(Error::config("transform.filter", format!("must be an expression of 1-{MAX_SQL} characters")));
        }
        for (i, r) in self.validate.iter().enumerate() {
            if r.name.trim().is_empty() || r.name.len() > 64 {
                return Err(Error::config(&format!("transform.validate[{i}].name"), "must be 1-64 characters"));
            }
            if r.sql.trim().is_empty() || r.sql.len() > MAX_SQL {
                let problem = format!("must be an expression of 1-{MAX_SQL} characters");
                return Err(Error::config(&format!("transform.validate[{i}].sql"), problem));
            }
        }
        if let Some(script) = &self.script
            && (script.trim().is_empty() || script.len() > 4 * MAX_SQL)
        {
            return Err(Error::config("transform.script", format!("must be a SELECT of 1-{} characters", 4 * MAX_SQL)));
        }
        if let Some(route) = &self.route {
            super::route::Route::parse(route).map_err(|e| Error::config("transform.route", e))?;
        }
        Ok(())
    }
}

impl FieldRule {
    /// The column this rule writes: its new name, or the field flattened (`a.b` → `a__b`).
    pub fn output(&self) -> String {
        match &self.rename {
            Some(name) => name.clone(),
            None => self.field.replace('.', crate::decode::SEPARATOR),
        }
    }
}
