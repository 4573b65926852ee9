//! An event read without building a `serde_json::Value`: names and strings borrowed from the
//! body where they have no escapes, objects as lists of fields, numbers as read. The decoder
//! walks it as it walks a `Value`, and it says the same about every value: its kind, how it
//! fits a column, its JSON text. Arrays stay values: they become JSON text or lists.

use std::borrow::Cow;
use std::fmt;

use serde::Deserializer;
use serde::de::{DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

use super::visitors::ValueSeed;
use crate::schema::{ColumnType, Fit, ValueKind};

/// A JSON value, borrowed from the text it was read from where it can be.
#[derive(Debug, Clone, PartialEq)]
pub enum Raw<'a> {
    /// null
    Null,
    /// true / false
    Bool(bool),
    /// A negative integer.
    I64(i64),
    /// A non-negative integer.
    U64(u64),
    /// Any other number (always finite).
    F64(f64),
    /// A string.
    Str(Cow<'a, str>),
    /// An array, as a value.
    Array(Value),
    /// An object's fields in order; a name given twice keeps its first place and last value.
    Object(Vec<(Cow<'a, str>, Raw<'a>)>),
}

/// One event: its value and the fields it named twice (flattened name, earlier value).
#[derive(Debug)]
pub struct RawEvent<'a> {
    /// The value.
    pub value: Raw<'a>,
    /// Fields named twice, with the value the later one replaced.
    pub duplicates: Vec<(String, Value)>,
}

/// Read one event's text (its UTF-8 checked once, as [`super::whole`] says).
pub fn parse(text: &[u8]) -> Result<RawEvent<'_>, serde_json::Error> {
    let mut duplicates = Vec::new();
    let value = super::whole(RawSeed { place: None, duplicates: &mut duplicates }, text)?;
    Ok(RawEvent { value, duplicates })
}

/// Read one event from any serde deserializer (`scripts/bench-parsers.sh` compares parsers
/// through it); the caller checks that nothing follows.
pub fn parse_from<'de, D: Deserializer<'de>>(de: D) -> Result<RawEvent<'de>, D::Error> {
    let mut duplicates = Vec::new();
    let value = RawSeed { place: None, duplicates: &mut duplicates }.deserialize(de)?;
    Ok(RawEvent { value, duplicates })
}

impl Raw<'_> {
    /// The same value as serde_json builds it.
    pub fn to_value(&self) -> Value {
        match self {
            Self::Null => Value::Null,
            Self::Bool(b) => Value::Bool(*b),
            Self::I64(i) => Value::from(*i),
            Self::U64(u) => Value::from(*u),
            Self::F64(f) => Number::from_f64(*f).map_or(Value::Null, Value::Number),
            Self::Str(s) => Value::String(s.to_string()),
            Self::Array(v) => v.clone(),
            Self::Object(fields) => {
                Value::Object(fields.iter().map(|(k, v)| (k.to_string(), v.to_value())).collect::<Map<_, _>>())
            }
        }
    }

    /// Its JSON text, as serde_json writes it.
    pub fn to_json(&self) -> String {
        match self {
            Self::Str(s) => Value::String(s.to_string()).to_string(),
            other => other.to_value().to_string(),
        }
    }

    /// What it looks like: [`crate::schema::kind_of`] of the same value.
    pub fn kind(&self) -> ValueKind {
        match self {
            Self::Null => ValueKind::Null,
            Self::Bool(_) => ValueKind::Bool,
            Self::I64(_) => ValueKind::Int,
            Self::U64(u) if i64::try_from(*u).is_ok() => ValueKind::Int,
            Self::U64(_) | Self::F64(_) => ValueKind::Float,
            Self::Str(s) => crate::schema::kind_of_text(s),
            Self::Array(_) | Self::Object(_) => ValueKind::Nested,
        }
    }

    /// How it goes into a column of type `ty`: [`crate::schema::fit`] of the same value. The
    /// common cases are decided here; the others on the value.
    pub fn fit(&self, ty: ColumnType) -> Fit<'_> {
        match (ty, self) {
            (_, Self::Null) => Fit::Null,
            (ColumnType::Boolean, Self::Bool(b)) => Fit::Bool(*b),
            (ColumnType::Bigint, Self::I64(i)) => Fit::Int(*i),
            (ColumnType::Bigint, Self::U64(u)) if i64::try_from(*u).is_ok() => Fit::Int(*u as i64),
            (ColumnType::Double, Self::I64(i)) => Fit::Float(*i as f64),
            (ColumnType::Double, Self::U64(u)) => Fit::Float(*u as f64),
            (ColumnType::Double, Self::F64(f)) => Fit::Float(*f),
            (ColumnType::Varchar, Self::Str(s)) => Fit::Text(Cow::Borrowed(s)),
            (ColumnType::Timestamptz | ColumnType::Date, Self::Str(s)) => {
                crate::schema::fit_instant(ty, s).unwrap_or(Fit::Misfit("not a string"))
            }
            // An array is already a value: no copy of it.
            (_, Self::Array(v)) => crate::schema::fit(ty, v),
            _ => crate::schema::fit(ty, &self.to_value()).into_owned(),
        }
    }
}

