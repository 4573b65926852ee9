//! The rejects of one write unit, kept as columns: a body of a million misfits costs the bytes
//! of its values, not a million structs, and lands in the ledger through the Arrow appender.

use std::borrow::Cow;
use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Builder, RecordBatch, StringBuilder, TimestampMicrosecondBuilder};
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};

use crate::batch::Reject;
use crate::schema::ColumnType;

/// Ledger rows, column by column.
#[derive(Debug, Default)]
pub struct Rejects {
    table: StringBuilder,
    column: StringBuilder,
    expected: Vec<Option<ColumnType>>,
    value: StringBuilder,
    sequence: Int64Builder,
    reason: StringBuilder,
    received_us: Int64Builder,
    source: StringBuilder,
}

impl Rejects {
    /// Add one row.
    pub fn push(&mut self, r: Reject) {
        self.table.append_value(&r.table);
        self.column.append_option(r.column.as_deref());
        self.expected.push(r.expected);
        self.value.append_value(&r.value);
        self.sequence.append_value(r.sequence);
        self.reason.append_value(&r.reason);
        self.received_us.append_value(r.received_us);
        self.source.append_option(r.source.map(|s| s.to_string()));
    }

    /// Add `other`'s rows, their sequences moved on by `by` (rows numbered within a part of a
    /// unit, joined to the unit).
    pub fn extend_shifted(&mut self, other: &Rejects, by: i64) {
        for mut r in other.iter() {
            r.sequence += by;
            self.push(r);
        }
    }

    /// Rows held.
    pub fn len(&self) -> usize {
        self.expected.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.expected.is_empty()
    }

    /// The rows, rebuilt one by one (tests and small callers; the sink takes [`Rejects::finish`]).
    pub fn iter(&self) -> impl Iterator<Item = Reject> + '_ {
        let (table, column, value) =
            (self.table.finish_cloned(), self.column.finish_cloned(), self.value.finish_cloned());
        let (reason, source) = (self.reason.finish_cloned(), self.source.finish_cloned());
        let (sequence, received) = (self.sequence.finish_cloned(), self.received_us.finish_cloned());
        (0..self.len()).map(move |i| {
            use arrow::array::Array;
            Reject {
                table: table.value(i).to_string(),
                column: (!column.is_null(i)).then(|| column.value(i).to_string()),
                expected: self.expected[i],
                value: value.value(i).to_string(),
                sequence: sequence.value(i),
                reason: Cow::Owned(reason.value(i).to_string()),
                received_us: received.value(i),
                source: (!source.is_null(i)).then(|| serde_json::from_str(source.value(i)).unwrap_or_default()),
            }
        })
    }

    /// The rows as columns, the builders emptied: what a write unit carries to the sink.
    pub fn finish(mut self) -> RejectBatch {
        let n = self.len();
        let mut expected = StringBuilder::new();
        for ty in &self.expected {
            expected.append_option(ty.map(|t| t.sql()));
        }
        let mut received = TimestampMicrosecondBuilder::with_capacity(n);
        received.append_values(self.received_us.values_slice(), &vec![true; n]);
        let columns: Vec<ArrayRef> = vec![
            Arc::new(self.table.finish()),
            Arc::new(self.column.finish()),
            Arc::new(expected.finish()),
            Arc::new(self.value.finish()),
            Arc::new(self.sequence.finish()),
            Arc::new(self.reason.finish()),
            Arc::new(self.source.finish()),
            Arc::new(received.finish().with_timezone("UTC")),
        ];
        RejectBatch { columns, rows: n }
    }
}

/// Ledger rows of one write unit, frozen: shared by every retry of the write without a copy.
#[derive(Debug, Clone, Default)]
pub struct RejectBatch {
    columns: Vec<ArrayRef>,
    rows: usize,
}

impl RejectBatch {
    /// Rows held.
    pub fn len(&self) -> usize {
        self.rows
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    /// Each row's sequence, column and reason, in order, read from the columns as it goes.
    pub fn summaries(&self) -> impl Iterator<Item = (i64, Option<&str>, &str)> + '_ {
        use arrow::array::{Array, AsArray};
        let columns = (self.rows > 0).then(|| {
            let column = self.columns[1].as_string::<i32>();
            let sequence = self.columns[4].as_primitive::<arrow::datatypes::Int64Type>();
            let reason = self.columns[5].as_string::<i32>();
            (column, sequence, reason)
        });
        (0..self.rows).filter_map(move |i| {
            let (column, sequence, reason) = columns?;
            Some((sequence.value(i), (!column.is_null(i)).then(|| column.value(i)), reason.value(i)))
        })
    }

    /// These rows without the first `n`.
    pub fn skip(&self, n: usize) -> RejectBatch {
        let n = n.min(self.rows);
        let columns = self.columns.iter().map(|c| c.slice(n, self.rows - n)).collect();
        RejectBatch { columns, rows: self.rows - n }
    }

    /// These rows, then `more`.
    pub fn with(&self, more: RejectBatch) -> RejectBatch {
        if self.is_empty() {
            return more;
        }
        if more.is_empty() {
            return self.clone();
        }
        let columns = self
            .columns
            .iter()
            .zip(&more.columns)
            .map(|(a, b)| arrow::compute::concat(&[a.as_ref(), b.as_ref()]).expect("ledger columns of one type"))
            .collect();
        RejectBatch { columns, rows: self.rows + more.rows }
    }

    /// The rows in the ledger's column order (`stream`, `table`, `column`, `expected_type`,
    /// `value`, `position`, `reason`, `source`, `received_at`, `recorded_at`).
    pub fn to_ledger(&self, stream: &str, recorded_us: i64) -> RecordBatch {
        let n = self.rows;
        let text = |name: &str, nullable: bool| Field::new(name, DataType::Utf8, nullable);
        let time = |name: &str| Field::new(name, DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())), true);
        let schema = Schema::new(vec![
            text("stream", false),
            text("table", false),
            text("column", true),
            text("expected_type", true),
            text("value", true),
            Field::new("position", DataType::Int64, true),
            text("reason", false),
            text("source", true),
            time("received_at"),
            time("recorded_at"),
        ]);
        let mut streams = StringBuilder::with_capacity(n, n * stream.len());
        for _ in 0..n {
            streams.append_value(stream);
        }
        let mut recorded = TimestampMicrosecondBuilder::with_capacity(n);
        recorded.append_values(&vec![recorded_us; n], &vec![true; n]);
        let mut columns: Vec<ArrayRef> = vec![Arc::new(streams.finish())];
        columns.extend(self.columns.iter().cloned());
        columns.push(Arc::new(recorded.finish().with_timezone("UTC")));
        RecordBatch::try_new(Arc::new(schema), columns).expect("ledger columns match their schema")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_round_trip_and_make_a_ledger_batch() {
        let mut rejects = Rejects::default();
        for i in 0..3 {
            rejects.push(Reject {
                table: "t".into(),
                column: (i != 1).then(|| format!("c{i}")),
                expected: (i == 0).then_some(ColumnType::Bigint),
                value: format!("v{i}"),
                sequence: i,
                reason: Cow::Borrowed("why"),
                received_us: 7,
                source: (i == 2).then(|| serde_json::json!({"offset": 9})),
            });
        }
        let rows: Vec<Reject> = rejects.iter().collect();
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[1].column, None);
        assert_eq!(rows[2].source, Some(serde_json::json!({"offset": 9})));
        assert_eq!(rejects.len(), 3);
        let batch = rejects.finish().to_ledger("s", 11);
        assert_eq!((batch.num_rows(), batch.num_columns()), (3, 10));
    }
}
