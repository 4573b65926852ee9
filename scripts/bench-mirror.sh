#!/usr/bin/env bash
# Mirror-mode benchmark: 500k Debezium change events (about 20% inserts, 70% updates, 10%
# deletes over 100k keys) pushed into a mirrored table, then checked against the final state.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
cargo build --release --locked -p sluice --quiet
"$CARGO_TARGET_DIR/release/sluice" bench-mirror "$@"
