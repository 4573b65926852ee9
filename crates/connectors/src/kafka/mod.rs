//! Kafka: any Kafka-compatible broker. `config.rs` holds the settings and the client config
//! they make; `source.rs` the source; `consumer.rs` the consumer thread and its rebalances; `throttle.rs` keeps repeated
//! warnings down; `watchdog.rs` rejoins a group that leaves partitions unread.

mod config;
mod consumer;
mod source;
mod throttle;
mod watchdog;

pub use config::{
    KafkaConfig, SaslConfig, SaslMechanism, StartFrom, TlsConfig, is_secret_property, probe, test_cluster,
};
pub use source::{KafkaSource, rewind_group};
