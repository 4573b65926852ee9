//! The run loop: read → decode → write → commit. The only place a position is committed.

use std::collections::VecDeque;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::batch::{Checkpoint, Chunk, IdempotencyKey, Position, Record, WriteUnit};
use crate::decode::Decoder;
use crate::error::{Error, ErrorKind, Result};
use crate::metrics::StreamMetrics;
use crate::quarantine::{self, Isolated};
use crate::rejects::RejectBatch;
use crate::sink::{Preceding, Sink};
use crate::source::Source;
use crate::source::{ChunkReport, REPORTED_REJECTS, RejectedEvent};

/// When a micro-batch is written: on rows, bytes or time, whichever comes first, or as soon as
/// the source has nothing more ready for `linger_ms`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct FlushConfig {
    /// Write once this many events are buffered.
    pub max_rows: usize,
    /// Write once this many payload bytes are buffered.
    pub max_bytes: usize,
    /// Write at the latest this long after the first buffered event arrived.
    pub max_wait_ms: u64,
    /// Write when no further data arrives for this long (keeps latency low at low rates).
    pub linger_ms: u64,
}

impl Default for FlushConfig {
    fn default() -> Self {
        Self { max_rows: 100_000, max_bytes: 32 << 20, max_wait_ms: 250, linger_ms: 0 }
    }
}

impl FlushConfig {
    /// Check the values; pure.
    pub fn validate(&self) -> Result<()> {
        if self.max_rows == 0 {
            return Err(Error::config("flush.max_rows", "must be at least 1"));
        }
        if self.max_bytes == 0 {
            return Err(Error::config("flush.max_bytes", "must be at least 1"));
        }
        if self.max_wait_ms == 0 || self.max_wait_ms > 60_000 {
            return Err(Error::config("flush.max_wait_ms", "must be between 1 and 60000"));
        }
        if self.linger_ms > self.max_wait_ms {
            return Err(Error::config("flush.linger_ms", "must not exceed flush.max_wait_ms"));
        }
        Ok(())
    }
}

/// Everything one stream's loop needs.
pub struct Stream<'a> {
    /// The stream's name.
    pub name: &'a str,
    /// Where records come from.
    pub source: &'a mut dyn Source,
    /// Turns records into batches.
    pub decoder: &'a mut Decoder,
    /// Where batches go.
    pub sink: Arc<dyn Sink>,
    /// Micro-batch rules.
    pub flush: &'a FlushConfig,
    /// Live metrics.
    pub metrics: Arc<StreamMetrics>,
    /// Stops the loop between batches.
    pub cancel: CancellationToken,
}

/// A write handed to the sink and not yet known to be durable.
struct InFlight {
    task: JoinHandle<Result<()>>,
    checkpoint: Checkpoint,
    arrived: Vec<Instant>,
    reports: Vec<ChunkReport>,
    /// The table of a unit that a next one may be written beside ([`beside`]).
    beside: Option<String>,
    /// The sink's lane it is written on (0, or 1 for every other unit written beside another).
    lane: usize,
    /// Says when it is durable, to a unit written beside it.
    durable: Preceding,
}

/// The writes in flight, oldest first: one, or two when the sink has lanes for a snapshot's
/// chunks ([`Sink::lanes`]). They finish in order.
#[derive(Default)]
struct Writes(VecDeque<InFlight>);

