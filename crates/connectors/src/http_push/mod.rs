//! HTTP push: the server's route parses a body and hands the events to a bounded channel;
//! the source reads the channel and answers each push once its events are durable.

mod keys;
mod source;

pub use keys::{Claim, KeyMemory};
pub use source::{HttpPushConfig, HttpPushSource, PushError, PushHandle, channel};
