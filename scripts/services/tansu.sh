# Sourced: builds tansu 0.6.0 (a Kafka-compatible broker) once into the cache and reuses it.
# Built with dynostore,libsql: without a storage feature tansu silently discards every record.
TANSU_VERSION=0.6.0
TANSU_ROOT="${SLUICE_CACHE:-$HOME/.cache/sluice}/tools/tansu-$TANSU_VERSION"
export TANSU_BIN="$TANSU_ROOT/bin/tansu"
if [ ! -x "$TANSU_BIN" ]; then
  echo "sluice: building tansu $TANSU_VERSION (once; 12-27 minutes on 2 cores)" >&2
  # Its own target dir, so the project's builds never wait on it and it is not rebuilt.
  CARGO_TARGET_DIR="$TANSU_ROOT/build" RUSTFLAGS="" cargo install tansu --version "=$TANSU_VERSION" --locked \
    --features dynostore,libsql --root "$TANSU_ROOT" --quiet
  rm -rf "$TANSU_ROOT/build"
fi
