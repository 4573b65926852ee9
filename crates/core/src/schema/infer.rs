//! Inference: which column type a JSON value suggests, and whether a value fits a column.

use std::borrow::Cow;

use chrono::{DateTime, NaiveDate};
use serde_json::Value;

use super::ColumnType;

/// What a JSON scalar looks like, finer than JSON's own types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueKind {
    /// null
    Null,
    /// true / false
    Bool,
    /// an integer that fits i64
    Int,
    /// any other number
    Float,
    /// an RFC 3339 date-time string
    Timestamp,
    /// a `YYYY-MM-DD` string
    Date,
    /// any other string
    Text,
    /// an array, or an object below the flattening depth
    Nested,
}

impl ValueKind {
    /// The column type a new column gets when this is its first value.
    pub fn column_type(self) -> Option<ColumnType> {
        Some(match self {
            Self::Null => return None,
            Self::Bool => ColumnType::Boolean,
            Self::Int => ColumnType::Bigint,
            Self::Float => ColumnType::Double,
            Self::Timestamp => ColumnType::Timestamptz,
            Self::Date => ColumnType::Date,
            Self::Text => ColumnType::Varchar,
            Self::Nested => ColumnType::Json,
        })
    }
}

/// Classify a value.
pub fn kind_of(value: &Value) -> ValueKind {
    match value {
        Value::Null => ValueKind::Null,
        Value::Bool(_) => ValueKind::Bool,
        Value::Number(n) if n.is_i64() => ValueKind::Int,
        Value::Number(_) => ValueKind::Float,
        Value::String(s) => kind_of_text(s),
        Value::Array(_) | Value::Object(_) => ValueKind::Nested,
    }
}

/// Classify a string value.
pub fn kind_of_text(s: &str) -> ValueKind {
    if parse_timestamp(s).is_some() {
        ValueKind::Timestamp
    } else if parse_date(s).is_some() {
        ValueKind::Date
    } else {
        ValueKind::Text
    }
}

/// How a string value goes into a TIMESTAMPTZ or DATE column (the columns strings are inferred
/// as besides VARCHAR), as [`fit`] decides it.
pub fn fit_instant(ty: ColumnType, s: &str) -> Option<Fit<'static>> {
    match ty {
        ColumnType::Timestamptz => Some(match parse_timestamp(s) {
            Some(us) => Fit::Micros(us),
            None => Fit::Misfit(NOT_RFC3339),
        }),
        ColumnType::Date => Some(match parse_date(s) {
            Some(days) => Fit::Days(days),
            None => Fit::Misfit(NOT_DATE),
        }),
        _ => None,
    }
}

const NOT_RFC3339: &str = "not an RFC 3339 timestamp";
const NOT_DATE: &str = "not a YYYY-MM-DD date";

