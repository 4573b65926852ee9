//! Debezium's logical types, when the event carries its schema: the wire value (epoch days,
//! base64 unscaled decimals, …) becomes the value users expect.
//!
//! Column types are decided per logical type, never from the first value seen:
//! - `MicroTime`, `NanoTime` and `Time` from a MySQL or MariaDB connector are a `TIME` column
//!   there, which is a duration (-838:59:59 to 838:59:59): always `INTERVAL`. From the other
//!   connectors they are a time of day: `TIME`.
//! - `VariableScaleDecimal` (an unconstrained `numeric`: any precision, a scale per value) is
//!   `VARCHAR` holding the exact decimal text; no `DECIMAL(p,s)` holds every value.
//!
//! A value that cannot be converted becomes NULL in its column, with a ledger row for that
//! column; the rest of the change is applied.

use serde_json::{Map, Value};

use crate::schema::ColumnType;

/// The field list of `field` (`before` or `after`) in an envelope schema.
pub fn fields_of<'a>(schema: &'a Value, field: &str) -> Option<&'a Vec<Value>> {
    let envelope = schema.get("fields")?.as_array()?;
    let image = envelope.iter().find(|f| f.get("field").and_then(Value::as_str) == Some(field))?;
    image.get("fields")?.as_array()
}

/// What converting an image's logical types found.
#[derive(Debug, Default, PartialEq)]
pub struct Typed {
    /// Each converted column's type (and that of each value that could not be converted).
    pub types: Vec<(String, ColumnType)>,
    /// Columns whose value could not be converted, and why: the value stays as sent.
    pub unconverted: Vec<(String, String)>,
}

/// Convert every field of `image` whose schema names a logical type; `binlog` when the event
/// comes from a MySQL or MariaDB connector. A value that cannot be converted stays as it is,
/// named in [`Typed::unconverted`], when its logical type has a column type; otherwise the
/// event cannot be used.
pub fn apply(image: &mut Map<String, Value>, fields: &[Value], binlog: bool) -> Result<Typed, String> {
    let mut typed = Typed::default();
    for f in fields {
        let (Some(name), Some(logical)) =
            (f.get("field").and_then(Value::as_str), f.get("name").and_then(Value::as_str))
        else {
            continue;
        };
        let Some(value) = image.get_mut(name) else { continue };
        if value.is_null() {
            continue;
        }
        match convert(logical, value, f.get("parameters"), binlog) {
            Ok(Some((v, ty))) => {
                *value = v;
                if let Some(ty) = ty {
                    typed.types.push((name.to_string(), ty));
                }
            }
            Ok(None) => {}
            Err(why) => match fallback_type(logical, f.get("parameters"), binlog) {
                // NULL in its column plus a ledger row; the rest of the change still applies.
                Some(ty) => {
                    typed.types.push((name.to_string(), ty));
                    typed.unconverted.push((name.to_string(), format!("{logical}: {why}")));
                }
                None => return Err(format!("field `{name}` ({logical}): {why}")),
            },
        }
    }
    Ok(typed)
}

/// The column type of a logical type whose value could not be converted, where it has one.
fn fallback_type(logical: &str, parameters: Option<&Value>, binlog: bool) -> Option<ColumnType> {
    Some(match logical {
        "org.apache.kafka.connect.data.Decimal" => {
            ColumnType::Decimal(38, scale_of(parameters).filter(|s| *s <= 38)? as u8)
        }
        "io.debezium.data.VariableScaleDecimal" => ColumnType::Varchar,
        "io.debezium.time.Date" | "org.apache.kafka.connect.data.Date" => ColumnType::Date,
        "io.debezium.time.Timestamp"
        | "org.apache.kafka.connect.data.Timestamp"
        | "io.debezium.time.MicroTimestamp"
        | "io.debezium.time.NanoTimestamp" => ColumnType::Timestamp,
        "io.debezium.time.Time"
        | "org.apache.kafka.connect.data.Time"
        | "io.debezium.time.MicroTime"
        | "io.debezium.time.NanoTime" => time_type(binlog),
        _ => return None,
    })
}

