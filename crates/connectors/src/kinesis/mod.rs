//! Amazon Kinesis Data Streams: every shard, through resharding, checkpointed after the write.

mod config;
mod kpl;
mod reader;
pub mod shards;
mod source;

pub use config::{KinesisConfig, KinesisCredentials, KinesisStart, probe, test_account};
pub use kpl::{KPL_MAGIC, aggregate, deaggregate};
pub use source::KinesisSource;
