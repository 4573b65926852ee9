#!/usr/bin/env bash
# Postgres → Postgres benchmark: two throwaway PostgreSQL 15 clusters on 127.0.0.1 (fsync on): the
# source (wal_level=logical) with database `src` holding a table of --rows rows (default 5M; bigint
# key, text, int, numeric and timestamptz columns, about 100 bytes a row), and the target with
# `dst2` for the baseline and `dst` for Sluice. Two clusters, so the WAL the slot decodes holds
# the source's changes only, not the target's writes.
# 1. baseline: `pg_dump -t items src | psql dst2` (the table, its rows, then its primary key);
# 2. a Sluice stream (source: postgres, destination: postgres `dst`), timed from its creation
#    until `dst` holds every row;
# 3. --rows/10 UPDATEs at the source in 5 transactions, timed from the first commit until `dst`
#    reflects all of them; the source's own time is printed beside it.
# The CPU seconds of both clusters and of Sluice are printed for each run.
# --keyed-target: `dst.items` is made first from the source's DDL (`pg_dump -s`: its primary key,
# its int column), as a user who wants the key in the copy does; by default Sluice creates it.
# --keyless: the source table has no primary key (REPLICA IDENTITY FULL), which the snapshot reads
# in heap order; only the snapshot is timed (a destination mirror needs a key for the changes).
# SLUICE_BIN=path runs that binary instead of building the release one (to compare two builds);
# CHUNK=n sets the source's snapshot_chunk_rows (default 200000).
# Usage: bash scripts/bench-pg-to-pg.sh [--rows N] [--keyed-target | --keyless]
set -euo pipefail
cd "$(dirname "$0")/.."
ROWS=5000000
KEYED=""
KEYLESS=""
while [ $# -gt 0 ]; do
  case $1 in
    --rows) ROWS=$2; shift 2 ;;
    --keyed-target) KEYED=1; shift ;;
    --keyless) KEYLESS=1; shift ;;
    *) echo "usage: $0 [--rows N] [--keyed-target | --keyless]" >&2; exit 2 ;;
  esac
done
TXS=5
UPDATES=$((ROWS / 10))
source scripts/env.sh
source scripts/services/postgres.sh
if [ -z "${SLUICE_BIN:-}" ]; then
  cargo build --release --locked -p sluice --quiet
  SLUICE_BIN=$CARGO_TARGET_DIR/release/sluice
fi

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
now() { date +%s.%N; }
calc() { python3 -c "print($1)"; }
API=$(free_port)
DIR=$(mktemp -d /tmp/sluice-bench-pg2pg.XXXXXX); chmod 755 "$DIR"
SLUICE_PID=""
cleanup() {
  if [ -n "$SLUICE_PID" ]; then kill "$SLUICE_PID" 2>/dev/null; wait "$SLUICE_PID" 2>/dev/null; fi
  for c in source target; do
    if [ -f "$DIR/$c/postmaster.pid" ]; then
      runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$DIR/$c" -m immediate stop >/dev/null 2>&1 || true
    fi
  done
  rm -rf "$DIR"
}
trap cleanup EXIT
echo postgres > "$DIR/pw"; chown -R postgres:postgres "$DIR"
# cluster NAME PORT WAL_LEVEL DB...: a cluster in $DIR/NAME with the `etl` user (LOGIN
# REPLICATION, password etl) owning the databases.
cluster() {
  local name=$1 port=$2 wal=$3; shift 3
  runuser -u postgres -- "$PG_BIN/initdb" -D "$DIR/$name" -U postgres --pwfile="$DIR/pw" --auth-local=trust \
    --auth-host=scram-sha-256 -E UTF8 --locale=C --no-sync >/dev/null
  printf "%s\n" "listen_addresses = '127.0.0.1'" "port = $port" "unix_socket_directories = '$DIR'" \
    "wal_level = $wal" "shared_buffers = 1GB" "max_wal_size = 8GB" "checkpoint_timeout = 30min" \
    "log_line_prefix = '%m [%p] %d '" "${PG_EXTRA_CONF:-}" >> "$DIR/$name/postgresql.conf"
  runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$DIR/$name" -l "$DIR/$name.log" -w start >/dev/null
  "$PG_BIN/psql" -h "$DIR" -p "$port" -U postgres -qAt -v ON_ERROR_STOP=1 \
    -c "CREATE ROLE etl WITH LOGIN REPLICATION PASSWORD 'etl'"
  for db in "$@"; do
    "$PG_BIN/psql" -h "$DIR" -p "$port" -U postgres -qAt -v ON_ERROR_STOP=1 -c "CREATE DATABASE $db OWNER etl"
  done
}
SRC_PORT=$(free_port); DST_PORT=$(free_port)
cluster source "$SRC_PORT" logical src
cluster target "$DST_PORT" replica dst dst2
export PGPASSWORD=etl
sql() {
  local db=$1 port=$DST_PORT; shift
  if [ "$db" = src ]; then port=$SRC_PORT; fi
  "$PG_BIN/psql" -h 127.0.0.1 -p "$port" -U etl -d "$db" -qAt -v ON_ERROR_STOP=1 "$@"
}
checkpoint() { for p in "$SRC_PORT" "$DST_PORT"; do "$PG_BIN/psql" -h "$DIR" -p "$p" -U postgres -qAt -c CHECKPOINT; done; }
dump() { "$PG_BIN/pg_dump" -h 127.0.0.1 -p "$SRC_PORT" -U etl -t items "$@" src; }
# CPU seconds (user + system) of both clusters (each postmaster, the children it reaped, the live
# ones) and of the Sluice process.
TICKS=$(getconf CLK_TCK)
pg_cpu() {
  local t=0 main p
  for c in source target; do
    main=$(head -1 "$DIR/$c/postmaster.pid")
    t=$((t + $(awk '{print $14 + $15 + $16 + $17}' "/proc/$main/stat")))
    for p in $(pgrep -P "$main"); do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null || echo 0))); done
  done
  calc "$t / $TICKS"
}
sluice_cpu() { awk -v t="$TICKS" '{print ($14 + $15) / t}' "/proc/$SLUICE_PID/stat"; }