/// How a value goes into a column of a given type.
#[derive(Debug, Clone, PartialEq)]
pub enum Fit<'a> {
    /// Store as NULL (the value was null).
    Null,
    /// Store this boolean.
    Bool(bool),
    /// Store this integer.
    Int(i64),
    /// Store this float.
    Float(f64),
    /// Store this text.
    Text(Cow<'a, str>),
    /// Store this instant (UTC microseconds).
    Micros(i64),
    /// Store this date (days since the epoch).
    Days(i32),
    /// Store this unscaled decimal.
    Decimal(i128),
    /// Store these bytes.
    Bytes(Vec<u8>),
    /// A BIGINT column must become DOUBLE to hold this float.
    Widen(f64),
    /// Does not fit: NULL plus a ledger row with this reason.
    Misfit(&'static str),
}

/// Decide how `value` goes into a column of type `ty`.
pub fn fit(ty: ColumnType, value: &Value) -> Fit<'_> {
    match (ty, value) {
        (_, Value::Null) => Fit::Null,
        (ColumnType::Boolean, Value::Bool(b)) => Fit::Bool(*b),
        // One rule for numbers in a BIGINT column: a value that is a whole number within
        // BIGINT's range is stored as one, however it is written (`-0`, `1.0`, `1e3`); any other
        // number (a fraction, or beyond ±2^63, `18446744073709551615` included) widens the
        // column to DOUBLE.
        (ColumnType::Bigint, Value::Number(n)) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => Fit::Int(i),
            (None, Some(f))
                if f.fract() == 0.0 && (-9.223_372_036_854_776e18..9.223_372_036_854_776e18).contains(&f) =>
            {
                Fit::Int(f as i64)
            }
            (None, Some(f)) => Fit::Widen(f),
            _ => Fit::Misfit("number out of range for DOUBLE"),
        },
        (ColumnType::Double, Value::Number(n)) => match n.as_f64() {
            Some(f) => Fit::Float(f),
            None => Fit::Misfit("number out of range for DOUBLE"),
        },
        (ColumnType::Varchar, Value::String(s)) => Fit::Text(Cow::Borrowed(s)),
        (ColumnType::Varchar, Value::Bool(_) | Value::Number(_)) => Fit::Text(Cow::Owned(value.to_string())),
        (ColumnType::Varchar, Value::Array(_) | Value::Object(_)) => Fit::Text(Cow::Owned(json_text(value))),
        (ColumnType::Json, _) => Fit::Text(Cow::Owned(json_text(value))),
        (ColumnType::Timestamptz | ColumnType::Date, Value::String(s)) => {
            fit_instant(ty, s).unwrap_or(Fit::Misfit(NOT_RFC3339))
        }
        (ColumnType::Decimal(precision, scale), Value::Number(n)) => decimal(&n.to_string(), precision, scale),
        (ColumnType::Decimal(precision, scale), Value::String(s)) => decimal(s, precision, scale),
        (ColumnType::Decimal(..), _) => Fit::Misfit("not a decimal number"),
        (ColumnType::Timestamp, Value::String(s)) => match parse_timestamp(s).or_else(|| parse_naive(s)) {
            Some(us) => Fit::Micros(us),
            None => Fit::Misfit("not a date and time"),
        },
        (ColumnType::Time, Value::String(s)) => match chrono::NaiveTime::parse_from_str(s, "%H:%M:%S%.f") {
            Ok(t) => Fit::Micros(
                i64::from(chrono::Timelike::num_seconds_from_midnight(&t)) * 1_000_000
                    + i64::from(chrono::Timelike::nanosecond(&t) / 1000),
            ),
            Err(_) => Fit::Misfit("not a time of day (HH:MM:SS)"),
        },
        (ColumnType::Uuid, Value::String(s)) if is_uuid(s) => Fit::Text(Cow::Borrowed(s)),
        (ColumnType::Uuid, _) => Fit::Misfit("not a UUID"),
        (ColumnType::Interval, Value::String(s)) if is_duration(s) => Fit::Text(Cow::Borrowed(s)),
        (ColumnType::Interval, _) => Fit::Misfit("not a duration ([-]H:MM:SS[.ffffff])"),
        (ColumnType::Blob, Value::String(s)) => match s.strip_prefix("\\x").and_then(hex_bytes) {
            Some(bytes) => Fit::Bytes(bytes),
            None => Fit::Misfit("not \\x-prefixed hex bytes"),
        },
        (ColumnType::Blob, _) => Fit::Misfit("not a string"),
        (ColumnType::List(item), Value::Array(items)) => {
            if items.iter().all(|v| list_item_fits(item, v)) {
                Fit::Text(Cow::Owned(value.to_string()))
            } else {
                Fit::Misfit("an item of the array does not fit the list's item type")
            }
        }
        (ColumnType::List(_), _) => Fit::Misfit("not an array"),
        (ColumnType::Timestamp | ColumnType::Time, _) => Fit::Misfit("not a string"),
        (ColumnType::Boolean, _) => Fit::Misfit("not a boolean"),
        (ColumnType::Bigint | ColumnType::Double, _) => Fit::Misfit("not a number"),
        (ColumnType::Timestamptz | ColumnType::Date, _) => Fit::Misfit("not a string"),
    }
}

