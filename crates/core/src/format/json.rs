//! JSON bodies: one object, an array of objects, or newline-delimited JSON.
//!
//! A body is read twice, and never held as one tree: [`check_body`] walks it without building
//! values (the HTTP edge answers 400 or counts events with it), and [`BodyEvents`] later hands
//! the decoder one event at a time, so memory follows the body's size, not its event count.

use std::fmt;

use serde::Deserializer;
use serde::de::{DeserializeSeed, IgnoredAny, SeqAccess, Visitor};
use serde_json::Value;

use crate::batch::Payload;

pub mod raw;
mod visitors;
use visitors::{ArrayShape, Shape, ValueSeed};

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

/// What a checked body holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BodySummary {
    /// Events in the body, objects or not.
    pub events: usize,
    /// Events that are not JSON objects (or NDJSON lines that are not JSON): ledger rows.
    pub invalid: usize,
}

/// How a body is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    Array,
    Single,
    Lines,
}

fn layout(body: &[u8]) -> Result<(Layout, usize), BodyError> {
    let start = body.iter().position(|b| !b.is_ascii_whitespace()).unwrap_or(body.len());
    if start == body.len() {
        return Err(BodyError { reason: "empty body".into(), line: 1, column: 1, byte: 0 });
    }
    if body[start] == b'[' {
        return Ok((Layout::Array, start));
    }
    // One (possibly pretty-printed) value, or NDJSON. The single-value parse fails fast on the
    // second line of NDJSON ("trailing characters").
    if serde_json::from_slice::<IgnoredAny>(body).is_ok() {
        Ok((Layout::Single, start))
    } else {
        Ok((Layout::Lines, 0))
    }
}

/// Check a body without building it: counts its events and those that are not objects. A body
/// in which nothing parses is a `BodyError`, located.
pub fn check_body(body: &[u8]) -> Result<BodySummary, BodyError> {
    match layout(body)?.0 {
        Layout::Array => serde_json::from_slice::<ArrayShape>(body).map(|a| a.0).map_err(|e| body_error(body, 0, &e)),
        Layout::Single => {
            let shape = serde_json::from_slice::<Shape>(body).map_err(|e| body_error(body, 0, &e))?;
            Ok(BodySummary { events: 1, invalid: usize::from(shape.0.is_some()) })
        }
        Layout::Lines => {
            let mut summary = BodySummary::default();
            let mut first_error = None;
            let mut offset = 0;
            for (i, line) in body.split(|b| *b == b'\n').enumerate() {
                let line_start = offset;
                offset += line.len() + 1;
                let trimmed = line.trim_ascii();
                if trimmed.is_empty() {
                    continue;
                }
                summary.events += 1;
                match serde_json::from_slice::<Shape>(trimmed) {
                    Ok(Shape(None)) => {}
                    Ok(Shape(Some(_))) => summary.invalid += 1,
                    Err(e) => {
                        summary.invalid += 1;
                        if first_error.is_none() {
                            let leading = line.len() - line.trim_ascii_start().len();
                            let mut err = body_error(trimmed, line_start + leading, &e);
                            err.line = i + 1;
                            err.column += leading;
                            first_error = Some(err);
                        }
                    }
                }
            }
            match first_error {
                Some(err) if summary.invalid == summary.events => Err(err),
                _ => Ok(summary),
            }
        }
    }
}

/// One event of a body, parsed: a payload, and the fields it named twice (the later value is
/// kept; the earlier ones go to the ledger).
#[derive(Debug, Clone)]
pub struct Event {
    /// `Payload::Json` for an object, `Payload::Invalid` otherwise.
    pub payload: Payload,
    /// Flattened field name and the value that a later field of the same name replaced.
    pub duplicates: Vec<(String, Value)>,
}

/// The events of a body, one at a time.
pub struct BodyEvents {
    body: bytes::Bytes,
    layout: Layout,
    pos: usize,
    line: usize,
    done: bool,
}

/// The events of a push body (object, array or NDJSON), parsed lazily.
pub fn body_events(body: bytes::Bytes) -> BodyEvents {
    let (layout, pos) = layout(&body).unwrap_or((Layout::Single, 0));
    BodyEvents { body, layout, pos: if layout == Layout::Array { pos + 1 } else { pos }, line: 0, done: false }
}

