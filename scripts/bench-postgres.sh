#!/usr/bin/env bash
# Postgres CDC benchmark: a throwaway PostgreSQL 15 on 127.0.0.1 with a 1M-row table.
# 1. PostgreSQL's own COPY ... TO STDOUT of the table (the limit for a snapshot);
# 2. a Sluice stream's snapshot of it, until every row is queryable;
# 3. 500k updates (50 transactions of 10k rows), until the mirrored table matches, sampling
#    the slot lag meanwhile.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
ROWS=${ROWS:-1000000}
UPDATES_PER_TX=10000
TXS=${TXS:-50}
cargo build --release --locked -p sluice --quiet
source scripts/services/bench-postgres-env.sh
t0=$(now); $PSQL -c "COPY accounts TO STDOUT" > /dev/null; t1=$(now)
copy_secs=$(calc "$t1 - $t0")

RUST_LOG=${SLUICE_LOG:-info} "$CARGO_TARGET_DIR/release/sluice" serve --data-dir "$DIR/sluice" --listen "127.0.0.1:$API" >/dev/null 2>"$DIR/sluice.log" &
SLUICE_PID=$!
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$API/health" >/dev/null && break; sleep 0.1; done
# Every /api route but push needs a token: the first start wrote the admin's into the data dir.
AUTH="authorization: Bearer $(cat "$DIR/sluice/admin.token")"
# curl and sed only: a Python per poll would take CPU from the run it measures.
count() { curl -s -H "$AUTH" "http://127.0.0.1:$API/api/sql" -H 'content-type: application/json' -d "{\"sql\": \"SELECT ($1)::VARCHAR AS v\"}" | sed -n 's/.*"v":"\([^"]*\)".*/\1/p'; }
t0=$(now)
curl -sf -H "$AUTH" "http://127.0.0.1:$API/api/streams" -H 'content-type: application/json' -d "{\"name\": \"pg\", \"table\": \"accounts\",
  \"source\": {\"type\": \"postgres\", \"host\": \"127.0.0.1\", \"port\": $PGPORT, \"database\": \"etltest\", \"user\": \"etl\",
  \"password\": \"etl\", \"tables\": [\"public.accounts\"], \"snapshot_chunk_rows\": ${CHUNK:-50000}}}" >/dev/null
until [ "$(count 'SELECT count(*) FROM accounts' 2>/dev/null || echo 0)" -ge "$ROWS" ] 2>/dev/null; do sleep 0.05; done
t1=$(now)
snap_secs=$(calc "$t1 - $t0")

UPDATES=$((UPDATES_PER_TX * TXS))
want=$($PSQL -c "SELECT sum(balance) + $UPDATES FROM accounts")
t0=$(now)
(for i in $(seq 0 $((TXS - 1))); do
   echo "UPDATE accounts SET balance = balance + 1 WHERE id > $((i * UPDATES_PER_TX)) AND id <= $(((i + 1) * UPDATES_PER_TX));"
 done | $PSQL >/dev/null) &
writer=$!
max_lag=0
while true; do
  lag=$(curl -s -H "$AUTH" "http://127.0.0.1:$API/api/streams/pg/metrics" | python3 -c 'import json,sys; print(int(json.load(sys.stdin)["source"].get("slot_lag_bytes", 0)))')
  [ "$lag" -gt "$max_lag" ] && max_lag=$lag
  got=$(count 'SELECT sum(balance)::VARCHAR FROM accounts')
  if ! kill -0 $writer 2>/dev/null && [ "$got" = "$want" ]; then break; fi
  sleep 0.2
done
t1=$(now)
apply_secs=$(calc "$t1 - $t0")
echo "rows: $ROWS; updates: $UPDATES in $TXS transactions"
echo "| run | rows or changes/s | seconds |"
echo "|---|---|---|"
printf "| COPY accounts TO STDOUT (psql, the limit) | %.0f | %.1f |\n" "$(calc "$ROWS / $copy_secs")" "$copy_secs"
printf "| Sluice snapshot (stream created → all rows queryable) | %.0f | %.1f |\n" "$(calc "$ROWS / $snap_secs")" "$snap_secs"
printf "| Sluice apply of %d updates (first update → table matches) | %.0f | %.1f |\n" "$UPDATES" "$(calc "$UPDATES / $apply_secs")" "$apply_secs"
printf "snapshot / COPY: %.2f\n" "$(calc "$copy_secs / $snap_secs")"
echo "largest slot lag sampled during the updates: $max_lag bytes"
echo "server log (snapshot timeline):"
sed 's/\x1b\[[0-9;]*m//g' "$DIR/sluice.log" | grep -E "Copying|Snapshot read|Stream started|slot" | head -8 | sed 's/^/  /'
# SLUICE_LOG="info,sluice_core::pipeline=debug" keeps the server's log (per-batch decode_ms and
# write_ms) in /tmp/bench-postgres-sluice.log.
if [ -n "${SLUICE_LOG:-}" ]; then cp "$DIR/sluice.log" /tmp/bench-postgres-sluice.log; fi
