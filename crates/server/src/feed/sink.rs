//! The hook on the write path: a sink around the stream's own that, once a unit is durable,
//! hands it to the stream's feed and the activity feed. Sending never waits; rows are turned
//! into JSON only while someone watches.

use std::sync::Arc;

use async_trait::async_trait;
use serde_json::{Value, json};
use sluice_connectors::workspace::SchemaHistory;
use sluice_core::sink::Preceding;
use sluice_core::{Result, Sink, WriteUnit};
use tokio::sync::broadcast;

use super::{Activity, FeedEvent, rows};

/// A stream's sink, watched.
pub struct FeedSink {
    inner: Arc<dyn Sink>,
    stream: String,
    feed: broadcast::Sender<Arc<FeedEvent>>,
    activity: Activity,
    /// Where a destination stream's schema changes are recorded (the workspace sink records
    /// its own in the transaction that applies them).
    history: Option<SchemaHistory>,
}

impl FeedSink {
    /// Watch `inner`, the sink of `stream`. `history` for sinks that do not record schema
    /// changes themselves.
    pub fn wrap(
        inner: Arc<dyn Sink>,
        stream: &str,
        feeds: &super::Feeds,
        history: Option<SchemaHistory>,
    ) -> Arc<dyn Sink> {
        Arc::new(Self {
            inner,
            stream: stream.to_string(),
            feed: feeds.sender(stream),
            activity: feeds.activity().clone(),
            history,
        })
    }

    fn publish(&self, unit: &WriteUnit) {
        let send = |kind: &'static str, data: &Value| {
            let _ = self.feed.send(Arc::new(FeedEvent { kind, data: data.to_string() }));
        };
        for change in rows::schema_changes(unit) {
            send("schema", &change);
            let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
            let columns: Vec<String> = change["changes"]
                .as_array()
                .map(|c| {
                    c.iter()
                        .map(|c| format!("{} {} {}", text(&c["change"]), text(&c["column"]), text(&c["type"])))
                        .collect()
                })
                .unwrap_or_default();
            let message = format!("table {}: {}", text(&change["table"]), columns.join(", "));
            self.activity.record("schema_changed", &self.stream, message, change.clone());
        }
        if let Some(rejects) = rows::rejects(unit) {
            send("rejects", &rejects);
            let reason = rejects["sample"][0]["reason"].as_str().unwrap_or_default();
            self.activity.record(
                "rejects",
                &self.stream,
                format!("{} rejected: {reason}", rejects["count"]),
                json!({ "count": rejects["count"] }),
            );
        }
        // The costly part, only while a client watches.
        if self.feed.receiver_count() > 0 {
            for table in rows::rows(unit) {
                send("rows", &table);
            }
        }
    }
}

#[async_trait]
impl Sink for FeedSink {
    async fn write(&self, unit: Arc<WriteUnit>) -> Result<()> {
        self.inner.write(unit.clone()).await?;
        self.written(unit).await;
        Ok(())
    }

    fn lanes(&self) -> usize {
        self.inner.lanes()
    }

    async fn write_after(&self, unit: Arc<WriteUnit>, lane: usize, previous: Preceding) -> Result<()> {
        self.inner.write_after(unit.clone(), lane, previous).await?;
        self.written(unit).await;
        Ok(())
    }

    async fn probe(&self, unit: Arc<WriteUnit>) -> Option<Result<()>> {
        self.inner.probe(unit).await
    }

    async fn probe_on(&self, lane: usize, unit: Arc<WriteUnit>) -> Option<Result<()>> {
        self.inner.probe_on(lane, unit).await
    }
}

impl FeedSink {
    /// A unit is durable: its schema changes into the history, and it goes to the feed.
    async fn written(&self, unit: Arc<WriteUnit>) {
        if let Some(history) = &self.history
            && unit.tables.iter().any(|t| !t.changes.is_empty())
            && let Err(e) = history.record(unit.clone()).await
        {
            tracing::warn!(stream = %self.stream, error = %e, "Could not record the schema change in the history.");
        }
        self.publish(&unit);
    }
}
