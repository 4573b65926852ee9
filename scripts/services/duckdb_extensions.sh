# Sourced: DuckDB's ducklake, sqlite_scanner, postgres_scanner, httpfs, iceberg, avro and delta
# extensions (delta: tests read Delta tables with it) for the
# DuckDB version Sluice links, from their PyPI wheels (DuckDB's own extension server is not
# reachable here), laid out as DuckDB's extension_directory wants: <dir>/v<version>/linux_amd64/.
# Sluice's DuckLake destination loads them from SLUICE_DUCKDB_EXTENSIONS; nothing is downloaded
# at run time.
export SLUICE_DUCKDB_EXTENSIONS="${SLUICE_CACHE:-$HOME/.cache/sluice}/duckdb-extensions"
_ext_dir="$SLUICE_DUCKDB_EXTENSIONS/v$DUCKDB_VERSION/linux_amd64"
_ext_names="ducklake sqlite_scanner postgres_scanner httpfs iceberg avro delta"
_ext_missing=""
for _e in $_ext_names; do [ -f "$_ext_dir/$_e.duckdb_extension" ] || _ext_missing=1; done
if [ -n "$_ext_missing" ]; then
  echo "sluice: fetching DuckDB $DUCKDB_VERSION extensions ($_ext_names) from PyPI" >&2
  _ext_tmp=$(mktemp -d)
  _ext_wheels=""
  for _e in $_ext_names; do _ext_wheels="$_ext_wheels duckdb-extension-${_e//_/-}==$DUCKDB_VERSION"; done
  # shellcheck disable=SC2086
  python3 -m pip download -q --no-deps --dest "$_ext_tmp" $_ext_wheels
  mkdir -p "$_ext_dir"
  for _w in "$_ext_tmp"/*.whl; do
    python3 -c 'import sys, zipfile, os
z = zipfile.ZipFile(sys.argv[1])
for n in z.namelist():
    if n.endswith(".duckdb_extension"):
        open(os.path.join(sys.argv[2], os.path.basename(n)), "wb").write(z.read(n))' "$_w" "$_ext_dir"
  done
  rm -rf "$_ext_tmp"
fi
unset _ext_dir _ext_names _ext_missing _e _ext_tmp _ext_wheels _w
