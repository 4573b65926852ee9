//! Core tests: the decoder's golden cases, the parsers under generated input, and the run loop
//! with in-memory peers.

mod changes;
mod debezium_keys;
mod decoder;
mod edge;
mod fuzz;
mod quarantine;
mod run_loop;
