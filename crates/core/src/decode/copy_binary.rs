//! Snapshot rows in PostgreSQL's binary `COPY` format: each field's value as the server keeps
//! it (an int8 as 8 bytes, a timestamptz as microseconds since 2000), so neither the server
//! prints nor the decoder parses text (a `numeric` as base-10000 digits). Columns of other types
//! are selected `::text`, whose binary form is the text itself, and take the text path.

use std::borrow::Cow;
use std::ops::Range;

use bytes::Bytes;

use super::copy_numeric::Numeric;
use crate::schema::{ColumnType, Fit, fit_text};

/// How a column's values are sent in a binary `COPY`: the source type's binary form.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    /// UTF-8 text: `text`, `varchar`, `bpchar`, and every column selected `::text`.
    Text,
    /// One byte, 0 or 1.
    Bool,
    /// Big-endian integers of 2, 4 and 8 bytes.
    Int2,
    /// 4 bytes.
    Int4,
    /// 8 bytes.
    Int8,
    /// IEEE 754, 4 and 8 bytes.
    Float4,
    /// 8 bytes.
    Float8,
    /// Days since 2000-01-01 (i32).
    Date,
    /// Microseconds since 2000-01-01 00:00 (i64), without a zone.
    Timestamp,
    /// Microseconds since 2000-01-01 00:00 UTC (i64).
    Timestamptz,
    /// The bytes themselves.
    Bytea,
    /// A `numeric`: digit count, weight, sign and display scale (16 bits each), then base-10000
    /// digits, most significant first.
    Numeric,
}

/// The start of every binary `COPY`: `PGCOPY\n\377\r\n\0`.
const SIGNATURE: &[u8; 11] = b"PGCOPY\n\xff\r\n\0";
/// 2000-01-01 in days and microseconds since 1970-01-01.
const EPOCH_DAYS: i64 = 10_957;
const EPOCH_MICROS: i64 = EPOCH_DAYS * 86_400_000_000;
/// Years 1 to 9999, as the text path reads them (`YYYY-MM-DD`), in days since 1970-01-01.
const FIRST_DAY: i64 = -719_162;
const LAST_DAY: i64 = 2_932_896;

/// Reads a binary `COPY … TO STDOUT` one data message at a time, as the server sends them (one
/// row each; the header comes before the first row, the trailer in a message of its own): the
/// header is taken off the first message, the trailer is no row.
#[derive(Debug, Default)]
pub struct BinaryCopyReader {
    header_read: bool,
}

impl BinaryCopyReader {
    /// The row in `message`, if it holds one.
    pub fn row(&mut self, mut message: Bytes) -> Result<Option<Bytes>, String> {
        if !self.header_read {
            if message.len() < 19 || &message[..11] != SIGNATURE {
                return Err("a binary COPY without its signature".into());
            }
            let extension = u32::from_be_bytes([message[15], message[16], message[17], message[18]]) as usize;
            let header = 19usize.saturating_add(extension);
            if message.len() < header {
                return Err("a binary COPY header cut short".into());
            }
            message = message.slice(header..);
            self.header_read = true;
        }
        // The trailer: a field count of -1.
        if message.is_empty() || message.as_ref() == [0xff, 0xff] {
            return Ok(None);
        }
        Ok(Some(message))
    }
}

/// The fields of one binary row as ranges of `row` (`None` for NULL); `false` when the row is
/// not well formed. `out` is reused from row to row.
pub fn fields(row: &[u8], out: &mut Vec<Option<Range<usize>>>) -> bool {
    out.clear();
    let Some(count) = row.get(0..2).map(|b| i16::from_be_bytes([b[0], b[1]])) else { return false };
    if count < 0 {
        return false;
    }
    let mut at = 2usize;
    for _ in 0..count {
        let Some(len) = row.get(at..at + 4).map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]])) else {
            return false;
        };
        at += 4;
        if len < 0 {
            out.push(None);
            continue;
        }
        let end = at + len as usize;
        if end > row.len() {
            return false;
        }
        out.push(Some(at..end));
        at = end;
    }
    at == row.len()
}

