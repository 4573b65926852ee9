#!/usr/bin/env bash
# The one command that passes all tests: format check, clippy with warnings denied, every test.
# Installs what it needs (lld, the prebuilt libduckdb) on a fresh machine; reuses the cache after.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
echo "== cargo fmt --check"
cargo fmt --all --check
echo "== cargo clippy (warnings denied)"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== cargo test"
cargo test --workspace --locked
