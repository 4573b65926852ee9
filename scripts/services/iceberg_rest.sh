# Sourced: installs lakana-server 0.20.0 (PyPI; a FastAPI server whose routes include an Iceberg
# REST catalog, keeping its metadata in PostgreSQL) once into its own venv in the cache (about
# 20 s and 407 MB), and exports LAKANA_BIN, the server executable. Tests start one per test with
# scripts/iceberg-rest-up.sh <dir> <port>, which also starts the throwaway PostgreSQL it needs
# (scripts/services/postgres.sh installs that); that script's header says how clients attach.
LAKANA_VERSION=0.20.0
LAKANA_VENV="${SLUICE_CACHE:-$HOME/.cache/sluice}/tools/lakana-server-$LAKANA_VERSION"
export LAKANA_BIN="$LAKANA_VENV/bin/lakana-server"
# Its Python, with lakana's packages (and pyiceberg 0.12.0, pyarrow): iceberg-rest-up.sh starts the
# server through it.
export LAKANA_PYTHON="$LAKANA_VENV/bin/python"
if ! "$LAKANA_VENV/bin/python" -c "import lakana_server, pg8000" >/dev/null 2>&1 || [ ! -x "$LAKANA_BIN" ]; then
  echo "sluice: installing lakana-server $LAKANA_VERSION (PyPI; about 20 s, 407 MB)" >&2
  if ! python3 -m venv "$LAKANA_VENV" >/dev/null 2>&1; then
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
    python3 -m venv "$LAKANA_VENV"
  fi
  "$LAKANA_VENV/bin/pip" install -q "lakana-server==$LAKANA_VERSION"
fi