/// Decide how PostgreSQL's text output of a value (as `COPY` prints it, with `TimeZone` UTC and
/// `DateStyle` ISO) goes into a column of type `ty`. The text is borrowed where it can be.
pub fn fit_text(ty: ColumnType, text: &str) -> Fit<'_> {
    match ty {
        ColumnType::Boolean => match text {
            "t" | "true" => Fit::Bool(true),
            "f" | "false" => Fit::Bool(false),
            _ => Fit::Misfit("not a boolean"),
        },
        ColumnType::Bigint => match text.parse::<i64>() {
            Ok(i) => Fit::Int(i),
            Err(_) => match text.parse::<f64>() {
                Ok(f) if f.is_finite() => Fit::Widen(f),
                _ => Fit::Misfit("integer out of range for BIGINT"),
            },
        },
        ColumnType::Double => match text.parse::<f64>() {
            Ok(f) => Fit::Float(f),
            Err(_) => Fit::Misfit("not a number"),
        },
        ColumnType::Varchar => Fit::Text(Cow::Borrowed(text)),
        // PostgreSQL prints jsonb with spaces (`{"a": 1}`); a change's image comes as parsed JSON
        // and is stored compact (`{"a":1}`). One form for both, or a keyless table (matched on
        // the whole row) could not find a snapshot row again.
        ColumnType::Json => match serde_json::from_str::<Value>(text) {
            Ok(v) => Fit::Text(Cow::Owned(v.to_string())),
            Err(_) => Fit::Text(Cow::Borrowed(text)),
        },
        ColumnType::Timestamptz => match pg_timestamp(text, true) {
            Some(us) => Fit::Micros(us),
            None => Fit::Misfit("not a timestamp with time zone"),
        },
        ColumnType::Timestamp => match pg_timestamp(text, false) {
            Some(us) => Fit::Micros(us),
            None => Fit::Misfit("not a date and time"),
        },
        ColumnType::Date => match text.as_bytes() {
            [_, _, _, _, b'-', _, _, b'-', _, _] => match civil_days(text) {
                Some(days) => Fit::Days(days),
                None => Fit::Misfit("not a YYYY-MM-DD date"),
            },
            _ => Fit::Misfit("not a YYYY-MM-DD date"),
        },
        ColumnType::Decimal(precision, scale) => decimal(text, precision, scale),
        ColumnType::Uuid if is_uuid(text) => Fit::Text(Cow::Borrowed(text)),
        ColumnType::Uuid => Fit::Misfit("not a UUID"),
        ColumnType::Time | ColumnType::Blob | ColumnType::Interval => {
            fit(ty, &Value::String(text.to_string())).into_owned()
        }
        // The list arrives as JSON text (`to_json` of a Postgres array).
        ColumnType::List(_) => match serde_json::from_str::<Value>(text) {
            Ok(v) => fit(ty, &v).into_owned(),
            Err(_) => Fit::Misfit("not a JSON array"),
        },
    }
}

/// Whether `s` is `[-]H:MM:SS[.ffffff]`: the duration text Debezium's times become.
fn is_duration(s: &str) -> bool {
    let s = s.strip_prefix('-').unwrap_or(s);
    let (whole, fraction) = s.split_once('.').unwrap_or((s, "0"));
    let mut parts = whole.split(':');
    let (Some(h), Some(m), Some(sec), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
        return false;
    };
    let digits =
        |t: &str, n: std::ops::RangeInclusive<usize>| n.contains(&t.len()) && t.bytes().all(|b| b.is_ascii_digit());
    digits(h, 1..=9) && digits(m, 2..=2) && digits(sec, 2..=2) && digits(fraction, 1..=6) && m < "60" && sec < "60"
}

