//! What the page watches live: each stream's committed rows (sampled), the server's activity,
//! and an hour of each stream's metrics.
//!
//! The write path only ever calls `broadcast::Sender::send`, which never waits: a client that
//! reads too slowly loses the oldest events and is told how many it skipped.

mod activity;
mod client;
mod history;
mod rows;
mod sink;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::broadcast;

pub use activity::{Activity, RECENT};
pub use client::{MAX_EVENTS_PER_SEC, events};
pub use history::{History, watch};
pub use rows::ROWS_PER_UNIT;
pub use sink::FeedSink;

/// Events a stream's channel holds for its slowest client before that client skips.
const STREAM_CAPACITY: usize = 64;

/// One server-sent event, serialized once for every client.
#[derive(Debug)]
pub struct FeedEvent {
    /// The SSE event name: `rows`, `schema`, `rejects`, or an activity's kind.
    pub kind: &'static str,
    /// Its JSON.
    pub data: String,
}

/// The live channels of every stream, the activity feed and the metrics history.
#[derive(Clone, Default)]
pub struct Feeds {
    streams: Arc<Mutex<HashMap<String, broadcast::Sender<Arc<FeedEvent>>>>>,
    activity: Activity,
    history: History,
}

impl Feeds {
    /// The channel of `stream`'s committed units, made on first use.
    pub fn sender(&self, stream: &str) -> broadcast::Sender<Arc<FeedEvent>> {
        let mut streams = self.streams.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        streams.entry(stream.to_string()).or_insert_with(|| broadcast::channel(STREAM_CAPACITY).0).clone()
    }

    /// A new client of `stream`'s feed.
    pub fn subscribe(&self, stream: &str) -> broadcast::Receiver<Arc<FeedEvent>> {
        self.sender(stream).subscribe()
    }

    /// A removed stream's channel goes: its clients' feeds end once its sink is dropped.
    pub fn forget(&self, stream: &str) {
        self.streams.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(stream);
    }

    /// The server's activity.
    pub fn activity(&self) -> &Activity {
        &self.activity
    }

    /// The streams' metrics over the last hour.
    pub fn history(&self) -> &History {
        &self.history
    }
}
