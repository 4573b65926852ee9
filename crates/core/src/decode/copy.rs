//! Snapshot rows in PostgreSQL's `COPY` text or binary format (`copy_binary.rs`): straight
//! into the table's column builders, one row per line or message, with no JSON in between. A snapshot is a consistent copy, so its rows are
//! appended as they are; only when a history is kept, or changes share the batch, do they go
//! through the mirror merge as `snapshot` changes.

use std::borrow::Cow;
use std::collections::HashMap;

use serde_json::Value;

use super::change::render;
use super::copy_binary;
use super::{Ctx, Decoded, Decoder, TableBuilder};
use crate::batch::{ChangeOp, CopyRows, MirrorWrite, RecordMeta, SnapshotWrite};
use crate::error::Result;
use crate::format::change::Route;
use crate::schema::{Fit, fit_text};
use crate::transform::mask_text;

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
                let hides = self.transform.as_ref().is_some_and(|t| t.mapping.hides());
                for line in &rows.rows {
                    out.events += 1;
                    out.last_sequence += 1;
                    let ctx = Ctx { table: &fallback, meta, seq: out.last_sequence };
                    let raw = match hides {
                        true => super::transformed::WITHHELD.to_string(),
                        false => String::from_utf8_lossy(line).into_owned(),
                    };
                    out.rejects.push(ctx.reject(None, None, raw, reason.clone()));
                }
                return Ok(());
            }
        };
        let builder = self.builder(&table, builders, order);
        // The stream's field rules: columns dropped, renamed, retyped or masked.
        let mapping = self.transform.as_ref().map(|t| &t.mapping).filter(|m| !m.is_empty());
        let plans: Vec<_> = rows
            .columns
            .iter()
            .map(|(name, ty)| match mapping {
                Some(m) => m.column(name, *ty),
                None => Some((name.clone(), *ty, None)),
            })
            .collect();
        let renamed = |key: &String| {
            let i = rows.columns.iter().position(|(c, _)| c == key);
            i.and_then(|i| plans[i].as_ref()).map_or_else(|| key.clone(), |(name, _, _)| name.clone())
        };
        let source_keys: Vec<String> = rows.keys.iter().map(renamed).collect();
        let keys = if self.changes.keys.is_empty() { source_keys.clone() } else { self.changes.keys.clone() };
        if self.changes.history && builder.mirror.is_none() {
            let whole_row = self.changes.keys.is_empty() && plans.iter().flatten().all(|(c, _, _)| keys.contains(c));
            let m = MirrorWrite { keys, whole_row, history: true, ..MirrorWrite::default() };
            builder.mirror = Some(m);
            builder.pad_mirror();
        }
        let snapshot = builder.snapshot.get_or_insert_with(SnapshotWrite::default);
        snapshot.clear |= rows.clear;
        snapshot.complete |= rows.last;
        if snapshot.keys.is_empty() && !rows.whole_row {
            snapshot.keys.clone_from(&source_keys);
        }
        // The table's columns come with the first row of the copy.
        builder.at = out.last_sequence + 1;
        let columns: Vec<Option<usize>> =
            plans.iter().map(|p| p.as_ref().map(|(name, ty, _)| builder.column(name, *ty))).collect();
        builder.reserve(rows.rows.len(), rows.len_bytes());
        let mut types: Vec<_> = columns.iter().map(|i| i.map(|i| builder.schema.columns()[i].ty)).collect();
        let wires = rows.binary.clone();
        let mut ranges = Vec::new();
        for line in &rows.rows {
            out.events += 1;
            out.last_sequence += 1;
            let ctx = Ctx { table: &table, meta, seq: out.last_sequence };
            builder.at = ctx.seq;
            // Invalid UTF-8 (a server in another encoding) becomes U+FFFD rather than a failure.
            let text = match &wires {
                None => String::from_utf8_lossy(line.strip_suffix(b"\n").unwrap_or(line)),
                Some(_) => Cow::Borrowed(""),
            };
            let fields: Vec<&str> = if wires.is_none() { text.split('\t').collect() } else { Vec::new() };
            let well_formed = match &wires {
                None => fields.len() == columns.len(),
                Some(_) => copy_binary::fields(line, &mut ranges) && ranges.len() == columns.len(),
            };
            if !well_formed {
                let (raw, reason) = match &wires {
                    None => (
                        text.to_string(),
                        format!("a COPY row with {} fields for {} columns", fields.len(), columns.len()),
                    ),
                    // As hex: the bytes may hold NULs, which a text column of the ledger refuses.
                    Some(_) => (
                        line.iter().map(|b| format!("{b:02x}")).collect(),
                        format!("a binary COPY row that is not {} fields", columns.len()),
                    ),
                };
                // With masks or drops, a row they could not act on keeps no raw text.
                let raw = match self.transform.as_ref().is_some_and(|t| t.mapping.hides()) {
                    true => super::transformed::WITHHELD.to_string(),
                    false => raw,
                };
                out.rejects.push(ctx.reject(None, None, raw, reason));
                continue;
            }
            builder.push_metadata(&ctx, &self.metadata, &mut out.rejects);
            for (k, &i) in columns.iter().enumerate() {
                let (Some(i), Some(ty)) = (i, types[k]) else { continue };
                let mask = plans[k].as_ref().and_then(|(_, _, mask)| *mask);
                // A binary field's form and bytes; `None` for a text row, or NULL.
                let binary = wires
                    .as_ref()
                    .and_then(|w| w.get(k).copied())
                    .zip(ranges.get(k).cloned().flatten())
                    .and_then(|(w, r)| Some((w, line.get(r)?)));
                let is_null = match &wires {
                    Some(_) => binary.is_none(),
                    None => fields[k] == "\\N",
                };
                // The field as text: a text row's field unescaped, or a binary value's text form
                // (for a masked column, a misfit's ledger row, or a column of another type).
                let as_text = || -> Option<Cow<'_, str>> {
                    match binary {
                        _ if is_null => None,
                        Some((wire, v)) => copy_binary::text_of(wire, v),
                        None => Some(unescape(fields[k])),
                    }
                };
                let fit = match (binary, mask) {
                    _ if is_null => Fit::Null,
                    (Some((wire, v)), None) => {
                        copy_binary::fit_binary(wire, ty, v).unwrap_or(Fit::Misfit("not a value of the source's type"))
                    }
                    (_, mask) => match as_text() {
                        None => Fit::Misfit("not a value of the source's type"),
                        Some(value) => match mask {
                            Some((mask, keep)) => fit_text(ty, &mask_text(&value, mask, keep)).into_owned(),
                            None => copy_binary::fit_cow(ty, value),
                        },
                    },
                };
                match fit {
                    // The common case, straight into the column: it holds exactly the rows so far.
                    Fit::Misfit(_) | Fit::Widen(_) => {
                        let raw = as_text().unwrap_or_default();
                        let raw = match mask {
                            Some((mask, keep)) => mask_text(&raw, mask, keep),
                            None => raw.into_owned(),
                        };
                        builder.store(&ctx, i, fit, Some(&Value::String(raw)), &mut out.rejects);
                        types[k] = Some(builder.schema.columns()[i].ty);
                    }
                    fit if builder.columns[i].len() == builder.rows => builder.columns[i].push(fit),
                    fit => builder.store(&ctx, i, fit, None, &mut out.rejects),
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
    /// Room for `rows` more rows, of `bytes` in all, in a builder that holds none yet (a
    /// snapshot's chunk is usually a unit of its own); one that holds rows grows as it goes.
    fn reserve(&mut self, rows: usize, bytes: usize) {
        if self.rows != 0 || self.columns.iter().any(|c| c.len() != 0) {
            return;
        }
        // Text: the rows' bytes shared among the columns, the fixed-width ones counted too
        // (a little more room than needed rather than growing twice).
        let text = bytes / self.columns.len().max(1) + rows * 8;
        for (column, schema) in self.columns.iter_mut().zip(self.schema.columns()) {
            *column = super::column::ColumnBuilder::with_capacity(schema.ty, rows, text);
        }
    }

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
    m.unavailable.push(Vec::new());
}

/// A `COPY` text field without its backslash escapes (`\\`, `\t`, `\n`, `\r`, `\b`, `\f`, `\v`,
/// octal, hex).
pub fn unescape(field: &str) -> Cow<'_, str> {
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
    use std::collections::HashMap;
    use std::sync::Arc;

    use super::unescape;
    use crate::batch::{CopyRows, Payload, Record, RecordMeta};
    use crate::decode::{ChangeConfig, Decoder, Format, MetadataConfig, Mode};
    use crate::schema::ColumnType;

    fn copy(lines: &[&str], clear: bool) -> Record {
        Record {
            payload: Payload::Copy(CopyRows {
                columns: Arc::new(vec![
                    ("id".into(), ColumnType::Bigint),
                    ("day".into(), ColumnType::Date),
                    ("amount".into(), ColumnType::Decimal(6, 2)),
                    ("note".into(), ColumnType::Varchar),
                ]),
                keys: vec!["id".into()],
                whole_row: false,
                db: "d".into(),
                schema: "public".into(),
                table: "t".into(),
                clear,
                last: false,
                rows: lines.iter().map(|l| bytes::Bytes::from(format!("{l}\n"))).collect(),
                binary: None,
            }),
            meta: RecordMeta { route: Some("t".into()), ..RecordMeta::default() },
        }
    }

    #[test]
    fn copy_rows_become_columns_and_misfits_go_to_the_ledger() {
        let changes = ChangeConfig { mode: Mode::Mirror, keys: Vec::new(), history: false, format: Format::Debezium };
        let decoder = Decoder::new("[table]".into(), MetadataConfig::default(), HashMap::new()).with_changes(changes);
        let lines = [
            "1\t2024-02-29\t12.50\ttab\\there",
            "2\tinfinity\t\\N\t\\N",
            "3\t2024-01-01\t99999.99\tover",
            "4\tonly two",
        ];
        let (out, _) = decoder.decode(vec![copy(&lines, true)], 1).unwrap();
        assert_eq!(out.events, 4);
        assert_eq!(out.rows, 3, "the short line is a reject, not a row");
        let write = &out.tables[0];
        assert_eq!(write.table, "t");
        assert!(write.mirror.is_none(), "snapshot rows are appended, not merged");
        assert!(write.snapshot.as_ref().is_some_and(|s| s.clear));
        let reasons: Vec<(Option<String>, String)> =
            out.rejects.iter().map(|r| (r.column.clone(), r.reason.to_string())).collect();
        assert_eq!(reasons.len(), 3, "{reasons:?}");
        assert_eq!(reasons[0].0.as_deref(), Some("day"), "{reasons:?}");
        assert_eq!(reasons[1].0.as_deref(), Some("amount"), "99999.99 does not fit DECIMAL(6,2): {reasons:?}");
        assert!(reasons[2].1.contains("2 fields for 4 columns"), "{reasons:?}");
        let notes = write.data.column_by_name("note").unwrap();
        let notes = arrow::array::AsArray::as_string::<i32>(notes);
        assert_eq!(notes.value(0), "tab\there");
        assert!(arrow::array::Array::is_null(notes, 1));
    }

    /// The same rows as above in the binary format: the same columns, values and ledger rows.
    #[test]
    fn binary_rows_decode_like_text_rows() {
        use crate::decode::Wire;
        let field = |v: Option<&[u8]>| match v {
            Some(v) => [(v.len() as i32).to_be_bytes().as_slice(), v].concat(),
            None => (-1i32).to_be_bytes().to_vec(),
        };
        let row = |fields: &[Option<&[u8]>]| {
            let mut out = (fields.len() as i16).to_be_bytes().to_vec();
            fields.iter().for_each(|f| out.extend(field(*f)));
            bytes::Bytes::from(out)
        };
        // 2024-02-29 is 8,825 days after 2000-01-01.
        let rows = vec![
            row(&[Some(&1i64.to_be_bytes()), Some(&8825i32.to_be_bytes()), Some(b"12.50"), Some(b"tab\there")]),
            row(&[Some(&2i64.to_be_bytes()), Some(&i32::MAX.to_be_bytes()), None, None]),
            row(&[Some(&3i64.to_be_bytes()), Some(&8766i32.to_be_bytes()), Some(b"99999.99"), Some(b"over")]),
            row(&[Some(&4i64.to_be_bytes()), Some(b"only two")]),
            row(&[Some(&[0, 5]), None, None, None]),
        ];
        let mut record = copy(&[], true);
        let Payload::Copy(copy_rows) = &mut record.payload else { unreachable!() };
        copy_rows.rows = rows;
        copy_rows.binary = Some(Arc::new(vec![Wire::Int8, Wire::Date, Wire::Text, Wire::Text]));
        let changes = ChangeConfig { mode: Mode::Mirror, keys: Vec::new(), history: false, format: Format::Debezium };
        let decoder = Decoder::new("[table]".into(), MetadataConfig::default(), HashMap::new()).with_changes(changes);
        let (out, _) = decoder.decode(vec![record], 1).unwrap();
        assert_eq!((out.events, out.rows), (5, 4));
        let reasons: Vec<(Option<String>, String)> =
            out.rejects.iter().map(|r| (r.column.clone(), r.reason.to_string())).collect();
        assert_eq!(reasons.len(), 4, "{reasons:?}");
        assert_eq!(reasons[0].0.as_deref(), Some("day"), "infinity is not a date: {reasons:?}");
        assert_eq!(reasons[1].0.as_deref(), Some("amount"), "{reasons:?}");
        assert!(reasons[2].1.contains("not 4 fields"), "{reasons:?}");
        assert_eq!(reasons[3].0.as_deref(), Some("id"), "a two-byte int8: {reasons:?}");
        let data = &out.tables[0].data;
        let days =
            arrow::array::AsArray::as_primitive::<arrow::datatypes::Date32Type>(data.column_by_name("day").unwrap());
        assert_eq!(days.value(0), 19_782, "2024-02-29");
        let notes = arrow::array::AsArray::as_string::<i32>(data.column_by_name("note").unwrap());
        assert_eq!(notes.value(0), "tab\there", "binary text is not unescaped");
    }

    #[test]
    fn escapes() {
        assert_eq!(unescape("plain"), "plain");
        assert_eq!(unescape("a\\tb\\nc\\\\d\\re"), "a\tb\nc\\d\re");
        assert_eq!(unescape("\\x41"), "A");
        assert_eq!(unescape("\\\\x0102"), "\\x0102");
        assert_eq!(unescape("\\101"), "A");
    }
}