/// Reads a value like [`ValueSeed`], borrowing names and strings.
struct RawSeed<'p> {
    /// The field this value is, within the fields around it (`None` for the event itself).
    place: Option<&'p Place<'p>>,
    duplicates: &'p mut Vec<(String, Value)>,
}

/// A field's name and the field it is in, kept on the stack while the parser descends: the
/// flattened name is written out only for a field named twice, which is rare.
struct Place<'a> {
    name: &'a str,
    up: Option<&'a Place<'a>>,
}

impl Place<'_> {
    /// The flattened name, as the decoder names the column.
    fn flattened(&self) -> String {
        let mut names = vec![self.name];
        let mut at = self.up;
        while let Some(place) = at {
            names.push(place.name);
            at = place.up;
        }
        // As the decoder's path grows: a separator only after a name that left it non-empty.
        let mut path = String::new();
        for name in names.iter().rev() {
            if !path.is_empty() {
                path.push_str(crate::decode::SEPARATOR);
            }
            path.push_str(name);
        }
        path
    }
}

/// One bit of 64 for a field name: names with different bits differ, so a name whose bit no
/// earlier field of the object set is no repeat, and the object's fields need not be searched.
fn name_bit(name: &str) -> u64 {
    let bytes = name.as_bytes();
    let (first, last) = (bytes.first().copied().unwrap_or(0), bytes.last().copied().unwrap_or(0));
    let mixed = (bytes.len() as u32)
        .wrapping_mul(31)
        .wrapping_add(u32::from(first))
        .wrapping_mul(31)
        .wrapping_add(u32::from(last));
    1 << (mixed % 64)
}

impl<'de> DeserializeSeed<'de> for RawSeed<'_> {
    type Value = Raw<'de>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Raw<'de>, D::Error> {
        d.deserialize_any(self)
    }
}

/// Objects with more fields than this find a name given twice through an index.
const SCAN_FIELDS: usize = 32;

impl<'de> Visitor<'de> for RawSeed<'_> {
    type Value = Raw<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Raw<'de>, E> {
        Ok(Raw::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Raw<'de>, E> {
        Ok(if v < 0 { Raw::I64(v) } else { Raw::U64(v as u64) })
    }
    fn visit_u64<E>(self, v: u64) -> Result<Raw<'de>, E> {
        Ok(Raw::U64(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Raw<'de>, E> {
        Ok(if v.is_finite() { Raw::F64(v) } else { Raw::Null })
    }
    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Raw<'de>, E> {
        Ok(Raw::Str(Cow::Borrowed(v)))
    }
    fn visit_str<E>(self, v: &str) -> Result<Raw<'de>, E> {
        Ok(Raw::Str(Cow::Owned(v.to_owned())))
    }
    fn visit_string<E>(self, v: String) -> Result<Raw<'de>, E> {
        Ok(Raw::Str(Cow::Owned(v)))
    }
    fn visit_unit<E>(self) -> Result<Raw<'de>, E> {
        Ok(Raw::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Raw<'de>, A::Error> {
        let (mut path, mut ignored) = (String::new(), Vec::new());
        ValueSeed { path: &mut path, duplicates: &mut ignored }.visit_seq(seq).map(Raw::Array)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Raw<'de>, A::Error> {
        let mut fields: Vec<(Cow<'de, str>, Raw<'de>)> = Vec::new();
        let mut index: Option<foldhash::HashMap<String, usize>> = None;
        let mut seen = 0u64;
        while let Some(key) = map.next_key_seed(Name)? {
            let here = Place { name: &key, up: self.place };
            let value = map.next_value_seed(RawSeed { place: Some(&here), duplicates: &mut *self.duplicates })?;
            let bit = name_bit(&key);
            let earlier = match &index {
                _ if seen & bit == 0 => None,
                Some(index) => index.get(key.as_ref()).copied(),
                None => fields.iter().position(|(k, _)| *k == key),
            };
            seen |= bit;
            match earlier {
                Some(at) => {
                    let replaced = std::mem::replace(&mut fields[at].1, value);
                    self.duplicates.push((here.flattened(), replaced.to_value()));
                }
                None => {
                    if let Some(index) = &mut index {
                        index.insert(key.to_string(), fields.len());
                    }
                    fields.push((key, value));
                    if index.is_none() && fields.len() > SCAN_FIELDS {
                        index = Some(fields.iter().enumerate().map(|(i, (k, _))| (k.to_string(), i)).collect());
                    }
                }
            }
        }
        Ok(Raw::Object(fields))
    }
}

/// A field name, borrowed when it has no escapes.
struct Name;

impl<'de> DeserializeSeed<'de> for Name {
    type Value = Cow<'de, str>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Cow<'de, str>, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Name {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a field name")
    }
    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Borrowed(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Owned(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Owned(v))
    }
}
