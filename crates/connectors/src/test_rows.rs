//! Rows for unit tests: an append of `id` values into table `t`.

use std::sync::Arc;

use arrow::array::Int64Array;
use arrow::datatypes::{DataType, Field, Schema};
use arrow::record_batch::RecordBatch;
use sluice_core::{Delivery, SyncMode};

/// One unit: an append of `ids` (column `id`) into table `t`, by `s`.
pub(crate) fn unit(ids: &[i64]) -> Vec<Delivery> {
    let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
    let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(Int64Array::from(ids.to_vec()))])
        .expect("a batch of one Int64 column");
    vec![Delivery {
        sync: "s".into(),
        run_id: String::new(),
        mode: SyncMode::Append,
        keys: Vec::new(),
        schema,
        rows: vec![batch],
        deletes: Vec::new(),
        table: Some("t".into()),
        copy: None,
        keep: Vec::new(),
        multiset: false,
    }]
}
