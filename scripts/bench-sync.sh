#!/usr/bin/env bash
# Reverse ETL benchmark, on a throwaway PostgreSQL 15 on 127.0.0.1:
# 1. a 1M-row table reaches the workspace (through a Postgres CDC stream);
# 2. an upsert sync delivers it to a new Postgres table, against PostgreSQL's own
#    COPY ... FROM STDIN of the same rows into a table of the same shape (the limit);
# 3. 1% of the rows change at the source; the rerun's change detection time is reported;
# 4. a replace sync writes the 1M rows as one Parquet file on local disk.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
ROWS=${ROWS:-1000000}
cargo build --release --locked -p sluice --quiet
source scripts/services/bench-postgres-env.sh
api() { curl -sf -H "$AUTH" "http://127.0.0.1:$API$1" -H 'content-type: application/json' "${@:2}"; }
field() { python3 -c "import json,sys; print(json.load(sys.stdin)$1)"; }
count() { api /api/sql -d "{\"sql\": \"$1\"}" | python3 -c 'import json,sys; r=json.load(sys.stdin).get("rows") or [{}]; print(list(r[0].values())[0] if r[0] else 0)'; }

"$CARGO_TARGET_DIR/release/sluice" serve --data-dir "$DIR/sluice" --listen "127.0.0.1:$API" >/dev/null 2>"$DIR/sluice.log" &
SLUICE_PID=$!
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$API/health" >/dev/null && break; sleep 0.1; done
# Every /api route but push needs a token: the first start wrote the admin's into the data dir.
AUTH="authorization: Bearer $(cat "$DIR/sluice/admin.token")"
api /api/streams -d "{\"name\": \"pg\", \"table\": \"accounts\", \"source\": {\"type\": \"postgres\", \"host\": \"127.0.0.1\",
  \"port\": $PGPORT, \"database\": \"etltest\", \"user\": \"etl\", \"password\": \"etl\", \"tables\": [\"public.accounts\"]}}" >/dev/null
until [ "$(count 'SELECT count(*) FROM accounts' 2>/dev/null || echo 0)" -ge "$ROWS" ] 2>/dev/null; do sleep 0.2; done

DEST="{\"kind\": \"postgres\", \"host\": \"127.0.0.1\", \"port\": $PGPORT, \"database\": \"etltest\", \"user\": \"etl\", \"password\": \"etl\", \"table\": \"accounts_out\"}"
api /api/syncs -d "{\"name\": \"out\", \"query\": \"SELECT id, owner, balance, opened, active FROM accounts\", \"mode\": \"upsert\", \"keys\": [\"id\"], \"destination\": $DEST}" >/dev/null
first=$(api "/api/syncs/out/runs?wait_seconds=3600" -X POST)
first_ms=$(echo "$first" | field '["duration_ms"]'); first_detect=$(echo "$first" | field '["detect_ms"]')
[ "$(echo "$first" | field '["inserted"]')" = "$ROWS" ] || { echo "first run: $first"; exit 1; }

# The limit: PostgreSQL's own COPY FROM STDIN of the same rows into a table of the same shape.
$PSQL -c "COPY accounts_out TO STDOUT" > "$DIR/rows.copy"
$PSQL -c "CREATE TABLE copy_in (LIKE accounts_out INCLUDING ALL)"
t0=$(now); $PSQL -c "COPY copy_in FROM STDIN" < "$DIR/rows.copy"; t1=$(now)
copy_secs=$(calc "$t1 - $t0")

# 1% of the rows change at the source and reach the workspace; then the rerun.
CHANGED=$((ROWS / 100))
want=$($PSQL -c "SELECT (sum(balance) + $CHANGED)::text FROM accounts")
$PSQL -c "UPDATE accounts SET balance = balance + 1 WHERE id % 100 = 0"
until [ "$(count 'SELECT sum(balance)::VARCHAR FROM accounts')" = "$want" ]; do sleep 0.2; done
second=$(api "/api/syncs/out/runs?wait_seconds=3600" -X POST)
second_ms=$(echo "$second" | field '["duration_ms"]'); second_detect=$(echo "$second" | field '["detect_ms"]')
[ "$(echo "$second" | field '["updated"]')" = "$CHANGED" ] || { echo "rerun: $second"; exit 1; }
[ "$($PSQL -c "SELECT sum(balance)::text FROM accounts_out")" = "$want" ] || { echo "destination does not match"; exit 1; }

api /api/syncs -d "{\"name\": \"pq\", \"query\": \"SELECT id, owner, balance, opened, active FROM accounts\", \"mode\": \"replace\", \"destination\": {\"kind\": \"files\", \"location\": \"$DIR/files\", \"format\": \"parquet\"}}" >/dev/null
pq=$(api "/api/syncs/pq/runs?wait_seconds=3600" -X POST)
pq_ms=$(echo "$pq" | field '["duration_ms"]')
pq_bytes=$(stat -c %s "$DIR/files/pq.parquet")

echo "rows: $ROWS; changed for the rerun: $CHANGED"
echo "| run | rows/s | seconds |"
echo "|---|---|---|"
printf "| PostgreSQL COPY FROM STDIN of the same rows (psql, the limit) | %.0f | %.2f |\n" "$(calc "$ROWS / $copy_secs")" "$copy_secs"
printf "| Sluice upsert sync, first run (query, hashes, COPY, commit) | %.0f | %.2f |\n" "$(calc "$ROWS * 1000 / $first_ms")" "$(calc "$first_ms / 1000")"
printf "| Sluice upsert sync, rerun with %d changed (all of it) | %.0f | %.2f |\n" "$CHANGED" "$(calc "$ROWS * 1000 / $second_ms")" "$(calc "$second_ms / 1000")"
printf "| Sluice replace sync to one Parquet file (%d MB) | %.0f | %.2f |\n" "$((pq_bytes / 1000000))" "$(calc "$ROWS * 1000 / $pq_ms")" "$(calc "$pq_ms / 1000")"
printf "first run / COPY: %.2f\n" "$(calc "$copy_secs * 1000 / $first_ms")"
echo "change detection: first run ${first_detect} ms, rerun ${second_detect} ms (goal: under 2000 ms)"
echo "phases (from the server log):"
sed 's/\x1b\[[0-9;]*m//g' "$DIR/sluice.log" | sed -n 's/.*Sync run phases\. /  /p'