echo "== $ROWS rows in src.items"
t0=$(now)
sql src -c "CREATE TABLE items (id bigint PRIMARY KEY, sku text NOT NULL, name text, qty int NOT NULL,
  price numeric(12,2), status text, created_at timestamptz NOT NULL, updated_at timestamptz)" \
  -c "INSERT INTO items SELECT g, 'SKU-' || lpad(g::text, 9, '0'), 'item ' || md5(g::text)::varchar(16), (g % 1000)::int,
        (g % 100000) / 100.0, (ARRAY['new', 'paid', 'shipped', 'delivered'])[1 + g % 4],
        timestamptz '2026-01-01 00:00:00+00' + g * interval '1 second', NULL
      FROM generate_series(1, $ROWS) g" \
  -c "VACUUM ANALYZE items"
if [ -n "$KEYLESS" ]; then
  sql src -c "ALTER TABLE items DROP CONSTRAINT items_pkey" -c "ALTER TABLE items REPLICA IDENTITY FULL"
fi
checkpoint
echo "   made in $(calc "round($(now) - $t0, 1)") s; $(sql src -c "SELECT pg_size_pretty(pg_table_size('items')) || ' heap, ' ||
  (pg_table_size('items') / $ROWS) || ' bytes/row on disk, ' || (SELECT avg(pg_column_size(i.*))::int FROM (SELECT * FROM items LIMIT 100000) i) || ' bytes/row as tuples'")"

echo "== baseline: pg_dump -t items src | psql dst2"
t0=$(now)
dump > /dev/null
t1=$(now)
dump_only_secs=$(calc "$t1 - $t0")
checkpoint
cpu0=$(pg_cpu); t0=$(now)
dump | sql dst2 >/dev/null
t1=$(now); sleep 0.5; cpu1=$(pg_cpu) # once the ended backends are reaped, their CPU counts
dump_secs=$(calc "$t1 - $t0"); dump_cpu=$(calc "$cpu1 - $cpu0")
[ "$(sql dst2 -c "SELECT count(*) FROM items")" = "$ROWS" ] || { echo "baseline: wrong row count"; exit 1; }

echo "== Sluice: stream src.items -> dst.items${KEYED:+ (made first from the source DDL)}"
if [ -n "$KEYED" ]; then dump -s | sql dst >/dev/null; fi
checkpoint
RUST_LOG=${SLUICE_LOG:-info} "$SLUICE_BIN" serve --data-dir "$DIR/sluice" --listen "127.0.0.1:$API" \
  >/dev/null 2>"$DIR/sluice.log" &
