//! JSON bodies: one object, an array of objects, or newline-delimited JSON.

use serde_json::Value;

use crate::batch::Payload;

/// A body that is not JSON at all, with where parsing failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("body is not JSON: {reason} at line {line}, column {column} (byte {byte})")]
pub struct BodyError {
    /// What the parser expected.
    pub reason: String,
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub column: usize,
    /// 0-based byte offset into the body.
    pub byte: usize,
}

/// Split a body into events. Objects become `Payload::Json`; array elements and NDJSON lines
/// that are not objects become `Payload::Invalid` with their raw text and reason. A body in which
/// nothing parses is a `BodyError`.
pub fn split_body(body: &[u8]) -> Result<Vec<Payload>, BodyError> {
    let start = body.iter().position(|b| !b.is_ascii_whitespace()).unwrap_or(body.len());
    if start == body.len() {
        return Err(BodyError { reason: "empty body".into(), line: 1, column: 1, byte: 0 });
    }
    if body[start] == b'[' {
        return match serde_json::from_slice::<Value>(body) {
            Ok(Value::Array(items)) => Ok(items.into_iter().map(event_or_invalid).collect()),
            Ok(_) => Err(BodyError { reason: "unexpected value".into(), line: 1, column: 1, byte: 0 }),
            Err(e) => Err(body_error(body, 0, &e)),
        };
    }
    // One (possibly pretty-printed) value, or NDJSON. The single-value parse fails fast on the
    // second line of NDJSON ("trailing characters").
    if let Ok(value) = serde_json::from_slice::<Value>(body) {
        return Ok(vec![event_or_invalid(value)]);
    }
    split_lines(body)
}

/// Decode one payload from raw bytes: an object is one event, an array gives one per element.
pub fn decode_bytes(raw: &[u8]) -> Vec<Payload> {
    match serde_json::from_slice::<Value>(raw) {
        Ok(Value::Array(items)) => items.into_iter().map(event_or_invalid).collect(),
        Ok(value) => vec![event_or_invalid(value)],
        Err(e) => {
            vec![Payload::Invalid { raw: String::from_utf8_lossy(raw).into_owned(), reason: format!("not JSON: {e}") }]
        }
    }
}

fn split_lines(body: &[u8]) -> Result<Vec<Payload>, BodyError> {
    let mut out = Vec::new();
    let mut first_error = None;
    let mut any_json = false;
    let mut offset = 0;
    for (i, line) in body.split(|b| *b == b'\n').enumerate() {
        let line_start = offset;
        offset += line.len() + 1;
        let trimmed = line.trim_ascii();
        if trimmed.is_empty() {
            continue;
        }
        match serde_json::from_slice::<Value>(trimmed) {
            Ok(value) => {
                any_json = true;
                out.push(event_or_invalid(value));
            }
            Err(e) => {
                let leading = line.len() - line.trim_ascii_start().len();
                let mut err = body_error(trimmed, line_start + leading, &e);
                err.line = i + 1;
                err.column += leading;
                out.push(Payload::Invalid {
                    raw: String::from_utf8_lossy(trimmed).into_owned(),
                    reason: format!("line {}: not JSON: {}", i + 1, err.reason),
                });
                first_error.get_or_insert(err);
            }
        }
    }
    match (any_json, first_error) {
        (false, Some(err)) => Err(err),
        _ => Ok(out),
    }
}

fn event_or_invalid(value: Value) -> Payload {
    match value {
        Value::Object(_) => Payload::Json(value),
        other => {
            let raw = other.to_string();
            let what = match other {
                Value::Array(_) => "an array",
                Value::String(_) => "a string",
                Value::Number(_) => "a number",
                Value::Bool(_) => "a boolean",
                _ => "null",
            };
            Payload::Invalid { raw, reason: format!("expected a JSON object, got {what}") }
        }
    }
}

/// Turn a serde_json error on `text` (which starts at `base` in the body) into a located error.
fn body_error(text: &[u8], base: usize, e: &serde_json::Error) -> BodyError {
    let (line, column) = (e.line().max(1), e.column().max(1));
    let line_start: usize = text.split(|b| *b == b'\n').take(line - 1).map(|l| l.len() + 1).sum();
    let reason = e.to_string();
    let reason = reason.split(" at line ").next().unwrap_or(&reason).to_string();
    BodyError { reason, line, column, byte: base + line_start + column.saturating_sub(1) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(p: &[Payload]) -> Vec<&'static str> {
        p.iter()
            .map(|p| match p {
                Payload::Json(_) => "ok",
                Payload::Invalid { .. } => "bad",
                Payload::Bytes(_) | Payload::Copy(_) => "bytes",
            })
            .collect()
    }

    #[test]
    fn shapes() {
        assert_eq!(kinds(&split_body(b"{\"a\":1}").unwrap()), ["ok"]);
        assert_eq!(kinds(&split_body(b"{\n \"a\": 1\n}").unwrap()), ["ok"]);
        assert_eq!(kinds(&split_body(b"[{\"a\":1}, 2]").unwrap()), ["ok", "bad"]);
        assert_eq!(kinds(&split_body(b"{\"a\":1}\nnope\n{\"b\":2}\n\n7").unwrap()), ["ok", "bad", "ok", "bad"]);
    }

    #[test]
    fn not_json() {
        let e = split_body(b"hello there").unwrap_err();
        assert_eq!((e.line, e.byte), (1, 0));
        let e = split_body(b"\n\n  {oops").unwrap_err();
        assert_eq!(e.line, 3);
        assert_eq!(e.byte, 5);
        let e = split_body(b"[1, 2").unwrap_err();
        assert_eq!(e.line, 1);
    }
}
