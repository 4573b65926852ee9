#!/usr/bin/env bash
# Snowflake destination benchmark on fakesnow (the drivers' protocol over DuckDB): 1M generated
# events from a tansu topic loaded by a staged Sluice stream (Parquet put into SLUICE_STAGE,
# COPY INTO every second, exactly once with the position), against fakesnow's own bulk load of
# the same rows: the Python connector's PUT of one Parquet file and COPY INTO an empty copy.
# Both measure the emulator; real Snowflake would differ.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
source scripts/services/tansu.sh
source scripts/services/snowflake.sh
cargo build --release --locked -p sluice --quiet
dir=$(mktemp -d /tmp/sluice-bench-snow.XXXXXX)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
kport=$(free_port); sport=$(free_port)
(cd "$dir" && exec "$TANSU_BIN" broker --listener-url "tcp://127.0.0.1:$kport" \
  --advertised-listener-url "tcp://127.0.0.1:$kport" --storage-engine memory://tansu/ --silent) &
broker=$!
"$FAKESNOW_BIN" -s -p "$sport" > "$dir/fakesnow.log" 2>&1 &
snow=$!
trap 'kill $snow $broker 2>/dev/null; wait $snow $broker 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 1 120); do python3 -c "import socket; socket.create_connection(('127.0.0.1', $sport), 1)" 2>/dev/null && break; sleep 0.5; done
for _ in $(seq 1 60); do
  timeout 2 "$TANSU_BIN" topic list --broker "tcp://127.0.0.1:$kport" >/dev/null 2>&1 && break
  sleep 0.5
done
events=1000000
if [ "${1:-}" = "--events" ]; then events=$2; fi
target="{\"kind\": \"snowflake\", \"url\": \"http://127.0.0.1:$sport\", \"account\": \"test\", \"user\": \"etl\", \"password\": \"etl\", \"database\": \"SLUICE\", \"schema\": \"PUBLIC\"}"
echo "== Kafka (tansu, memory storage) -> Snowflake on fakesnow, staged ($events events)"
"$CARGO_TARGET_DIR/release/sluice" bench-kafka --brokers "127.0.0.1:$kport" --events "$events" \
  --destination "$target" --stage '{"every_ms": 1000}'
# fakesnow's own bulk load of the rows Sluice wrote: exported to one Parquet file, then PUT and
# COPY INTO an empty table of the same columns, timed.
"$SNOW_PYTHON" - "$sport" "$dir" <<'PY'
import sys, time, pyarrow as pa, pyarrow.parquet as pq, snowflake.connector
port, folder = int(sys.argv[1]), sys.argv[2]
c = snowflake.connector.connect(user='etl', password='etl', account='test', host='127.0.0.1', port=port,
                                protocol='http', database='SLUICE', schema='PUBLIC')
cur = c.cursor()
rows = cur.execute('SELECT * FROM "bench"').fetchall()
names = [d[0] for d in cur.description]
table = pa.table({n: [r[i] for r in rows] for i, n in enumerate(names)})
path = f"{folder}/rows.parquet"
pq.write_table(table, path)
cur.execute('CREATE OR REPLACE TABLE "copy_baseline" LIKE "bench"')
cur.execute("CREATE STAGE IF NOT EXISTS BASELINE")
start = time.time()
cur.execute(f"PUT file://{path} @BASELINE AUTO_COMPRESS=FALSE")
cur.execute('COPY INTO "copy_baseline" FROM @BASELINE FILE_FORMAT=(TYPE=PARQUET) MATCH_BY_COLUMN_NAME=CASE_INSENSITIVE')
took = time.time() - start
rows = cur.execute('SELECT count(*) FROM "copy_baseline"').fetchone()[0]
print(f"| fakesnow's own load of the same {rows} rows (Python connector: PUT of one Parquet file, COPY INTO) | {rows / took:.0f} | {took:.1f} |")
PY
