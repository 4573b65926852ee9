//! Live per-stream metrics. Totals are restored from the checkpoint on start; the counts
//! "since start" and "since the last check" are this run's.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::batch::Totals;

const LATENCY_SAMPLES: usize = 8192;
const RATE_WINDOW: Duration = Duration::from_secs(10);

/// Counters and gauges of one stream, shared between its run loop and the API.
#[derive(Debug)]
pub struct StreamMetrics {
    events_in: AtomicU64,
    rows_written: AtomicU64,
    rejects: AtomicU64,
    filtered: AtomicU64,
    bytes_in: AtomicU64,
    batches: AtomicU64,
    last_event_us: AtomicI64,
    max_lag: AtomicI64,
    max_lag_ms: AtomicI64,
    /// Events committed since this run started (the totals' growth, not the totals).
    processed: AtomicU64,
    inner: Mutex<Inner>,
    /// Where the last [`StreamMetrics::check`] left off. Locked before `inner`, never after.
    check: Mutex<Check>,
}

/// The last check: events processed by then and when it was.
#[derive(Debug, Clone, Copy, Default)]
struct Check {
    processed: u64,
    at: Option<chrono::DateTime<chrono::Utc>>,
}

/// How far a stream is behind its source on one partition or shard.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Lag {
    /// Messages between the stream's durable position and the newest message, where the
    /// source can count them (Kafka; not Kinesis).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub messages: Option<i64>,
    /// How far behind the newest record, in seconds: the age of the oldest message read but
    /// not yet durable (Kafka), or MillisBehindLatest (Kinesis). 0 when caught up.
    pub age_seconds: f64,
}

#[derive(Debug)]
struct Inner {
    state: &'static str,
    last_error: Option<String>,
    latency: VecDeque<u64>,
    latency_count: u64,
    latency_sum: u64,
    latency_min: u64,
    latency_max: u64,
    latency_max_at: Option<chrono::DateTime<chrono::Utc>>,
    rate: VecDeque<(Instant, u64)>,
    lag: BTreeMap<String, Lag>,
    source: BTreeMap<&'static str, f64>,
    destination: BTreeMap<&'static str, f64>,
}

/// A snapshot for the API.
#[derive(Debug, Clone, Serialize)]
pub struct MetricsSnapshot {
    /// running, retrying, failed, stopped.
    pub state: &'static str,
    /// The last error, while not running.
    pub last_error: Option<String>,
    /// Events received (rows plus rejected events), all time: restored from the checkpoint.
    pub events_in: u64,
    /// Events committed since this run of the stream started.
    pub records_since_start: u64,
    /// Events committed since the last check (a call of `GET /api/streams/:id/metrics`), or
    /// since start before the first.
    pub records_since_last_check: u64,
    /// When the last check was (RFC 3339), or null before the first.
    pub last_check: Option<String>,
    /// Rows written.
    pub rows_written: u64,
    /// Ledger rows.
    pub rejects: u64,
    /// Events a transform's filter skipped.
    pub filtered: u64,
    /// Payload bytes.
    pub bytes_in: u64,
    /// Committed batches.
    pub batches: u64,
    /// Receive time of the newest committed event, i.e. when the stream last received a
    /// record (RFC 3339).
    pub last_event_time: Option<String>,
    /// Events per second over the last 10 seconds.
    pub messages_per_sec: f64,
    /// Receive-to-committed latency, milliseconds.
    pub latency_ms: LatencySnapshot,
    /// Lag per partition or shard, for sources that have them.
    pub lag: BTreeMap<String, Lag>,
    /// Total lag in messages, summed over partitions.
    pub lag_messages: i64,
    /// Largest total lag seen since start.
    pub max_lag_messages: i64,
    /// Largest per-partition or per-shard lag in seconds seen since start.
    pub max_lag_seconds: f64,
    /// Source-specific gauges and counters, e.g. Kinesis `open_shards`, `throttled`.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub source: BTreeMap<&'static str, f64>,
    /// A stream destination's figures: `rows`, `deletes`, `writes`, `load_ms` (the last
    /// write), `load_ms_max`, and for files `pending_rows` and `pending_seconds` (rows not in
    /// the store yet, and the age of the oldest: the destination's lag behind the source).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub destination: BTreeMap<&'static str, f64>,
}