SLUICE_PID=$!
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$API/health" >/dev/null && break; sleep 0.1; done
# Every /api route but push needs a token: the first start wrote the admin's into the data dir.
AUTH="authorization: Bearer $(cat "$DIR/sluice/admin.token")"
# curl and sed only while a run is timed: a Python per poll would take CPU from the run.
metric() { curl -s -H "$AUTH" "http://127.0.0.1:$API/api/streams/pg/metrics" | sed -n "s/.*\"$1\":\([0-9.]*\).*/\1/p"; }
# A stream that fails restarts from its position: noted (its time is in the figures), and the
# run stops only when it stays down for 60 s.
touch "$DIR/restarts"
down_since=""
alive() {
  local body s
  body=$(curl -s -H "$AUTH" "http://127.0.0.1:$API/api/streams/pg/metrics")
  s=$(echo "$body" | sed -n 's/.*"state":"\([a-z]*\)".*/\1/p')
  if [ "$s" = failed ] || [ "$s" = retrying ] || [ "$s" = reconnecting ]; then
    if [ -z "$down_since" ]; then
      down_since=$(date +%s)
      echo "$body" | sed -n 's/.*"last_error":"\(.\{0,200\}\).*/\1/p' >> "$DIR/restarts"
    elif [ $(($(date +%s) - down_since)) -gt 60 ]; then
      echo "stream down for 60 s: $body"; sed 's/\x1b\[[0-9;]*m//g' "$DIR/sluice.log" | tail -20; exit 1
    fi
  else
    down_since=""
  fi
}
cpu0=$(pg_cpu); scpu0=$(sluice_cpu); t0=$(now)
curl -sf -H "$AUTH" "http://127.0.0.1:$API/api/streams" -H 'content-type: application/json' -d "{\"name\": \"pg\", \"table\": \"items\",
  \"source\": {\"type\": \"postgres\", \"host\": \"127.0.0.1\", \"port\": $SRC_PORT, \"database\": \"src\", \"user\": \"etl\",
               \"password\": \"etl\", \"tables\": [\"public.items\"]${CHUNK:+, \"snapshot_chunk_rows\": $CHUNK}},
  \"destination\": {\"kind\": \"postgres\", \"host\": \"127.0.0.1\", \"port\": $DST_PORT, \"database\": \"dst\", \"user\": \"etl\",
                    \"password\": \"etl\", \"schema\": \"public\"}}" >/dev/null
# rows_written moves once a batch is committed in dst (it is counted after the destination's
# commit); the row count of dst is checked once it says all rows are there.
until [ "$(metric rows_written || echo 0)" -ge "$ROWS" ] 2>/dev/null; do alive; sleep 0.05; done
# For a keyless table, also wait for the count itself, and name the rows missing if it stays short
# (once the last chunk went to the ledger: the key added at the copy's end failed on a NULL).
if [ -n "$KEYLESS" ]; then
  waited=0
  until [ "$(sql dst -c "SELECT count(*) FROM items")" = "$ROWS" ]; do
    alive; sleep 0.2; waited=$((waited + 1))
    if [ $waited -gt 300 ]; then
      echo "dst holds $(sql dst -c "SELECT count(*) || ' rows, ' || count(DISTINCT id) || ' distinct ids' FROM items") 60 s after rows_written said $ROWS"
      sql dst -c "SELECT min(g), max(g), count(*) FROM (SELECT g, g - row_number() OVER (ORDER BY g) AS run
        FROM generate_series(1, $ROWS) g WHERE NOT EXISTS (SELECT 1 FROM items WHERE id = g)) m GROUP BY run ORDER BY 1 LIMIT 20"
      sed 's/\x1b\[[0-9;]*m//g' "$DIR/sluice.log" | grep -v DEBUG | tail -20
      exit 1
    fi
  done
fi
t1=$(now); cpu1=$(pg_cpu); scpu1=$(sluice_cpu)
snap_secs=$(calc "$t1 - $t0"); snap_pg_cpu=$(calc "$cpu1 - $cpu0"); snap_sluice_cpu=$(calc "$scpu1 - $scpu0")
got=$(sql dst -c "SELECT count(*) FROM items"); [ "$got" = "$ROWS" ] || { echo "snapshot: $got rows in dst, not $ROWS"; exit 1; }
dst_indexes=$(sql dst -c "SELECT coalesce(string_agg(indexdef, '; '), 'none') FROM pg_indexes WHERE tablename = 'items'")
snap_written=$(metric rows_written)
if [ -n "$KEYLESS" ]; then
  echo
  echo "rows: $ROWS in a table without a key (REPLICA IDENTITY FULL); snapshot only"
  echo
  echo "| run | rows/s | seconds | PG CPU s | Sluice CPU s |"
  echo "|---|---|---|---|---|"
  printf "| pg_dump -t items src \\| psql dst2 (the baseline) | %.0f | %.1f | %.1f | |\n" "$(calc "$ROWS / $dump_secs")" "$dump_secs" "$dump_cpu"
  printf "| Sluice snapshot (stream created → all rows in dst) | %.0f | %.1f | %.1f | %.1f |\n" "$(calc "$ROWS / $snap_secs")" "$snap_secs" "$snap_pg_cpu" "$snap_sluice_cpu"
  printf "\nsnapshot / pg_dump|psql: %.2f×\n" "$(calc "$dump_secs / $snap_secs")"
  exit 0
fi

