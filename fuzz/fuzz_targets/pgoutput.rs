//! The `pgoutput` check of crates/connectors/tests/fuzz/checks.rs under libFuzzer, on the
//! connector's parser files built alone (at the root, as `fuzz.rs` expects its siblings).
#![no_main]
#![allow(dead_code)]

#[path = "../../crates/connectors/src/postgres/fuzz.rs"]
mod fuzz;
#[path = "../../crates/connectors/src/postgres/pgoutput.rs"]
mod pgoutput;
#[path = "../../crates/connectors/src/postgres/types.rs"]
mod types;
#[path = "../../crates/connectors/src/postgres/values.rs"]
mod values;

use crate::fuzz as api;

#[path = "../../crates/connectors/tests/fuzz/checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::pgoutput(data));
