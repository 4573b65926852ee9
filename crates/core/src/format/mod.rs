//! Payload formats: bytes in, JSON events out. Transport-free.

pub mod json;
