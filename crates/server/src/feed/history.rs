//! An hour of each stream's metrics in memory, sampled every `--history-sample-ms` (10 s by
//! default), and the watch that turns a stream's failures into activity events.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::Feeds;
use crate::supervisor::Supervisor;

/// How far back the history goes.
const SPAN: Duration = Duration::from_secs(3600);

/// One stream's figures at one time.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    /// Milliseconds since the epoch.
    pub at_ms: i64,
    /// Events per second.
    pub messages_per_sec: f64,
    /// Messages behind the source (Kafka, Kinesis).
    pub lag_messages: i64,
    /// Age of the oldest message read but not yet committed, the largest over partitions.
    pub lag_seconds: f64,
    /// Receive → commit latency, median of the recent events, in ms.
    pub latency_p50_ms: f64,
    /// Its 99th percentile.
    pub latency_p99_ms: f64,
    /// Rejects since start.
    pub rejects: u64,
    /// Events since start.
    pub events_in: u64,
}

/// The samples of every stream. Cheap to clone.
#[derive(Clone, Default)]
pub struct History {
    every: Arc<Mutex<Duration>>,
    streams: Arc<Mutex<HashMap<String, VecDeque<Sample>>>>,
}

impl History {
    /// `stream`'s samples, oldest first, and the sampling interval.
    pub fn of(&self, stream: &str) -> (Duration, Vec<Sample>) {
        let every = *self.every.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let streams = self.streams.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        (every, streams.get(stream).map(|s| s.iter().cloned().collect()).unwrap_or_default())
    }

    fn push(&self, stream: &str, sample: Sample, keep: usize) {
        let mut streams = self.streams.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let samples = streams.entry(stream.to_string()).or_default();
        if samples.len() >= keep {
            samples.pop_front();
        }
        samples.push_back(sample);
    }

    fn retain(&self, names: &[String]) {
        let mut streams = self.streams.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        streams.retain(|name, _| names.contains(name));
    }
}

/// Sample every stream each `every`, and each second report streams that started failing,
/// until `cancel`.
pub async fn watch(supervisor: Supervisor, feeds: Feeds, every: Duration, cancel: CancellationToken) {
    let every = every.max(Duration::from_millis(100));
    *feeds.history().every.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = every;
    let keep = (SPAN.as_millis() / every.as_millis()).max(1) as usize;
    let mut states: HashMap<String, &'static str> = HashMap::new();
    let mut tick = tokio::time::interval(every.min(Duration::from_secs(1)));
    let mut last_sample = tokio::time::Instant::now() - every;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        let streams = supervisor.list().await;
        let sample_now = last_sample.elapsed() >= every;
        if sample_now {
            last_sample = tokio::time::Instant::now();
        }
        let at_ms = chrono::Utc::now().timestamp_millis();
        for stream in &streams {
            let name = &stream.config.name;
            let m = stream.metrics.snapshot();
            let before = states.insert(name.clone(), m.state);
            if before != Some(m.state) && matches!(m.state, "failed" | "retrying" | "reconnecting") {
                let error = m.last_error.clone().unwrap_or_default();
                feeds.activity().record("error", name, format!("{}: {error}", m.state), json!({ "state": m.state }));
            }
            if sample_now {
                let sample = Sample {
                    at_ms,
                    messages_per_sec: m.messages_per_sec,
                    lag_messages: m.lag_messages,
                    lag_seconds: m.lag.values().map(|l| l.age_seconds).fold(0.0, f64::max),
                    latency_p50_ms: m.latency_ms.p50,
                    latency_p99_ms: m.latency_ms.p99,
                    rejects: m.rejects,
                    events_in: m.events_in,
                };
                feeds.history().push(name, sample, keep);
            }
        }
        let names: Vec<String> = streams.iter().map(|s| s.config.name.clone()).collect();
        states.retain(|name, _| names.contains(name));
        if sample_now {
            feeds.history().retain(&names);
        }
    }
}
