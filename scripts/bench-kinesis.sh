#!/usr/bin/env bash
# Kinesis benchmark: starts a throwaway kinesis-local on 127.0.0.1, then runs
# `sluice bench-kinesis` against it: 1M generated events in a 4-shard stream (100 per record, as
# KPL aggregates), a raw GetRecords reader over every shard, then Sluice.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
source scripts/services/kinesis.sh
cargo build --release --locked -p sluice --quiet
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
port=$(free_port)
KINESIS_MOCK_CERT_PATH="$KINESIS_LOCAL_DIR/server.json" KINESIS_MOCK_PLAIN_PORT=$port \
  KINESIS_MOCK_TLS_PORT=$(free_port) CREATE_STREAM_DURATION=50ms LOG_LEVEL=WARN \
  node "$KINESIS_LOCAL_DIR/main.js" >/dev/null 2>&1 &
emulator=$!
trap 'kill $emulator 2>/dev/null; wait $emulator 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do
  curl -s -o /dev/null "http://127.0.0.1:$port/" && break
  sleep 0.5
done
"$CARGO_TARGET_DIR/release/sluice" bench-kinesis --endpoint "http://127.0.0.1:$port" "$@"
