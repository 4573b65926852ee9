//! One column's values while a batch is being built.

use std::sync::Arc;

use arrow::array::{
    ArrayRef, BinaryBuilder, BooleanBuilder, Date32Builder, Decimal128Builder, Float64Builder, Int64Builder,
    StringBuilder, Time64MicrosecondBuilder, TimestampMicrosecondBuilder,
};

use crate::schema::{ColumnType, Fit};

/// An Arrow builder for one column type.
pub(crate) enum ColumnBuilder {
    Bool(BooleanBuilder),
    Int(Int64Builder),
    Float(Float64Builder),
    Text(StringBuilder),
    Micros(TimestampMicrosecondBuilder),
    Days(Date32Builder),
    Decimal(Decimal128Builder),
    /// A list column: each row's JSON array text (validated by `fit`), built at the end.
    List(crate::schema::Scalar, Vec<Option<String>>),
    Time(Time64MicrosecondBuilder),
    Bytes(BinaryBuilder),
}

impl ColumnBuilder {
    /// An empty builder of Arrow's default room (1,024 values, and 1,024 bytes of text).
    pub(crate) fn new(ty: ColumnType) -> Self {
        Self::with_capacity(ty, 1024, 1024)
    }

    /// An empty builder with room for `rows` values (and `bytes` of text or bytes): a
    /// snapshot's chunk knows its row count, and building its columns without growing them
    /// spares copying each buffer several times over.
    pub(crate) fn with_capacity(ty: ColumnType, rows: usize, bytes: usize) -> Self {
        match ty {
            ColumnType::Boolean => Self::Bool(BooleanBuilder::with_capacity(rows)),
            ColumnType::Bigint => Self::Int(Int64Builder::with_capacity(rows)),
            ColumnType::Double => Self::Float(Float64Builder::with_capacity(rows)),
            ColumnType::Varchar | ColumnType::Json | ColumnType::Uuid | ColumnType::Interval => {
                Self::Text(StringBuilder::with_capacity(rows, bytes))
            }
            ColumnType::Timestamp => Self::Micros(TimestampMicrosecondBuilder::with_capacity(rows)),
            ColumnType::Timestamptz => {
                Self::Micros(TimestampMicrosecondBuilder::with_capacity(rows).with_timezone("UTC"))
            }
            ColumnType::Date => Self::Days(Date32Builder::with_capacity(rows)),
            ColumnType::Decimal(precision, scale) => Self::Decimal(
                Decimal128Builder::with_capacity(rows)
                    .with_precision_and_scale(precision, scale as i8)
                    .unwrap_or_else(|_| Decimal128Builder::with_capacity(rows)),
            ),
            ColumnType::Blob => Self::Bytes(BinaryBuilder::with_capacity(rows, bytes)),
            ColumnType::Time => Self::Time(Time64MicrosecondBuilder::with_capacity(rows)),
            ColumnType::List(item) => Self::List(item, Vec::new()),
        }
    }

    pub(crate) fn len(&self) -> usize {
        use arrow::array::ArrayBuilder;
        match self {
            Self::Bool(b) => b.len(),
            Self::Int(b) => b.len(),
            Self::Float(b) => b.len(),
            Self::Text(b) => b.len(),
            Self::Micros(b) => b.len(),
            Self::Days(b) => b.len(),
            Self::Decimal(b) => b.len(),
            Self::List(_, rows) => rows.len(),
            Self::Time(b) => b.len(),
            Self::Bytes(b) => b.len(),
        }
    }

    /// Append nulls until the column has `rows` values.
    pub(crate) fn pad(&mut self, rows: usize) {
        let missing = rows.saturating_sub(self.len());
        if missing == 0 {
            return;
        }
        match self {
            Self::Bool(b) => b.append_nulls(missing),
            Self::Int(b) => b.append_nulls(missing),
            Self::Float(b) => b.append_nulls(missing),
            Self::Text(b) => b.append_nulls(missing),
            Self::Micros(b) => b.append_nulls(missing),
            Self::Days(b) => b.append_nulls(missing),
            Self::Decimal(b) => b.append_nulls(missing),
            Self::List(_, rows) => rows.resize(rows.len() + missing, None),
            Self::Time(b) => b.append_nulls(missing),
            Self::Bytes(b) => {
                for _ in 0..missing {
                    b.append_null();
                }
            }
        }
    }

