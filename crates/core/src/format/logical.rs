//! Debezium's logical types, when the event carries its schema: the wire value (epoch days,
//! base64 unscaled decimals, …) becomes the value users expect.

use serde_json::{Map, Value};

/// The field list of `field` (`before` or `after`) in an envelope schema.
pub fn fields_of<'a>(schema: &'a Value, field: &str) -> Option<&'a Vec<Value>> {
    let envelope = schema.get("fields")?.as_array()?;
    let image = envelope.iter().find(|f| f.get("field").and_then(Value::as_str) == Some(field))?;
    image.get("fields")?.as_array()
}

/// Convert every field of `image` whose schema names a logical type.
pub fn apply(image: &mut Map<String, Value>, fields: &[Value]) -> Result<(), String> {
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
        let converted =
            convert(logical, value, f.get("parameters")).map_err(|why| format!("field `{name}` ({logical}): {why}"))?;
        if let Some(v) = converted {
            *value = v;
        }
    }
    Ok(())
}

fn convert(logical: &str, value: &Value, parameters: Option<&Value>) -> Result<Option<Value>, String> {
    let int = || value.as_i64().ok_or("expected an integer");
    Ok(Some(match logical {
        "org.apache.kafka.connect.data.Decimal" => {
            let scale = parameters
                .and_then(|p| p.get("scale"))
                .and_then(|s| s.as_str().map(str::to_string).or_else(|| s.as_i64().map(|i| i.to_string())))
                .and_then(|s| s.parse::<u32>().ok())
                .ok_or("no scale parameter")?;
            decimal(value.as_str().ok_or("expected base64 text")?, scale)?
        }
        "io.debezium.data.VariableScaleDecimal" => {
            let scale = value.get("scale").and_then(Value::as_u64).ok_or("no scale")? as u32;
            decimal(value.get("value").and_then(Value::as_str).ok_or("no value")?, scale)?
        }
        "io.debezium.time.Date" | "org.apache.kafka.connect.data.Date" => {
            let day = i32::try_from(int()?)
                .ok()
                .and_then(|d| d.checked_add(719_163))
                .and_then(chrono::NaiveDate::from_num_days_from_ce_opt)
                .ok_or("date out of range")?;
            Value::String(day.format("%Y-%m-%d").to_string())
        }
        "io.debezium.time.Timestamp" | "org.apache.kafka.connect.data.Timestamp" => {
            typed(naive(int()?.checked_mul(1000).ok_or("time out of range")?)?, "TIMESTAMP")
        }
        "io.debezium.time.MicroTimestamp" => typed(naive(int()?)?, "TIMESTAMP"),
        "io.debezium.time.NanoTimestamp" => typed(naive(int()? / 1000)?, "TIMESTAMP"),
        "io.debezium.time.ZonedTimestamp" => typed(value.clone(), "TIMESTAMPTZ"),
        "io.debezium.time.Time" | "org.apache.kafka.connect.data.Time" => {
            typed(time_of_day(int()?.checked_mul(1000).ok_or("time out of range")?)?, "TIME")
        }
        "io.debezium.time.MicroTime" => typed(time_of_day(int()?)?, "TIME"),
        "io.debezium.time.NanoTime" => typed(time_of_day(int()? / 1000)?, "TIME"),
        "io.debezium.data.Uuid" => typed(value.clone(), "UUID"),
        "io.debezium.data.Json" => match value.as_str() {
            // Kept as one JSON value (see `JSON_MARK`), not flattened into columns.
            Some(text) => typed(serde_json::from_str(text).map_err(|_| "not JSON text")?, "JSON"),
            None => return Ok(None),
        },
        _ => return Ok(None),
    }))
}

/// Wraps a value with the column type it must land in; the decoder unwraps it.
pub const TYPED_MARK: &str = "\u{0}sluice-typed";

fn typed(value: Value, ty: &str) -> Value {
    serde_json::json!({ TYPED_MARK: value, "type": ty })
}

/// An unscaled big-endian two's-complement integer (base64) with `scale`, as decimal text.
fn decimal(b64: &str, scale: u32) -> Result<Value, String> {
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
    let digits = unscaled.unsigned_abs().to_string();
    let sign = if unscaled < 0 { "-" } else { "" };
    let scale = scale as usize;
    let text = if scale == 0 {
        digits
    } else if digits.len() > scale {
        format!("{}.{}", &digits[..digits.len() - scale], &digits[digits.len() - scale..])
    } else {
        format!("0.{}{digits}", "0".repeat(scale - digits.len()))
    };
    Ok(typed(Value::String(format!("{sign}{text}")), &format!("DECIMAL(38,{scale})")))
}

/// Epoch microseconds as a zoneless date-time text.
fn naive(us: i64) -> Result<Value, String> {
    let t = chrono::DateTime::from_timestamp_micros(us).ok_or("time out of range")?;
    Ok(Value::String(t.naive_utc().format("%Y-%m-%dT%H:%M:%S%.f").to_string()))
}

fn time_of_day(us: i64) -> Result<Value, String> {
    let t = chrono::NaiveTime::from_num_seconds_from_midnight_opt(
        (us / 1_000_000) as u32,
        ((us % 1_000_000) * 1000) as u32,
    )
    .ok_or("time of day out of range")?;
    Ok(Value::String(t.format("%H:%M:%S%.6f").to_string()))
}
