#!/usr/bin/env bash
# Parse speed of JSON parsers on the push bench's kind of event (about 300 bytes, nested), one
# core, 200,000 events, best of five: serde_json (as a Value, and its tokenizer alone), the
# borrowed tree Sluice decodes from (format/json/raw.rs), simd-json and sonic-rs. A throwaway
# crate outside the workspace, so the project's build does not carry the candidates.
# Usage: bash scripts/bench-parsers.sh
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
dir="${TMPDIR:-/tmp}/sluice-bench-parsers"
mkdir -p "$dir/src"
cat > "$dir/Cargo.toml" <<EOF
[package]
name = "bench-parsers"
version = "0.1.0"
edition = "2021"

[dependencies]
serde = { version = "1", features = ["derive"] }
serde_json = { version = "1", features = ["preserve_order"] }
simd-json = "0.15"
sonic-rs = "0.5"
sluice-core = { path = "$root/crates/core" }

[workspace]
EOF
cp "$root/Cargo.lock" "$dir/Cargo.lock"
cat > "$dir/src/main.rs" <<'EOF'
use std::time::Instant;

use sluice_core::format::json::raw::{self, Raw};

fn events(n: usize) -> Vec<String> {
    let mut s: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    (0..n)
        .map(|i| {
            format!(
                r#"{{"event_id":{i},"kind":"page_view","ts":"2025-11-24T16:00:00.{:03}Z","user":{{"id":{},"country":"DE","plan":"free"}},"page":{{"path":"/docs/streams","referrer":"https://example.com/r/{}"}},"device":{{"browser":"firefox","mobile":{}}},"amount":{}.{:02},"tags":["t{}","t{}"],"session":"{:016x}"}}"#,
                next() % 1000, next() % 100000, next() % 1000, next() % 2 == 0, next() % 500, next() % 100,
                next() % 10, next() % 10, next()
            )
        })
        .collect()
}

fn time(name: &str, lines: &[String], mut f: impl FnMut(&str) -> usize) {
    let bytes: usize = lines.iter().map(|l| l.len()).sum();
    let (mut best, mut fields) = (f64::MAX, 0);
    for _ in 0..5 {
        let t = Instant::now();
        fields = lines.iter().map(|l| f(l)).sum::<usize>();
        best = best.min(t.elapsed().as_secs_f64());
    }
    println!("| {name} | {:.0} | {:.0} | {fields} |", lines.len() as f64 / best, bytes as f64 / best / 1e6);
}

fn main() {
    let lines = events(200_000);
    println!("| parser | events/s, one core | MB/s | top-level fields seen |");
    println!("|---|---|---|---|");
    time("serde_json, tokenizer only (IgnoredAny)", &lines, |l| {
        serde_json::from_str::<serde::de::IgnoredAny>(l).map(|_| 0).unwrap()
    });
    time("serde_json `Value` (preserve_order)", &lines, |l| {
        serde_json::from_str::<serde_json::Value>(l).unwrap().as_object().map_or(0, |o| o.len())
    });
    time("Sluice's borrowed tree (serde_json visitors)", &lines, |l| match raw::parse(l.as_bytes()).unwrap().value {
        Raw::Object(fields) => fields.len(),
        _ => 0,
    });
    time("simd-json `BorrowedValue` (a copy, then the tape)", &lines, |l| {
        let mut b = l.as_bytes().to_vec();
        let fields = match simd_json::to_borrowed_value(&mut b).unwrap() {
            simd_json::BorrowedValue::Object(o) => o.len(),
            _ => 0,
        };
        fields
    });
    time("Sluice's borrowed tree (sonic-rs visitors)", &lines, |l| {
        let mut de = sonic_rs::Deserializer::from_slice(l.as_bytes());
        match raw::parse_from(&mut de).unwrap().value {
            Raw::Object(fields) => fields.len(),
            _ => 0,
        }
    });
    time("sonic-rs `Value`", &lines, |l| {
        use sonic_rs::JsonContainerTrait;
        let v: sonic_rs::Value = sonic_rs::from_str(l).unwrap();
        v.as_object().map_or(0, |o| o.len())
    });
}
EOF
cd "$dir" && CARGO_TARGET_DIR="$dir/target" cargo run --release --quiet
