# Sourced: installs kinesis-local 0.6.2 (the npm build of kinesis-mock, a Kinesis emulator that
# gets resharding and ChildShards right) once into the cache. Tests start one per test.
KINESIS_LOCAL_VERSION=0.6.2
KINESIS_ROOT="${SLUICE_CACHE:-$HOME/.cache/sluice}/tools/kinesis-local-$KINESIS_LOCAL_VERSION"
export KINESIS_LOCAL_DIR="$KINESIS_ROOT/node_modules/kinesis-local"
if ! command -v node >/dev/null 2>&1; then
  echo "sluice: installing nodejs and npm (Debian packages) for kinesis-local" >&2
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
fi
if [ ! -f "$KINESIS_LOCAL_DIR/main.js" ]; then
  echo "sluice: installing kinesis-local $KINESIS_LOCAL_VERSION (npm)" >&2
  npm install --silent --no-audit --no-fund --prefix "$KINESIS_ROOT" "kinesis-local@$KINESIS_LOCAL_VERSION" >/dev/null
fi