/// Latency figures in milliseconds: the latest chunk's, since start (min, max, avg) and over
/// recent chunks (p50, p99).
#[derive(Debug, Clone, Serialize)]
pub struct LatencySnapshot {
    /// The latest chunk's.
    pub now: f64,
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
    /// When the largest was committed (RFC 3339), or null before the first chunk.
    pub max_at: Option<String>,
    /// Mean, weighted by chunks.
    pub avg: f64,
    /// 50th percentile of the last 8192 chunks.
    pub p50: f64,
    /// 99th percentile of the last 8192 chunks.
    pub p99: f64,
    /// Chunks measured.
    pub count: u64,
}

impl StreamMetrics {
    /// Metrics starting from stored totals.
    pub fn new(totals: &Totals) -> Self {
        Self {
            events_in: AtomicU64::new(totals.events_in),
            rows_written: AtomicU64::new(totals.rows_written),
            rejects: AtomicU64::new(totals.rejects),
            filtered: AtomicU64::new(totals.filtered),
            bytes_in: AtomicU64::new(totals.bytes_in),
            batches: AtomicU64::new(totals.batches),
            last_event_us: AtomicI64::new(totals.last_event_us.unwrap_or(i64::MIN)),
            max_lag: AtomicI64::new(0),
            max_lag_ms: AtomicI64::new(0),
            processed: AtomicU64::new(0),
            check: Mutex::new(Check::default()),
            inner: Mutex::new(Inner {
                state: "starting",
                last_error: None,
                latency: VecDeque::with_capacity(LATENCY_SAMPLES),
                latency_count: 0,
                latency_sum: 0,
                latency_min: u64::MAX,
                latency_max: 0,
                latency_max_at: None,
                rate: VecDeque::new(),
                lag: BTreeMap::new(),
                source: BTreeMap::new(),
                destination: BTreeMap::new(),
            }),
        }
    }

    /// Set the state shown to users, with the error that caused it.
    pub fn set_state(&self, state: &'static str, error: Option<String>) {
        if let Ok(mut inner) = self.inner.lock() {
            inner.state = state;
            inner.last_error = error;
        }
    }

    /// Replace the lag of every partition (the source's current assignment).
    pub fn set_lag(&self, lag: BTreeMap<String, Lag>) {
        let total: i64 = lag.values().filter_map(|l| l.messages).map(|m| m.max(0)).sum();
        self.max_lag.fetch_max(total, Ordering::Relaxed);
        let worst = lag.values().map(|l| (l.age_seconds * 1000.0) as i64).max().unwrap_or(0);
        self.max_lag_ms.fetch_max(worst, Ordering::Relaxed);
        if let Ok(mut inner) = self.inner.lock() {
            inner.lag = lag;
        }
    }

    /// Set a source-specific gauge or counter.
    pub fn set_source(&self, name: &'static str, value: f64) {
        if let Ok(mut inner) = self.inner.lock() {
            inner.source.insert(name, value);
        }
    }

    /// Set a destination gauge.
    pub fn set_destination(&self, name: &'static str, value: f64) {
        if let Ok(mut inner) = self.inner.lock() {
            inner.destination.insert(name, value);
        }
    }

    /// Add to a destination counter.
    pub fn add_destination(&self, name: &'static str, value: f64) {
        if let Ok(mut inner) = self.inner.lock() {
            *inner.destination.entry(name).or_default() += value;
        }
    }

    /// Raise a destination gauge to `value` if it is below.
    pub fn max_destination(&self, name: &'static str, value: f64) {
        if let Ok(mut inner) = self.inner.lock() {
            let slot = inner.destination.entry(name).or_default();
            *slot = slot.max(value);
        }
    }