impl Writes {
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `unit` may be written while the write in flight still runs (both are chunks of
    /// the same snapshot table, with nothing else to write: [`beside`], and only one write is
    /// in flight): then the lane for `unit`, the other one's, and what says when that one is
    /// durable.
    fn can_follow(&self, unit: &WriteUnit, lanes: usize) -> Option<(usize, Preceding)> {
        let front = self.0.front().filter(|_| lanes > 1 && self.0.len() == 1)?;
        let same = front.beside.as_deref().is_some_and(|t| beside(unit) == Some(t));
        same.then(|| (1 - front.lane, front.durable.clone()))
    }
}

impl Drop for Writes {
    /// The loop is dropped: a write beside the oldest one is stopped, as nothing would finish
    /// it in order; the oldest goes on, as a single write always did.
    fn drop(&mut self) {
        for f in self.0.iter().skip(1) {
            f.task.abort();
        }
    }
}

/// The table of a unit that is only rows of a snapshot's chunk in the middle of a table's copy:
/// no new table or column, no first or last chunk, no rejects, push keys or replays. Such a
/// unit may be written beside the one before it.
fn beside(unit: &WriteUnit) -> Option<&str> {
    let [table] = unit.tables.as_slice() else { return None };
    let middle = table.snapshot.as_ref().is_some_and(|s| !s.clear && !s.complete);
    let alone = unit.rejects.is_empty() && unit.idempotency.is_empty() && unit.replayed.is_empty();
    (middle && alone && table.changes.is_empty() && table.mirror.is_none()).then_some(table.table.as_str())
}

/// Run a stream from `checkpoint` until the source ends or `cancel` fires, and return the last
/// durable checkpoint.
///
/// One write is in flight while the next batch is gathered and decoded, so decoding and the
/// sink's work overlap; a sink with two lanes also takes a snapshot's next chunk while the one
/// before it is written, and commits them in order. Writes finish in order, and a position is
/// committed upstream only after its write is durable. Retryable write errors are retried with
/// backoff, the unit unchanged; any other error stops the loop (the caller restarts from the durable checkpoint, with a
/// decoder rebuilt from the destination).
pub async fn run(mut s: Stream<'_>, checkpoint: Checkpoint) -> Result<Checkpoint> {
    s.metrics.set_state("running", None);
    let mut durable = checkpoint.clone();
    let mut inflight = Writes::default();
    let outcome = run_batches(&mut s, checkpoint, &mut inflight, &mut durable).await;
    // Whatever ended the loop, the write in flight ends before we return: the caller reloads
    // the checkpoint from the sink, and must not read it while a write may still land.
    let drained = drain(&mut s, &mut inflight, &mut durable).await;
    outcome.and(drained).map(|()| durable)
}

/// The loop proper: gather, decode, and hand each unit to the sink behind the previous one.
async fn run_batches(
    s: &mut Stream<'_>,
    checkpoint: Checkpoint,
    inflight: &mut Writes,
    durable: &mut Checkpoint,
) -> Result<()> {
    let mut decoded_to = checkpoint;
    let lanes = s.sink.lanes();
    loop {
        let first = tokio::select! {
            _ = s.cancel.cancelled() => return Ok(()),
            chunk = s.source.next() => chunk?,
            done = join(inflight), if !inflight.is_empty() => {
                *durable = finish(s, inflight, done).await?;
                continue;
            }
        };
        let Some(first) = first else { return Ok(()) };
        let (chunks, ended) = gather(s, first, inflight, durable).await?;
        let (unit, arrived, reports) = decode(s, chunks, &decoded_to)?;
        decoded_to = unit.checkpoint.clone();
        // A snapshot's chunk goes beside the one in flight when the sink can write two at once;
        // any other unit waits until the writes before it are done.
        let follows = loop {
            if let Some(follows) = inflight.can_follow(&unit, lanes) {
                break Some(follows);
            }
            if inflight.is_empty() {
                break None;
            }
            let done = join(inflight).await;
            *durable = finish(s, inflight, done).await?;
        };
        inflight.0.push_back(submit(s, unit, arrived, reports, follows));
        // Let the write start before the next decode: tokio runs a task spawned here on this
        // worker (its LIFO slot, which other workers do not steal from) only once this task
        // yields, and decoding does not yield, so the write would wait for the next decode
        // instead of overlapping it.
        tokio::task::yield_now().await;
        if ended {
            return Ok(());
        }
    }
}

/// Wait for the writes in flight, oldest first, and finish them.
async fn drain(s: &mut Stream<'_>, inflight: &mut Writes, durable: &mut Checkpoint) -> Result<()> {
    while !inflight.is_empty() {
        let done = join(inflight).await;
        *durable = finish(s, inflight, done).await?;
    }
    Ok(())
}

/// Collect chunks until a flush rule fires, finishing an in-flight write meanwhile. Returns the
/// chunks and whether the source ended.
async fn gather(
    s: &mut Stream<'_>,
    first: Chunk,
    inflight: &mut Writes,
    durable: &mut Checkpoint,
) -> Result<(Vec<Chunk>, bool)> {
    let deadline = tokio::time::Instant::from_std(first.arrived + Duration::from_millis(s.flush.max_wait_ms));
    let linger = Duration::from_millis(s.flush.linger_ms);
    let mut rows = first.records.len();
    let mut bytes = first.bytes;
    let mut flush = first.flush;
    // Chunks whose events the edge already decoded into columns cost the loop almost nothing
    // to decode, so while the previous write is in flight the batch takes every such chunk
    // that arrives until that write is done, instead of being fixed before it: with the write
    // the slow part, batches then hold what arrived during one write, not during the one
    // before it (1.5 times as many rows per unit on a slow machine, and each push waits for
    // one write fewer). Other chunks are decoded while the write is in flight.
    let mut predecoded = is_predecoded(&first);
    let mut chunks = vec![first];
    while !flush && rows < s.flush.max_rows && bytes < s.flush.max_bytes {
        let holds = predecoded && !inflight.is_empty();
        // Pushes with no write in flight take only what is here already. A timer set to now
        // would fire at the timer's next tick, up to a millisecond later, while the pushes'
        // clients wait for their commit and nothing else is done (a fifth of the push bench's
        // rate). A broker's messages keep that wait, which gathers more of them into the unit:
        // without it Kafka → workspace ran 6-8% slower in two pairs of runs, within this
        // machine's noise but not shown to be harmless (BENCHMARKS.md).
        let ready = (predecoded && inflight.is_empty() && linger.is_zero()).then(|| ready_now(s.source));
        let next = match ready {
            Some(Poll::Ready(next)) => next,
            // Nothing here, unless the task's cooperative budget ran out: then the source
            // answers Pending whatever it holds, and the wait below goes on with a new budget.
            Some(Poll::Pending) if tokio::task::coop::has_budget_remaining() => break,
            _ => {
                let wake = if holds { deadline } else { deadline.min(tokio::time::Instant::now() + linger) };
                tokio::select! {
                    next = tokio::time::timeout_at(wake, s.source.next()) => match next {
                        Ok(next) => next,
                        Err(_) => break,
                    },
                    done = join(inflight), if !inflight.is_empty() => {
                        *durable = finish(s, inflight, done).await?;
                        continue;
                    }
                }
            }
        };
        let Some(chunk) = next? else { return Ok((chunks, true)) };
        rows += chunk.records.len();
        bytes += chunk.bytes;
        flush = chunk.flush;
        predecoded &= is_predecoded(&chunk);
        chunks.push(chunk);
    }
    Ok((chunks, false))
}

/// The source's next chunk if one is here now, else `Pending` at once (the source's `next` is
/// cancel-safe, so the dropped call loses nothing).
fn ready_now(source: &mut dyn Source) -> Poll<Result<Option<Chunk>>> {
    source.next().as_mut().poll(&mut std::task::Context::from_waker(std::task::Waker::noop()))
}

/// Whether every event of `chunk` was decoded into columns at the edge.
fn is_predecoded(chunk: &Chunk) -> bool {
    !chunk.records.is_empty() && chunk.records.iter().all(|r| matches!(r.payload, crate::batch::Payload::Decoded(_)))
}

/// Turn chunks into one write unit that moves the stream from `from` onwards.
fn decode(
    s: &mut Stream<'_>,
    chunks: Vec<Chunk>,
    from: &Checkpoint,
) -> Result<(WriteUnit, Vec<Instant>, Vec<ChunkReport>)> {
    let position = chunks.last().map(|c| c.position.clone()).unwrap_or_else(|| from.position.clone());
    let shape: Vec<(Position, usize)> = chunks.iter().map(|c| (c.position.clone(), c.records.len())).collect();
    let arrived: Vec<Instant> = chunks.iter().map(|c| c.arrived).collect();
    let bytes: usize = chunks.iter().map(|c| c.bytes).sum();
    let mut records: Vec<Record> = Vec::with_capacity(chunks.iter().map(|c| c.records.len()).sum());
    chunks.into_iter().for_each(|c| records.extend(c.records));
    let newest = records.iter().map(|r| r.meta.received_us).max();
    // Each push's Idempotency-Key, with the chunk it came in: the key keeps that chunk's answer.
    let chunk_of = shape.iter().enumerate().flat_map(|(i, (_, n))| std::iter::repeat_n(i, *n));
    let mut idempotency: Vec<(usize, IdempotencyKey)> =
        chunk_of.zip(&records).filter_map(|(i, r)| Some((i, r.meta.idempotency.clone()?))).collect();
    let started = Instant::now();
    let (decoded, pending) =
        s.decoder.decode_spread(records, from.sequence + 1, decode_threads(), crate::decode::SPREAD_MIN_RUN_BYTES)?;
    // The next batch decodes against these schemas. Should this write fail for good, the loop
    // stops and the caller rebuilds the decoder from the destination.
    s.decoder.commit(pending);
    tracing::debug!(
        stream = s.name,
        rows = decoded.rows,
        chunks = arrived.len(),
        decode_ms = started.elapsed().as_secs_f64() * 1e3,
        "Batch decoded."
    );
    let mut totals = from.totals.clone();
    totals.events_in += decoded.events;
    totals.rows_written += decoded.rows;
    totals.filtered += decoded.filtered_at.len() as u64;
    totals.rejects += decoded.rejects.len() as u64;
    totals.bytes_in += bytes as u64;
    totals.batches += 1;
    totals.last_event_us = newest.max(totals.last_event_us);
    let rejects = decoded.rejects.finish();
    let reports = reports(shape, &decoded.record_ends, from.sequence, &rejects, &decoded.filtered_at);
    for (i, key) in &mut idempotency {
        if let Some(report) = reports.get(*i) {
            key.answer = report.answer(false).to_string();
        }
    }
    let idempotency = idempotency.into_iter().map(|(_, key)| key).collect();
    let unit = WriteUnit {
        stream: s.name.to_string(),
        tables: decoded.tables,
        rejects,
        idempotency,
        replayed: Vec::new(),
        checkpoint: Checkpoint { position, sequence: decoded.last_sequence, totals },
    };
    Ok((unit, arrived, reports))
}

/// Threads a large batch of raw messages is decoded on, at most: `SLUICE_DECODE_THREADS` (1 to
/// 64), or one per core up to 8.
fn decode_threads() -> usize {
    static THREADS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *THREADS.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, usize::from).min(8);
        let set = std::env::var("SLUICE_DECODE_THREADS").ok().and_then(|v| v.parse::<usize>().ok());
        set.unwrap_or(cores).clamp(1, 64)
    })
}