echo "== $UPDATES updates at the source in $TXS transactions"
# Let the stream settle (the snapshot's end, autovacuum of the new table) before timing.
sleep 2
written0=$(metric rows_written)
want=$(sql src -c "SELECT sum(qty) + $UPDATES FROM items")
per_tx=$((ROWS / TXS))
script=""
for i in $(seq 0 $((TXS - 1))); do
  script+="UPDATE items SET qty = qty + 1, updated_at = now() WHERE id % 10 = 0 AND id > $((i * per_tx)) AND id <= $(((i + 1) * per_tx));
SELECT extract(epoch FROM clock_timestamp());
"
done
cpu0=$(pg_cpu); scpu0=$(sluice_cpu); t0=$(now)
(echo "$script" | sql src > "$DIR/commits") &
writer=$!
max_lag=0
while true; do
  lag=$(metric slot_lag_bytes); lag=${lag%.*}
  if [ -n "$lag" ] && [ "$lag" -gt "$max_lag" ]; then max_lag=$lag; fi
  if ! kill -0 $writer 2>/dev/null && [ "$(metric rows_written)" -ge $((written0 + UPDATES)) ] 2>/dev/null; then
    [ "$(sql dst -c "SELECT sum(qty) FROM items")" = "$want" ] && break
  fi
  alive
  sleep 0.05
done
t1=$(now); cpu1=$(pg_cpu); scpu1=$(sluice_cpu)
wait $writer
first_commit=$(head -1 "$DIR/commits"); last_commit=$(tail -1 "$DIR/commits")
src_secs=$(calc "$last_commit - $t0")
apply_secs=$(calc "$t1 - $first_commit")
apply_all_secs=$(calc "$t1 - $t0")
apply_pg_cpu=$(calc "$cpu1 - $cpu0"); apply_sluice_cpu=$(calc "$scpu1 - $scpu0")
check="SELECT count(*), sum(qty), sum(price), sum(extract(epoch FROM updated_at))::bigint, md5(string_agg(sku || name, '' ORDER BY id)) FROM items"
[ "$(sql src -c "$check")" = "$(sql dst -c "$check")" ] || { echo "dst does not equal src"; exit 1; }

echo
echo "rows: $ROWS; updates: $UPDATES in $TXS transactions; two PostgreSQL 15 clusters on this machine (src; dst and dst2), fsync on"
echo "dst.items ${KEYED:+made first from the source DDL; }indexes: $dst_indexes"
echo
echo "| run | rows or changes/s | seconds | PG CPU s | Sluice CPU s |"
echo "|---|---|---|---|---|"
printf "| pg_dump -t items src > /dev/null (reading alone) | %.0f | %.1f | | |\n" "$(calc "$ROWS / $dump_only_secs")" "$dump_only_secs"
printf "| pg_dump -t items src \\| psql dst2 (the baseline) | %.0f | %.1f | %.1f | |\n" "$(calc "$ROWS / $dump_secs")" "$dump_secs" "$dump_cpu"
printf "| Sluice snapshot (stream created → all rows in dst) | %.0f | %.1f | %.1f | %.1f |\n" "$(calc "$ROWS / $snap_secs")" "$snap_secs" "$snap_pg_cpu" "$snap_sluice_cpu"
printf "| source: %d UPDATEs in %d transactions (start → last commit) | %.0f | %.1f | | |\n" "$UPDATES" "$TXS" "$(calc "$UPDATES / $src_secs")" "$src_secs"
printf "| Sluice apply (first commit → dst matches) | %.0f | %.1f | %.1f | %.1f |\n" "$(calc "$UPDATES / $apply_secs")" "$apply_secs" "$apply_pg_cpu" "$apply_sluice_cpu"
echo
printf "snapshot / pg_dump|psql: %.2f× (goal ≥ 1.0×)\n" "$(calc "$dump_secs / $snap_secs")"
printf "apply: %.0f changes/s from the first commit (goal ≥ 50,000); %.0f/s from the first UPDATE's start\n" \
  "$(calc "$UPDATES / $apply_secs")" "$(calc "$UPDATES / $apply_all_secs")"
echo "largest slot lag sampled during the updates: $max_lag bytes; rows_written after the snapshot: $snap_written"
if [ -s "$DIR/restarts" ]; then echo "the stream restarted (included in the times above) after:"; sed 's/^/  /' "$DIR/restarts"; fi
# SLUICE_LOG="info,sluice_core::pipeline=debug" keeps the server's log (per-batch decode_ms and
# write_ms) in /tmp/bench-pg-to-pg-sluice.log, and the clusters' in /tmp/bench-pg-to-pg-pg.log
# (PG_EXTRA_CONF="log_min_duration_statement = 0" logs every statement with its duration).
if [ -n "${SLUICE_LOG:-}" ]; then
  cp "$DIR/sluice.log" /tmp/bench-pg-to-pg-sluice.log
  cat "$DIR/source.log" "$DIR/target.log" > /tmp/bench-pg-to-pg-pg.log
fi
