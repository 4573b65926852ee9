//! Payload formats: bytes in, JSON events out. Transport-free.

pub mod debezium;
pub mod extended_json;
pub mod json;
pub mod logical;
