//! The consumer thread. It owns the librdkafka consumer, batches messages into chunks, seeks to
//! the stored offsets on assignment, and on revocation makes everything read so far durable
//! before letting the partitions go.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::message::{Headers, Message};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use serde_json::{Map, Value};
use sluice_core::{Chunk, Lag, Payload, Position, Record, RecordMeta, StreamMetrics};
use tokio::sync::{mpsc, oneshot};

use super::StartFrom;
use super::throttle::{self, Throttle};
use super::watchdog::Watchdog;

/// Next offset to read, per topic and partition.
pub(crate) type Offsets = BTreeMap<String, BTreeMap<i32, i64>>;

/// How long a revocation waits for buffered messages to become durable.
const REVOKE_WAIT: Duration = Duration::from_secs(30);
/// Messages per chunk handed to the run loop, at most.
const CHUNK_RECORDS: usize = 2000;
/// Payload bytes per chunk, at most (give or take one message): with the source's channel of 64
/// chunks, what is read ahead of the run loop is bounded by bytes, not by messages, whatever
/// their size.
const CHUNK_BYTES: usize = 1 << 20;
/// How long the first message of a chunk waits for more.
const CHUNK_WAIT: Duration = Duration::from_millis(20);

/// Whether what is buffered is sent as a chunk now.
fn chunk_due(records: usize, bytes: usize, first: Option<Instant>) -> bool {
    records >= CHUNK_RECORDS || bytes >= CHUNK_BYTES || first.is_some_and(|f| f.elapsed() >= CHUNK_WAIT)
}

/// A chunk, tagged with the rewind epoch it was read in.
pub(crate) struct Tagged {
    pub chunk: Chunk,
    pub epoch: u64,
}

/// What the async side asks of the thread.
pub(crate) enum Command {
    /// Seek every assigned partition back to these offsets.
    Rewind(Offsets, oneshot::Sender<()>),
}

/// State shared by the thread and the source.
pub(crate) struct Shared {
    /// Offsets durable in the destination.
    pub durable: Mutex<Offsets>,
    /// The highest chunk number whose rows are durable, with a condvar for revocations.
    pub durable_chunk: Mutex<u64>,
    pub durable_signal: Condvar,
    /// Bumped by a rewind; chunks of an older epoch are dropped.
    pub epoch: AtomicU64,
    /// Set when the source is dropped: stop, and do not wait on revocation.
    pub stopping: AtomicBool,
    /// The partitions assigned here, kept by the rebalance callback, so that a commit can name
    /// only those without asking librdkafka (whose `assignment()` waits on its own thread).
    pub held: Mutex<std::collections::BTreeMap<String, std::collections::BTreeSet<i32>>>,
}

/// The first message of a chunk on one partition: offset, timestamp (ms), chunk number.
type ChunkStart = (i64, i64, u64);

/// Messages read since the last chunk was sent.
#[derive(Default)]
struct Buffer {
    records: Vec<Record>,
    bytes: usize,
    first: Option<Instant>,
    /// Next offset per partition as read so far (not necessarily durable).
    read: Offsets,
    chunk_no: u64,
    /// First message of each chunk, per partition: (offset, timestamp ms, chunk number), for
    /// the age of the oldest message not yet durable.
    pending: BTreeMap<(String, i32), VecDeque<ChunkStart>>,
}

/// The consumer's context: the rebalance handling lives here.
pub(crate) struct Context {
    pub shared: Arc<Shared>,
    pub tx: mpsc::Sender<Tagged>,
    pub start: StartFrom,
    pub metrics: Arc<StreamMetrics>,
    /// The stream's name, for log lines.
    stream: String,
    buffer: Mutex<Buffer>,
    /// The last specific client error (its code and text), kept so "all brokers down" can say
    /// why.
    cause: Mutex<Option<(Option<rdkafka::types::RDKafkaErrorCode>, String)>>,
    /// Repeated warnings and errors are logged once a minute, with a count.
    throttle: Throttle,
    /// An error was reported (from the consumer thread or librdkafka's own) and the stream has
    /// not been seen healthy since: the next message read, or a broker answer while holding
    /// partitions, puts the state back to `running`.
    degraded: AtomicBool,
    /// Rejoins the watchdog asked for (the `group_rejoins` metric).
    rejoins: AtomicU64,
    /// The offset each partition held here was assigned at: the group's offset then, or a
    /// later one stored with the rows.
    assigned_at: Mutex<Offsets>,
}

