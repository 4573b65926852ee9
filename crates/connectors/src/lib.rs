//! Every Source and Sink, one folder per technology, registered by one serde enum and one match.

pub mod http_push;
pub mod kafka;
pub mod kinesis;
pub mod postgres;
mod stream;
pub mod workspace;

pub use stream::{SourceConfig, SourceContext, SourceHandle, StreamConfig, build_source, release_source, test_source};
