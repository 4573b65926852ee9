# Sourced: installs Azurite 3.35.0 (Microsoft's Azure Storage emulator, npm) once into the cache
# and exports AZURITE_BLOB_MAIN, the Blob service's entry point. Tests start one per test on a
# free 127.0.0.1 port, always with --disableTelemetry (without it Azurite calls out to an
# Application Insights host on the internet).
AZURITE_VERSION=3.35.0
AZURITE_ROOT="${SLUICE_CACHE:-$HOME/.cache/sluice}/tools/azurite-$AZURITE_VERSION"
export AZURITE_BLOB_MAIN="$AZURITE_ROOT/node_modules/azurite/dist/src/blob/main.js"
if ! command -v node >/dev/null 2>&1; then
  echo "sluice: installing nodejs and npm (Debian packages) for Azurite" >&2
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
fi
if [ ! -f "$AZURITE_BLOB_MAIN" ]; then
  echo "sluice: installing Azurite $AZURITE_VERSION (npm)" >&2
  npm install --silent --no-audit --no-fund --prefix "$AZURITE_ROOT" "azurite@$AZURITE_VERSION" >/dev/null
fi