impl Context {
    pub(crate) fn new(
        stream: &str,
        shared: Arc<Shared>,
        tx: mpsc::Sender<Tagged>,
        start: StartFrom,
        metrics: Arc<StreamMetrics>,
    ) -> Self {
        let read = shared.durable.lock().map(|d| d.clone()).unwrap_or_default();
        let buffer = Mutex::new(Buffer { read, ..Buffer::default() });
        Self {
            shared,
            tx,
            start,
            metrics,
            stream: stream.to_string(),
            buffer,
            cause: Mutex::new(None),
            throttle: Throttle::new(throttle::WINDOW),
            degraded: AtomicBool::new(true),
            rejoins: AtomicU64::new(0),
            assigned_at: Mutex::default(),
        }
    }

    /// Send what is buffered as one chunk; returns its number. Returns `None` when the source
    /// is gone.
    fn flush(&self, barrier: bool) -> Option<u64> {
        let mut buffer = self.buffer.lock().ok()?;
        if buffer.records.is_empty() && !barrier {
            return Some(buffer.chunk_no);
        }
        buffer.chunk_no += 1;
        let position = position(&buffer.read, buffer.chunk_no);
        let chunk = Chunk {
            records: std::mem::take(&mut buffer.records),
            bytes: std::mem::take(&mut buffer.bytes),
            position,
            arrived: buffer.first.take().unwrap_or_else(Instant::now),
            flush: barrier,
        };
        let epoch = self.shared.epoch.load(Ordering::Acquire);
        let no = buffer.chunk_no;
        drop(buffer);
        self.tx.blocking_send(Tagged { chunk, epoch }).ok()?;
        Some(no)
    }

    fn push(&self, message: &rdkafka::message::BorrowedMessage<'_>) {
        let Ok(mut buffer) = self.buffer.lock() else { return };
        let topic = message.topic().to_string();
        let (partition, offset) = (message.partition(), message.offset());
        // Below the resume point (a message the broker sent again): already stored.
        if buffer.read.get(&topic).and_then(|p| p.get(&partition)).is_some_and(|next| offset < *next) {
            return;
        }
        let ts_ms = message.timestamp().to_millis();
        let payload = Bytes::copy_from_slice(message.payload().unwrap_or_default());
        buffer.bytes += payload.len();
        buffer.first.get_or_insert_with(Instant::now);
        let chunk_no = buffer.chunk_no;
        let pending = buffer.pending.entry((topic.clone(), partition)).or_default();
        if pending.back().is_none_or(|(_, _, chunk)| *chunk != chunk_no) {
            pending.push_back((offset, ts_ms.unwrap_or(0), chunk_no));
        }
        buffer.read.entry(topic.clone()).or_default().insert(partition, offset + 1);
        let meta = RecordMeta {
            received_us: sluice_core::batch::now_us(),
            key: message.key().map(|k| String::from_utf8_lossy(k).into_owned()),
            no_key: message.key().is_none(),
            topic: Some(topic.clone()),
            partition: Some(i64::from(partition)),
            offset: Some(offset),
            event_time_us: ts_ms.map(|ms| ms * 1000),
            headers: message.headers().map(headers_json),
            route: Some(topic),
            shard: None,
            sequence: None,
            idempotency: None,
        };
        buffer.records.push(Record { payload: Payload::Bytes(payload), meta });
    }

    fn buffered(&self) -> (usize, usize, Option<Instant>) {
        self.buffer.lock().map(|b| (b.records.len(), b.bytes, b.first)).unwrap_or((0, 0, None))
    }

