//! The `decoder` check of crates/core/tests/fuzz/checks.rs under libFuzzer.
#![no_main]

#[path = "../../crates/core/tests/fuzz/checks.rs"]
#[allow(dead_code)]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::decoder(data));
