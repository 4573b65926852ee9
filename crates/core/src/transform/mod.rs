//! Transforms in flight: field rules on each event before it is decoded, and SQL expressions
//! (filter, validation, computed columns) over each decoded batch.
//!
//! The expressions are evaluated by an [`Expressions`] the connectors provide (DuckDB over the
//! batch's Arrow columns); the core only knows what comes back and what to do with it: computed
//! columns join the table's schema as any column does, rows the filter skips are counted, rows a
//! rule fails go to the ledger. A row whose expression fails at run time (a cast) is found by
//! halving the batch, and goes to the ledger with DuckDB's message.

mod config;
mod custom_sql;
mod mapping;
mod route;

use std::fmt;

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, Int32Array, new_null_array};
use arrow::datatypes::DataType;
use arrow::record_batch::RecordBatch;

pub use config::{FieldRule, FieldType, Mask, Rule, TransformConfig};
pub use custom_sql::{Block, CustomSql, Param};
pub use mapping::{Mapping, REDACTED, lookup, mask_text, masked};
pub use route::Route;

use crate::error::{Error, ErrorKind, Result};
use crate::schema::ColumnType;

/// What a stream's SQL expressions make of one batch, row for row.
#[derive(Debug, Clone)]
pub struct Evaluated {
    /// One array per computed field, in the order of the config's fields.
    pub computed: Vec<ArrayRef>,
    /// The filter's verdict (NULL is false); absent without a filter.
    pub keep: Option<BooleanArray>,
    /// The index of the first rule a row does not meet; NULL where it meets them all.
    pub failed: Option<Int32Array>,
}

/// Evaluates a stream's SQL expressions over a batch of one table.
pub trait Expressions: Send + Sync + fmt::Debug {
    /// Evaluate over `batch`; an error of kind `Data` is a value an expression could not take
    /// (the rows are then tried in halves).
    fn evaluate(&self, batch: &RecordBatch) -> Result<Evaluated>;

    /// Run the stream's script over `batch`: the rows it returns. Errors as for `evaluate`.
    fn script(&self, batch: &RecordBatch) -> Result<RecordBatch> {
        let _ = batch;
        Err(Error::new(ErrorKind::Config, "this stream has no script"))
    }
}

/// A row whose expressions failed: its index in the batch and DuckDB's message.
pub type RowError = (usize, String);

/// A stream's transform, ready to run.
#[derive(Debug, Default)]
pub struct Transform {
    /// Field rules, applied to each event.
    pub mapping: Mapping,
    /// The table each event goes to.
    pub route: Option<Route>,
    /// Computed columns: name and the type a rule sets.
    pub computed: Vec<(String, Option<ColumnType>)>,
    /// Validation rules' names, by index.
    pub rules: Vec<String>,
    /// Whether a filter is set.
    pub filters: bool,
    /// Whether a script is set.
    pub scripted: bool,
    /// The SQL expressions, when any are set.
    pub expressions: Option<Box<dyn Expressions>>,
}

impl Transform {
    /// The transform `config` describes, with `expressions` evaluating its SQL.
    pub fn new(config: &TransformConfig, expressions: Option<Box<dyn Expressions>>) -> Result<Self> {
        config.validate()?;
        let route =
            config.route.as_deref().map(Route::parse).transpose().map_err(|e| Error::config("transform.route", e))?;
        let computed = config
            .fields
            .iter()
            .filter(|f| f.sql.is_some())
            .map(|f| (f.field.clone(), f.ty.map(FieldType::column)))
            .collect();
        let needs = config.filter.is_some()
            || config.script.is_some()
            || !config.validate.is_empty()
            || config.fields.iter().any(|f| f.sql.is_some());
        if needs && expressions.is_none() {
            return Err(Error::config("transform", "SQL expressions are set but nothing evaluates them"));
        }
        Ok(Self {
            mapping: Mapping::new(config),
            route,
            computed,
            rules: config.validate.iter().map(|r| r.name.clone()).collect(),
            filters: config.filter.is_some(),
            scripted: config.script.is_some(),
            expressions: if needs { expressions } else { None },
        })
    }