/// What each chunk's events came to: its sequences follow the chunk before it's.
fn reports(
    shape: Vec<(Position, usize)>,
    record_ends: &[i64],
    before: i64,
    rejects: &RejectBatch,
    filtered_at: &[i64],
) -> Vec<ChunkReport> {
    let mut reports = Vec::with_capacity(shape.len());
    let (mut records, mut start) = (0usize, before + 1);
    let mut ends = Vec::with_capacity(shape.len());
    for (position, n) in shape {
        records += n;
        let end = if records == 0 { before } else { record_ends.get(records - 1).copied().unwrap_or(before) };
        let end = end.max(start - 1);
        reports.push(ChunkReport {
            position,
            events: u64::try_from(end - start + 1).unwrap_or(0),
            ..ChunkReport::default()
        });
        ends.push((start, end));
        start = end + 1;
    }
    for sequence in filtered_at {
        let i = ends.partition_point(|(_, end)| end < sequence);
        if let Some(report) = reports.get_mut(i).filter(|_| ends[i].0 <= *sequence) {
            report.filtered += 1;
        }
    }
    let mut seen: Vec<Option<i64>> = vec![None; reports.len()];
    let mut refused_seen: Vec<Option<i64>> = vec![None; reports.len()];
    for (sequence, column, reason) in rejects.summaries() {
        // The chunks' ranges follow each other in order: the first ending at or after it.
        let i = ends.partition_point(|(_, end)| *end < sequence);
        if ends.get(i).is_none_or(|(start, _)| *start > sequence) {
            continue;
        }
        let report = &mut reports[i];
        if seen[i] != Some(sequence) {
            report.rejected += 1;
            seen[i] = Some(sequence);
        }
        if column.is_none() && refused_seen[i] != Some(sequence) {
            report.refused += 1;
            refused_seen[i] = Some(sequence);
        }
        if report.rejects.len() < REPORTED_REJECTS {
            report.rejects.push(RejectedEvent {
                event: u64::try_from(sequence - ends[i].0).unwrap_or(0),
                column: column.map(str::to_string),
                reason: reason.to_string(),
            });
        }
    }
    reports
}

