//! A stream's file names: a template of `{placeholder}`s, rendered to a relative path that
//! cannot leave the destination's folder. The same file always gets the same name (its
//! `{seq}` and `{uuid}` come from the spool, its `{date}` from when it opened), so a file
//! written again after a crash replaces itself instead of adding a duplicate.

use chrono::{DateTime, Utc};
use sha2::{Digest, Sha256};
use sluice_core::{Error, Result};

/// The default: one folder per table and day.
pub(crate) const DEFAULT_PATH: &str = "{table}/{date}/part-{seq}.{ext}";

const PLACEHOLDERS: [&str; 7] = ["table", "stream", "date", "hour", "seq", "uuid", "ext"];

/// A parsed name template.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Template {
    parts: Vec<Part>,
}

#[derive(Debug, Clone, PartialEq)]
enum Part {
    Text(String),
    Field(&'static str),
}

/// What one file's name is made of.
pub(crate) struct FileName<'a> {
    pub stream: &'a str,
    pub table: &'a str,
    pub seq: u64,
    pub opened: DateTime<Utc>,
    pub ext: &'a str,
}

fn bad(message: impl std::fmt::Display) -> Error {
    Error::config("destination.path", message)
}

impl Template {
    pub(crate) fn parse(text: &str) -> Result<Self> {
        let mut parts = Vec::new();
        let mut rest = text;
        while let Some(open) = rest.find('{') {
            if open > 0 {
                parts.push(Part::Text(rest[..open].to_string()));
            }
            let close = rest[open..].find('}').ok_or_else(|| bad("a '{' without its '}'"))? + open;
            let name = &rest[open + 1..close];
            let field = PLACEHOLDERS.iter().find(|p| **p == name).ok_or_else(|| {
                bad(format!(
                    "unknown placeholder {{{name}}}; use {}",
                    PLACEHOLDERS.map(|p| format!("{{{p}}}")).join(", ")
                ))
            })?;
            parts.push(Part::Field(field));
            rest = &rest[close + 1..];
        }
        if !rest.is_empty() {
            parts.push(Part::Text(rest.to_string()));
        }
        let template = Self { parts };
        if !template.parts.iter().any(|p| matches!(p, Part::Field("seq" | "uuid"))) {
            return Err(bad("needs {seq} or {uuid}, so that every file has its own name"));
        }
        for part in &template.parts {
            if let Part::Text(text) = part
                && (text.contains('}') || text.contains('\\'))
            {
                return Err(bad(format!("'{text}': no '}}' or '\\' outside a placeholder")));
            }
        }
        if text.starts_with('/') {
            return Err(bad("must be relative to the location"));
        }
        // The literal parts alone must not climb out of the folder.
        check_segments(&template.render_with(|_| "x".to_string()))?;
        Ok(template)
    }

    fn render_with(&self, value: impl Fn(&str) -> String) -> String {
        self.parts
            .iter()
            .map(|p| match p {
                Part::Text(text) => text.clone(),
                Part::Field(field) => value(field),
            })
            .collect()
    }

    /// The relative path of one file.
    pub(crate) fn render(&self, name: &FileName<'_>) -> Result<String> {
        let path = self.render_with(|field| match field {
            "table" => segment(name.table),
            "stream" => segment(name.stream),
            "date" => name.opened.format("%Y-%m-%d").to_string(),
            "hour" => name.opened.format("%H").to_string(),
            "seq" => format!("{:012}", name.seq),
            "uuid" => uuid(name.stream, name.table, name.seq),
            _ => name.ext.to_string(),
        });
        check_segments(&path)?;
        Ok(path)
    }
}

/// A value as one path segment: anything but letters, digits, `-`, `_` and `.` becomes `_`,
/// and a segment of dots alone becomes underscores.
fn segment(value: &str) -> String {
    let clean: String = value
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') { c } else { '_' })
        .collect();
    if clean.is_empty() || clean.chars().all(|c| c == '.') { "_".repeat(clean.len().max(1)) } else { clean }
}

fn check_segments(path: &str) -> Result<()> {
    for segment in path.split('/') {
        if segment.is_empty() || segment == "." || segment == ".." {
            return Err(bad(format!("'{path}' has an empty, '.' or '..' folder")));
        }
    }
    Ok(())
}

/// A UUID-shaped name from the file's identity (SHA-256, version 8 bits set): the same file
/// always gets the same one.
fn uuid(stream: &str, table: &str, seq: u64) -> String {
    let digest = Sha256::digest(format!("{stream}\0{table}\0{seq}"));
    let mut b: [u8; 16] = digest[..16].try_into().unwrap_or_default();
    b[6] = (b[6] & 0x0f) | 0x80;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = hex::encode(b);
    format!("{}-{}-{}-{}-{}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name<'a>(table: &'a str, seq: u64) -> FileName<'a> {
        let opened = DateTime::parse_from_rfc3339("2026-11-30T21:05:00Z").unwrap().with_timezone(&Utc);
        FileName { stream: "orders", table, seq, opened, ext: "parquet" }
    }

    #[test]
    fn the_default_names_a_folder_per_table_and_day() {
        let t = Template::parse(DEFAULT_PATH).unwrap();
        assert_eq!(t.render(&name("orders", 7)).unwrap(), "orders/2026-11-30/part-000000000007.parquet");
    }

    #[test]
    fn a_table_name_cannot_climb_out_of_the_folder() {
        let t = Template::parse("{table}/{hour}-{uuid}.{ext}").unwrap();
        for table in ["..", "../etc", "a/../../b", ".", "", "x\\y"] {
            let path = t.render(&name(table, 1)).unwrap();
            assert!(!path.split('/').any(|s| s == ".." || s == "." || s.is_empty()), "{table} -> {path}");
            assert_eq!(path.split('/').count(), 2, "{table} -> {path}");
        }
    }

    #[test]
    fn the_same_file_gets_the_same_uuid_and_another_file_another() {
        let t = Template::parse("{uuid}.{ext}").unwrap();
        assert_eq!(t.render(&name("a", 1)).unwrap(), t.render(&name("a", 1)).unwrap());
        assert_ne!(t.render(&name("a", 1)).unwrap(), t.render(&name("a", 2)).unwrap());
        assert_ne!(t.render(&name("a", 1)).unwrap(), t.render(&name("b", 1)).unwrap());
    }

    #[test]
    fn bad_templates_name_the_field() {
        for bad in ["{table}.{ext}", "{seq}/../{ext}", "/abs/{seq}", "{nope}/{seq}", "{seq", "a//{seq}", "{seq}}"] {
            let e = Template::parse(bad).unwrap_err().to_string();
            assert!(e.contains("destination.path"), "{bad}: {e}");
        }
    }
}
