//! End-to-end tests: the real `sluice` binary, over real HTTP, on a real DuckDB workspace.

mod broker;
mod harness;

mod api;
mod crash;
mod kafka;
mod kafka_faults;
mod push;
mod schema;