    /// Evaluate the expressions over `batch`. Rows whose evaluation fails come back apart, with
    /// the error, and every other row's results are kept.
    pub fn evaluate(&self, batch: &RecordBatch) -> Result<Option<(Evaluated, Vec<RowError>)>> {
        let Some(expressions) = self.expressions.as_ref().filter(|_| self.evaluates()) else { return Ok(None) };
        let mut parts: Vec<(usize, usize, Option<Evaluated>)> = Vec::new();
        let mut errors = Vec::new();
        // A value an expression cannot take fails its row alone; an expression that no longer
        // binds (a column's type changed) fails every row at once, with the reason.
        halve(batch, 0, batch.num_rows(), &mut |slice, offset, len| match expressions.evaluate(slice) {
            Ok(evaluated) => {
                parts.push((offset, len, Some(evaluated)));
                Ok(true)
            }
            Err(e) if e.kind() == ErrorKind::Data && len > 1 => Ok(false),
            Err(e) if matches!(e.kind(), ErrorKind::Data | ErrorKind::Config) => {
                parts.push((offset, len, None));
                errors.extend((offset..offset + len).map(|row| (row, e.to_string())));
                Ok(true)
            }
            Err(e) => Err(e),
        })?;
        if parts.len() == 1
            && let Some((_, _, Some(whole))) = parts.pop()
        {
            return Ok(Some((whole, errors)));
        }
        Ok(Some((self.join(parts)?, errors)))
    }

    /// Whether computed columns, a filter or rules are set (a script alone evaluates nothing).
    pub fn evaluates(&self) -> bool {
        !self.computed.is_empty() || self.filters || !self.rules.is_empty()
    }

    /// Run the script over `batch`: its output, and the input rows whose run failed. `None`
    /// without a script.
    pub fn run_script(&self, batch: &RecordBatch) -> Result<Option<(Option<RecordBatch>, Vec<RowError>)>> {
        let Some(expressions) = self.expressions.as_ref().filter(|_| self.scripted) else { return Ok(None) };
        let mut outputs = Vec::new();
        let mut errors = Vec::new();
        halve(batch, 0, batch.num_rows(), &mut |slice, offset, len| match expressions.script(slice) {
            Ok(out) => {
                outputs.push(out);
                Ok(true)
            }
            Err(e) if e.kind() == ErrorKind::Data && len > 1 => Ok(false),
            Err(e) if matches!(e.kind(), ErrorKind::Data | ErrorKind::Config) => {
                errors.extend((offset..offset + len).map(|row| (row, e.to_string())));
                Ok(true)
            }
            Err(e) => Err(e),
        })?;
        let output = match outputs.first() {
            None => None,
            Some(first) => Some(arrow::compute::concat_batches(&first.schema(), &outputs).map_err(|e| {
                Error::new(ErrorKind::Data, "the script returned other columns for other events").with_source(e)
            })?),
        };
        Ok(Some((output, errors)))
    }