/// Whether one JSON array item fits a list of `item`s (NULL always does).
fn list_item_fits(item: crate::schema::Scalar, v: &Value) -> bool {
    use crate::schema::Scalar;
    match (item, v) {
        (_, Value::Null) => true,
        (Scalar::Boolean, Value::Bool(_)) => true,
        (Scalar::Bigint, Value::Number(n)) => n.is_i64(),
        (Scalar::Double, Value::Number(_)) => true,
        (Scalar::Varchar, Value::String(_)) => true,
        _ => false,
    }
}

/// The items of a list value (the JSON text a list column holds): `None` for NULL items.
pub fn list_items(text: &str) -> Vec<Value> {
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Array(items)) => items,
        _ => Vec::new(),
    }
}

/// Days since the epoch of the `YYYY-MM-DD` at the start of `s`.
fn civil_days(s: &str) -> Option<i32> {
    let b = s.as_bytes();
    let n = |r: std::ops::Range<usize>| -> Option<u32> {
        b.get(r)?.iter().try_fold(0u32, |acc, d| d.is_ascii_digit().then(|| acc * 10 + u32::from(d - b'0')))
    };
    let date = NaiveDate::from_ymd_opt(i32::try_from(n(0..4)?).ok()?, n(5..7)?, n(8..10)?)?;
    Some(chrono::Datelike::num_days_from_ce(&date) - 719_163)
}

/// `YYYY-MM-DD HH:MM:SS[.ffffff][+HH[:MM[:SS]]]` as microseconds (UTC when `zoned`).
fn pg_timestamp(s: &str, zoned: bool) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() < 19 || b[4] != b'-' || b[7] != b'-' || b[10] != b' ' || b[13] != b':' || b[16] != b':' {
        return None;
    }
    let n = |r: std::ops::Range<usize>| -> Option<i64> {
        b.get(r)?.iter().try_fold(0i64, |acc, d| d.is_ascii_digit().then(|| acc * 10 + i64::from(d - b'0')))
    };
    let days = i64::from(civil_days(s)?);
    let (h, m, sec) = (n(11..13)?, n(14..16)?, n(17..19)?);
    if h > 23 || m > 59 || sec > 60 {
        return None;
    }
    let mut i = 19;
    let mut micros = 0i64;
    if b.get(i) == Some(&b'.') {
        let start = i + 1;
        i = start;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        let digits = &s[start..i];
        if digits.is_empty() || digits.len() > 6 {
            return None;
        }
        micros = digits.parse::<i64>().ok()? * 10i64.pow(6 - digits.len() as u32);
    }
    let mut offset = 0i64;
    if zoned {
        let sign = match b.get(i) {
            Some(b'+') => 1,
            Some(b'-') => -1,
            _ => return None,
        };
        let parts: Vec<&str> = s.get(i + 1..)?.split(':').collect();
        if parts.is_empty() || parts.len() > 3 || parts.iter().any(|p| p.len() != 2) {
            return None;
        }
        let units = [3600, 60, 1];
        for (p, unit) in parts.iter().zip(units) {
            offset += p.parse::<i64>().ok()? * unit;
        }
        offset *= sign;
    } else if i != b.len() {
        return None;
    }
    Some(((days * 86_400 + h * 3600 + m * 60 + sec) - offset) * 1_000_000 + micros)
}

/// Decimal text (`-12.5`, `3e2` is refused) scaled to `scale` places, within `precision` digits.
fn decimal(text: &str, precision: u8, scale: u8) -> Fit<'static> {
    match parse_decimal(text, scale) {
        Some(v) if fits_precision(v, precision) => Fit::Decimal(v),
        _ => Fit::Misfit("not a decimal that fits the column's precision and scale"),
    }
}

/// Whether an unscaled decimal has at most `precision` digits (38 at most, a DECIMAL's).
pub(crate) fn fits_precision(unscaled: i128, precision: u8) -> bool {
    unscaled.unsigned_abs() < 10u128.pow(u32::from(precision.min(38)))
}