    /// Lag per assigned partition: high watermark minus the durable offset.
    /// Measure each held partition's lag; returns whether the broker answered for one.
    fn measure_lag(&self, consumer: &BaseConsumer<Context>) -> bool {
        let Ok(assignment) = consumer.assignment() else { return false };
        let mut answered = false;
        let durable = self.shared.durable.lock().map(|d| d.clone()).unwrap_or_default();
        let now_ms = chrono::Utc::now().timestamp_millis();
        let mut lag = BTreeMap::new();
        for e in assignment.elements() {
            let (topic, partition) = (e.topic(), e.partition());
            let Ok((low, high)) = consumer.fetch_watermarks(topic, partition, Duration::from_secs(2)) else { continue };
            answered = true;
            let at = durable.get(topic).and_then(|p| p.get(&partition)).copied().unwrap_or(low).max(low);
            let mut age_seconds = 0.0;
            if let Ok(mut buffer) = self.buffer.lock()
                && let Some(pending) = buffer.pending.get_mut(&(topic.to_string(), partition))
            {
                while pending.front().is_some_and(|(o, _, _)| *o < at) {
                    pending.pop_front();
                }
                if let Some((_, ts, _)) = pending.front()
                    && high > at
                {
                    age_seconds = ((now_ms - ts) as f64 / 1000.0).max(0.0);
                }
            }
            lag.insert(format!("{topic}/{partition}"), Lag { messages: Some((high - at).max(0)), age_seconds });
        }
        self.metrics.set_lag(lag);
        answered
    }

    /// Where each newly assigned partition starts: the larger of the offset stored with the
    /// rows and the group's committed offset (another member may have moved it on); with
    /// neither, `start`.
    fn place(&self, consumer: &BaseConsumer<Context>, tpl: &mut TopicPartitionList) {
        let durable = self.shared.durable.lock().map(|d| d.clone()).unwrap_or_default();
        let committed = consumer.committed_offsets(tpl.clone(), Duration::from_secs(10)).ok();
        let Ok(mut buffer) = self.buffer.lock() else { return };
        let partitions: Vec<(String, i32)> =
            tpl.elements().iter().map(|e| (e.topic().to_string(), e.partition())).collect();
        for (topic, partition) in partitions {
            let stored = durable.get(&topic).and_then(|p| p.get(&partition)).copied();
            let group =
                committed.as_ref().and_then(|c| c.find_partition(&topic, partition)).and_then(|e| match e.offset() {
                    Offset::Offset(o) if o >= 0 => Some(o),
                    _ => None,
                });
            // The larger of the two: the group moves past the stored offset when another member
            // wrote a partition's messages into its own workspace.
            let offset = match stored.max(group) {
                Some(o) => {
                    buffer.read.entry(topic.clone()).or_default().insert(partition, o);
                    if let Ok(mut at) = self.assigned_at.lock() {
                        at.entry(topic.clone()).or_default().insert(partition, o);
                    }
                    Offset::Offset(o)
                }
                None if self.start == StartFrom::Oldest => Offset::Beginning,
                None => Offset::End,
            };
            tracing::info!(topic = %topic, partition, ?offset, "Partition assigned.");
            let _ = tpl.set_partition_offset(&topic, partition, offset);
        }
    }
}

impl Context {
    /// Commit the durable offsets of the partitions being revoked to the group, synchronously,
    /// before they are let go: the member that takes one over starts from the group's offset,
    /// and the asynchronous commit that follows each write may not have reached the broker yet
    /// (a restarted member re-read a unit or more per partition). Only offsets this member
    /// moved past where the partition was assigned: a partition that came back here and goes
    /// again before a write has an older stored offset than the group's, which must not move
    /// back.
    fn hand_over(&self, consumer: &BaseConsumer<Context>, revoked: &TopicPartitionList) {
        let durable = self.shared.durable.lock().map(|d| d.clone()).unwrap_or_default();
        let Ok(mut assigned_at) = self.assigned_at.lock() else { return };
        let mut held = Offsets::new();
        for e in revoked.elements() {
            let (topic, partition) = (e.topic(), e.partition());
            let from = assigned_at.get_mut(topic).and_then(|p| p.remove(&partition));
            if let Some(o) = durable.get(topic).and_then(|p| p.get(&partition))
                && from.is_none_or(|from| *o > from)
            {
                held.entry(topic.to_string()).or_default().insert(partition, *o);
            }
        }
        drop(assigned_at);
        if held.is_empty() {
            return;
        }
        if let Err(e) = consumer.commit(&tpl_of(&held), rdkafka::consumer::CommitMode::Sync) {
            tracing::warn!(stream = %self.stream, error = %e, "Group offset commit on revocation failed.");
        }
    }

