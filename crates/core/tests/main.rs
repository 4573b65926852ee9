//! Core tests: the decoder's golden cases and the run loop with in-memory peers.

mod decoder;
mod quarantine;
mod run_loop;
