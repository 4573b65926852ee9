//! The run loop with an in-memory source and sink: positions are committed only after the
//! write holding them is durable, in order; transient errors retry; fatal ones abort.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use async_trait::async_trait;
use serde_json::json;
use sluice_core::pipeline::{Stream, run};
use sluice_core::{
    Checkpoint, Chunk, Decoder, Error, ErrorKind, FlushConfig, MetadataConfig, Payload, Position, Record, RecordMeta,
    Result, Sink, Source, StreamMetrics, Totals, WriteUnit,
};
use tokio_util::sync::CancellationToken;

#[derive(Default)]
struct Log {
    durable: Vec<i64>,
    commits: Vec<i64>,
    aborts: usize,
    attempts: usize,
}

struct FakeSource {
    chunks: VecDeque<Chunk>,
    log: Arc<Mutex<Log>>,
    /// Fail instead of ending once the chunks run out.
    fail_at_end: bool,
}

#[async_trait]
impl Source for FakeSource {
    async fn next(&mut self) -> Result<Option<Chunk>> {
        match self.chunks.pop_front() {
            None if self.fail_at_end => Err(Error::new(ErrorKind::Connect, "source lost")),
            next => Ok(next),
        }
    }
    async fn commit(&mut self, position: &Position) -> Result<()> {
        let mut log = self.log.lock().unwrap();
        let p = position.0.as_i64().unwrap();
        assert!(log.durable.contains(&p), "position {p} committed before its write was durable");
        log.commits.push(p);
        Ok(())
    }
    async fn abort(&mut self, _error: &Error) {
        self.log.lock().unwrap().aborts += 1;
    }
}

struct FakeSink {
    log: Arc<Mutex<Log>>,
    fail: Mutex<Vec<ErrorKind>>,
}

#[async_trait]
impl Sink for FakeSink {
    async fn write(&self, unit: std::sync::Arc<WriteUnit>) -> Result<()> {
        self.log.lock().unwrap().attempts += 1;
        if let Some(kind) = self.fail.lock().unwrap().pop() {
            return Err(Error::new(kind, "injected"));
        }
        self.log.lock().unwrap().durable.push(unit.checkpoint.position.0.as_i64().unwrap());
        Ok(())
    }
}

fn chunks(n: i64) -> VecDeque<Chunk> {
    (1..=n)
        .map(|p| Chunk {
            records: vec![Record { payload: Payload::Json(json!({"p": p})), meta: RecordMeta::default() }],
            bytes: 10,
            position: Position(json!(p)),
            arrived: Instant::now(),
            flush: false,
        })
        .collect()
}

async fn drive(n: i64, fail: Vec<ErrorKind>, flush: FlushConfig) -> (Result<Checkpoint>, Arc<Mutex<Log>>) {
    drive_source(n, false, fail, flush).await
}

async fn drive_source(
    n: i64,
    fail_at_end: bool,
    fail: Vec<ErrorKind>,
    flush: FlushConfig,
) -> (Result<Checkpoint>, Arc<Mutex<Log>>) {
    let log = Arc::new(Mutex::new(Log::default()));
    let mut source = FakeSource { chunks: chunks(n), log: log.clone(), fail_at_end };
    let sink = Arc::new(FakeSink { log: log.clone(), fail: Mutex::new(fail) });
    let mut decoder = Decoder::new("t".into(), MetadataConfig::default(), HashMap::new());
    let stream = Stream {
        name: "s",
        source: &mut source,
        decoder: &mut decoder,
        sink,
        flush: &flush,
        metrics: Arc::new(StreamMetrics::new(&Totals::default())),
        cancel: CancellationToken::new(),
    };
    (run(stream, Checkpoint::default()).await, log)
}

fn one_per_batch() -> FlushConfig {
    FlushConfig { max_rows: 1, ..FlushConfig::default() }
}

#[tokio::test]
async fn commits_follow_durable_writes_in_order() {
    let (result, log) = drive(5, vec![], one_per_batch()).await;
    let cp = result.unwrap();
    assert_eq!(cp.sequence, 5);
    assert_eq!(cp.totals.rows_written, 5);
    assert_eq!(cp.totals.batches, 5);
    let log = log.lock().unwrap();
    assert_eq!(log.commits, [1, 2, 3, 4, 5]);
}

#[tokio::test]
async fn batches_group_chunks_up_to_max_rows() {
    let (result, log) = drive(10, vec![], FlushConfig { max_rows: 4, ..FlushConfig::default() }).await;
    assert_eq!(result.unwrap().totals.batches, 3);
    assert_eq!(log.lock().unwrap().commits, [4, 8, 10]);
}

#[tokio::test]
async fn transient_errors_retry_the_same_unit() {
    let (result, log) = drive(2, vec![ErrorKind::Transient, ErrorKind::Connect], one_per_batch()).await;
    assert_eq!(result.unwrap().sequence, 2);
    let log = log.lock().unwrap();
    assert_eq!(log.attempts, 4);
    assert_eq!(log.commits, [1, 2]);
    assert_eq!(log.aborts, 0);
}

#[tokio::test]
async fn fatal_errors_abort_without_committing() {
    let (result, log) = drive(3, vec![ErrorKind::Fatal], one_per_batch()).await;
    assert_eq!(result.unwrap_err().kind(), ErrorKind::Fatal);
    let log = log.lock().unwrap();
    assert!(log.commits.is_empty());
    assert_eq!(log.aborts, 1);
}

#[tokio::test]
async fn a_source_error_still_finishes_the_write_in_flight() {
    let (result, log) = drive_source(3, true, vec![], one_per_batch()).await;
    assert_eq!(result.unwrap_err().kind(), ErrorKind::Connect);
    let log = log.lock().unwrap();
    assert_eq!(log.durable, [1, 2, 3], "every submitted write ended before run returned");
    assert_eq!(log.commits, [1, 2, 3], "and its position was committed upstream");
}
