//! The optional metadata columns a stream can add to each row.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::batch::RecordMeta;
use crate::schema::Fit;

/// Optional metadata columns, per stream.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
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

/// A text value, or NULL.
pub(super) fn text(v: Option<&str>) -> Fit<'_> {
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