    /// Show a client error as the stream's state, naming the likely fix where there is one. An
    /// "all brokers down" that follows a specific error keeps that error visible, and so does a
    /// poll failing with the code the client has just reported (`polled`).
    fn report(&self, error: &rdkafka::error::KafkaError, reason: &str, polled: bool) {
        use rdkafka::types::RDKafkaErrorCode;
        let code = error.rdkafka_error_code();
        let Ok(mut cause) = self.cause.lock() else { return };
        let text = match code {
            Some(RDKafkaErrorCode::Authentication) => {
                format!("authentication failed, check source.sasl.username and source.sasl.password: {reason}")
            }
            Some(RDKafkaErrorCode::AllBrokersDown) => match cause.as_ref() {
                Some((_, why)) => format!("all brokers are down; last error: {why}"),
                None => format!("all brokers are down: {reason}"),
            },
            _ => match cause.as_ref() {
                Some((c, why)) if polled && *c == code => why.clone(),
                _ => format!("{error}: {reason}"),
            },
        };
        if code != Some(RDKafkaErrorCode::AllBrokersDown) {
            *cause = Some((code, text.clone()));
        }
        drop(cause);
        self.degraded.store(true, Ordering::Release);
        self.metrics.set_state("reconnecting", Some(text.clone()));
        self.warn(&text);
    }

    /// A warning, unless one like it was logged within the last minute.
    pub(crate) fn warn(&self, text: &str) {
        match self.throttle.admit(text) {
            Some(0) => tracing::warn!(stream = %self.stream, error = %text, "Kafka client error."),
            Some(n) => tracing::warn!(
                stream = %self.stream, error = %text, left_out = n,
                "Kafka client error ({n} similar lines left out in the last minute)."
            ),
            None => {}
        }
    }

    /// Clear the remembered cause once the client works again.
    /// The stream is seen healthy: back to `running` if an error was reported since last time.
    pub(crate) fn recovered(&self) {
        // A load first: this runs for every message, and is a no-op almost always.
        if !self.degraded.load(Ordering::Acquire) || !self.degraded.swap(false, Ordering::AcqRel) {
            return;
        }
        if let Ok(mut cause) = self.cause.lock() {
            *cause = None;
        }
        self.metrics.set_state("running", None);
    }
}

impl ClientContext for Context {
    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        self.report(&error, reason, false);
    }

    /// librdkafka's own log lines, into `tracing` (set the `debug` property to get more).
    /// Warnings and errors that repeat are logged once a minute, with a count.
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, facility: &str, message: &str) {
        use rdkafka::config::RDKafkaLogLevel as L;
        let loud = matches!(level, L::Emerg | L::Alert | L::Critical | L::Error | L::Warning);
        let left_out = if loud {
            match self.throttle.admit(message) {
                Some(n) => n,
                None => return,
            }
        } else {
            0
        };
        let stream = self.stream.as_str();
        match level {
            L::Emerg | L::Alert | L::Critical | L::Error if left_out > 0 => {
                tracing::error!(stream, facility, left_out, "{message} ({left_out} similar lines left out)")
            }
            L::Emerg | L::Alert | L::Critical | L::Error => tracing::error!(stream, facility, "{message}"),
            L::Warning if left_out > 0 => {
                tracing::warn!(stream, facility, left_out, "{message} ({left_out} similar lines left out)")
            }
            L::Warning => tracing::warn!(stream, facility, "{message}"),
            L::Notice | L::Info => tracing::info!(stream, facility, "{message}"),
            L::Debug => tracing::debug!(stream, facility, "{message}"),
        }
    }
}

