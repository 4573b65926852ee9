# Sourced: makes sure the ClickHouse server and client are installed (Debian's 18.16, the only
# ClickHouse a registry here delivers). Tests start their own throwaway server on free
# 127.0.0.1 ports (tests/clickhouse.rs).
if ! command -v clickhouse-server >/dev/null 2>&1 || ! command -v clickhouse-client >/dev/null 2>&1; then
  echo "sluice: installing ClickHouse (Debian packages)" >&2
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends clickhouse-server clickhouse-client >/dev/null
fi
export CLICKHOUSE_SERVER_BIN="$(command -v clickhouse-server)"
