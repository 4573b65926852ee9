//! End-to-end tests: the real `sluice` binary, over real HTTP, on a real DuckDB workspace.

mod harness;

mod api;
mod crash;
mod push;
mod schema;