    /// Put evaluated ranges (and failed ones, as NULLs) back together in row order.
    fn join(&self, parts: Vec<(usize, usize, Option<Evaluated>)>) -> Result<Evaluated> {
        let sample = parts.iter().find_map(|(_, _, e)| e.as_ref());
        let types: Vec<DataType> = match sample {
            Some(e) => e.computed.iter().map(|a| a.data_type().clone()).collect(),
            None => vec![DataType::Null; self.computed.len()],
        };
        let concat = |pieces: Vec<ArrayRef>| -> Result<ArrayRef> {
            let refs: Vec<&dyn Array> = pieces.iter().map(|a| a.as_ref()).collect();
            arrow::compute::concat(&refs)
                .map_err(|e| Error::new(ErrorKind::Fatal, "could not join evaluated rows").with_source(e))
        };
        let mut computed = Vec::with_capacity(types.len());
        for (i, ty) in types.iter().enumerate() {
            let pieces = parts
                .iter()
                .map(|(_, len, e)| match e {
                    Some(e) => e.computed[i].clone(),
                    None => new_null_array(ty, *len),
                })
                .collect();
            computed.push(concat(pieces)?);
        }
        let keep = if self.filters {
            let pieces: Vec<ArrayRef> = parts
                .iter()
                .map(|(_, len, e)| match e.as_ref().and_then(|e| e.keep.clone()) {
                    Some(k) => std::sync::Arc::new(k) as ArrayRef,
                    None => new_null_array(&DataType::Boolean, *len),
                })
                .collect();
            Some(concat(pieces)?.as_boolean().clone())
        } else {
            None
        };
        let failed = if self.rules.is_empty() {
            None
        } else {
            let pieces: Vec<ArrayRef> = parts
                .iter()
                .map(|(_, len, e)| match e.as_ref().and_then(|e| e.failed.clone()) {
                    Some(f) => std::sync::Arc::new(f) as ArrayRef,
                    None => new_null_array(&DataType::Int32, *len),
                })
                .collect();
            Some(concat(pieces)?.as_primitive::<arrow::datatypes::Int32Type>().clone())
        };
        Ok(Evaluated { computed, keep, failed })
    }
}

/// Call `run` on rows `offset..offset + len`; where it answers false, on each half instead.
fn halve(
    batch: &RecordBatch,
    offset: usize,
    len: usize,
    run: &mut dyn FnMut(&RecordBatch, usize, usize) -> Result<bool>,
) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    let slice = if offset == 0 && len == batch.num_rows() { batch.clone() } else { batch.slice(offset, len) };
    if !run(&slice, offset, len)? {
        let half = len / 2;
        halve(batch, offset, half, run)?;
        halve(batch, offset + half, len - half, run)?;
    }
    Ok(())
}

/// The column type a computed value of Arrow type `ty` is stored as, when Sluice has one.
pub fn column_type_of(ty: &DataType) -> Option<ColumnType> {
    Some(match ty {
        DataType::Boolean => ColumnType::Boolean,
        DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64 => ColumnType::Bigint,
        DataType::UInt8 | DataType::UInt16 | DataType::UInt32 => ColumnType::Bigint,
        DataType::UInt64 | DataType::Float16 | DataType::Float32 | DataType::Float64 => ColumnType::Double,
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => ColumnType::Varchar,
        DataType::Date32 | DataType::Date64 => ColumnType::Date,
        DataType::Timestamp(_, Some(_)) => ColumnType::Timestamptz,
        DataType::Timestamp(_, None) => ColumnType::Timestamp,
        DataType::Time32(_) | DataType::Time64(_) => ColumnType::Time,
        DataType::Decimal128(p, s) if *s >= 0 && *p <= 38 => ColumnType::Decimal(*p, *s as u8),
        DataType::Binary | DataType::LargeBinary => ColumnType::Blob,
        DataType::List(item) | DataType::LargeList(item) => ColumnType::List(match item.data_type() {
            DataType::Boolean => crate::schema::Scalar::Boolean,
            DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64 => crate::schema::Scalar::Bigint,
            DataType::Float32 | DataType::Float64 => crate::schema::Scalar::Double,
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => crate::schema::Scalar::Varchar,
            _ => return None,
        }),
        _ => return None,
    })
}

/// `array` as column type `ty` (values that do not convert become NULL).
pub fn cast_to(array: &ArrayRef, ty: ColumnType) -> Result<ArrayRef> {
    let target = ty.arrow();
    if array.data_type() == &target {
        return Ok(array.clone());
    }
    arrow::compute::cast(array, &target).map_err(|e| {
        Error::new(ErrorKind::Data, format!("a value of type {} cannot be stored as {ty}", array.data_type()))
            .with_source(e)
    })
}