/// The value for a column of type `ty`, straight from its binary form when the two agree (an
/// int8 into a BIGINT column); else `None`, and the value goes through its text form.
pub fn native(wire: Wire, ty: ColumnType, v: &[u8]) -> Option<Fit<'static>> {
    Some(match (wire, ty) {
        (Wire::Bool, ColumnType::Boolean) => Fit::Bool(*v.first()? != 0),
        (Wire::Int2 | Wire::Int4 | Wire::Int8, ColumnType::Bigint) => Fit::Int(int(wire, v)?),
        (Wire::Float8, ColumnType::Double) => Fit::Float(f64::from_be_bytes(v.try_into().ok()?)),
        (Wire::Date, ColumnType::Date) => {
            let days = i64::from(i32::from_be_bytes(v.try_into().ok()?)) + EPOCH_DAYS;
            // Outside years 1-9999 (and ±infinity) the text path decides, as for a change.
            if !(FIRST_DAY..=LAST_DAY).contains(&days) {
                return None;
            }
            Fit::Days(days as i32)
        }
        (Wire::Timestamp, ColumnType::Timestamp) | (Wire::Timestamptz, ColumnType::Timestamptz) => {
            let micros = i64::from_be_bytes(v.try_into().ok()?).checked_add(EPOCH_MICROS)?;
            if !(FIRST_DAY * 86_400_000_000..(LAST_DAY + 1) * 86_400_000_000).contains(&micros) {
                return None;
            }
            Fit::Micros(micros)
        }
        (Wire::Bytea, ColumnType::Blob) => Fit::Bytes(v.to_vec()),
        (Wire::Numeric, ColumnType::Decimal(precision, scale)) => {
            Fit::Decimal(Numeric::read(v)?.unscaled(precision, scale)?)
        }
        _ => return None,
    })
}

fn int(wire: Wire, v: &[u8]) -> Option<i64> {
    Some(match wire {
        Wire::Int2 => i64::from(i16::from_be_bytes(v.try_into().ok()?)),
        Wire::Int4 => i64::from(i32::from_be_bytes(v.try_into().ok()?)),
        _ => i64::from_be_bytes(v.try_into().ok()?),
    })
}

/// The text PostgreSQL prints for a binary value (with `TimeZone` UTC, `DateStyle` ISO and hex
/// bytea): for a column whose type differs from the source's, a masked column, and the keys
/// that page the snapshot. `None` when the value is not well formed.
pub fn text_of(wire: Wire, v: &[u8]) -> Option<Cow<'_, str>> {
    let text = match wire {
        // Valid UTF-8 is checked by the fast path; only invalid text is scanned again, lossily.
        Wire::Text => return Some(std::str::from_utf8(v).map_or_else(|_| String::from_utf8_lossy(v), Cow::Borrowed)),
        Wire::Bool => if *v.first()? != 0 { "t" } else { "f" }.to_string(),
        Wire::Int2 | Wire::Int4 | Wire::Int8 => int(wire, v)?.to_string(),
        Wire::Float4 => {
            float(f64::from(f32::from_be_bytes(v.try_into().ok()?)), Some(f32::from_be_bytes(v.try_into().ok()?)))
        }
        Wire::Float8 => float(f64::from_be_bytes(v.try_into().ok()?), None),
        Wire::Date => match i32::from_be_bytes(v.try_into().ok()?) {
            i32::MAX => "infinity".into(),
            i32::MIN => "-infinity".into(),
            days => {
                let (ymd, bc) = pg_date(i64::from(days) + EPOCH_DAYS);
                format!("{ymd}{bc}")
            }
        },
        Wire::Timestamp | Wire::Timestamptz => match i64::from_be_bytes(v.try_into().ok()?) {
            i64::MAX => "infinity".into(),
            i64::MIN => "-infinity".into(),
            micros => {
                let micros = i128::from(micros) + i128::from(EPOCH_MICROS);
                let (days, in_day) = (micros.div_euclid(86_400_000_000), micros.rem_euclid(86_400_000_000));
                let (ymd, bc) = pg_date(i64::try_from(days).ok()?);
                let zone = if wire == Wire::Timestamptz { "+00" } else { "" };
                let seconds = in_day / 1_000_000;
                let time = format!("{:02}:{:02}:{:02}", seconds / 3600, seconds / 60 % 60, seconds % 60);
                match in_day % 1_000_000 {
                    0 => format!("{ymd} {time}{zone}{bc}"),
                    us => format!("{ymd} {time}.{}{zone}{bc}", format!("{us:06}").trim_end_matches('0')),
                }
            }
        },
        Wire::Bytea => {
            let mut hex = String::with_capacity(2 + v.len() * 2);
            hex.push_str("\\x");
            for b in v {
                hex.push_str(&format!("{b:02x}"));
            }
            hex
        }
        Wire::Numeric => Numeric::read(v)?.text(),
    };
    Some(Cow::Owned(text))
}