/// A MySQL/MariaDB `TIME` is a duration; elsewhere a time is a time of day.
fn time_type(binlog: bool) -> ColumnType {
    if binlog { ColumnType::Interval } else { ColumnType::Time }
}

fn scale_of(parameters: Option<&Value>) -> Option<u32> {
    parameters
        .and_then(|p| p.get("scale"))
        .and_then(|s| s.as_str().map(str::to_string).or_else(|| s.as_i64().map(|i| i.to_string())))
        .and_then(|s| s.parse::<u32>().ok())
}

/// A converted value, and the column type it declares (none: the type is inferred from it).
type Converted = (Value, Option<ColumnType>);

fn convert(
    logical: &str,
    value: &Value,
    parameters: Option<&Value>,
    binlog: bool,
) -> Result<Option<Converted>, String> {
    let int = || value.as_i64().ok_or("expected an integer");
    let time = |us: i64| -> Result<Converted, String> {
        let text = if binlog { duration(us) } else { time_of_day(us)? };
        Ok((text, Some(time_type(binlog))))
    };
    Ok(Some(match logical {
        "org.apache.kafka.connect.data.Decimal" => {
            let scale = scale_of(parameters).ok_or("no scale parameter")?;
            decimal(value.as_str().ok_or("expected base64 text")?, scale)?
        }
        "io.debezium.data.VariableScaleDecimal" => {
            let scale = value.get("scale").and_then(Value::as_u64).ok_or("no scale")?;
            let scale = u32::try_from(scale).map_err(|_| "scale out of range")?;
            let text = exact_decimal(value.get("value").and_then(Value::as_str).ok_or("no value")?, scale)?;
            (Value::String(text), Some(ColumnType::Varchar))
        }
        "io.debezium.time.Date" | "org.apache.kafka.connect.data.Date" => {
            let day = i32::try_from(int()?)
                .ok()
                .and_then(|d| d.checked_add(719_163))
                .and_then(chrono::NaiveDate::from_num_days_from_ce_opt)
                .ok_or("date out of range")?;
            (Value::String(day.format("%Y-%m-%d").to_string()), None)
        }
        "io.debezium.time.Timestamp" | "org.apache.kafka.connect.data.Timestamp" => {
            (naive(int()?.checked_mul(1000).ok_or("time out of range")?)?, Some(ColumnType::Timestamp))
        }
        "io.debezium.time.MicroTimestamp" => (naive(int()?)?, Some(ColumnType::Timestamp)),
        "io.debezium.time.NanoTimestamp" => (naive(int()? / 1000)?, Some(ColumnType::Timestamp)),
        "io.debezium.time.ZonedTimestamp" => (value.clone(), Some(ColumnType::Timestamptz)),
        "io.debezium.time.Time" | "org.apache.kafka.connect.data.Time" => {
            time(int()?.checked_mul(1000).ok_or("time out of range")?)?
        }
        "io.debezium.time.MicroTime" => time(int()?)?,
        "io.debezium.time.NanoTime" => time(int()? / 1000)?,
        "io.debezium.data.Uuid" => (value.clone(), Some(ColumnType::Uuid)),
        "io.debezium.data.Json" => match value.as_str() {
            // One JSON value, not flattened into columns: its text, compact as any JSON column's.
            Some(text) => {
                let document: Value = serde_json::from_str(text).map_err(|_| "not JSON text")?;
                (Value::String(document.to_string()), Some(ColumnType::Json))
            }
            None => return Ok(None),
        },
        _ => return Ok(None),
    }))
}

/// An unscaled big-endian two's-complement integer (base64) with `scale`, as decimal text.
fn decimal(b64: &str, scale: u32) -> Result<Converted, String> {
    use base64::Engine;
    let bytes = base64::engine::general_purpose::STANDARD.decode(b64).map_err(|_| "bad base64")?;
    if scale > 38 {
        return Err("a scale above 38 does not fit DECIMAL(38)".into());
    }
    if bytes.is_empty() || bytes.len() > 16 {
        return Err("unscaled value must be 1 to 16 bytes".into());
    }
    let mut buf = if bytes[0] & 0x80 != 0 { [0xFFu8; 16] } else { [0u8; 16] };
    buf[16 - bytes.len()..].copy_from_slice(&bytes);
    let unscaled = i128::from_be_bytes(buf);
    let text = scaled(unscaled < 0, unscaled.unsigned_abs().to_string(), scale as usize);
    Ok((Value::String(text), Some(ColumnType::Decimal(38, scale as u8))))
}

