//! Payload formats: bytes in, JSON events or typed changes out. Transport-free.

pub mod change;
pub mod debezium;
pub mod extended_json;
pub mod json;
pub mod logical;
