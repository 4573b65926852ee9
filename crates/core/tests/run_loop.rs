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
    Result, Sink, Source, StreamMetrics, Totals, WriteUnit, sink::Preceding,
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
    (run_stream(&mut source, &mut decoder, sink, &flush).await, log)
}

/// Run stream `s` from the start until its source ends.
pub(crate) async fn run_stream(
    source: &mut dyn Source,
    decoder: &mut Decoder,
    sink: Arc<dyn Sink>,
    flush: &FlushConfig,
) -> Result<Checkpoint> {
    let stream = Stream {
        name: "s",
        source,
        decoder,
        sink,
        flush,
        metrics: Arc::new(StreamMetrics::new(&Totals::default())),
        cancel: CancellationToken::new(),
    };
    run(stream, Checkpoint::default()).await
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

/// A stream stopped while it waits to try a write again ends at once: the wait (up to 10 s)
/// does not hold the stop, and no try follows it; the unit was never committed.
#[tokio::test(start_paused = true)]
async fn a_stop_ends_the_wait_between_tries() {
    let log = Arc::new(Mutex::new(Log::default()));
    let mut source = FakeSource { chunks: chunks(1), log: log.clone(), fail_at_end: false };
    let sink = Arc::new(FakeSink { log: log.clone(), fail: Mutex::new(vec![ErrorKind::Transient; 50]) });
    let mut decoder = Decoder::new("t".into(), MetadataConfig::default(), HashMap::new());
    let cancel = CancellationToken::new();
    let flush = one_per_batch();
    let stream = Stream {
        name: "s",
        source: &mut source,
        decoder: &mut decoder,
        sink,
        flush: &flush,
        metrics: Arc::new(StreamMetrics::new(&Totals::default())),
        cancel: cancel.clone(),
    };
    let running = run(stream, Checkpoint::default());
    tokio::pin!(running);
    // Six tries have failed: the wait before the seventh is 3.2 s.
    while log.lock().unwrap().attempts < 6 {
        tokio::select! {
            ended = &mut running => panic!("the stream ended on its own: {ended:?}"),
            () = tokio::time::sleep(std::time::Duration::from_millis(10)) => {}
        }
    }
    let tries = log.lock().unwrap().attempts;
    let stopped = tokio::time::Instant::now();
    cancel.cancel();
    assert!(running.await.is_err(), "the unit was not written");
    assert!(stopped.elapsed() < std::time::Duration::from_secs(1), "the stop waited {:?}", stopped.elapsed());
    let log = log.lock().unwrap();
    assert_eq!(log.attempts, tries, "no try after the stop");
    assert!(log.commits.is_empty());
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

/// A source fed by the test through a channel, as pushes arrive.
struct ChannelSource(tokio::sync::mpsc::UnboundedReceiver<Chunk>);

#[async_trait]
impl Source for ChannelSource {
    async fn next(&mut self) -> Result<Option<Chunk>> {
        Ok(self.0.recv().await)
    }
    async fn commit(&mut self, _position: &Position) -> Result<()> {
        Ok(())
    }
    async fn abort(&mut self, _error: &Error) {}
}

/// A sink whose writes wait for the test to let them finish, telling it when each begins; it
/// keeps each unit's positions (its rows' `p`).
struct GatedSink {
    units: Arc<Mutex<Vec<Vec<i64>>>>,
    started: tokio::sync::mpsc::UnboundedSender<()>,
    gate: Arc<tokio::sync::Semaphore>,
}

#[async_trait]
impl Sink for GatedSink {
    async fn write(&self, unit: std::sync::Arc<WriteUnit>) -> Result<()> {
        let _ = self.started.send(());
        self.gate.acquire().await.unwrap().forget();
        let column = unit.tables[0].data.column_by_name("p").unwrap().clone();
        let p = column.as_any().downcast_ref::<arrow::array::Int64Array>().unwrap();
        self.units.lock().unwrap().push(p.values().to_vec());
        Ok(())
    }
}

/// A decoder of table `t` (`p` BIGINT) whose edge decodes pushes into columns.
fn decoder_with_edge() -> (Decoder, Arc<sluice_core::decode::Edge>) {
    use sluice_core::schema::Column;
    let edge = sluice_core::decode::Edge::new();
    let table =
        sluice_core::TableSchema::existing(vec![Column { name: "p".into(), ty: sluice_core::ColumnType::Bigint }]);
    let mut decoder = Decoder::new("t".into(), MetadataConfig::default(), HashMap::from([("t".to_string(), table)]))
        .with_edge(Some(edge.clone()));
    // A first unit publishes the table's columns to the edge.
    let (_, pending) = decoder.decode(chunks(1).pop_front().unwrap().records, 1).unwrap();
    decoder.commit(pending);
    (decoder, edge)
}

/// A push of `{"p": p}`, decoded at `edge`.
fn pushed(edge: &sluice_core::decode::Edge, p: i64) -> Chunk {
    let body = bytes::Bytes::from(format!(r#"{{"p": {p}}}"#));
    let (payload, _) = edge.decode_body(&body, &RecordMeta::default()).unwrap().unwrap();
    assert!(matches!(payload, Payload::Decoded(_)), "decoded at the edge");
    Chunk {
        records: vec![Record { payload, meta: RecordMeta::default() }],
        bytes: 10,
        position: Position(json!(p)),
        arrived: Instant::now(),
        flush: false,
    }
}

/// Pushes the edge decoded into columns that arrive while a write is in flight all go into
/// the next unit (they cost the loop nothing to decode, so it takes them until the write is
/// done); before, the next unit was fixed at the first of them, and the rest waited for a
/// write more.
#[tokio::test]
async fn predecoded_pushes_that_arrive_during_a_write_share_the_next_unit() {
    use tokio::sync::Semaphore;
    let (mut decoder, edge) = decoder_with_edge();
    let push = |p: i64| pushed(&edge, p);
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let (started_tx, mut started) = tokio::sync::mpsc::unbounded_channel();
    let units = Arc::new(Mutex::new(Vec::new()));
    let gate = Arc::new(Semaphore::new(0));
    let sink = Arc::new(GatedSink { units: units.clone(), started: started_tx, gate: gate.clone() });
    // No deadline cuts a batch short here, however slow the machine.
    let flush = FlushConfig { max_wait_ms: 60_000, ..FlushConfig::default() };
    let mut source = ChannelSource(rx);
    let feeder = async {
        tx.send(push(2)).unwrap();
        started.recv().await.unwrap();
        // Three pushes while the first write is in flight, apart, so the loop has taken the
        // first before the next comes; then the write ends.
        for p in 3..=5 {
            tx.send(push(p)).unwrap();
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        // Every write from now on ends at once.
        gate.add_permits(Semaphore::MAX_PERMITS / 2);
        drop(tx);
    };
    let (result, ()) = tokio::join!(run_stream(&mut source, &mut decoder, sink, &flush), feeder);
    result.unwrap();
    assert_eq!(*units.lock().unwrap(), vec![vec![2], vec![3, 4, 5]]);
}

/// A sink that notes the (paused) clock at each write, then ends its [`ChannelSource`].
struct ClockSink(Arc<Mutex<Vec<tokio::time::Instant>>>, Mutex<Option<tokio::sync::mpsc::UnboundedSender<Chunk>>>);

#[async_trait]
impl Sink for ClockSink {
    async fn write(&self, _unit: std::sync::Arc<WriteUnit>) -> Result<()> {
        self.0.lock().unwrap().push(tokio::time::Instant::now());
        self.1.lock().unwrap().take();
        Ok(())
    }
}

/// With `linger_ms` 0 and no write in flight, a unit of pushes takes what is here and is
/// written at once. The loop used to ask a timer set to now whether more had come, and such a
/// timer fires only at the timer's next millisecond tick: up to a millisecond per unit while
/// the pushes' clients waited, a fifth of the push bench's rate. With the clock paused, the
/// write must happen at the very instant the push arrived.
#[tokio::test(start_paused = true)]
async fn with_no_linger_a_unit_is_written_without_waiting_on_a_timer() {
    // Off the millisecond, so that a timer set to now would move the paused clock on.
    tokio::time::advance(std::time::Duration::from_micros(500)).await;
    let writes = Arc::new(Mutex::new(Vec::new()));
    let (mut decoder, edge) = decoder_with_edge();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tx.send(pushed(&edge, 2)).unwrap();
    let mut source = ChannelSource(rx);
    let sink = Arc::new(ClockSink(writes.clone(), Mutex::new(Some(tx))));
    let start = tokio::time::Instant::now();
    run_stream(&mut source, &mut decoder, sink, &FlushConfig::default()).await.unwrap();
    assert_eq!(*writes.lock().unwrap(), [start], "the unit was written without the clock moving");
}

/// A chunk of a snapshot's copy of table `t`: one row, `p`; the first clears the table, the
/// last completes the copy.
fn copy_chunk(p: i64, clear: bool, last: bool) -> Chunk {
    use sluice_core::CopyRows;
    let rows = CopyRows {
        columns: Arc::new(vec![("p".into(), sluice_core::ColumnType::Bigint)]),
        keys: vec!["p".into()],
        whole_row: false,
        db: "d".into(),
        schema: "public".into(),
        table: "t".into(),
        clear,
        last,
        rows: vec![bytes::Bytes::from(format!("{p}\n"))],
        binary: None,
    };
    Chunk {
        records: vec![Record {
            payload: Payload::Copy(rows),
            meta: RecordMeta { route: Some("t".into()), ..RecordMeta::default() },
        }],
        bytes: 10,
        position: Position(json!(p)),
        arrived: Instant::now(),
        flush: true,
    }
}

/// A sink with two lanes. It logs each call (`write`, or `write_after` with its lane) as it
/// begins; a write beside another waits for the loop to say the one before is durable. The
/// write of each position in `wait_for_next` is answered only once the next write has begun,
/// so the two must run at once; `fail` fails that position's write for good once the next has
/// begun.
struct LaneSink {
    log: Arc<Mutex<Log>>,
    calls: Arc<Mutex<Vec<String>>>,
    wait_for_next: Vec<i64>,
    fail: Option<i64>,
    began: tokio::sync::watch::Sender<i64>,
}

impl LaneSink {
    fn begin(&self, unit: &WriteUnit, call: String) -> i64 {
        let p = unit.checkpoint.position.0.as_i64().unwrap();
        self.calls.lock().unwrap().push(call);
        self.began.send_replace(p);
        p
    }

    async fn apply(&self, p: i64) -> Result<()> {
        if self.wait_for_next.contains(&p) || Some(p) == self.fail {
            let mut began = self.began.subscribe();
            let next = tokio::time::timeout(std::time::Duration::from_secs(30), began.wait_for(|b| *b > p));
            if next.await.is_err() {
                return Err(Error::new(ErrorKind::Fatal, format!("the write after {p} did not begin beside it")));
            }
            if Some(p) == self.fail {
                return Err(Error::new(ErrorKind::Fatal, "refused"));
            }
        }
        self.log.lock().unwrap().durable.push(p);
        Ok(())
    }
}

#[async_trait]
impl Sink for LaneSink {
    async fn write(&self, unit: std::sync::Arc<WriteUnit>) -> Result<()> {
        let p = self.begin(&unit, format!("write {}", unit.checkpoint.position.0));
        self.apply(p).await
    }
    fn lanes(&self) -> usize {
        2
    }
    async fn write_after(&self, unit: std::sync::Arc<WriteUnit>, lane: usize, previous: Preceding) -> Result<()> {
        let p = self.begin(&unit, format!("write {} on {lane}", unit.checkpoint.position.0));
        let told = previous.durable().await;
        self.calls.lock().unwrap().push(format!("{p}: {}", if told.is_ok() { "durable" } else { "failed" }));
        told?;
        // The loop says so only once the write before has returned.
        assert_eq!(self.log.lock().unwrap().durable.last(), Some(&(p - 1)), "{p} was let commit before {}", p - 1);
        self.apply(p).await
    }
}

async fn drive_lanes(
    n: i64,
    wait_for_next: Vec<i64>,
    fail: Option<i64>,
) -> (Result<Checkpoint>, Arc<Mutex<Log>>, Vec<String>) {
    let log = Arc::new(Mutex::new(Log::default()));
    let chunks = (1..=n).map(|p| copy_chunk(p, p == 1, p == n)).collect();
    let mut source = FakeSource { chunks, log: log.clone(), fail_at_end: false };
    let calls = Arc::new(Mutex::new(Vec::new()));
    let began = tokio::sync::watch::Sender::new(0);
    let sink = Arc::new(LaneSink { log: log.clone(), calls: calls.clone(), wait_for_next, fail, began });
    let mut decoder = Decoder::new("t".into(), MetadataConfig::default(), HashMap::new());
    let result = run_stream(&mut source, &mut decoder, sink, &one_per_batch()).await;
    let calls = calls.lock().unwrap().clone();
    (result, log, calls)
}

/// A snapshot's middle chunks go beside the one before them, on alternate lanes, each told
/// when the one before is durable; the first chunk (it creates the table) and the last (it
/// adds the key) go alone; positions are still committed in order, each after its own write.
#[tokio::test]
async fn a_sink_with_two_lanes_writes_a_snapshot_chunk_beside_the_one_before() {
    let (result, log, calls) = drive_lanes(6, vec![2, 3, 4], None).await;
    assert_eq!(result.unwrap().totals.rows_written, 6);
    let (writes, told): (Vec<_>, Vec<_>) = calls.iter().partition(|c| c.starts_with("write"));
    assert_eq!(writes, ["write 1", "write 2", "write 3 on 1", "write 4 on 0", "write 5 on 1", "write 6"]);
    assert_eq!(told, ["3: durable", "4: durable", "5: durable"]);
    let log = log.lock().unwrap();
    assert_eq!(log.durable, [1, 2, 3, 4, 5, 6]);
    assert_eq!(log.commits, [1, 2, 3, 4, 5, 6]);
}

/// When a write fails, the one beside it is told so and does not commit: the loop returns the
/// error, and commits neither position.
#[tokio::test]
async fn a_write_beside_one_that_failed_is_stopped_and_never_committed() {
    let (result, log, calls) = drive_lanes(5, vec![], Some(2)).await;
    assert_eq!(result.unwrap_err().kind(), ErrorKind::Fatal);
    // The write beside the failed one is told so (not "durable"), and never commits.
    assert_eq!(calls, ["write 1", "write 2", "write 3 on 1", "3: failed"]);
    let log = log.lock().unwrap();
    assert_eq!(log.commits, [1]);
    assert_eq!(log.durable, [1]);
    assert_eq!(log.aborts, 1);
}

/// A source that notes, as each chunk is taken, how many writes had begun by then.
struct WatchingSource {
    chunks: VecDeque<Chunk>,
    begun: Arc<std::sync::atomic::AtomicUsize>,
    seen: Arc<Mutex<Vec<usize>>>,
}

#[async_trait]
impl Source for WatchingSource {
    async fn next(&mut self) -> Result<Option<Chunk>> {
        let chunk = self.chunks.pop_front();
        if chunk.is_some() {
            self.seen.lock().unwrap().push(self.begun.load(std::sync::atomic::Ordering::SeqCst));
        }
        Ok(chunk)
    }
    async fn commit(&mut self, _position: &Position) -> Result<()> {
        Ok(())
    }
    async fn abort(&mut self, _error: &Error) {}
}

/// A sink that counts the writes begun, then waits a moment (a write is I/O).
struct CountingSink(Arc<std::sync::atomic::AtomicUsize>);

#[async_trait]
impl Sink for CountingSink {
    async fn write(&self, _unit: std::sync::Arc<WriteUnit>) -> Result<()> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        Ok(())
    }
}

/// A unit's write begins before the loop takes and decodes the next chunk, for every kind of
/// unit (here plain JSON, not a snapshot's chunk): tokio runs a task spawned from this one only
/// once this one yields, and the next chunk here is ready at once, so without the loop's yield
/// the write would wait for the next decode instead of overlapping it.
#[tokio::test]
async fn a_units_write_begins_before_the_next_chunk_is_decoded() {
    let begun = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut source = WatchingSource { chunks: chunks(4), begun: begun.clone(), seen: seen.clone() };
    let sink = Arc::new(CountingSink(begun.clone()));
    let mut decoder = Decoder::new("t".into(), MetadataConfig::default(), HashMap::new());
    run_stream(&mut source, &mut decoder, sink, &one_per_batch()).await.unwrap();
    assert_eq!(*seen.lock().unwrap(), vec![0, 1, 2, 3], "chunk n+1 is taken once write n has begun");
}