/// Hand a unit to the sink on its own task, retrying what may succeed; `follows` is the lane
/// of a unit written beside the one still in flight, and what says when that one is durable.
fn submit(
    s: &Stream<'_>,
    unit: WriteUnit,
    arrived: Vec<Instant>,
    reports: Vec<ChunkReport>,
    follows: Option<(usize, Preceding)>,
) -> InFlight {
    let checkpoint = unit.checkpoint.clone();
    let beside = beside(&unit).map(str::to_string);
    let lane = follows.as_ref().map_or(0, |(lane, _)| *lane);
    let (done, durable) = Preceding::new();
    let unit = Arc::new(unit);
    let (sink, metrics, cancel, name) = (s.sink.clone(), s.metrics.clone(), s.cancel.clone(), s.name.to_string());
    let task = tokio::spawn(async move {
        let written = write(sink.as_ref(), unit, follows, &metrics, &cancel, &name).await;
        // A unit written beside this one commits only once this says so.
        done.send_replace(Some(written.is_ok()));
        written
    });
    InFlight { task, checkpoint, arrived, reports, beside, lane, durable }
}

/// Write `unit`, retrying what may succeed; a unit that the sink refuses for good has its
/// refused rows found and sent to the ledger, and the rest written, once.
async fn write(
    sink: &dyn Sink,
    unit: Arc<WriteUnit>,
    follows: Option<(usize, Preceding)>,
    metrics: &StreamMetrics,
    cancel: &CancellationToken,
    name: &str,
) -> Result<()> {
    let started = Instant::now();
    let mut backoff = Duration::from_millis(100);
    let mut unit = unit;
    let mut isolated = false;
    let lane = follows.as_ref().map_or(0, |(lane, _)| *lane);
    loop {
        let written = match &follows {
            Some((lane, previous)) => sink.write_after(unit.clone(), *lane, previous.clone()).await,
            None => sink.write(unit.clone()).await,
        };
        match written {
            Ok(()) => break,
            // The write before failed: this one must not commit, and the loop stops both.
            Err(e) if follows.as_ref().is_some_and(|(_, previous)| previous.failed()) => return Err(e),
            // A full disk stored nothing: the unit fails at once (its pushes are told so), and
            // the stream waits for room, not for a backoff.
            Err(e) if e.kind() == crate::ErrorKind::Storage => return Err(e),
            Err(e) if e.is_retryable() && !cancel.is_cancelled() => {
                tracing::warn!(stream = %name, error = %e, "Write failed; retrying.");
                let state = if e.kind() == crate::ErrorKind::Connect { "reconnecting" } else { "retrying" };
                metrics.set_state(state, Some(e.to_string()));
                // A stop ends the wait: the unit was not committed, so nothing is lost.
                tokio::select! {
                    () = cancel.cancelled() => return Err(e),
                    () = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(10));
            }
            // Refused for good: find the rows at fault and write the rest, once. A config
            // error is the config's to fix, not the rows'.
            Err(e) if !isolated && !cancel.is_cancelled() && e.kind() != crate::ErrorKind::Config => {
                isolated = true;
                // A unit written beside another is isolated, and written again with its
                // rejects, only once the one before is durable: the two never both hold
                // what one of them refused.
                if let Some((_, previous)) = &follows {
                    previous.durable().await?;
                }
                match quarantine::isolate(sink, &unit, &e, lane).await {
                    Isolated::Unchanged => {}
                    Isolated::Cleaned(cleaned, refused) => {
                        tracing::warn!(stream = %name, error = %e, rows = refused, "Rows refused by the destination went to the ledger.");
                        unit = Arc::from(cleaned);
                    }
                    Isolated::NotData => return Err(e),
                    // A try failed with an error that may pass: nothing was decided, so the unit
                    // is written again after a wait, and isolated again should it be refused.
                    Isolated::Retry => {
                        isolated = false;
                        tracing::warn!(stream = %name, error = %e, "Finding the refused rows met an error that may pass; retrying.");
                        metrics.set_state("retrying", Some(e.to_string()));
                        tokio::select! {
                            () = cancel.cancelled() => return Err(e),
                            () = tokio::time::sleep(backoff) => {}
                        }
                        backoff = (backoff * 2).min(Duration::from_secs(10));
                    }
                }
            }
            Err(e) => return Err(e),
        }
    }
    tracing::debug!(stream = %name, write_ms = started.elapsed().as_secs_f64() * 1e3, "Batch written.");
    Ok(())
}