/// The events of one message (an object, or an array of them), parsed lazily.
pub fn message_events(raw: bytes::Bytes) -> BodyEvents {
    let start = raw.iter().position(|b| !b.is_ascii_whitespace()).unwrap_or(raw.len());
    let array = raw.get(start) == Some(&b'[') && serde_json::from_slice::<IgnoredAny>(&raw).is_ok();
    let (layout, pos) = if array { (Layout::Array, start + 1) } else { (Layout::Single, 0) };
    BodyEvents { body: raw, layout, pos, line: 0, done: false }
}

impl Iterator for BodyEvents {
    type Item = Event;

    fn next(&mut self) -> Option<Event> {
        match self.next_span()? {
            Span::Text(range, line) => Some(parse_event(&self.body[range], line)),
            Span::Broken(event) => Some(event),
        }
    }
}

/// Where a body's next event is: its text (and its NDJSON line, for a reason), or an event
/// already found broken.
pub(crate) enum Span {
    Text(std::ops::Range<usize>, Option<usize>),
    Broken(Event),
}

impl BodyEvents {
    /// The body.
    pub(crate) fn body(&self) -> &[u8] {
        &self.body
    }

    /// Whether the body is one array of events.
    pub(crate) fn is_array(&self) -> bool {
        self.layout == Layout::Array
    }

    /// The next event's place in the body.
    pub(crate) fn next_span(&mut self) -> Option<Span> {
        if self.done {
            return None;
        }
        match self.layout {
            Layout::Single => {
                self.done = true;
                Some(Span::Text(0..self.body.len(), None))
            }
            Layout::Array => self.next_element(),
            Layout::Lines => self.next_line(),
        }
    }

    fn next_element(&mut self) -> Option<Span> {
        let body = &self.body[..];
        while self.pos < body.len() && (body[self.pos].is_ascii_whitespace() || body[self.pos] == b',') {
            self.pos += 1;
        }
        if self.pos >= body.len() || body[self.pos] == b']' {
            self.done = true;
            return None;
        }
        let mut stream =
            serde_json::Deserializer::from_slice(&body[self.pos..]).into_iter::<&serde_json::value::RawValue>();
        match stream.next() {
            Some(Ok(raw)) => {
                // The element's text is the raw value's, which borrows the body.
                let start = raw.get().as_ptr() as usize - body.as_ptr() as usize;
                let span = Span::Text(start..start + raw.get().len(), None);
                self.pos += stream.byte_offset();
                Some(span)
            }
            other => {
                // A checked body never gets here; an unchecked one stops at its first fault.
                self.done = true;
                let reason = match other {
                    Some(Err(e)) => format!("not JSON: {e}"),
                    _ => "not JSON: unexpected end".into(),
                };
                Some(Span::Broken(invalid(String::from_utf8_lossy(&body[self.pos..]).into_owned(), reason)))
            }
        }
    }

    fn next_line(&mut self) -> Option<Span> {
        loop {
            let body = &self.body[..];
            if self.pos >= body.len() {
                self.done = true;
                return None;
            }
            let end = memchr::memchr(b'\n', &body[self.pos..]).map_or(body.len(), |i| self.pos + i);
            let line = body[self.pos..end].trim_ascii();
            let start = line.as_ptr() as usize - body.as_ptr() as usize;
            self.pos = end + 1;
            self.line += 1;
            if !line.is_empty() {
                return Some(Span::Text(start..start + line.len(), Some(self.line)));
            }
        }
    }
}

fn invalid(raw: String, reason: String) -> Event {
    Event { payload: Payload::Invalid { raw, reason }, duplicates: Vec::new() }
}

/// Why an event's text is not JSON, with its NDJSON line when it has one.
pub(crate) fn not_json(line: Option<usize>, e: &serde_json::Error) -> String {
    let reason = e.to_string();
    let reason = reason.split(" at line ").next().unwrap_or(&reason);
    match line {
        Some(line) => format!("line {line}: not JSON: {reason}"),
        None => format!("not JSON: {reason}"),
    }
}

/// Parse one event's text (NDJSON line `line`, if it is one).
fn parse_event(text: &[u8], line: Option<usize>) -> Event {
    let mut duplicates = Vec::new();
    let mut path = String::new();
    match whole(ValueSeed { path: &mut path, duplicates: &mut duplicates }, text) {
        Ok(value) => Event { payload: event_or_invalid(value), duplicates },
        Err(e) => invalid(String::from_utf8_lossy(text).into_owned(), not_json(line, &e)),
    }
}