    /// A unit became durable: totals are the checkpoint's, `latencies` one per chunk.
    pub fn committed(&self, totals: &Totals, latencies: &[Duration]) {
        // Count the totals' steps, not their distance from the start: after a checkpoint
        // reloaded from a destination that is behind, the first commit counts nothing and the
        // events read again after it count once more; one that is ahead counts its lead.
        let before = self.events_in.swap(totals.events_in, Ordering::Relaxed);
        self.processed.fetch_add(totals.events_in.saturating_sub(before), Ordering::Relaxed);
        self.rows_written.store(totals.rows_written, Ordering::Relaxed);
        self.rejects.store(totals.rejects, Ordering::Relaxed);
        self.filtered.store(totals.filtered, Ordering::Relaxed);
        self.bytes_in.store(totals.bytes_in, Ordering::Relaxed);
        self.batches.store(totals.batches, Ordering::Relaxed);
        if let Some(us) = totals.last_event_us {
            self.last_event_us.store(us, Ordering::Relaxed);
        }
        let Ok(mut inner) = self.inner.lock() else { return };
        inner.state = "running";
        inner.last_error = None;
        for l in latencies {
            let us = l.as_micros() as u64;
            if inner.latency.len() == LATENCY_SAMPLES {
                inner.latency.pop_front();
            }
            inner.latency.push_back(us);
            inner.latency_count += 1;
            inner.latency_sum += us;
            inner.latency_min = inner.latency_min.min(us);
            if inner.latency_max_at.is_none() || us > inner.latency_max {
                inner.latency_max = us;
                inner.latency_max_at = Some(chrono::Utc::now());
            }
        }
        let now = Instant::now();
        inner.rate.push_back((now, totals.events_in));
        while inner.rate.len() > 2 && inner.rate.front().is_some_and(|(t, _)| now.duration_since(*t) > RATE_WINDOW) {
            inner.rate.pop_front();
        }
    }

    /// A consistent-enough snapshot. Changes nothing: the history sampler, Prometheus and
    /// the stream list read it as often as they like.
    pub fn snapshot(&self) -> MetricsSnapshot {
        let mark = *lock(&self.check);
        self.snapshot_since(mark)
    }

    /// A snapshot for the stream's metrics API that is also a check: it reports the records
    /// processed since the previous check and when that was, then starts counting anew.
    pub fn check(&self) -> MetricsSnapshot {
        let mut mark = lock(&self.check);
        let snapshot = self.snapshot_since(*mark);
        *mark = Check { processed: snapshot.records_since_start, at: Some(chrono::Utc::now()) };
        snapshot
    }

    fn snapshot_since(&self, mark: Check) -> MetricsSnapshot {
        let inner = lock(&self.inner);
        let mut sorted: Vec<u64> = inner.latency.iter().copied().collect();
        sorted.sort_unstable();
        let pct = |p: f64| -> f64 {
            if sorted.is_empty() {
                return 0.0;
            }
            let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
            sorted[i] as f64 / 1000.0
        };
        let events_in = self.events_in.load(Ordering::Relaxed);
        let now = Instant::now();
        let messages_per_sec = match inner.rate.iter().find(|(t, _)| now.duration_since(*t) <= RATE_WINDOW) {
            Some((t, n)) if now.duration_since(*t) > Duration::from_millis(100) => {
                events_in.saturating_sub(*n) as f64 / now.duration_since(*t).as_secs_f64()
            }
            _ => 0.0,
        };
        let last = self.last_event_us.load(Ordering::Relaxed);
        let processed = self.processed.load(Ordering::Relaxed);
        MetricsSnapshot {
            state: inner.state,
            last_error: inner.last_error.clone(),
            events_in,
            records_since_start: processed,
            records_since_last_check: processed.saturating_sub(mark.processed),
            last_check: mark.at.map(|t| t.to_rfc3339()),
            rows_written: self.rows_written.load(Ordering::Relaxed),
            rejects: self.rejects.load(Ordering::Relaxed),
            filtered: self.filtered.load(Ordering::Relaxed),
            bytes_in: self.bytes_in.load(Ordering::Relaxed),
            batches: self.batches.load(Ordering::Relaxed),
            last_event_time: (last != i64::MIN)
                .then(|| chrono::DateTime::from_timestamp_micros(last).map(|t| t.to_rfc3339()))
                .flatten(),
            messages_per_sec,
            lag_messages: inner.lag.values().filter_map(|l| l.messages).map(|m| m.max(0)).sum(),
            max_lag_seconds: self.max_lag_ms.load(Ordering::Relaxed) as f64 / 1000.0,
            source: inner.source.clone(),
            destination: inner.destination.clone(),
            lag: inner.lag.clone(),
            max_lag_messages: self.max_lag.load(Ordering::Relaxed),
            latency_ms: LatencySnapshot {
                now: inner.latency.back().map_or(0.0, |us| *us as f64 / 1000.0),
                min: if inner.latency_count == 0 { 0.0 } else { inner.latency_min as f64 / 1000.0 },
                max: inner.latency_max as f64 / 1000.0,
                max_at: inner.latency_max_at.map(|t| t.to_rfc3339()),
                avg: if inner.latency_count == 0 {
                    0.0
                } else {
                    inner.latency_sum as f64 / inner.latency_count as f64 / 1000.0
                },
                p50: pct(0.50),
                p99: pct(0.99),
                count: inner.latency_count,
            },
        }
    }
}

