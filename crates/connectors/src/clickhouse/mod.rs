//! ClickHouse as a destination, over its HTTP interface: rows go as `INSERT … FORMAT Native`
//! (or `JSONEachRow` where a column does not map exactly) in one request per table and write;
//! `config.rs` the config, `client.rs` the HTTP calls and their errors, `types.rs` column types
//! and rows as JSON, `native.rs` rows as `Native` blocks, `target.rs` the writes and the
//! stream's position.
//!
//! ClickHouse has no transactions, so a stream's write is made exactly once by a position
//! table: before its rows, a `writing` marker names the attempt (a random number, new for each
//! attempt) and its tables; each row carries it in `_sluice_unit`; after them the `done` row
//! holds the checkpoint. On restart, and before a write is tried again, an attempt without its
//! `done` row has its rows deleted (`ALTER TABLE … DELETE`, waited for, then marked `undone`);
//! a retried write whose `done` row landed is not written again. Keyed tables (mirrors, and a
//! snapshot's that changes follow) are `ReplacingMergeTree` on the keys with `_version` (the
//! write's time) and `_deleted`: read them with `FINAL WHERE _deleted = 0`.

mod client;
mod config;
mod native;
mod target;
mod types;

pub use config::ClickhouseConfig;
pub use target::ClickhouseTarget;