/// A date (days since 1970-01-01) as PostgreSQL prints it: at least four digits of year,
/// unsigned (`12000-01-01`), and years before 1 as ` BC` (`0044-03-15 BC`); the suffix is
/// returned apart, as it ends the text. The civil calendar in integers (H. Hinnant's
/// `civil_from_days`), for every date PostgreSQL keeps (to 5874897 AD).
fn pg_date(days: i64) -> (String, &'static str) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let (year, bc) = if year <= 0 { (1 - year, " BC") } else { (year, "") };
    (format!("{year:04}-{month:02}-{day:02}"), bc)
}

/// A float as PostgreSQL 12+ prints it: the shortest text that reads back the same value (a
/// float4 by its own shortest form, so 1.1 stays 1.1 and not 1.100000023841858), in plain
/// notation for decimal exponents from -4 up to the type's digits (15, or 6 for a float4), else
/// as `1.5e+15` / `1e-05`.
fn float(value: f64, single: Option<f32>) -> String {
    if value.is_nan() {
        return "NaN".into();
    }
    if value.is_infinite() {
        return if value > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    let (scientific, plain, digits) = match single {
        Some(f) => (format!("{f:e}"), f.to_string(), 6),
        None => (format!("{value:e}"), value.to_string(), 15),
    };
    let Some((mantissa, exponent)) = scientific.split_once('e') else { return plain };
    let Ok(exponent) = exponent.parse::<i32>() else { return plain };
    if (-4..digits).contains(&exponent) {
        return plain;
    }
    let sign = if exponent < 0 { '-' } else { '+' };
    format!("{mantissa}e{sign}{:02}", exponent.abs())
}

/// A field for a column of type `ty`: its value straight from the binary form, or through
/// its text (`None` when the bytes are not a value of the wire type). Text borrowed from the
/// row stays borrowed until it is copied into the column.
pub fn fit_binary(wire: Wire, ty: ColumnType, v: &[u8]) -> Option<Fit<'_>> {
    if let Some(fit) = native(wire, ty, v) {
        return Some(fit);
    }
    Some(fit_cow(ty, text_of(wire, v)?))
}

