# Sourced: fakesnow 0.12.1 in server mode (PyPI), which speaks the REST protocol of Snowflake's
# own drivers over DuckDB, and snowflake-connector-python (<5: 5.x breaks fakesnow 0.12.1 at
# import) as the independent reader tests check with. Its own venv: fakesnow pins a DuckDB
# other than the one Sluice links. Tests start their own server on a free 127.0.0.1 port.
SNOW_VENV="${SLUICE_CACHE:-$HOME/.cache/sluice}/tools/snow-1"
export FAKESNOW_BIN="$SNOW_VENV/bin/fakesnow"
export SNOW_PYTHON="$SNOW_VENV/bin/python"
if ! "$SNOW_PYTHON" -c "import fakesnow, snowflake.connector" >/dev/null 2>&1; then
  echo "sluice: installing fakesnow 0.12.1 and snowflake-connector-python<5 (PyPI)" >&2
  python3 -m venv "$SNOW_VENV"
  "$SNOW_VENV/bin/pip" install -q "fakesnow[server]==0.12.1" "snowflake-connector-python<5"
fi
