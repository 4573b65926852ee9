//! Core tests: the decoder's golden cases and the run loop with in-memory peers.

mod decoder;
mod run_loop;
