# Sourced by the Postgres benches: a throwaway PostgreSQL 15 (wal_level=logical, fsync off) on a
# free 127.0.0.1 port, with the `etl` user (LOGIN REPLICATION) owning `etltest` and a 1M-row
# `accounts` table; a free port for the Sluice API; cleanup on exit (also stops $SLUICE_PID).
# Sets PGPORT, API, DIR, ADMIN, PSQL, and the helpers now and calc.
source scripts/services/postgres.sh
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
PGPORT=$(free_port); API=$(free_port)
DIR=$(mktemp -d /tmp/sluice-bench-pg.XXXXXX); chmod 755 "$DIR"
echo postgres > "$DIR/pw"; chown -R postgres:postgres "$DIR"
runuser -u postgres -- "$PG_BIN/initdb" -D "$DIR/data" -U postgres --pwfile="$DIR/pw" --auth-local=trust \
  --auth-host=scram-sha-256 -E UTF8 --locale=C --no-sync >/dev/null
printf "listen_addresses = '127.0.0.1'\nport = $PGPORT\nunix_socket_directories = '$DIR'\nwal_level = logical\nfsync = off\nfull_page_writes = off\nmax_wal_size = 4GB\n" >> "$DIR/data/postgresql.conf"
runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$DIR/data" -l "$DIR/log" -w start >/dev/null
SLUICE_PID=""
cleanup() {
  [ -n "$SLUICE_PID" ] && kill "$SLUICE_PID" 2>/dev/null && wait "$SLUICE_PID" 2>/dev/null || true
  runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$DIR/data" -m immediate stop >/dev/null 2>&1 || true
  rm -rf "$DIR"
}
trap cleanup EXIT
ADMIN="$PG_BIN/psql -h $DIR -p $PGPORT -U postgres -qAt -v ON_ERROR_STOP=1"
$ADMIN -c "CREATE ROLE etl WITH LOGIN REPLICATION PASSWORD 'etl'" -c "CREATE DATABASE etltest OWNER etl"
export PGPASSWORD=etl
PSQL="$PG_BIN/psql -h 127.0.0.1 -p $PGPORT -U etl -d etltest -qAt -v ON_ERROR_STOP=1"
$PSQL -c "CREATE TABLE accounts (id int PRIMARY KEY, owner text, balance numeric(12,2), opened timestamptz, active boolean)" \
  -c "INSERT INTO accounts SELECT g, 'owner-' || g, (g % 100000) / 100.0, now() - (g || ' minutes')::interval, g % 3 <> 0 FROM generate_series(1, $ROWS) g" \
  -c "VACUUM ANALYZE accounts"
now() { date +%s.%N; }
calc() { python3 -c "print($1)"; }