/// The guarded value, also after a panic elsewhere poisoned the lock (metrics stay readable).
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn time(t: &Option<String>) -> chrono::DateTime<chrono::FixedOffset> {
        chrono::DateTime::parse_from_rfc3339(t.as_deref().expect("a time")).expect("RFC 3339")
    }

    fn totals(events_in: u64) -> Totals {
        Totals { events_in, rows_written: events_in, batches: 1, ..Totals::default() }
    }

    #[test]
    fn check_reports_records_since_the_previous_check() {
        let m = StreamMetrics::new(&totals(100));
        m.committed(&totals(103), &[]);
        let first = m.check();
        assert_eq!((first.events_in, first.records_since_start), (103, 3));
        assert_eq!((first.records_since_last_check, first.last_check.as_deref()), (3, None));

        m.committed(&totals(110), &[]);
        let peek = m.snapshot();
        assert_eq!(peek.records_since_last_check, 7, "a snapshot sees the count so far");
        assert!(peek.last_check.is_some());
        assert_eq!(m.snapshot().records_since_last_check, 7, "and does not reset it");

        let second = m.check();
        assert_eq!((second.records_since_start, second.records_since_last_check), (10, 7));
        assert_eq!(second.last_check, peek.last_check, "the time of the first check");
        let third = m.check();
        assert_eq!(third.records_since_last_check, 0);
        assert!(time(&third.last_check) >= time(&second.last_check));
    }

    #[test]
    fn since_start_counts_this_runs_commits_across_a_reloaded_checkpoint() {
        let m = StreamMetrics::new(&totals(50));
        m.committed(&totals(60), &[]);
        // A destination's checkpoint behind the workspace's: the replay counts from there.
        m.committed(&totals(40), &[]);
        m.committed(&totals(45), &[]);
        let s = m.snapshot();
        assert_eq!((s.events_in, s.records_since_start), (45, 15));
    }

    #[test]
    fn latency_keeps_the_latest_and_when_the_largest_was() {
        let m = StreamMetrics::new(&Totals::default());
        let empty = m.snapshot().latency_ms;
        assert_eq!((empty.now, empty.max, empty.max_at), (0.0, 0.0, None));

        let ms = Duration::from_millis;
        m.committed(&totals(1), &[ms(5), ms(40)]);
        let first = m.snapshot().latency_ms;
        assert_eq!((first.now, first.max, first.min), (40.0, 40.0, 5.0));
        let at = first.max_at.clone().expect("set with the max");
        assert!(chrono::DateTime::parse_from_rfc3339(&at).is_ok(), "{at}");

        m.committed(&totals(2), &[ms(20)]);
        let lower = m.snapshot().latency_ms;
        assert_eq!((lower.now, lower.max, lower.max_at.as_deref()), (20.0, 40.0, Some(at.as_str())));

        std::thread::sleep(ms(2));
        m.committed(&totals(3), &[ms(90)]);
        let higher = m.snapshot().latency_ms;
        assert_eq!((higher.now, higher.max, higher.count), (90.0, 90.0, 4));
        assert!(time(&higher.max_at) > time(&Some(at)), "moves with a new max");
    }
}
