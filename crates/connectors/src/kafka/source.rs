//! The Kafka source: chunks from the consumer thread; `commit` records durable offsets, commits
//! them to the group and releases a waiting revocation; `rewind` seeks back after a failure.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use sluice_core::{Chunk, Error, ErrorKind, Position, Result, Source, StreamMetrics};
use tokio::sync::{mpsc, oneshot};

use super::KafkaConfig;
use super::consumer::{self, Command, Context, Shared, Tagged, offsets_of, tpl_of};
use super::watchdog::{Topics, Watchdog};

/// Reads Kafka topics into the run loop.
pub struct KafkaSource {
    rx: mpsc::Receiver<Tagged>,
    commands: std::sync::mpsc::Sender<Command>,
    shared: Arc<Shared>,
    consumer: Arc<BaseConsumer<Context>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl KafkaSource {
    /// Connect a consumer for `stream`, resuming from `position` (the durable checkpoint).
    pub fn build(config: &KafkaConfig, stream: &str, position: &Position, metrics: Arc<StreamMetrics>) -> Result<Self> {
        for (field, file) in config.tls.iter().flat_map(|t| {
            [
                ("source.tls.ca_file", &t.ca_file),
                ("source.tls.cert_file", &t.cert_file),
                ("source.tls.key_file", &t.key_file),
            ]
        }) {
            if let Some(f) = file
                && !f.is_file()
            {
                return Err(Error::config(field, format!("{} is not a readable file", f.display())));
            }
        }
        let shared = Arc::new(Shared {
            durable: Mutex::new(offsets_of(position)),
            durable_chunk: Mutex::new(0),
            durable_signal: Condvar::new(),
            epoch: AtomicU64::new(0),
            stopping: AtomicBool::new(false),
            held: Mutex::default(),
        });
        let (tx, rx) = mpsc::channel(64);
        let context = Context::new(stream, shared.clone(), tx, config.start, metrics);
        let consumer: BaseConsumer<Context> =
            config.client_config(stream).create_with_context(context).map_err(super::config::client_config_error)?;
        let topics: Vec<String> = match &config.topic_regex {
            Some(r) if r.starts_with('^') => vec![r.clone()],
            Some(r) => vec![format!("^{r}")],
            None => config.topics.clone(),
        };
        let names: Vec<&str> = topics.iter().map(String::as_str).collect();
        consumer
            .subscribe(&names)
            .map_err(|e| Error::new(ErrorKind::Config, "cannot subscribe to the topics").with_source(e))?;
        let consumer = Arc::new(consumer);
        let (commands, inbox) = std::sync::mpsc::channel();
        let polled = consumer.clone();
        let watched = match &config.topic_regex {
            // librdkafka's regex syntax is close to the regex crate's; a pattern only it accepts
            // leaves the watchdog without a way to tell which partitions are unread.
            Some(_) => regex::Regex::new(&topics[0]).ok().map(Topics::Pattern),
            None => Some(Topics::Names(topics.clone())),
        };
        let watchdog = Watchdog::new(Duration::from_millis(config.rejoin_idle_ms), watched);
        let thread = std::thread::Builder::new()
            .name(format!("kafka-{stream}"))
            .spawn(move || consumer::run(&polled, inbox, watchdog, &topics))
            .map_err(|e| Error::new(ErrorKind::Fatal, "cannot start the Kafka thread").with_source(e))?;
        Ok(Self { rx, commands, shared, consumer, thread: Some(thread) })
    }
}

#[async_trait]
impl Source for KafkaSource {
    async fn next(&mut self) -> Result<Option<Chunk>> {
        loop {
            // Cancel-safe: mpsc::Receiver::recv loses nothing when dropped.
            let Some(tagged) = self.rx.recv().await else {
                return Err(Error::new(ErrorKind::Transient, "the Kafka consumer thread stopped"));
            };
            if tagged.epoch >= self.shared.epoch.load(Ordering::Acquire) {
                return Ok(Some(tagged.chunk));
            }
        }
    }