    /// Append a value that [`crate::schema::fit`] found fitting this column's type. A value of
    /// another shape becomes NULL; the decoder never produces one.
    pub(crate) fn push(&mut self, value: Fit<'_>) {
        match (self, value) {
            (Self::Bool(b), Fit::Bool(v)) => b.append_value(v),
            (Self::Int(b), Fit::Int(v)) => b.append_value(v),
            (Self::Float(b), Fit::Float(v)) => b.append_value(v),
            (Self::Float(b), Fit::Int(v)) => b.append_value(v as f64),
            (Self::Text(b), Fit::Text(v)) => b.append_value(v.as_ref()),
            (Self::Micros(b), Fit::Micros(v)) => b.append_value(v),
            (Self::Days(b), Fit::Days(v)) => b.append_value(v),
            (Self::Decimal(b), Fit::Decimal(v)) => b.append_value(v),
            (Self::List(_, rows), Fit::Text(v)) => rows.push(Some(v.into_owned())),
            (Self::List(_, rows), _) => rows.push(None),
            (Self::Time(b), Fit::Micros(v)) => b.append_value(v),
            (Self::Bytes(b), Fit::Bytes(v)) => b.append_value(v),
            (Self::Bool(b), _) => b.append_null(),
            (Self::Int(b), _) => b.append_null(),
            (Self::Float(b), _) => b.append_null(),
            (Self::Text(b), _) => b.append_null(),
            (Self::Micros(b), _) => b.append_null(),
            (Self::Days(b), _) => b.append_null(),
            (Self::Decimal(b), _) => b.append_null(),
            (Self::Time(b), _) => b.append_null(),
            (Self::Bytes(b), _) => b.append_null(),
        }
    }

    /// Turn an integer column into a float column, keeping its values.
    pub(crate) fn widen_to_double(&mut self) {
        if let Self::Int(b) = self {
            let ints = b.finish();
            let mut floats = Float64Builder::with_capacity(ints.len());
            for v in ints.iter() {
                floats.append_option(v.map(|i| i as f64));
            }
            *self = Self::Float(floats);
        }
    }

    pub(crate) fn finish(mut self) -> ArrayRef {
        match &mut self {
            Self::Bool(b) => Arc::new(b.finish()),
            Self::Int(b) => Arc::new(b.finish()),
            Self::Float(b) => Arc::new(b.finish()),
            Self::Text(b) => Arc::new(b.finish()),
            Self::Micros(b) => Arc::new(b.finish()),
            Self::Days(b) => Arc::new(b.finish()),
            Self::Decimal(b) => Arc::new(b.finish()),
            Self::Time(b) => Arc::new(b.finish()),
            Self::Bytes(b) => Arc::new(b.finish()),
            Self::List(item, rows) => list_array(*item, rows),
        }
    }
}

/// A list array from each row's JSON array text.
fn list_array(item: crate::schema::Scalar, rows: &[Option<String>]) -> ArrayRef {
    use arrow::array::ListBuilder;
    use serde_json::Value;

    use crate::schema::{Scalar, list_items};
    macro_rules! build {
        ($builder:expr, $get:expr) => {{
            let mut list = ListBuilder::new($builder);
            for row in rows {
                match row {
                    Some(text) => {
                        for v in list_items(text) {
                            list.values().append_option($get(&v));
                        }
                        list.append(true);
                    }
                    None => list.append(false),
                }
            }
            Arc::new(list.finish()) as ArrayRef
        }};
    }
    match item {
        Scalar::Boolean => build!(BooleanBuilder::new(), Value::as_bool),
        Scalar::Bigint => build!(Int64Builder::new(), Value::as_i64),
        Scalar::Double => build!(Float64Builder::new(), Value::as_f64),
        Scalar::Varchar => build!(StringBuilder::new(), |v: &Value| v.as_str().map(str::to_string)),
    }
}