/// Epoch microseconds as a zoneless date-time text.
fn naive(us: i64) -> Result<Value, String> {
    let t = chrono::DateTime::from_timestamp_micros(us).ok_or("time out of range")?;
    Ok(Value::String(t.naive_utc().format("%Y-%m-%dT%H:%M:%S%.f").to_string()))
}

/// Microseconds as a signed duration text, `[-]H:MM:SS.ffffff`, any number of hours.
fn duration(us: i64) -> Value {
    let sign = if us < 0 { "-" } else { "" };
    let us = us.unsigned_abs();
    let (secs, micros) = (us / 1_000_000, us % 1_000_000);
    Value::String(format!("{sign}{}:{:02}:{:02}.{micros:06}", secs / 3600, secs / 60 % 60, secs % 60))
}

/// The longest unscaled value taken: 2,048 bytes, about 4,900 digits.
const MAX_UNSCALED_BYTES: usize = 2048;
/// The largest scale taken: Postgres' largest `numeric` scale.
const MAX_SCALE: u32 = 16_383;

/// An unscaled big-endian two's-complement integer of up to [`MAX_UNSCALED_BYTES`] (base64) with `scale`, as
/// exact decimal text.
fn exact_decimal(b64: &str, scale: u32) -> Result<String, String> {
    use base64::Engine;
    let mut bytes = base64::engine::general_purpose::STANDARD.decode(b64).map_err(|_| "bad base64")?;
    if bytes.is_empty() || bytes.len() > MAX_UNSCALED_BYTES {
        return Err(format!("the unscaled value must be 1 to {MAX_UNSCALED_BYTES} bytes"));
    }
    if scale > MAX_SCALE {
        return Err(format!("a scale above {MAX_SCALE} (Postgres' largest)"));
    }
    let negative = bytes[0] & 0x80 != 0;
    if negative {
        // Two's complement: invert and add one for the magnitude.
        for b in bytes.iter_mut() {
            *b = !*b;
        }
        for b in bytes.iter_mut().rev() {
            let (v, carry) = b.overflowing_add(1);
            *b = v;
            if !carry {
                break;
            }
        }
    }
    // Base 256 to base 10 by repeated division.
    let mut digits = Vec::new();
    while bytes.iter().any(|b| *b != 0) {
        let mut rem = 0u32;
        for b in bytes.iter_mut() {
            let cur = (rem << 8) | u32::from(*b);
            *b = (cur / 10) as u8;
            rem = cur % 10;
        }
        digits.push(b'0' + rem as u8);
    }
    if digits.is_empty() {
        digits.push(b'0');
    }
    digits.reverse();
    let digits = String::from_utf8(digits).expect("ASCII digits");
    Ok(scaled(negative, digits, scale as usize))
}

/// The decimal text of an unscaled magnitude's `digits` with `scale` digits after the point.
fn scaled(negative: bool, digits: String, scale: usize) -> String {
    let text = if scale == 0 {
        digits
    } else if digits.len() > scale {
        format!("{}.{}", &digits[..digits.len() - scale], &digits[digits.len() - scale..])
    } else {
        format!("0.{}{digits}", "0".repeat(scale - digits.len()))
    };
    if negative { format!("-{text}") } else { text }
}

fn time_of_day(us: i64) -> Result<Value, String> {
    if !(0..86_400_000_000).contains(&us) {
        return Err("time of day out of range".into());
    }
    let t = chrono::NaiveTime::from_num_seconds_from_midnight_opt(
        (us / 1_000_000) as u32,
        ((us % 1_000_000) * 1000) as u32,
    )
    .ok_or("time of day out of range")?;
    Ok(Value::String(t.format("%H:%M:%S%.6f").to_string()))
}
