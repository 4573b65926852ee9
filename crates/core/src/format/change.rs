//! A change to one keyed row, as every change source hands it to the decoder: Sluice's own
//! Postgres source builds it directly, Debezium events become one (`debezium.rs`), and a plain
//! JSON event in mirror mode is an upsert of its key.

use std::sync::Arc;

use serde_json::{Map, Value, json};

use crate::batch::{ChangeOp, RecordMeta};
use crate::schema::ColumnType;

/// One change to one keyed row.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    /// What happened.
    pub op: ChangeOp,
    /// The row image: `after`, or for a delete `before` (or just the key).
    pub image: Map<String, Value>,
    /// For an update: the image before it, when the source sent one. If the key changed, the
    /// old key's row is deleted.
    pub before: Option<Map<String, Value>>,
    /// Key columns the change itself names (a table's primary key, a Debezium key).
    pub keys: Vec<String>,
    /// The column type the source declares for a top-level column of the images. A new column
    /// gets it instead of a type inferred from its first value; a value is fitted to its
    /// column as any other. A `JSON` column's value is the document's JSON text, so a JSON
    /// `null` (`"null"`) stays apart from SQL NULL. Shared by the changes of one source table.
    pub types: Arc<Vec<(String, ColumnType)>>,
    /// Values the format could not convert to their declared type (a Debezium logical type):
    /// the images keep them as sent; the column gets NULL and the ledger the value.
    pub unconverted: Vec<Unconverted>,
    /// When it happened at the source, microseconds since the epoch.
    pub change_us: Option<i64>,
    /// The source position (Debezium's `source` block).
    pub source: Option<Value>,
    /// The source position as text that sorts in source order, when the connector has one.
    pub source_order: Option<String>,
    /// Source database, schema and table.
    pub route: Route,
    /// Columns the source did not send: the placeholder for an unchanged value.
    pub unavailable: Vec<String>,
}

impl Change {
    /// A plain JSON event in mirror mode: the latest version of its key.
    pub fn upsert(image: Map<String, Value>) -> Self {
        Self {
            op: ChangeOp::Upsert,
            image,
            before: None,
            keys: Vec::new(),
            types: Arc::default(),
            unconverted: Vec::new(),
            change_us: None,
            source: None,
            source_order: None,
            route: Route::default(),
            unavailable: Vec::new(),
        }
    }

    /// The change as JSON, for a ledger row: an upsert is its image; any other change
    /// `{"op", "before", "after", "source"}`.
    pub fn to_json(&self) -> Value {
        let image = Value::Object(self.image.clone());
        match self.op {
            ChangeOp::Upsert => image,
            ChangeOp::Delete => json!({"op": self.op.name(), "before": image, "after": null, "source": self.source}),
            op => json!({"op": op.name(), "before": self.before, "after": image, "source": self.source}),
        }
    }
}

/// A value a format could not convert to its column's declared type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unconverted {
    /// The column.
    pub column: String,
    /// Why, for the ledger.
    pub reason: String,
    /// The value is in [`Change::before`], not in [`Change::image`].
    pub in_before: bool,
}

/// Where a change comes from, for destination templates.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Route {
    /// `[db]`.
    pub db: Option<String>,
    /// `[schema]`.
    pub schema: Option<String>,
    /// `[table]` (or a MongoDB collection).
    pub table: Option<String>,
}

/// What the transport says about an event's message key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKey<'a> {
    /// Nothing: a bare pushed value, whose key is unknown.
    Unknown,
    /// The message has no key (a Kafka message without one, a pushed pair with `"key": null`):
    /// for Debezium, a row of a table without a primary key, identified by its whole image.
    Absent,
    /// The message key, as text.
    Given(&'a str),
}

impl<'a> EventKey<'a> {
    /// The key a record's metadata carries.
    pub fn of(meta: &'a RecordMeta) -> Self {
        match (&meta.key, meta.no_key) {
            (Some(key), _) => Self::Given(key),
            (None, true) => Self::Absent,
            (None, false) => Self::Unknown,
        }
    }
}