/// Wait for the oldest write in flight; pending forever when there is none (for `select!`
/// guards).
async fn join(inflight: &mut Writes) -> Result<()> {
    match inflight.0.front_mut() {
        Some(f) => (&mut f.task).await.map_err(|e| Error::new(ErrorKind::Fatal, "write task failed").with_source(e))?,
        None => std::future::pending().await,
    }
}

/// The in-flight write ended: on success commit its position upstream (the only place a
/// position is committed) and return the new durable checkpoint.
async fn finish(s: &mut Stream<'_>, inflight: &mut Writes, done: Result<()>) -> Result<Checkpoint> {
    let Some(f) = inflight.0.pop_front() else { return Err(Error::new(ErrorKind::Fatal, "no write in flight")) };
    if let Err(e) = done {
        // A write beside this one must not commit after it failed: it is stopped.
        for behind in inflight.0.drain(..) {
            behind.task.abort();
            let _ = behind.task.await;
        }
        s.source.abort(&e).await;
        return Err(e);
    }
    let now = Instant::now();
    let latencies: Vec<Duration> = f.arrived.iter().map(|a| now.duration_since(*a)).collect();
    s.metrics.committed(&f.checkpoint.totals, &latencies);
    s.source.commit_reports(&f.checkpoint.position, f.reports).await?;
    Ok(f.checkpoint)
}
