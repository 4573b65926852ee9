//! Snapshot rows in PostgreSQL's `COPY` text format: straight into the table's column builders,
//! one row per line, with no JSON in between. A snapshot is a consistent copy, so its rows are
//! appended as they are; only when a history is kept, or changes share the batch, do they go
//! through the mirror merge as `snapshot` changes.

use std::borrow::Cow;
use std::collections::HashMap;

use serde_json::Value;

use super::change::{Route, render};
use super::{Ctx, Decoded, Decoder, TableBuilder};
use crate::batch::{ChangeOp, CopyRows, MirrorWrite, RecordMeta, SnapshotWrite};
use crate::error::Result;
use crate::schema::{Fit, fit_text};

impl Decoder {
    /// Decode one `COPY` chunk into its table's builder; each line is one event.
    pub(super) fn copy_rows(
        &self,
        meta: &RecordMeta,
        rows: CopyRows,
        builders: &mut HashMap<String, TableBuilder>,
        order: &mut Vec<String>,
        out: &mut Decoded,
    ) -> Result<()> {
        let route =
            Route { db: Some(rows.db.clone()), schema: Some(rows.schema.clone()), table: Some(rows.table.clone()) };
        let table = match render(&self.table, meta.route.as_deref(), &route) {
            Ok(table) => table,
            Err(reason) => {
                let fallback = self.table_for(meta);
                for line in &rows.rows {
                    out.events += 1;
                    out.last_sequence += 1;
                    let ctx = Ctx { table: &fallback, meta, seq: out.last_sequence };
                    out.rejects.push(ctx.reject(
                        None,
                        None,
                        String::from_utf8_lossy(line).into_owned(),
                        reason.clone(),
                    ));
                }
                return Ok(());
            }
        };
        let builder = self.builder(&table, builders, order);
        let keys = if self.changes.keys.is_empty() { rows.keys.clone() } else { self.changes.keys.clone() };
        if self.changes.history && builder.mirror.is_none() {
            let m = MirrorWrite { keys, history: true, ..MirrorWrite::default() };
            builder.mirror = Some(m);
            builder.pad_mirror();
        }
        let snapshot = builder.snapshot.get_or_insert_with(SnapshotWrite::default);
        snapshot.clear |= rows.clear;
        let columns: Vec<usize> = rows.columns.iter().map(|(name, ty)| builder.column(name, *ty)).collect();
        for line in &rows.rows {
            out.events += 1;
            out.last_sequence += 1;
            let ctx = Ctx { table: &table, meta, seq: out.last_sequence };
            // Invalid UTF-8 (a server in another encoding) becomes U+FFFD rather than a failure.
            let text = String::from_utf8_lossy(line.strip_suffix(b"\n").unwrap_or(line));
            let fields: Vec<&str> = text.split('\t').collect();
            if fields.len() != columns.len() {
                let reason = format!("a COPY row with {} fields for {} columns", fields.len(), columns.len());
                out.rejects.push(ctx.reject(None, None, text.to_string(), reason));
                continue;
            }
            builder.push_metadata(&ctx, &self.metadata, &mut out.rejects);
            for (field, &i) in fields.iter().zip(&columns) {
                if *field == "\\N" {
                    builder.store(&ctx, i, Fit::Null, None, &mut out.rejects);
                    continue;
                }
                let value = unescape(field);
                let fit = fit_text(builder.schema.columns()[i].ty, &value);
                if matches!(fit, Fit::Misfit(_)) {
                    let raw = Value::String(value.to_string());
                    builder.store(&ctx, i, fit, Some(&raw), &mut out.rejects);
                } else {
                    builder.store(&ctx, i, fit, None, &mut out.rejects);
                }
            }
            builder.rows += 1;
            if let Some(m) = builder.mirror.as_mut() {
                push_snapshot(m, ctx.seq);
            }
        }
        Ok(())
    }
}

impl TableBuilder {
    /// Give rows that entered before the builder became a mirror (snapshot rows) their change
    /// entries, so a batch can hold both.
    pub(super) fn pad_mirror(&mut self) {
        if let Some(m) = self.mirror.as_mut() {
            while m.ops.len() < self.rows {
                push_snapshot(m, 0);
            }
        }
    }
}

fn push_snapshot(m: &mut MirrorWrite, seq: i64) {
    m.ops.push(ChangeOp::Snapshot);
    m.orders.push(seq);
    m.recorded.push(true);
    m.change_us.push(None);
    m.sources.push(None);
    m.source_orders.push(None);
}

/// A field without its backslash escapes (`\\`, `\t`, `\n`, `\r`, `\b`, `\f`, `\v`, octal, hex).
fn unescape(field: &str) -> Cow<'_, str> {
    if !field.contains('\\') {
        return Cow::Borrowed(field);
    }
    let mut out = String::with_capacity(field.len());
    let mut chars = field.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('t') => out.push('\t'),
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some('b') => out.push('\u{8}'),
            Some('f') => out.push('\u{c}'),
            Some('v') => out.push('\u{b}'),
            Some('x') if chars.peek().is_some_and(char::is_ascii_hexdigit) => {
                let mut code = 0;
                for _ in 0..2 {
                    match chars.peek().and_then(|c| c.to_digit(16)) {
                        Some(v) => {
                            code = code * 16 + v;
                            chars.next();
                        }
                        None => break,
                    }
                }
                out.push(char::from_u32(code).unwrap_or('\u{fffd}'));
            }
            Some(d @ '0'..='7') => {
                let mut code = d.to_digit(8).unwrap_or(0);
                for _ in 0..2 {
                    match chars.peek().and_then(|c| c.to_digit(8)) {
                        Some(v) => {
                            code = code * 8 + v;
                            chars.next();
                        }
                        None => break,
                    }
                }
                out.push(char::from_u32(code).unwrap_or('\u{fffd}'));
            }
            Some(other) => out.push(other),
            None => out.push('\\'),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::unescape;

    #[test]
    fn escapes() {
        assert_eq!(unescape("plain"), "plain");
        assert_eq!(unescape("a\\tb\\nc\\\\d\\re"), "a\tb\nc\\d\re");
        assert_eq!(unescape("\\x41"), "A");
        assert_eq!(unescape("\\\\x0102"), "\\x0102");
        assert_eq!(unescape("\\101"), "A");
    }
}
