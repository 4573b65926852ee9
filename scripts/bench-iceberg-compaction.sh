#!/usr/bin/env bash
# Iceberg compaction benchmark: a throwaway catalog (--catalog rest: lakana, scripts/iceberg-rest-up.sh;
# --catalog sql: a SQLite SQL catalog behind Sluice's own REST front), data files in a local
# folder, and a release `sluice serve`; a push stream into `bronze.clicks` gets --pushes serial
# pushes of 20 rows (a commit and a data file each), timed until pyiceberg counts every row;
# then one compaction on demand (POST /api/streams/clicks/compact) is timed; pyiceberg counts
# the rows before and after, and the data folder's Parquet files are counted before and after.
# SLUICE_BIN=path runs that binary instead of building the release one.
# Usage: bash scripts/bench-iceberg-compaction.sh [--pushes N] [--catalog rest|sql]   (default 1000, rest)
set -euo pipefail
cd "$(dirname "$0")/.."
PUSHES=1000
CATALOG=rest
while [ $# -gt 0 ]; do
  case $1 in
    --pushes) PUSHES=$2; shift 2 ;;
    --catalog) CATALOG=$2; shift 2 ;;
    *) echo "usage: $0 [--pushes N] [--catalog rest|sql]" >&2; exit 2 ;;
  esac
done
case $CATALOG in rest | sql) ;; *) echo "--catalog: rest or sql" >&2; exit 2 ;; esac
source scripts/env.sh
for s in postgres pytools duckdb_extensions iceberg_rest; do source "scripts/services/$s.sh" >/dev/null; done
if [ -z "${SLUICE_BIN:-}" ]; then
  cargo build --release --locked -p sluice --quiet
  SLUICE_BIN=$CARGO_TARGET_DIR/release/sluice
fi
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
DIR=$(mktemp -d /tmp/sluice-bench-iceberg.XXXXXX); chmod 755 "$DIR"
SLUICE_PID=""
cleanup() {
  if [ -n "$SLUICE_PID" ]; then kill "$SLUICE_PID" 2>/dev/null; wait "$SLUICE_PID" 2>/dev/null || true; fi
  if [ -f "$DIR/catalog/pids" ]; then kill $(cat "$DIR/catalog/pids") 2>/dev/null || true; fi
  sleep 1; rm -rf "$DIR"
}
trap cleanup EXIT
mkdir -p "$DIR/catalog/warehouse"
if [ "$CATALOG" = rest ]; then
  eval "$(bash scripts/iceberg-rest-up.sh "$DIR/catalog" "$(free_port)")"
  DEST="{\"kind\": \"iceberg\", \"endpoint\": \"$ICEBERG_REST_URI\", \"warehouse\": \"$ICEBERG_REST_WAREHOUSE\",
    \"token\": \"$ICEBERG_REST_TOKEN\", \"namespace\": \"bronze\", \"simple_create\": true,
    \"compaction\": {\"every_s\": 0, \"min_files\": 2}}"
  READER="from pyiceberg.catalog.rest import RestCatalog
c = RestCatalog('b', uri='$ICEBERG_REST_URI', warehouse='$ICEBERG_REST_WAREHOUSE', token=os.environ['ICEBERG_TOKEN'])"
else
  DEST="{\"kind\": \"iceberg\", \"sql\": {\"sqlite\": \"$DIR/catalog/catalog.db\",
    \"location\": \"file://$DIR/catalog/warehouse\"}, \"warehouse\": \"lake\", \"namespace\": \"bronze\",
    \"compaction\": {\"every_s\": 0, \"min_files\": 2}}"
  READER="from pyiceberg.catalog.sql import SqlCatalog
c = SqlCatalog('lake', uri='sqlite:///$DIR/catalog/catalog.db', init_catalog_tables='false')"
fi
API=$(free_port)
RUST_LOG=warn "$SLUICE_BIN" serve --data-dir "$DIR/sluice" --listen "127.0.0.1:$API" > "$DIR/sluice.log" 2>&1 &
SLUICE_PID=$!
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$API/health" >/dev/null && break; sleep 0.1; done
AUTH="authorization: Bearer $(cat "$DIR/sluice/admin.token")"
KEY=$(curl -sf -H "$AUTH" "http://127.0.0.1:$API/api/streams" -H 'content-type: application/json' \
  -d "{\"name\": \"clicks\", \"table\": \"clicks\", \"flush\": {\"max_wait_ms\": 10}, \"destination\": $DEST}" \
  | python3 -c 'import json, sys; print(json.load(sys.stdin)["push_key"])')
count() {
  ICEBERG_TOKEN=${ICEBERG_REST_TOKEN:-} "$PYTOOLS_PYTHON" -c "
import os
$READER
t = c.load_table('bronze.clicks').scan().to_arrow()
print(t.num_rows, len(set(t.column('id').to_pylist())))"
}
parquet() { find "$DIR/catalog/warehouse" -name '*.parquet' | wc -l; }
started=$(date +%s.%N)
for ((p = 0; p < PUSHES; p++)); do
  body=$(python3 -c "import json; print(json.dumps([{'id': $p * 20 + i, 'page': '/p'} for i in range(20)]))")
  curl -sf -o /dev/null -H "authorization: Bearer $KEY" "http://127.0.0.1:$API/api/streams/clicks/push" -d "$body"
done
pushed=$(python3 -c "import time; print(round(time.time() - $started, 1))")
for ((w = 0; ; w++)); do
  [ "$(count 2>/dev/null | cut -d' ' -f1)" = "$((PUSHES * 20))" ] && break
  if [ "$w" -ge 1800 ]; then echo "not every row landed in 30 minutes: $(count)" >&2; exit 1; fi
  sleep 1
done
landed=$(python3 -c "import time; print(round(time.time() - $started, 1))")
echo "catalog: $CATALOG; pushes: $PUSHES in ${pushed} s; every row in the table after ${landed} s (a commit a push or batch)"
echo "rows and distinct ids before (pyiceberg): $(count); Parquet files in the folder: $(parquet)"
t0=$(date +%s.%N)
report=$(curl -sf -X POST -H "$AUTH" "http://127.0.0.1:$API/api/streams/clicks/compact")
t1=$(date +%s.%N)
echo "compaction: $(python3 -c "print(round($t1 - $t0, 2))") s: $report"
echo "rows and distinct ids after (pyiceberg): $(count); Parquet files in the folder: $(parquet)"