/// [`fit_text`] of a value that may be borrowed: a borrowed one's fit borrows it too.
pub(super) fn fit_cow(ty: ColumnType, text: Cow<'_, str>) -> Fit<'_> {
    match text {
        Cow::Borrowed(text) => fit_text(ty, text),
        Cow::Owned(text) => fit_text(ty, &text).into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(fields: &[Option<&[u8]>]) -> Vec<u8> {
        let mut out = (fields.len() as i16).to_be_bytes().to_vec();
        for f in fields {
            match f {
                Some(v) => {
                    out.extend((v.len() as i32).to_be_bytes());
                    out.extend(*v);
                }
                None => out.extend((-1i32).to_be_bytes()),
            }
        }
        out
    }

    fn binary_copy_rows(messages: Vec<Bytes>) -> Result<Vec<Bytes>, String> {
        let mut reader = BinaryCopyReader::default();
        let mut rows = Vec::new();
        for message in messages {
            rows.extend(reader.row(message)?);
        }
        Ok(rows)
    }

    #[test]
    fn header_and_trailer_are_taken_off() {
        let mut first = SIGNATURE.to_vec();
        first.extend([0, 0, 0, 0, 0, 0, 0, 0]);
        let one = row(&[Some(b"a")]);
        first.extend(&one);
        let messages = vec![Bytes::from(first), Bytes::from(row(&[None])), Bytes::from_static(&[0xff, 0xff])];
        let rows = binary_copy_rows(messages).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].as_ref(), one.as_slice());
        assert!(binary_copy_rows(vec![Bytes::from_static(b"1\tx\n")]).is_err());
        // No rows: the header and the trailer only.
        let mut empty = SIGNATURE.to_vec();
        empty.extend([0, 0, 0, 0, 0, 0, 0, 0]);
        assert!(binary_copy_rows(vec![Bytes::from(empty), Bytes::from_static(&[0xff, 0xff])]).unwrap().is_empty());
    }

    #[test]
    fn fields_are_ranges_and_short_rows_are_refused() {
        let r = row(&[Some(b"abc"), None, Some(b"")]);
        let mut out = Vec::new();
        assert!(fields(&r, &mut out));
        assert_eq!(out, vec![Some(6..9), None, Some(17..17)]);
        assert!(!fields(&r[..r.len() - 1], &mut out));
        let mut long = r.clone();
        long.push(0);
        assert!(!fields(&long, &mut out), "bytes after the last field");
        assert!(!fields(&[0xff, 0xff], &mut out));
        assert!(!fields(&[0, 1, 0, 0, 0, 9, 1], &mut out), "a length past the end");
    }

    #[test]
    fn values_agree_with_the_text_path() {
        let ts = 1_000_000i64.to_be_bytes(); // 2000-01-01 00:00:01
        assert_eq!(
            native(Wire::Timestamptz, ColumnType::Timestamptz, &ts),
            Some(Fit::Micros(EPOCH_MICROS + 1_000_000))
        );
        assert_eq!(text_of(Wire::Timestamptz, &ts).unwrap(), "2000-01-01 00:00:01+00");
        assert_eq!(text_of(Wire::Timestamp, &1_500i64.to_be_bytes()).unwrap(), "2000-01-01 00:00:00.0015");
        assert_eq!(text_of(Wire::Date, &(-1i32).to_be_bytes()).unwrap(), "1999-12-31");
        // Years past 9999 and before 1, as PostgreSQL prints them.
        let days = |y: i32, m: u32, d: u32| {
            let date = chrono::NaiveDate::from_ymd_opt(y, m, d).unwrap();
            (date - chrono::NaiveDate::from_ymd_opt(2000, 1, 1).unwrap()).num_days() as i32
        };
        assert_eq!(text_of(Wire::Date, &days(12000, 1, 1).to_be_bytes()).unwrap(), "12000-01-01");
        assert_eq!(text_of(Wire::Date, &days(-43, 3, 15).to_be_bytes()).unwrap(), "0044-03-15 BC");
        let bc = (i64::from(days(-43, 3, 15)) * 86_400_000_000 + 1).to_be_bytes();
        assert_eq!(text_of(Wire::Timestamptz, &bc).unwrap(), "0044-03-15 00:00:00.000001+00 BC");
        // ±infinity and years past 9999 go the text path's way: not a date.
        assert_eq!(native(Wire::Date, ColumnType::Date, &i32::MAX.to_be_bytes()), None);
        assert!(matches!(fit_binary(Wire::Date, ColumnType::Date, &i32::MAX.to_be_bytes()), Some(Fit::Misfit(_))));
        assert!(matches!(
            fit_binary(Wire::Timestamptz, ColumnType::Timestamptz, &i64::MIN.to_be_bytes()),
            Some(Fit::Misfit(_))
        ));
        assert_eq!(native(Wire::Int2, ColumnType::Bigint, &(-5i16).to_be_bytes()), Some(Fit::Int(-5)));
        assert_eq!(native(Wire::Int4, ColumnType::Bigint, &[0, 1]), None, "a short value");
        // A float4 keeps its own shortest form.
        assert_eq!(fit_binary(Wire::Float4, ColumnType::Double, &1.1f32.to_be_bytes()), Some(Fit::Float(1.1)));
        assert_eq!(text_of(Wire::Float8, &f64::NAN.to_be_bytes()).unwrap(), "NaN");
        // PostgreSQL's notation: plain for exponents -4 to 14 (float4: to 5), else e+NN.
        let f8 = |v: f64| text_of(Wire::Float8, &v.to_be_bytes()).unwrap().into_owned();
        let f4 = |v: f32| text_of(Wire::Float4, &v.to_be_bytes()).unwrap().into_owned();
        assert_eq!(
            (f8(1e15), f8(1.5e15), f8(123456789012345.0), f8(0.0001), f8(1.5e-5)),
            ("1e+15".into(), "1.5e+15".into(), "123456789012345".into(), "0.0001".into(), "1.5e-05".into())
        );
        assert_eq!((f8(-2.5e100), f8(0.0), f8(-0.0)), ("-2.5e+100".into(), "0".into(), "-0".into()));
        assert_eq!(
            (f4(1e6), f4(123456.0), f4(1.1), f4(3.4028235e38)),
            ("1e+06".into(), "123456".into(), "1.1".into(), "3.4028235e+38".into())
        );
        // Dates past chrono's range, as PostgreSQL prints them.
        let last = (2_147_483_493i64 - 2_440_588) as i32; // Julian day of 5874897-12-31, the last date
        assert_eq!(text_of(Wire::Date, &(last - EPOCH_DAYS as i32).to_be_bytes()).unwrap(), "5874897-12-31");
        let last_micro = 9_223_371_331_199_999_999i64; // PostgreSQL's last timestamp
        assert_eq!(text_of(Wire::Timestamp, &last_micro.to_be_bytes()).unwrap(), "294276-12-31 23:59:59.999999");
        // An int into a VARCHAR column (a column retyped by a mapping) is its text.
        assert_eq!(fit_binary(Wire::Int8, ColumnType::Varchar, &42i64.to_be_bytes()), Some(Fit::Text("42".into())));
        assert_eq!(text_of(Wire::Bytea, &[0, 0xab]).unwrap(), "\\x00ab");
        assert_eq!(text_of(Wire::Bool, &[1]).unwrap(), "t");
    }
}
