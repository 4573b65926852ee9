//! The server's activity: streams created, changed or removed, schema changes, rejects, sync
//! runs started and finished, errors. The newest [`RECENT`] are kept in memory for a page that
//! opens late; every event also goes to the live clients.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use serde::Serialize;
use serde_json::Value;
use tokio::sync::broadcast;

use super::FeedEvent;

/// Events kept for `GET /api/activity?recent`.
pub const RECENT: usize = 200;

/// One thing that happened.
#[derive(Debug, Clone, Serialize)]
pub struct ActivityEvent {
    /// When (RFC 3339).
    pub at: String,
    /// What: `stream_created`, `stream_changed`, `stream_removed`, `schema_changed`,
    /// `rejects`, `sync_created`, `sync_changed`, `sync_removed`, `run_started`,
    /// `run_finished`, `error`.
    pub kind: &'static str,
    /// The stream or sync it concerns.
    pub subject: String,
    /// In words.
    pub message: String,
    /// More, by kind (the run's status, the changed columns, …).
    #[serde(skip_serializing_if = "Value::is_null")]
    pub details: Value,
}

/// The activity feed. Cheap to clone.
#[derive(Clone)]
pub struct Activity {
    tx: broadcast::Sender<Arc<FeedEvent>>,
    recent: Arc<Mutex<VecDeque<ActivityEvent>>>,
}

impl Default for Activity {
    fn default() -> Self {
        Self { tx: broadcast::channel(256).0, recent: Arc::default() }
    }
}

impl Activity {
    /// Record an event; never waits.
    pub fn record(&self, kind: &'static str, subject: &str, message: impl Into<String>, details: Value) {
        let event = ActivityEvent {
            at: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            kind,
            subject: subject.to_string(),
            message: message.into(),
            details,
        };
        let data = serde_json::to_string(&event).unwrap_or_default();
        {
            let mut recent = self.recent.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            if recent.len() == RECENT {
                recent.pop_front();
            }
            recent.push_back(event);
        }
        let _ = self.tx.send(Arc::new(FeedEvent { kind, data }));
    }

    /// The newest events, oldest first.
    pub fn recent(&self) -> Vec<ActivityEvent> {
        self.recent.lock().unwrap_or_else(std::sync::PoisonError::into_inner).iter().cloned().collect()
    }

    /// A new live client.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<FeedEvent>> {
        self.tx.subscribe()
    }
}
