//! The serde visitors of the body parser: a value's shape read without building it, and a
//! value built like serde_json's own while noting fields an object names twice.

use std::fmt;

use serde::de::{DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};

use super::BodySummary;

/// A value's shape, read without building it: `None` for an object, else what it is.
pub(super) struct Shape(pub(super) Option<&'static str>);

impl<'de> Deserialize<'de> for Shape {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ShapeVisitor)
    }
}

pub(super) struct ShapeVisitor;

impl<'de> Visitor<'de> for ShapeVisitor {
    type Value = Shape;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Shape, A::Error> {
        while map.next_entry::<Checked, Checked>()?.is_some() {}
        Ok(Shape(None))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Shape, A::Error> {
        while seq.next_element::<Checked>()?.is_some() {}
        Ok(Shape(Some("an array")))
    }
    fn visit_bool<E>(self, _: bool) -> Result<Shape, E> {
        Ok(Shape(Some("a boolean")))
    }
    fn visit_i64<E>(self, _: i64) -> Result<Shape, E> {
        Ok(Shape(Some("a number")))
    }
    fn visit_u64<E>(self, _: u64) -> Result<Shape, E> {
        Ok(Shape(Some("a number")))
    }
    fn visit_f64<E>(self, _: f64) -> Result<Shape, E> {
        Ok(Shape(Some("a number")))
    }
    fn visit_str<E>(self, _: &str) -> Result<Shape, E> {
        Ok(Shape(Some("a string")))
    }
    fn visit_unit<E>(self) -> Result<Shape, E> {
        Ok(Shape(Some("null")))
    }
}

/// A value read as the decoder will read it, and dropped. Not `IgnoredAny`: serde_json skips an
/// ignored string without checking its UTF-8, so a body the decoder refuses would pass the check.
pub(super) struct Checked;

impl<'de> Deserialize<'de> for Checked {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ShapeVisitor).map(|_| Checked)
    }
}

/// A top-level array's elements, counted by shape.
pub(super) struct ArrayShape(pub(super) BodySummary);

impl<'de> Deserialize<'de> for ArrayShape {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Counter;
        impl<'de> Visitor<'de> for Counter {
            type Value = ArrayShape;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an array")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<ArrayShape, A::Error> {
                let mut summary = BodySummary::default();
                while let Some(shape) = seq.next_element::<Shape>()? {
                    summary.events += 1;
                    summary.invalid += usize::from(shape.0.is_some());
                }
                Ok(ArrayShape(summary))
            }
        }
        d.deserialize_seq(Counter)
    }
}

/// Builds a `Value` like serde_json's own, and notes each field an object names twice.
pub(super) struct ValueSeed<'a> {
    /// The flattened name of the value being read: one buffer for the whole event, grown and
    /// cut back as objects nest, so a field costs no allocation unless it is a duplicate.
    pub(super) path: &'a mut String,
    pub(super) duplicates: &'a mut Vec<(String, Value)>,
}

impl<'de> DeserializeSeed<'de> for ValueSeed<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for ValueSeed<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        // Inside an array, names do not become columns: duplicates there are only JSON text.
        let (mut ignored, mut path) = (Vec::new(), String::new());
        while let Some(v) = seq.next_element_seed(ValueSeed { path: &mut path, duplicates: &mut ignored })? {
            items.push(v);
        }
        Ok(Value::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let mark = self.path.len();
            if mark > 0 {
                self.path.push_str(crate::decode::SEPARATOR);
            }
            self.path.push_str(&key);
            let value = map.next_value_seed(ValueSeed { path: &mut *self.path, duplicates: &mut *self.duplicates })?;
            if let Some(earlier) = out.insert(key, value) {
                self.duplicates.push((self.path.clone(), earlier));
            }
            self.path.truncate(mark);
        }
        Ok(Value::Object(out))
    }
}
