#!/usr/bin/env bash
# ClickHouse destination benchmark: 1M generated events from a tansu topic (and over HTTP push)
# delivered by Sluice into a table of a throwaway ClickHouse (Debian's 18.16; exactly once
# through its position table), against ClickHouse's own bulk load of the same rows from a file
# (`clickhouse-client … INSERT … FORMAT JSONEachRow` < the rows Sluice wrote, exported).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
source scripts/services/tansu.sh
source scripts/services/clickhouse.sh
cargo build --release --locked -p sluice --quiet
dir=$(mktemp -d /tmp/sluice-bench-ch.XXXXXX)
chmod 755 "$dir"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
kport=$(free_port); http=$(free_port); tcp=$(free_port)
(cd "$dir" && exec "$TANSU_BIN" broker --listener-url "tcp://127.0.0.1:$kport" \
  --advertised-listener-url "tcp://127.0.0.1:$kport" --storage-engine memory://tansu/ --silent) &
broker=$!
mkdir -p "$dir/ch/data" "$dir/ch/log"
sed -e "s#/var/lib/clickhouse/#$dir/ch/data/#g" -e "s#/var/log/clickhouse-server/#$dir/ch/log/#g" \
    -e "s#<http_port>8123</http_port>#<http_port>$http</http_port>#" \
    -e "s#<tcp_port>9000</tcp_port>#<tcp_port>$tcp</tcp_port>#" \
    -e "s#<interserver_http_port>9009</interserver_http_port>##" -e "s#<listen_host>::1</listen_host>##" \
    /etc/clickhouse-server/config.xml > "$dir/ch/config.xml"
cp /etc/clickhouse-server/users.xml "$dir/ch/users.xml"
if [ "$(id -u)" = 0 ]; then chown -R clickhouse:clickhouse "$dir/ch"; as=(setpriv --reuid=clickhouse --regid=clickhouse --init-groups); else as=(); fi
"${as[@]}" "$CLICKHOUSE_SERVER_BIN" --config-file="$dir/ch/config.xml" >/dev/null 2>&1 &
server=$!
trap 'kill $server $broker 2>/dev/null; wait $server $broker 2>/dev/null; rm -rf "$dir"' EXIT
ch() { clickhouse-client --host 127.0.0.1 --port "$tcp" "$@"; }
for _ in $(seq 1 120); do ch --query "SELECT 1" >/dev/null 2>&1 && break; sleep 0.5; done
for _ in $(seq 1 60); do
  timeout 2 "$TANSU_BIN" topic list --broker "tcp://127.0.0.1:$kport" >/dev/null 2>&1 && break
  sleep 0.5
done
# ClickHouse's own load of the rows of table $1 (exported as JSONEachRow) into an empty copy.
bulk_baseline() {
  local table=$1 columns
  columns=$(ch --query "SELECT arrayStringConcat(groupArray(concat('\`', name, '\`')), ', ') FROM system.columns WHERE database = 'default' AND table = '$table' AND name != '_sluice_unit'")
  ch --query "SELECT $columns FROM $table FORMAT JSONEachRow" > "$dir/rows.json"
  ch --query "DROP TABLE IF EXISTS copy_baseline"
  ch --query "CREATE TABLE copy_baseline AS $table"
  local start end rows
  start=$(date +%s.%N)
  ch --query "INSERT INTO copy_baseline FORMAT JSONEachRow" < "$dir/rows.json"
  end=$(date +%s.%N)
  rows=$(ch --query "SELECT count() FROM copy_baseline")
  echo "| ClickHouse's own load of the same $rows rows (clickhouse-client, JSONEachRow file, $(du -m "$dir/rows.json" | cut -f1) MB) | $(python3 -c "print(f'{$rows / ($end - $start):.0f}')") | $(python3 -c "print(f'{$end - $start:.1f}')") |"
}
target() { echo "{\"kind\": \"clickhouse\", \"url\": \"http://127.0.0.1:$http\", \"database\": \"default\"}"; }
events=1000000
if [ "${1:-}" = "--events" ]; then events=$2; fi
echo "== Kafka (tansu, memory storage) -> ClickHouse ($events events)"
"$CARGO_TARGET_DIR/release/sluice" bench-kafka --brokers "127.0.0.1:$kport" --events "$events" --destination "$(target)"
bulk_baseline bench
echo "== HTTP push -> ClickHouse ($events events, 4 clients, 1000 per push)"
ch --query "DROP TABLE bench"
ch --query "DROP TABLE sluice_positions"
"$CARGO_TARGET_DIR/release/sluice" bench --events "$events" --seconds 5 --destination "$(target)"
bulk_baseline bench
