#!/usr/bin/env bash
# Kafka benchmark: starts a throwaway tansu broker (memory storage, its fastest; SQLITE=1 for
# its SQLite storage) on 127.0.0.1, then runs `sluice bench-kafka` against it: 1M generated
# events, a raw rdkafka consumer, then Sluice.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
source scripts/services/tansu.sh
cargo build --release --locked -p sluice --quiet
dir=$(mktemp -d /tmp/sluice-bench-tansu.XXXXXX)
storage=memory://tansu/
if [ "${SQLITE:-}" = 1 ]; then storage=sqlite://tansu.db; fi
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
(cd "$dir" && exec "$TANSU_BIN" broker --listener-url "tcp://127.0.0.1:$port" \
  --advertised-listener-url "tcp://127.0.0.1:$port" --storage-engine "$storage" --silent) &
broker=$!
trap 'kill $broker 2>/dev/null; wait $broker 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 1 60); do
  timeout 2 "$TANSU_BIN" topic list --broker "tcp://127.0.0.1:$port" >/dev/null 2>&1 && break
  sleep 0.5
done
"$CARGO_TARGET_DIR/release/sluice" bench-kafka --brokers "127.0.0.1:$port" "$@"
