#!/usr/bin/env bash
# Stream-destination benchmark: 1M generated events pushed over HTTP and in a tansu topic,
# delivered by Sluice into a table of a throwaway PostgreSQL 15 (exactly once: position committed
# with the rows), one transaction per unit and then staged (bulk loads every 500 ms), against
# PostgreSQL's own COPY of the same rows (exported from that table, loaded into an empty copy).
# Usage: bench-destination.sh [--events N] [--only push|kafka|push-staged|kafka-staged]...
# tansu runs on its memory storage (its SQLite storage serves about 32k messages/s); `sluice
# bench-kafka` sets fetch.wait.max.ms=10 for both its consumers (see its --property).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
source scripts/services/tansu.sh
source scripts/services/postgres.sh
cargo build --release --locked -p sluice --quiet
dir=$(mktemp -d /tmp/sluice-bench-dest.XXXXXX)
chmod 755 "$dir"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
kport=$(free_port)
pport=$(free_port)
bin=/usr/lib/postgresql/15/bin
(cd "$dir" && exec "$TANSU_BIN" broker --listener-url "tcp://127.0.0.1:$kport" \
  --advertised-listener-url "tcp://127.0.0.1:$kport" --storage-engine memory://tansu/ --silent) &
broker=$!
mkdir "$dir/pg" && chown postgres:postgres "$dir/pg"
runuser -u postgres -- "$bin/initdb" -D "$dir/pg/data" -U postgres --auth=trust -E UTF8 --locale=C --no-sync >/dev/null
printf "listen_addresses = '127.0.0.1'\nport = %s\nunix_socket_directories = '%s'\nfsync = on\n" "$pport" "$dir/pg" \
  >> "$dir/pg/data/postgresql.conf"
runuser -u postgres -- "$bin/pg_ctl" -D "$dir/pg/data" -l "$dir/pg/log" -w start >/dev/null
trap 'runuser -u postgres -- "$bin/pg_ctl" -D "$dir/pg/data" -m immediate stop >/dev/null 2>&1; kill $broker 2>/dev/null; wait $broker 2>/dev/null; rm -rf "$dir"' EXIT
psql() { "$bin/psql" -h 127.0.0.1 -p "$pport" -U postgres -d postgres -qAt -v ON_ERROR_STOP=1 "$@"; }
for _ in $(seq 1 60); do
  timeout 2 "$TANSU_BIN" topic list --broker "tcp://127.0.0.1:$kport" >/dev/null 2>&1 && break
  sleep 0.5
done
# COPY of the rows of `bench` in database $1, into an empty table of the same shape: rows/s.
copy_baseline() {
  local db=$1
  "$bin/psql" -h 127.0.0.1 -p "$pport" -U postgres -d "$db" -qAt -v ON_ERROR_STOP=1 -c "\\copy bench TO '$dir/rows-$db.txt'"
  "$bin/psql" -h 127.0.0.1 -p "$pport" -U postgres -d "$db" -qAt -v ON_ERROR_STOP=1 -c "CREATE TABLE copy_baseline (LIKE bench)"
  local start end
  start=$(date +%s.%N)
  "$bin/psql" -h 127.0.0.1 -p "$pport" -U postgres -d "$db" -qAt -v ON_ERROR_STOP=1 -c "\\copy copy_baseline FROM '$dir/rows-$db.txt'"
  end=$(date +%s.%N)
  local rows
  rows=$("$bin/psql" -h 127.0.0.1 -p "$pport" -U postgres -d "$db" -qAt -c "SELECT count(*) FROM copy_baseline")
  echo "| PostgreSQL COPY of the same $rows rows (psql \\copy, text, into an empty table) | $(python3 -c "print(f'{$rows / ($end - $start):.0f}')") | $(python3 -c "print(f'{$end - $start:.1f}')") |"
}
target() { echo "{\"kind\": \"postgres\", \"host\": \"127.0.0.1\", \"port\": $pport, \"database\": \"$1\", \"user\": \"postgres\", \"schema\": \"public\"}"; }

events=1000000
only=""
while [ $# -gt 0 ]; do
  case "$1" in
    --events) events=$2; shift 2 ;;
    --only) only="$only $2"; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
wanted() { [ -z "$only" ] || [[ " $only " == *" $1 "* ]]; }
if wanted push; then
echo "== HTTP push -> PostgreSQL ($events events, 4 clients, 1000 per push)"
psql -c "CREATE DATABASE pushbench"
"$CARGO_TARGET_DIR/release/sluice" bench --events "$events" --seconds 5 --destination "$(target pushbench)"
copy_baseline pushbench
fi
if wanted kafka; then
echo "== Kafka (tansu) -> PostgreSQL ($events events)"
psql -c "CREATE DATABASE kafkabench"
"$CARGO_TARGET_DIR/release/sluice" bench-kafka --brokers "127.0.0.1:$kport" --events "$events" \
  --destination "$(target kafkabench)"
copy_baseline kafkabench
fi
if wanted push-staged; then
echo "== HTTP push -> PostgreSQL, staged (stage every 500 ms; $events events)"
psql -c "CREATE DATABASE pushstaged"
"$CARGO_TARGET_DIR/release/sluice" bench --events "$events" --seconds 5 --destination "$(target pushstaged)" \
  --stage '{"every_ms": 500}'
copy_baseline pushstaged
fi
if wanted kafka-staged; then
echo "== Kafka (tansu) -> PostgreSQL, staged (stage every 500 ms; $events events)"
psql -c "CREATE DATABASE kafkastaged"
"$CARGO_TARGET_DIR/release/sluice" bench-kafka --brokers "127.0.0.1:$kport" --events "$events" \
  --destination "$(target kafkastaged)" --stage '{"every_ms": 500}'
copy_baseline kafkastaged
fi
