//! A stream's config (the API's and the YAML's type) and the one place sources are built.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sluice_core::{FlushConfig, MetadataConfig, Position, Result, Secret, Source, StreamMetrics, error::Error};

use crate::http_push::{self, HttpPushConfig, PushHandle};
use crate::kafka::{KafkaConfig, KafkaSource};

/// One stream: a source, a destination table in the workspace, and how to batch.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamConfig {
    /// Unique name; also the stream's id in URLs. Letters, digits, `_` and `-`.
    pub name: String,
    /// Destination table in the workspace. Any characters; `*` is replaced by the record's
    /// route (a topic, a source table) for sources that have one.
    pub table: String,
    /// Where events come from. Defaults to HTTP push.
    #[serde(default)]
    pub source: SourceConfig,
    /// Optional metadata columns.
    #[serde(default)]
    pub metadata: MetadataConfig,
    /// Micro-batch rules.
    #[serde(default)]
    pub flush: FlushConfig,
    /// For declared streams: the push key to accept. When absent one is generated and shown
    /// once. Stored hashed, never serialized back.
    #[serde(default, skip_serializing)]
    pub push_key: Option<Secret>,
}

impl StreamConfig {
    /// Check every field; pure. Errors name the field.
    pub fn validate(&self) -> Result<()> {
        let name_ok = !self.name.is_empty()
            && self.name.len() <= 64
            && self.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !name_ok {
            return Err(Error::config("name", "must be 1-64 letters, digits, '_' or '-'"));
        }
        if self.table.trim().is_empty() || self.table.len() > 255 || self.table.contains('\0') {
            return Err(Error::config("table", "must be 1-255 characters without NUL"));
        }
        if let Some(key) = &self.push_key
            && key.expose().len() < 16
        {
            return Err(Error::config("push_key", "must be at least 16 characters"));
        }
        self.flush.validate()?;
        match &self.source {
            SourceConfig::HttpPush(c) => c.validate(),
            SourceConfig::Kafka(c) => c.validate(),
        }
    }

    /// The secrets inside the source config, by field path. The server keeps them apart from
    /// the serialized config, which never contains them.
    pub fn secrets(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        if let SourceConfig::Kafka(kafka) = &self.source
            && let Some(p) = kafka.sasl.as_ref().and_then(|s| s.password.as_ref())
        {
            out.insert("source.sasl.password".to_string(), p.expose().to_string());
        }
        out
    }

    /// Put secrets back where [`StreamConfig::secrets`] found them, unless the config already
    /// carries a new value.
    pub fn restore_secrets(&mut self, secrets: &BTreeMap<String, String>) {
        if let SourceConfig::Kafka(kafka) = &mut self.source
            && let Some(sasl) = kafka.sasl.as_mut()
            && sasl.password.is_none()
            && let Some(p) = secrets.get("source.sasl.password")
        {
            sasl.password = Some(Secret::new(p.clone()));
        }
    }
}

/// Where a stream's events come from. The `type` field picks the variant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum SourceConfig {
    /// Events POSTed to `/api/streams/:id/push`.
    HttpPush(HttpPushConfig),
    /// Messages from Kafka topics.
    Kafka(Box<KafkaConfig>),
}

impl Default for SourceConfig {
    fn default() -> Self {
        Self::HttpPush(HttpPushConfig::default())
    }
}

/// What the server keeps to feed a running source from outside.
#[derive(Debug, Clone)]
pub enum SourceHandle {
    /// The push endpoint's way into the stream.
    Push(PushHandle),
    /// The source reads by itself.
    None,
}

/// What a source is built with besides its config.
pub struct SourceContext<'a> {
    /// The stream's name.
    pub stream: &'a str,
    /// The stream's last durable position, to resume from.
    pub position: &'a Position,
    /// The stream's metrics, for state and lag.
    pub metrics: Arc<StreamMetrics>,
}

/// Build a source from its config: the one place connectors are wired.
pub fn build_source(config: &SourceConfig, ctx: SourceContext<'_>) -> Result<(Box<dyn Source>, SourceHandle)> {
    match config {
        SourceConfig::HttpPush(c) => {
            let (source, handle) = http_push::channel(c);
            Ok((Box::new(source), SourceHandle::Push(handle)))
        }
        SourceConfig::Kafka(c) => {
            let source = KafkaSource::build(c, ctx.stream, ctx.position, ctx.metrics)?;
            Ok((Box::new(source), SourceHandle::None))
        }
    }
}