impl ConsumerContext for Context {
    fn rebalance(&self, consumer: &BaseConsumer<Self>, err: RDKafkaRespErr, tpl: &mut TopicPartitionList) {
        match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                self.place(consumer, tpl);
                if let Ok(mut held) = self.shared.held.lock() {
                    for e in tpl.elements() {
                        held.entry(e.topic().to_string()).or_default().insert(e.partition());
                    }
                }
                if let Err(e) = consumer.assign(tpl) {
                    tracing::error!(error = %e, "Assign failed.");
                }
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                // No longer named in the commits that follow each write.
                if let Ok(mut held) = self.shared.held.lock() {
                    for e in tpl.elements() {
                        if let Some(partitions) = held.get_mut(e.topic()) {
                            partitions.remove(&e.partition());
                        }
                    }
                    held.retain(|_, partitions| !partitions.is_empty());
                }
                // Make what was read durable before another member may read it again.
                if !self.shared.stopping.load(Ordering::Acquire)
                    && let Some(no) = self.flush(true)
                {
                    let deadline = Instant::now() + REVOKE_WAIT;
                    let mut done = match self.shared.durable_chunk.lock() {
                        Ok(d) => d,
                        Err(p) => p.into_inner(),
                    };
                    while *done < no && Instant::now() < deadline && !self.shared.stopping.load(Ordering::Acquire) {
                        done = match self.shared.durable_signal.wait_timeout(done, Duration::from_millis(100)) {
                            Ok((d, _)) => d,
                            Err(p) => p.into_inner().0,
                        };
                    }
                    if *done < no {
                        tracing::warn!("Partitions revoked before the buffered batch was durable.");
                    }
                    drop(done);
                    self.hand_over(consumer, tpl);
                }
                if let Err(e) = consumer.unassign() {
                    tracing::error!(error = %e, "Unassign failed.");
                }
                self.metrics.set_lag(BTreeMap::new());
            }
            other => tracing::error!(error = ?other, "Rebalance error."),
        }
    }
}

/// The position of a chunk: offsets read so far and the chunk's number.
pub(crate) fn position(read: &Offsets, chunk_no: u64) -> Position {
    Position(serde_json::json!({ "offsets": read, "chunk": chunk_no }))
}

/// Offsets from a stored position (empty for none or another shape).
pub(crate) fn offsets_of(position: &Position) -> Offsets {
    serde_json::from_value(position.0.get("offsets").cloned().unwrap_or(Value::Null)).unwrap_or_default()
}

fn headers_json(headers: &rdkafka::message::BorrowedHeaders) -> Value {
    let mut map = Map::new();
    for h in headers.iter() {
        let value = h.value.map_or(Value::Null, |v| Value::String(String::from_utf8_lossy(v).into_owned()));
        match map.get_mut(h.key) {
            Some(Value::Array(values)) => values.push(value),
            Some(existing) => *existing = Value::Array(vec![existing.take(), value]),
            None => {
                map.insert(h.key.to_string(), value);
            }
        }
    }
    Value::Object(map)
}

pub(crate) fn tpl_of(offsets: &Offsets) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    for (topic, partitions) in offsets {
        for (p, o) in partitions {
            let _ = tpl.add_partition_offset(topic, *p, Offset::Offset(*o));
        }
    }
    tpl
}

