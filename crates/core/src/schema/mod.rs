//! Table schemas: column types, inference from JSON values, and evolution.

mod infer;
mod table;

pub(crate) use infer::fits_precision;
pub use infer::{Fit, ValueKind, fit, fit_instant, fit_text, kind_of, kind_of_text, list_items};
pub use table::{Column, SchemaChange, TableSchema};

use arrow::datatypes::{DataType, Field, TimeUnit};
use serde::{Deserialize, Serialize};

/// The field metadata key that names an Arrow extension type.
const EXTENSION_NAME: &str = "ARROW:extension:name";
/// Arrow's canonical extension for JSON text in a string column.
const JSON_EXTENSION: &str = "arrow.json";

/// Whether `field` holds JSON text: marked `arrow.json`, as [`ColumnType::field`] marks a JSON
/// column (and DuckDB marks a `JSON` column it exports).
pub fn is_json(field: &Field) -> bool {
    field.metadata().get(EXTENSION_NAME).is_some_and(|name| name == JSON_EXTENSION)
}

/// The column types Sluice creates. Each maps to one Arrow type and one SQL type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum ColumnType {
    /// true / false.
    Boolean,
    /// 64-bit integer.
    Bigint,
    /// 64-bit float.
    Double,
    /// Text.
    Varchar,
    /// Instant with time zone (RFC 3339 strings), stored as UTC microseconds.
    Timestamptz,
    /// Calendar date (`YYYY-MM-DD` strings).
    Date,
    /// Arrays and values nested deeper than the flattening depth, kept as JSON text.
    Json,
    /// Exact decimal with this precision (1-38) and scale: a Postgres `numeric(p,s)`, or
    /// Debezium's `Decimal` logical type (precision 38).
    Decimal(u8, u8),
    /// Date and time without a zone (Debezium's `Timestamp`, `MicroTimestamp`, …).
    Timestamp,
    /// Time of day (Debezium's `Time`, `MicroTime`, …).
    Time,
    /// UUID (Debezium's `Uuid`).
    Uuid,
    /// A duration (a MySQL/MariaDB `TIME`, through Debezium's `MicroTime`), from
    /// `[-]H:MM:SS[.ffffff]` text with any number of hours.
    Interval,
    /// Bytes (Postgres `bytea`, sent as `\x` hex).
    Blob,
    /// A list of scalars (a Postgres one-dimensional array), from a JSON array.
    List(Scalar),
}

/// The item type of a [`ColumnType::List`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Scalar {
    /// true / false.
    Boolean,
    /// 64-bit integer.
    Bigint,
    /// 64-bit float.
    Double,
    /// Text.
    Varchar,
}

impl Scalar {
    fn sql(self) -> &'static str {
        match self {
            Self::Boolean => "BOOLEAN",
            Self::Bigint => "BIGINT",
            Self::Double => "DOUBLE",
            Self::Varchar => "VARCHAR",
        }
    }

    /// The Arrow type of one item.
    pub fn arrow(self) -> DataType {
        match self {
            Self::Boolean => DataType::Boolean,
            Self::Bigint => DataType::Int64,
            Self::Double => DataType::Float64,
            Self::Varchar => DataType::Utf8,
        }
    }
}

impl ColumnType {
    /// The SQL type name.
    pub fn sql(self) -> std::borrow::Cow<'static, str> {
        std::borrow::Cow::Borrowed(match self {
            Self::Boolean => "BOOLEAN",
            Self::Bigint => "BIGINT",
            Self::Double => "DOUBLE",
            Self::Varchar => "VARCHAR",
            Self::Timestamptz => "TIMESTAMPTZ",
            Self::Date => "DATE",
            Self::Json => "JSON",
            Self::Timestamp => "TIMESTAMP",
            Self::Time => "TIME",
            Self::Uuid => "UUID",
            Self::Interval => "INTERVAL",
            Self::Blob => "BLOB",
            Self::Decimal(precision, scale) => {
                return std::borrow::Cow::Owned(format!("DECIMAL({precision},{scale})"));
            }
            Self::List(item) => return std::borrow::Cow::Owned(format!("{}[]", item.sql())),
        })
    }

    /// Parse an SQL type name as the workspace reports it.
    pub fn from_sql(name: &str) -> Option<Self> {
        let upper = name.trim().to_ascii_uppercase();
        Some(match upper.as_str() {
            "BOOLEAN" => Self::Boolean,
            "BIGINT" => Self::Bigint,
            "DOUBLE" => Self::Double,
            "VARCHAR" => Self::Varchar,
            "TIMESTAMP WITH TIME ZONE" | "TIMESTAMPTZ" => Self::Timestamptz,
            "DATE" => Self::Date,
            "JSON" => Self::Json,
            "TIMESTAMP" => Self::Timestamp,
            "TIME" => Self::Time,
            "UUID" => Self::Uuid,
            "INTERVAL" => Self::Interval,
            "BLOB" => Self::Blob,
            "BOOLEAN[]" => Self::List(Scalar::Boolean),
            "BIGINT[]" => Self::List(Scalar::Bigint),
            "DOUBLE[]" => Self::List(Scalar::Double),
            "VARCHAR[]" => Self::List(Scalar::Varchar),
            other => {
                let (precision, scale) = other.strip_prefix("DECIMAL(")?.strip_suffix(')')?.split_once(',')?;
                let (precision, scale): (u8, u8) = (precision.trim().parse().ok()?, scale.trim().parse().ok()?);
                if !(1..=38).contains(&precision) || scale > precision {
                    return None;
                }
                Self::Decimal(precision, scale)
            }
        })
    }

    /// The Arrow field the decoder builds for a column of this type named `name`: nullable,
    /// and a JSON column marked with Arrow's canonical `arrow.json` extension, so a
    /// destination can give it its own JSON type (Snowflake's VARIANT) instead of text.
    pub fn field(self, name: &str) -> Field {
        let field = Field::new(name, self.arrow(), true);
        if self == Self::Json {
            let metadata = [(EXTENSION_NAME.to_string(), JSON_EXTENSION.to_string())];
            return field.with_metadata(metadata.into_iter().collect());
        }
        field
    }

    /// The Arrow type the decoder builds for this column.
    pub fn arrow(self) -> DataType {
        match self {
            Self::Boolean => DataType::Boolean,
            Self::Bigint => DataType::Int64,
            Self::Double => DataType::Float64,
            // The appender casts text to UUID and INTERVAL.
            Self::Varchar | Self::Json | Self::Uuid | Self::Interval => DataType::Utf8,
            Self::Timestamp => DataType::Timestamp(TimeUnit::Microsecond, None),
            Self::Time => DataType::Time64(TimeUnit::Microsecond),
            Self::Blob => DataType::Binary,
            Self::Timestamptz => DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
            Self::Date => DataType::Date32,
            Self::Decimal(precision, scale) => DataType::Decimal128(precision, scale as i8),
            Self::List(item) => {
                DataType::List(std::sync::Arc::new(arrow::datatypes::Field::new("item", item.arrow(), true)))
            }
        }
    }
}

impl std::fmt::Display for ColumnType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.sql())
    }
}