/// The unscaled value of `text` at `scale` places; `None` if it has more places or digits.
pub fn parse_decimal(text: &str, scale: u8) -> Option<i128> {
    let (negative, digits) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    let (whole, fraction) = digits.split_once('.').unwrap_or((digits, ""));
    if whole.is_empty() && fraction.is_empty()
        || !whole.bytes().all(|b| b.is_ascii_digit())
        || !fraction.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let fraction = fraction.trim_end_matches('0');
    if fraction.len() > usize::from(scale) {
        return None;
    }
    let mut value: i128 = 0;
    for b in whole.bytes().chain(fraction.bytes()) {
        value = value.checked_mul(10)?.checked_add(i128::from(b - b'0'))?;
    }
    for _ in fraction.len()..usize::from(scale) {
        value = value.checked_mul(10)?;
    }
    if value >= 10i128.pow(38) {
        return None;
    }
    Some(if negative { -value } else { value })
}

/// `YYYY-MM-DDTHH:MM:SS[.f]` without an offset, as microseconds.
fn parse_naive(s: &str) -> Option<i64> {
    let t = chrono::NaiveDateTime::parse_from_str(s.trim_end_matches('Z'), "%Y-%m-%dT%H:%M:%S%.f").ok()?;
    Some(t.and_utc().timestamp_micros())
}

/// Pairs of hex digits as bytes.
fn hex_bytes(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}

/// 8-4-4-4-12 hex digits.
fn is_uuid(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 36
        && b.iter()
            .enumerate()
            .all(|(i, c)| if matches!(i, 8 | 13 | 18 | 23) { *c == b'-' } else { c.is_ascii_hexdigit() })
}

/// RFC 3339 with a time and an offset, as UTC microseconds.
fn parse_timestamp(s: &str) -> Option<i64> {
    // Cheap shape check first: the common non-timestamp string fails here.
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    DateTime::parse_from_rfc3339(s).ok().map(|t| t.timestamp_micros())
}

/// `YYYY-MM-DD`, as days since the epoch.
fn parse_date(s: &str) -> Option<i32> {
    let b = s.as_bytes();
    if b.len() != 10 || b[4] != b'-' || b[7] != b'-' {
        return None;
    }
    let date = NaiveDate::parse_from_str(s, "%Y-%m-%d").ok()?;
    let epoch = NaiveDate::from_ymd_opt(1970, 1, 1)?;
    i32::try_from((date - epoch).num_days()).ok()
}

impl Fit<'_> {
    /// The same decision, owning its text.
    pub fn into_owned(self) -> Fit<'static> {
        match self {
            Fit::Null => Fit::Null,
            Fit::Bool(b) => Fit::Bool(b),
            Fit::Int(i) => Fit::Int(i),
            Fit::Float(f) => Fit::Float(f),
            Fit::Text(t) => Fit::Text(Cow::Owned(t.into_owned())),
            Fit::Micros(us) => Fit::Micros(us),
            Fit::Days(d) => Fit::Days(d),
            Fit::Decimal(d) => Fit::Decimal(d),
            Fit::Bytes(b) => Fit::Bytes(b),
            Fit::Widen(f) => Fit::Widen(f),
            Fit::Misfit(r) => Fit::Misfit(r),
        }
    }
}