/// What `seed` reads from `text`, with nothing after it.
///
/// Read from bytes, serde_json checks the UTF-8 of each string on its own; read from a `str`, it
/// checks none. So the text is checked whole, in one pass, and read as a `str`; a text that is
/// not UTF-8 is read from its bytes, which finds and locates the bad string as before.
pub(crate) fn whole<'de, S: DeserializeSeed<'de>>(seed: S, text: &'de [u8]) -> Result<S::Value, serde_json::Error> {
    fn read<'de, S: DeserializeSeed<'de>, R: serde_json::de::Read<'de>>(
        seed: S,
        mut de: serde_json::Deserializer<R>,
    ) -> Result<S::Value, serde_json::Error> {
        let value = seed.deserialize(&mut de)?;
        de.end()?;
        Ok(value)
    }
    match std::str::from_utf8(text) {
        Ok(text) => read(seed, serde_json::Deserializer::from_str(text)),
        Err(_) => read(seed, serde_json::Deserializer::from_slice(text)),
    }
}

/// Decode one payload from raw bytes: an object is one event, an array gives one per element.
pub fn decode_bytes(raw: &[u8]) -> Vec<Payload> {
    message_events(bytes::Bytes::copy_from_slice(raw)).map(|e| e.payload).collect()
}

/// Parse a whole body into its events in one pass (a small push body, at the edge): the
/// events and what they are, or, as [`check_body`] says, where the body is not JSON.
pub fn parse_body(body: &bytes::Bytes) -> Result<(Vec<Event>, BodySummary), BodyError> {
    let events: Vec<Event> = match layout(body)?.0 {
        Layout::Array => match whole(Elements, body) {
            Ok(events) => events,
            Err(_) => return check_body(body).and(Err(BodyError::unreadable())),
        },
        Layout::Single | Layout::Lines => body_events(body.clone()).collect(),
    };
    let invalid = events.iter().filter(|e| matches!(e.payload, Payload::Invalid { .. })).count();
    if invalid == events.len() && invalid > 0 {
        // Nothing parsed as an object: the body may not be JSON at all, which check_body tells.
        check_body(body)?;
    }
    let summary = BodySummary { events: events.len(), invalid };
    Ok((events, summary))
}

impl BodyError {
    fn unreadable() -> Self {
        BodyError { reason: "unreadable body".into(), line: 1, column: 1, byte: 0 }
    }
}

/// A top-level array's elements, each parsed as an event.
struct Elements;

