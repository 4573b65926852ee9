//! Quarantine in the run loop: a sink that refuses some rows for good gets the rest, the
//! refused rows land in the ledger with the sink's error, and the stream goes on.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use arrow::array::AsArray;
use arrow::datatypes::Int64Type;
use async_trait::async_trait;
use serde_json::json;
use sluice_core::{
    Checkpoint, Chunk, Decoder, Error, ErrorKind, FlushConfig, MetadataConfig, Payload, Position, Record, RecordMeta,
    Result, Sink, Source, WriteUnit,
};

struct ListSource(VecDeque<Chunk>, Arc<Mutex<Vec<i64>>>);

#[async_trait]
impl Source for ListSource {
    async fn next(&mut self) -> Result<Option<Chunk>> {
        Ok(self.0.pop_front())
    }
    async fn commit(&mut self, position: &Position) -> Result<()> {
        self.1.lock().unwrap().push(position.0.as_i64().unwrap());
        Ok(())
    }
}

/// A destination that refuses, for good, any unit holding a row whose `p` is poison, and can
/// try a unit without keeping it.
#[derive(Default)]
struct RefusingSink {
    poison: Vec<i64>,
    /// Refuse every unit that has any table, whatever its rows (a broken table, not bad rows).
    refuse_tables: bool,
    stored: Mutex<Vec<i64>>,
    ledger: Mutex<Vec<(String, String)>>,
    /// Tries that fail with an error that may pass (out of memory) before tries work.
    flaky_probes: Mutex<usize>,
}

impl RefusingSink {
    fn check(&self, unit: &WriteUnit) -> Result<Vec<i64>> {
        let mut values = Vec::new();
        for table in &unit.tables {
            if self.refuse_tables {
                return Err(Error::new(ErrorKind::Fatal, "table is broken"));
            }
            if let Some(column) = table.data.column_by_name("p") {
                values.extend(column.as_primitive::<Int64Type>().values().iter().copied());
            }
        }
        match values.iter().find(|v| self.poison.contains(v)) {
            Some(v) => Err(Error::new(ErrorKind::Fatal, format!("value {v} violates a constraint"))),
            None => Ok(values),
        }
    }
}

#[async_trait]
impl Sink for RefusingSink {
    async fn write(&self, unit: Arc<WriteUnit>) -> Result<()> {
        let values = self.check(&unit)?;
        self.stored.lock().unwrap().extend(values);
        for r in unit
            .rejects
            .to_ledger("s", 0)
            .column_by_name("value")
            .unwrap()
            .as_string::<i32>()
            .iter()
            .zip(unit.rejects.to_ledger("s", 0).column_by_name("reason").unwrap().as_string::<i32>().iter())
        {
            self.ledger.lock().unwrap().push((r.0.unwrap().to_string(), r.1.unwrap().to_string()));
        }
        Ok(())
    }

    async fn probe(&self, unit: Arc<WriteUnit>) -> Option<Result<()>> {
        let mut flaky = self.flaky_probes.lock().unwrap();
        if *flaky > 0 {
            *flaky -= 1;
            return Some(Err(Error::new(ErrorKind::Transient, "out of memory")));
        }
        Some(self.check(&unit).map(|_| ()))
    }
}

async fn drive(sink: Arc<RefusingSink>, n: i64) -> (Result<Checkpoint>, Vec<i64>) {
    let chunks = (1..=n)
        .map(|p| Chunk {
            records: vec![Record { payload: Payload::Json(json!({"p": p})), meta: RecordMeta::default() }],
            bytes: 10,
            position: Position(json!(p)),
            arrived: Instant::now(),
            flush: false,
        })
        .collect();
    let commits = Arc::new(Mutex::new(Vec::new()));
    let mut source = ListSource(chunks, commits.clone());
    let mut decoder = Decoder::new("t".into(), MetadataConfig::default(), HashMap::new());
    let flush = FlushConfig { max_rows: 10, ..FlushConfig::default() };
    let result = crate::run_loop::run_stream(&mut source, &mut decoder, sink, &flush).await;
    let commits = commits.lock().unwrap().clone();
    (result, commits)
}

#[tokio::test]
async fn refused_rows_go_to_the_ledger_and_the_rest_is_written() {
    let sink = Arc::new(RefusingSink { poison: vec![3, 17], ..RefusingSink::default() });
    let (result, commits) = drive(sink.clone(), 20).await;
    assert_eq!(result.unwrap().sequence, 20);
    assert_eq!(commits, [10, 20]);
    let stored = sink.stored.lock().unwrap().clone();
    let expected: Vec<i64> = (1..=20).filter(|p| *p != 3 && *p != 17).collect();
    assert_eq!(stored, expected);
    let ledger = sink.ledger.lock().unwrap().clone();
    assert_eq!(ledger.len(), 2, "{ledger:?}");
    assert_eq!(ledger[0].0, r#"{"p":3}"#);
    assert!(ledger[0].1.contains("value 3 violates a constraint"), "{ledger:?}");
    assert_eq!(ledger[1].0, r#"{"p":17}"#);
}

#[tokio::test]
async fn a_refusal_that_is_not_about_rows_still_stops_the_stream() {
    let sink = Arc::new(RefusingSink { refuse_tables: true, ..RefusingSink::default() });
    let (result, commits) = drive(sink.clone(), 5).await;
    // Even the table's schema change alone is refused: every row goes to the ledger rather
    // than the stream restarting for ever on it.
    assert_eq!(result.unwrap().sequence, 5);
    assert_eq!(commits, [5]);
    assert!(sink.stored.lock().unwrap().is_empty());
    assert_eq!(sink.ledger.lock().unwrap().len(), 5);
}

#[tokio::test]
async fn a_try_that_fails_with_an_error_that_may_pass_decides_nothing() {
    // The first two tries run out of memory: each ends the search undecided and the unit is
    // written again; then the search finds the one refused row. Before, a failed try counted as
    // refused rows: the stream stopped (the empty unit's try "refused"), or rows were ledgered.
    let sink = Arc::new(RefusingSink { poison: vec![3], flaky_probes: Mutex::new(2), ..RefusingSink::default() });
    let (result, commits) = drive(sink.clone(), 10).await;
    assert_eq!(result.unwrap().sequence, 10);
    assert_eq!(commits, [10]);
    assert_eq!(*sink.stored.lock().unwrap(), [1, 2, 4, 5, 6, 7, 8, 9, 10]);
    let ledger = sink.ledger.lock().unwrap().clone();
    assert_eq!(ledger.len(), 1, "{ledger:?}");
    assert_eq!(ledger[0].0, r#"{"p":3}"#);
}
