//! The optional metadata columns a stream can add to each row.

use serde::{Deserialize, Serialize};

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
