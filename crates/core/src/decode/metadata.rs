//! The optional metadata columns a stream can add to each row.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{Ctx, TableBuilder};
use crate::batch::RecordMeta;
use crate::rejects::Rejects;
use crate::schema::{ColumnType, Fit};

/// Optional metadata columns, per stream.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct MetadataConfig {
    /// `_received_at` TIMESTAMPTZ: when Sluice received the event.
    pub received_at: bool,
    /// `_position` BIGINT: the stream's monotonically increasing sequence.
    pub position: bool,
    /// `_key` VARCHAR: the message key, for sources that have one.
    pub key: bool,
    /// `_topic` VARCHAR: the topic, for sources that have one.
    pub topic: bool,
    /// `_partition` BIGINT: the partition, for sources that have one.
    pub partition: bool,
    /// `_offset` BIGINT: offset within the partition, for sources that have one.
    pub offset: bool,
    /// `_event_time` TIMESTAMPTZ: the producer's timestamp, for sources that have one.
    pub event_time: bool,
    /// `_headers` JSON: message headers, for sources that have them.
    pub headers: bool,
    /// `_shard_id` VARCHAR: the Kinesis shard.
    pub shard_id: bool,
    /// `_sequence_number` VARCHAR: the Kinesis sequence number (up to 128 bits, so text).
    pub sequence_number: bool,
    /// `_partition_key` VARCHAR: the Kinesis partition key.
    pub partition_key: bool,
    /// `_arrival_time` TIMESTAMPTZ: when Kinesis accepted the record.
    pub arrival_time: bool,
}

impl TableBuilder {
    /// The metadata columns the stream asks for, for one event.
    pub(super) fn push_metadata(&mut self, ctx: &Ctx, m: &MetadataConfig, rejects: &mut Rejects) {
        let meta = ctx.meta;
        if m.received_at {
            self.put_typed(ctx, "_received_at", ColumnType::Timestamptz, Fit::Micros(meta.received_us), rejects);
        }
        if m.position {
            self.put_typed(ctx, "_position", ColumnType::Bigint, Fit::Int(ctx.seq), rejects);
        }
        if m.key {
            let v = meta.key.as_deref().map_or(Fit::Null, |k| Fit::Text(k.into()));
            self.put_typed(ctx, "_key", ColumnType::Varchar, v, rejects);
        }
        if m.topic {
            let v = meta.topic.as_deref().map_or(Fit::Null, |t| Fit::Text(t.into()));
            self.put_typed(ctx, "_topic", ColumnType::Varchar, v, rejects);
        }
        if m.partition {
            let v = meta.partition.map_or(Fit::Null, Fit::Int);
            self.put_typed(ctx, "_partition", ColumnType::Bigint, v, rejects);
        }
        if m.offset {
            let v = meta.offset.map_or(Fit::Null, Fit::Int);
            self.put_typed(ctx, "_offset", ColumnType::Bigint, v, rejects);
        }
        if m.event_time {
            let v = meta.event_time_us.map_or(Fit::Null, Fit::Micros);
            self.put_typed(ctx, "_event_time", ColumnType::Timestamptz, v, rejects);
        }
        if m.headers {
            let v = meta.headers.as_ref().map_or(Fit::Null, |h| Fit::Text(h.to_string().into()));
            self.put_typed(ctx, "_headers", ColumnType::Json, v, rejects);
        }
        if m.shard_id {
            self.put_typed(ctx, "_shard_id", ColumnType::Varchar, text(meta.shard.as_deref()), rejects);
        }
        if m.sequence_number {
            self.put_typed(ctx, "_sequence_number", ColumnType::Varchar, text(meta.sequence.as_deref()), rejects);
        }
        if m.partition_key {
            self.put_typed(ctx, "_partition_key", ColumnType::Varchar, text(meta.key.as_deref()), rejects);
        }
        if m.arrival_time {
            let v = meta.event_time_us.map_or(Fit::Null, Fit::Micros);
            self.put_typed(ctx, "_arrival_time", ColumnType::Timestamptz, v, rejects);
        }
    }
}

/// A text value, or NULL.
fn text(v: Option<&str>) -> Fit<'_> {
    v.map_or(Fit::Null, |t| Fit::Text(t.into()))
}

pub(super) fn source_coordinates(meta: &RecordMeta) -> Option<Value> {
    if meta.topic.is_none()
        && meta.partition.is_none()
        && meta.offset.is_none()
        && meta.route.is_none()
        && meta.shard.is_none()
    {
        return None;
    }
    let mut m = Map::new();
    if let Some(r) = &meta.route {
        m.insert("route".into(), Value::from(r.as_str()));
    }
    if let Some(t) = &meta.topic {
        m.insert("topic".into(), Value::from(t.as_str()));
    }
    if let Some(p) = meta.partition {
        m.insert("partition".into(), Value::from(p));
    }
    if let Some(o) = meta.offset {
        m.insert("offset".into(), Value::from(o));
    }
    if let Some(shard) = &meta.shard {
        m.insert("shard".into(), Value::from(shard.as_str()));
    }
    if let Some(seq) = &meta.sequence {
        m.insert("sequence_number".into(), Value::from(seq.as_str()));
    }
    Some(Value::Object(m))
}
