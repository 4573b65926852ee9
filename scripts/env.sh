# Sourced by every project script: one cargo target dir outside the clone, the prebuilt
# DuckDB library, and the tools the build needs. Idempotent and quiet when all is in place.
SLUICE_CACHE="${SLUICE_CACHE:-$HOME/.cache/sluice}"
DUCKDB_VERSION=1.5.5
DUCKDB_NPM="@duckdb/node-bindings-linux-x64@${DUCKDB_VERSION}-r.5"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$SLUICE_CACHE/target}"
export DUCKDB_LIB_DIR="$SLUICE_CACHE/duckdb-$DUCKDB_VERSION/package"
export LD_LIBRARY_PATH="$DUCKDB_LIB_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
mkdir -p "$SLUICE_CACHE"

# lld keeps link times short (.cargo/config.toml asks for it).
if ! command -v ld.lld >/dev/null 2>&1; then
  echo "sluice: installing lld (Debian package)" >&2
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends lld >/dev/null
fi

# DuckDB's official prebuilt libduckdb.so, carried by an npm package; the duckdb crate links it
# instead of compiling DuckDB from C++ (30+ minutes on 2 cores).
if [ ! -f "$DUCKDB_LIB_DIR/libduckdb.so" ]; then
  echo "sluice: fetching prebuilt libduckdb $DUCKDB_VERSION" >&2
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent "$DUCKDB_NPM" >/dev/null && tar xzf ./*.tgz)
  mkdir -p "$(dirname "$DUCKDB_LIB_DIR")"
  rm -rf "$DUCKDB_LIB_DIR" && mv "$tmp/package" "$DUCKDB_LIB_DIR" && rm -rf "$tmp"
fi