    async fn commit(&mut self, position: &Position) -> Result<()> {
        let offsets = offsets_of(position);
        if let Ok(mut durable) = self.shared.durable.lock() {
            for (topic, partitions) in &offsets {
                let entry = durable.entry(topic.clone()).or_default();
                for (p, o) in partitions {
                    entry.insert(*p, *o);
                }
            }
        }
        if let Some(no) = position.0.get("chunk").and_then(|c| c.as_u64())
            && let Ok(mut done) = self.shared.durable_chunk.lock()
        {
            *done = (*done).max(no);
            self.shared.durable_signal.notify_all();
        }
        // Group offsets are for external lag tools and for another member taking over; the
        // offsets stored with the rows are what this stream resumes from. Committed at once, so
        // the window in which the group trails the stored offsets stays a broker round trip.
        // Only partitions still assigned here: the position also names partitions another
        // member holds now, whose group offsets must not move back.
        let mut offsets = offsets;
        if let Ok(held) = self.shared.held.lock() {
            for (topic, partitions) in &mut offsets {
                let here = held.get(topic);
                partitions.retain(|p, _| here.is_some_and(|h| h.contains(p)));
            }
        }
        offsets.retain(|_, partitions| !partitions.is_empty());
        if !offsets.is_empty()
            && let Err(e) = self.consumer.commit(&tpl_of(&offsets), CommitMode::Async)
        {
            tracing::debug!(error = %e, "Group offset commit failed.");
        }
        Ok(())
    }

    async fn close(&mut self) {
        // Leaving gracefully hands the partitions over at the offsets stored with the rows: the
        // group gets them synchronously first, not behind an asynchronous commit the leave may
        // overtake (under load that left another member re-reading what was stored here).
        // Only partitions still assigned here: another member may have moved the others on.
        let durable = self.shared.durable.lock().map(|d| d.clone()).unwrap_or_default();
        if !durable.is_empty() {
            let consumer = self.consumer.clone();
            let committed = tokio::task::spawn_blocking(move || {
                let assigned = consumer.assignment()?;
                let mut held = durable;
                for (topic, partitions) in &mut held {
                    partitions.retain(|p, _| assigned.find_partition(topic, *p).is_some());
                }
                // Never behind the group: after a partition came back here, or on an idle stream,
                // `durable` may trail what another member committed since.
                let group = consumer.committed_offsets(tpl_of(&held), Duration::from_secs(5))?;
                for (topic, partitions) in &mut held {
                    partitions.retain(|p, offset| match group.find_partition(topic, *p).map(|e| e.offset()) {
                        Some(rdkafka::Offset::Offset(at)) => *offset > at,
                        _ => true,
                    });
                }
                held.retain(|_, partitions| !partitions.is_empty());
                if held.is_empty() {
                    return Ok(());
                }
                consumer.commit(&tpl_of(&held), CommitMode::Sync)
            });
            match tokio::time::timeout(Duration::from_secs(10), committed).await {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(e))) => tracing::warn!(error = %e, "Group offset commit on leaving failed."),
                _ => tracing::warn!("Group offset commit on leaving did not finish in 10 s."),
            }
        }
        self.stop();
        // The thread unsubscribes (leaving the group) once it sees `stopping`; wait for it.
        if let Some(thread) = self.thread.take() {
            let _ = tokio::task::spawn_blocking(move || thread.join()).await;
        }
    }

    async fn rewind(&mut self, position: &Position) -> Result<()> {
        let offsets = offsets_of(position);
        if let Ok(mut durable) = self.shared.durable.lock() {
            *durable = offsets.clone();
        }
        let (ack, done) = oneshot::channel();
        self.commands
            .send(Command::Rewind(offsets, ack))
            .map_err(|_| Error::new(ErrorKind::Fatal, "the Kafka consumer thread stopped"))?;
        done.await.map_err(|_| Error::new(ErrorKind::Fatal, "the Kafka consumer thread stopped"))
    }
}

impl KafkaSource {
    fn stop(&self) {
        self.shared.stopping.store(true, Ordering::Release);
        self.shared.durable_signal.notify_all();
    }
}

impl Drop for KafkaSource {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Move the consumer group of a stopped stream back to `offsets` (a replay): a member joining
/// later starts from the larger of the group's offset and the stored one, so both must move.
pub async fn rewind_group(
    config: &super::KafkaConfig,
    stream: &str,
    offsets: &std::collections::BTreeMap<String, std::collections::BTreeMap<i32, i64>>,
) -> Result<()> {
    use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
    let client = config.client_config(stream);
    let offsets = offsets.clone();
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = client
            .create()
            .map_err(|e| Error::new(ErrorKind::Connect, "cannot create a Kafka client").with_source(e))?;
        let mut tpl = rdkafka::TopicPartitionList::new();
        for (topic, partitions) in &offsets {
            for (partition, offset) in partitions {
                tpl.add_partition_offset(topic, *partition, rdkafka::Offset::Offset(*offset)).map_err(|e| {
                    Error::new(ErrorKind::Config, format!("offsets.{topic}.{partition}")).with_source(e)
                })?;
            }
        }
        consumer
            .commit(&tpl, CommitMode::Sync)
            .map_err(|e| Error::new(ErrorKind::Connect, "could not move the consumer group's offsets").with_source(e))
    })
    .await
    .map_err(|e| Error::new(ErrorKind::Fatal, "rewind task failed").with_source(e))?
}
