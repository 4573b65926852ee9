//! Every Source and Sink, one folder per technology, registered by one serde enum and one match.

pub mod http_push;
pub mod kafka;
pub mod kinesis;
mod stream;
pub mod workspace;

pub use stream::{SourceConfig, SourceContext, SourceHandle, StreamConfig, build_source};