impl<'de> DeserializeSeed<'de> for Elements {
    type Value = Vec<Event>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Vec<Event>, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Elements {
    type Value = Vec<Event>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<Event>, A::Error> {
        let mut events = Vec::new();
        let mut path = String::new();
        loop {
            let mut duplicates = Vec::new();
            let Some(value) = seq.next_element_seed(ValueSeed { path: &mut path, duplicates: &mut duplicates })? else {
                return Ok(events);
            };
            events.push(Event { payload: event_or_invalid(value), duplicates });
        }
    }
}

/// Split a body into events, all at once (tests and small bodies; the push path uses
/// [`check_body`] and [`body_events`]).
pub fn split_body(body: &[u8]) -> Result<Vec<Payload>, BodyError> {
    check_body(body)?;
    Ok(body_events(bytes::Bytes::copy_from_slice(body)).map(|e| e.payload).collect())
}

fn event_or_invalid(value: Value) -> Payload {
    match value {
        Value::Object(_) => Payload::Json(value),
        other => Payload::Invalid { raw: other.to_string(), reason: not_an_object(&other) },
    }
}

/// Why a value that is not an object is not an event.
pub(crate) fn not_an_object(value: &Value) -> String {
    let what = match value {
        Value::Object(_) => "an object",
        Value::Array(_) => "an array",
        Value::String(_) => "a string",
        Value::Number(_) => "a number",
        Value::Bool(_) => "a boolean",
        Value::Null => "null",
    };
    format!("expected a JSON object, got {what}")
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
                Payload::Bytes(_)
                | Payload::Body(_)
                | Payload::Events(_)
                | Payload::Copy(_)
                | Payload::Change(_)
                | Payload::Decoded(_) => "other",
            })
            .collect()
    }

    #[test]
    fn shapes() {
        assert_eq!(kinds(&split_body(b"{\"a\":1}").unwrap()), ["ok"]);
        assert_eq!(kinds(&split_body(b"{\n \"a\": 1\n}").unwrap()), ["ok"]);
        assert_eq!(kinds(&split_body(b"[{\"a\":1}, 2]").unwrap()), ["ok", "bad"]);
        assert_eq!(kinds(&split_body(b"[ ]").unwrap()), Vec::<&str>::new());
        assert_eq!(kinds(&split_body(b"[1,{\"a\":[1,2]},\"x\" , -0 ]").unwrap()), ["bad", "ok", "bad", "bad"]);
        assert_eq!(kinds(&split_body(b"{\"a\":1}\nnope\n{\"b\":2}\n\n7").unwrap()), ["ok", "bad", "ok", "bad"]);
        assert_eq!(check_body(b"{\"a\":1}\nnope\n{\"b\":2}\n\n7").unwrap(), BodySummary { events: 4, invalid: 2 });
        assert_eq!(check_body(b"[{\"a\":1}, 2, []]").unwrap(), BodySummary { events: 3, invalid: 2 });
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
        // Trailing garbage after an array is not ignored.
        assert!(check_body(b"[{\"a\":1}] x").is_err());
        // Text that is not UTF-8, anywhere in a value, is not JSON (the decoder refuses it too).
        assert!(check_body(b"{\"a\":{\"b\":\"\xff\"}}").is_err());
        assert!(check_body(b"[{\"a\":\"\xff\"}, {}]").is_err());
        assert_eq!(check_body(b"{\"\xff\":1}\n{}").unwrap(), BodySummary { events: 2, invalid: 1 });
    }

    #[test]
    fn text_checked_whole_reads_as_before_and_bad_utf8_is_still_refused_where_it_is() {
        // Valid text is read as a `str`; multi-byte characters and escapes come out as sent.
        let good = "{\"a\":\"caf\u{e9} \\u00e9\",\"b\":{\"c\":\"\u{1F600}\"}}";
        let event = raw::parse(good.as_bytes()).unwrap();
        assert_eq!(event.value.to_value(), serde_json::json!({"a": "caf\u{e9} \u{e9}", "b": {"c": "\u{1F600}"}}));
        // A string that is not UTF-8 is refused with its place, by both parsers.
        let bad = b"{\"a\":\"ok\",\n\"b\":\"x\xff\"}";
        let e = raw::parse(bad).unwrap_err();
        assert_eq!((e.line(), e.column()), (2, 7));
        let events: Vec<Event> =
            body_events(bytes::Bytes::from_static(b"{\"a\":\"\xc3\xa9\"}\n{\"b\":\"\xff\"}")).collect();
        assert!(matches!(&events[0].payload, Payload::Json(v) if v["a"] == "\u{e9}"));
        assert!(matches!(&events[1].payload, Payload::Invalid { reason, .. } if reason.contains("line 2")));
        // A whole array with one bad string is refused, and located.
        let e = parse_body(&bytes::Bytes::from_static(b"[{\"a\":1},\n {\"b\":\"\xff\"}]")).unwrap_err();
        assert_eq!(e.line, 2);
    }

    #[test]
    fn field_names_are_data_as_sent() {
        // The mark an earlier version put on typed values is a name like any other.
        let body = r#"{"a": {"\u0000sluice-typed": "1", "type": "BOOLEAN"}}"#;
        let events: Vec<Event> = body_events(bytes::Bytes::from(body)).collect();
        let Payload::Json(v) = &events[0].payload else { panic!("not an object") };
        assert_eq!(v, &serde_json::json!({"a": {"\u{0}sluice-typed": "1", "type": "BOOLEAN"}}));
    }

    #[test]
    fn duplicate_fields_are_noted_with_their_earlier_value() {
        let events: Vec<Event> =
            body_events(bytes::Bytes::from_static(br#"{"a":1,"b":{"c":2,"c":3},"a":4,"l":[{"x":1,"x":2}]}"#)).collect();
        assert_eq!(events.len(), 1);
        let Payload::Json(v) = &events[0].payload else { panic!("not an object") };
        assert_eq!(v["a"], 4);
        assert_eq!(v["b"]["c"], 3);
        assert_eq!(events[0].duplicates, vec![("b__c".to_string(), Value::from(2)), ("a".to_string(), Value::from(1))]);
    }
}
