#!/usr/bin/env bash
# Starts a throwaway Iceberg REST catalog for one test: lakana-server (scripts/services/
# iceberg_rest.sh) on 127.0.0.1:<port>, with its metadata in a throwaway PostgreSQL 15 that
# listens on a Unix socket in <dir>/pg only (no TCP port), and one environment (the catalog's
# warehouse, the REST `{prefix}`) whose files are local under <dir>/warehouse.
#
#   bash scripts/iceberg-rest-up.sh <dir> <port>
#
# On success prints these lines on stdout and exits 0 (the servers keep running, detached from
# its stdout/stderr):
#   ICEBERG_REST_URI=http://127.0.0.1:<port>   the endpoint (clients append /v1/...)
#   ICEBERG_REST_WAREHOUSE=sluice              the environment: the REST prefix
#   ICEBERG_REST_TOKEN=lakana_pat_..._...      bearer token of the bootstrap admin
#   ICEBERG_REST_WAREHOUSE_ROOT=file://<dir>/warehouse
# and writes <dir>/pids: lakana's PID, then PostgreSQL's postmaster PID. `kill $(cat <dir>/pids)`
# stops both (SIGTERM: lakana exits, then PostgreSQL's smart shutdown ends once lakana's
# connections are gone). Logs: <dir>/lakana.log, <dir>/pg.log. On failure it prints the logs'
# tails on stderr, stops whatever it started and exits non-zero.
#
# What lakana 0.20.0 asks of a client:
# - tables only under the namespaces bronze, silver or gold (made with the environment), or
#   namespaces nested in them (bronze.x);
# - the environment as the REST prefix: GET /v1/config?warehouse=<env> answers it (see the
#   launcher below), so pyiceberg with warehouse=<env> and DuckDB's ATTACH '<env>' find it;
# - DuckDB (1.5.5, iceberg extension): no POST /v1/{prefix}/transactions/commit and no staged
#   create, and a new table's follow-up metadata commit is refused, so
#     CREATE SECRET s (TYPE iceberg, TOKEN '<ICEBERG_REST_TOKEN>');
#     ATTACH '<ICEBERG_REST_WAREHOUSE>' AS cat (TYPE iceberg, SECRET s, ENDPOINT '<ICEBERG_REST_URI>',
#       DISABLE_MULTI_TABLE_COMMIT true, STAGE_CREATE_TABLES false,
#       SKIP_CREATE_TABLE_METADATA_UPDATES true);
#   (files are local, so no storage secret; DuckDB needs its httpfs, avro and iceberg extensions).
set -euo pipefail

dir=${1:?usage: iceberg-rest-up.sh <dir> <port>}
port=${2:?usage: iceberg-rest-up.sh <dir> <port>}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=services/postgres.sh
source "$here/services/postgres.sh" >&2
# shellcheck source=services/iceberg_rest.sh
source "$here/services/iceberg_rest.sh" >&2

warehouse=sluice
key_id=sluicetest
secret=sluice-iceberg-rest-secret
token="lakana_pat_${key_id}_${secret}"

mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
pgdir="$dir/pg"
sock="$pgdir/.s.PGSQL.5432"
if [ ${#sock} -gt 100 ]; then
  echo "iceberg-rest-up: $dir is too long a path for PostgreSQL's Unix socket" >&2
  exit 2
fi
mkdir -p "$pgdir" "$dir/warehouse"
if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
  echo "iceberg-rest-up: something already listens on 127.0.0.1:$port" >&2
  exit 2
fi

lakana_pid=""
started_pg=""
cleanup() {
  local rc=$?
  set +e
  if [ $rc -ne 0 ]; then
    echo "iceberg-rest-up: failed; lakana.log and pg.log end with:" >&2
    tail -n 30 "$dir/lakana.log" >&2 2>/dev/null
    tail -n 10 "$dir/pg.log" >&2 2>/dev/null
    if [ -n "$lakana_pid" ]; then kill "$lakana_pid" 2>/dev/null; wait "$lakana_pid" 2>/dev/null; fi
    if [ -n "$started_pg" ]; then as_pg "$PG_BIN/pg_ctl" -D "$pgdir/data" -m immediate -w stop >/dev/null 2>&1; fi
    rm -f "$dir/pids"
  fi
  return $rc
}
trap cleanup EXIT
trap "exit 143" TERM INT HUP

# PostgreSQL refuses to run as root: as the postgres user when we are root, else as ourselves.
if [ "$(id -u)" = 0 ]; then
  as_pg() { runuser -u postgres -- "$@"; }
  chmod o+x "$dir"
  chown -R postgres:postgres "$pgdir"
else
  as_pg() { "$@"; }
fi

as_pg "$PG_BIN/initdb" -D "$pgdir/data" -U postgres --auth-local=trust --auth-host=reject \
  -E UTF8 --locale=C --no-sync >/dev/null
cat >>"$pgdir/data/postgresql.conf" <<EOF
listen_addresses = ''
port = 5432
unix_socket_directories = '$pgdir'
fsync = off
full_page_writes = off
synchronous_commit = off
EOF
as_pg "$PG_BIN/pg_ctl" -D "$pgdir/data" -l "$pgdir/log" -w -t 60 start >/dev/null
started_pg=1
ln -sf "$pgdir/log" "$dir/pg.log"
pg_pid=$(head -n 1 "$pgdir/data/postmaster.pid")
"$PG_BIN/psql" -h "$pgdir" -U postgres -d postgres -qAt -v ON_ERROR_STOP=1 -c "CREATE DATABASE lakana" >/dev/null

export LAKANA_DATABASE__URL="postgresql+pg8000://postgres@/lakana?unix_sock=$sock"
export LAKANA_HOST=127.0.0.1 LAKANA_PORT="$port"
export LAKANA_BOOTSTRAP_PAT_KEY_ID="$key_id" LAKANA_BOOTSTRAP_PAT_SECRET="$secret"
export LAKANA_LOG__LEVEL=WARNING
"$LAKANA_BIN" migrate >"$dir/lakana.log" 2>&1
# lakana-server's own start-up (lakana_server.__main__.main), with one addition: lakana's
# GET /v1/config names no prefix and its catalog routes all need one (/v1/{environment}/...),
# while DuckDB's iceberg extension takes the prefix only from /v1/config. So GET /v1/config with
# ?warehouse=<environment> answers overrides.prefix=<environment>; every other request, and
# /v1/config without a warehouse, goes to lakana unchanged. Detached from our stdout/stderr, so
# a caller reading them to the end is not held.
"$LAKANA_PYTHON" -c '
import json, urllib.parse
import uvicorn
from lakana_core.log_setup import configure_logging
from lakana_server.app import create_app
from lakana_server.log_config import uvicorn_log_config
from lakana_server.settings import Settings

settings = Settings()
configure_logging(settings.log.level)
lakana = create_app(settings)

async def app(scope, receive, send):
    if scope["type"] == "http" and scope["method"] == "GET" and scope["path"] == "/v1/config":
        query = urllib.parse.parse_qs(scope.get("query_string", b"").decode())
        warehouse = (query.get("warehouse") or [""])[0]
        if warehouse:
            body = json.dumps({"defaults": {}, "overrides": {"prefix": warehouse}}).encode()
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
    await lakana(scope, receive, send)

uvicorn.run(app, host=settings.host, port=settings.port, log_level=settings.log.level.lower(),
            log_config=uvicorn_log_config(), access_log=settings.log.access)
' </dev/null >>"$dir/lakana.log" 2>&1 &
lakana_pid=$!

for _ in $(seq 1 300); do
  if curl -fsS -o /dev/null "http://127.0.0.1:$port/healthz" 2>/dev/null; then break; fi
  kill -0 "$lakana_pid" 2>/dev/null || { echo "iceberg-rest-up: lakana-server exited" >&2; exit 1; }
  sleep 0.1
done
curl -fsS -o /dev/null "http://127.0.0.1:$port/healthz"

# The warehouse's files: a local folder, or with ICEBERG_REST_S3_ROOT=s3://bucket/prefix and
# ICEBERG_REST_S3_ENDPOINT=http://host:port a bucket of an S3 server (moto; key test/test).
root="file://$dir/warehouse"
storage="{\"scheme\": \"file\", \"root\": \"$root\"}"
if [ -n "${ICEBERG_REST_S3_ROOT:-}" ]; then
  root=$ICEBERG_REST_S3_ROOT
  storage="{\"scheme\": \"s3\", \"root\": \"$root\", \"options\": {\"s3.endpoint\": \"$ICEBERG_REST_S3_ENDPOINT\",
    \"s3.access-key-id\": \"test\", \"s3.secret-access-key\": \"test\", \"s3.region\": \"us-east-1\",
    \"s3.path-style-access\": \"true\"}}"
fi
curl -fsS -o /dev/null -X POST "http://127.0.0.1:$port/api/v1/environments" \
  -H "Authorization: Bearer $token" -H 'Content-Type: application/json' \
  -d "{\"name\": \"$warehouse\", \"storage\": $storage}"

# Still ours answering (not another server that took the port first)?
kill -0 "$lakana_pid"
printf '%s\n%s\n' "$lakana_pid" "$pg_pid" >"$dir/pids"
echo "ICEBERG_REST_URI=http://127.0.0.1:$port"
echo "ICEBERG_REST_WAREHOUSE=$warehouse"
echo "ICEBERG_REST_TOKEN=$token"
echo "ICEBERG_REST_WAREHOUSE_ROOT=$root"