/// The thread's loop: poll, batch, run commands, measure lag, until the source is dropped.
pub(crate) fn run(
    consumer: &BaseConsumer<Context>,
    commands: std::sync::mpsc::Receiver<Command>,
    mut watchdog: Watchdog,
    topics: &[String],
) {
    let ctx = consumer.context().clone();
    let mut last_lag = Instant::now();
    loop {
        if ctx.shared.stopping.load(Ordering::Acquire) {
            break;
        }
        while let Ok(command) = commands.try_recv() {
            match command {
                Command::Rewind(offsets, ack) => {
                    rewind(consumer, &ctx, &offsets);
                    let _ = ack.send(());
                }
            }
        }
        match consumer.poll(Duration::from_millis(50)) {
            Some(Ok(message)) => {
                ctx.recovered();
                ctx.push(&message);
            }
            Some(Err(e)) => ctx.report(&e, "while reading", true),
            None => {}
        }
        let (count, bytes, first) = ctx.buffered();
        if chunk_due(count, bytes, first) && ctx.flush(false).is_none() {
            break;
        }
        if last_lag.elapsed() >= Duration::from_secs(1) {
            if ctx.measure_lag(consumer) {
                ctx.recovered();
            }
            last_lag = Instant::now();
            if let Some(reason) = watchdog.check(consumer) {
                rejoin(consumer, &ctx, topics, &reason);
            }
        }
    }
    ctx.shared.stopping.store(true, Ordering::Release);
    // Leave the group now, so its partitions move to another member without a session timeout.
    consumer.unsubscribe();
    // Serve the revocation and the LeaveGroup request before the process may exit.
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until && consumer.assignment().is_ok_and(|a| a.count() > 0) {
        let _ = consumer.poll(Duration::from_millis(50));
    }
    let _ = consumer.poll(Duration::from_millis(100));
}

/// Leave the group and join it again, with a new member id.
fn rejoin(consumer: &BaseConsumer<Context>, ctx: &Context, topics: &[String], reason: &str) {
    tracing::warn!(stream = %ctx.stream, reason, "Partitions go unread by the consumer group; rejoining it.");
    ctx.degraded.store(true, Ordering::Release);
    let rejoins = ctx.rejoins.fetch_add(1, Ordering::AcqRel) + 1;
    ctx.metrics.set_source("group_rejoins", rejoins as f64);
    ctx.metrics.set_state("rejoining", Some(reason.to_string()));
    consumer.unsubscribe();
    let names: Vec<&str> = topics.iter().map(String::as_str).collect();
    if let Err(e) = consumer.subscribe(&names) {
        ctx.report(&e, "subscribing again", false);
    }
}

/// Drop what was read but not written, and seek back to the durable offsets.
fn rewind(consumer: &BaseConsumer<Context>, ctx: &Context, durable: &Offsets) {
    ctx.shared.epoch.fetch_add(1, Ordering::AcqRel);
    let Ok(assignment) = consumer.assignment() else { return };
    let Ok(mut buffer) = ctx.buffer.lock() else { return };
    buffer.records.clear();
    buffer.bytes = 0;
    buffer.first = None;
    buffer.pending.clear();
    buffer.read = durable.clone();
    for e in assignment.elements() {
        let (topic, partition) = (e.topic(), e.partition());
        let offset = match durable.get(topic).and_then(|p| p.get(&partition)) {
            Some(o) => Offset::Offset(*o),
            None if ctx.start == StartFrom::Oldest => Offset::Beginning,
            None => Offset::End,
        };
        if let Err(e) = consumer.seek(topic, partition, offset, Duration::from_secs(10)) {
            tracing::error!(topic, partition, error = %e, "Seek on rewind failed.");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_is_cut_by_messages_bytes_or_time() {
        let now = Some(Instant::now());
        assert!(!chunk_due(0, 0, None), "nothing buffered");
        assert!(!chunk_due(1_999, CHUNK_BYTES - 1, now));
        assert!(chunk_due(2_000, 10, now), "by messages");
        // Large messages: three of 400 KiB make a chunk, not 2,000 of them (800 MB).
        assert!(!chunk_due(2, 2 * 400 * 1024, now));
        assert!(chunk_due(3, 3 * 400 * 1024, now), "by bytes");
        let old = Instant::now().checked_sub(CHUNK_WAIT);
        assert!(chunk_due(1, 10, old), "by time");
    }
}