/// A value's JSON text, the same as its `Display` writes, but written straight into the
/// string's bytes rather than through a formatter: 4% of `scripts/bench-decode.sh`, whose
/// events each carry an array.
fn json_text(value: &Value) -> String {
    serde_json::to_string(value).unwrap_or_else(|_| value.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_text_is_the_text_display_gives() {
        let values = [
            json!(["t1", "t\"2\\", "\u{0}\u{1F600}é", 1, -2, 1.5, 1e300, 0.1, null, true, [], {}]),
            json!({"b": {"a": [1, {"z": "\n"}]}, "a": -0.0, "": u64::MAX}),
        ];
        for value in values {
            assert_eq!(json_text(&value), value.to_string());
        }
    }

    #[test]
    fn postgres_text() {
        assert_eq!(fit_text(ColumnType::Timestamptz, "1970-01-01 00:00:01.5+00"), Fit::Micros(1_500_000));
        assert_eq!(
            fit_text(ColumnType::Timestamptz, "2024-01-01 10:00:00+02"),
            fit_text(ColumnType::Timestamptz, "2024-01-01 08:00:00+00")
        );
        assert_eq!(fit_text(ColumnType::Timestamptz, "1969-12-31 23:59:59.999999+00"), Fit::Micros(-1));
        assert_eq!(
            fit_text(ColumnType::Timestamptz, "2024-01-01 05:30:00+05:30"),
            fit_text(ColumnType::Timestamptz, "2024-01-01 00:00:00+00")
        );
        assert!(matches!(fit_text(ColumnType::Timestamptz, "infinity"), Fit::Misfit(_)));
        assert_eq!(fit_text(ColumnType::Timestamp, "1970-01-02 00:00:00"), Fit::Micros(86_400_000_000));
        assert!(matches!(fit_text(ColumnType::Timestamp, "1970-01-02 00:00:00+00"), Fit::Misfit(_)));
        assert_eq!(fit_text(ColumnType::Date, "1970-01-11"), Fit::Days(10));
        assert!(matches!(fit_text(ColumnType::Date, "2024-02-30"), Fit::Misfit(_)));
        assert_eq!(fit_text(ColumnType::Bigint, "-42"), Fit::Int(-42));
        assert_eq!(fit_text(ColumnType::Boolean, "t"), Fit::Bool(true));
        assert_eq!(fit_text(ColumnType::Decimal(4, 2), "12.5"), Fit::Decimal(1250));
        assert!(matches!(fit_text(ColumnType::Decimal(4, 2), "123.5"), Fit::Misfit(_)));
        assert_eq!(fit_text(ColumnType::Blob, "\\x0aff"), Fit::Bytes(vec![10, 255]));
        let ints = ColumnType::List(crate::schema::Scalar::Bigint);
        assert_eq!(fit_text(ints, "[1,null,3]"), Fit::Text("[1,null,3]".into()));
        assert!(matches!(fit_text(ints, "[1.5]"), Fit::Misfit(_)));
        assert!(matches!(fit_text(ints, "[[1]]"), Fit::Misfit(_)));
        assert_eq!(ColumnType::from_sql("VARCHAR[]"), Some(ColumnType::List(crate::schema::Scalar::Varchar)));
        assert_eq!(ColumnType::from_sql("DECIMAL(12,2)"), Some(ColumnType::Decimal(12, 2)));
    }

    #[test]
    fn kinds() {
        assert_eq!(kind_of(&json!(1)), ValueKind::Int);
        assert_eq!(kind_of(&json!(1.5)), ValueKind::Float);
        assert_eq!(kind_of(&json!("2024-05-01T10:00:00+02:00")), ValueKind::Timestamp);
        assert_eq!(kind_of(&json!("2024-05-01")), ValueKind::Date);
        assert_eq!(kind_of(&json!("2024-05-01 but not")), ValueKind::Text);
        assert_eq!(kind_of(&json!([1])), ValueKind::Nested);
    }

    #[test]
    fn fits() {
        assert_eq!(fit(ColumnType::Bigint, &json!(2.5)), Fit::Widen(2.5));
        assert_eq!(fit(ColumnType::Double, &json!(2)), Fit::Float(2.0));
        assert_eq!(fit(ColumnType::Varchar, &json!(2)), Fit::Text(Cow::Borrowed("2")));
        assert!(matches!(fit(ColumnType::Bigint, &json!("x")), Fit::Misfit(_)));
        assert_eq!(fit(ColumnType::Timestamptz, &json!("1970-01-01T00:00:01Z")), Fit::Micros(1_000_000));
        assert!(matches!(fit(ColumnType::Boolean, &json!(1)), Fit::Misfit(_)));
    }
}
