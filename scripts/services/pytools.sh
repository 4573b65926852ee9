# Sourced: one Python venv in the cache with moto 5.2.5 (an S3 server; 5.2.1 answers multipart
# uploads wrongly) and the independent readers tests use to check files Sluice wrote
# (duckdb and pyarrow).
PYTOOLS_VENV="${SLUICE_CACHE:-$HOME/.cache/sluice}/tools/pytools-1"
export PYTOOLS_PYTHON="$PYTOOLS_VENV/bin/python"
export MOTO_SERVER="$PYTOOLS_VENV/bin/moto_server"
# duckdb is pinned to the version Sluice links, so it loads the same extensions (DuckLake).
if ! "$PYTOOLS_PYTHON" -c "import moto, duckdb, pyarrow; assert duckdb.__version__ == '1.5.5'" >/dev/null 2>&1; then
  echo "sluice: installing moto 5.2.5, duckdb and pyarrow (PyPI)" >&2
  if ! python3 -m venv "$PYTOOLS_VENV" >/dev/null 2>&1; then
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
    python3 -m venv "$PYTOOLS_VENV"
  fi
  "$PYTOOLS_VENV/bin/pip" install -q "moto[server]==5.2.5" "duckdb==1.5.5" "pyarrow==26.0.0"
fi
# azure-storage-blob, the reader tests use to check blobs Sluice wrote to Azurite (its own check,
# so adding it never reinstalls the rest).
if ! "$PYTOOLS_PYTHON" -c "import azure.storage.blob" >/dev/null 2>&1; then
  echo "sluice: installing azure-storage-blob 12.31.1 (PyPI)" >&2
  "$PYTOOLS_VENV/bin/pip" install -q "azure-storage-blob==12.31.1"
fi
# pyiceberg, the reader tests use to check Iceberg tables Sluice wrote through a REST catalog
# (its own check, so adding it never reinstalls the rest).
if ! "$PYTOOLS_PYTHON" -c "import pyiceberg" >/dev/null 2>&1; then
  echo "sluice: installing pyiceberg 0.12.0 (PyPI)" >&2
  "$PYTOOLS_VENV/bin/pip" install -q "pyiceberg==0.12.0"
fi
# SQLAlchemy and psycopg2, which pyiceberg's SqlCatalog reads an Iceberg SQL catalog through (a
# SQLite file or Postgres), in tests of tables Sluice wrote there (their own check).
if ! "$PYTOOLS_PYTHON" -c "import sqlalchemy, psycopg2" >/dev/null 2>&1; then
  echo "sluice: installing SQLAlchemy 2.0.44 and psycopg2-binary 2.9.11 (PyPI)" >&2
  "$PYTOOLS_VENV/bin/pip" install -q "sqlalchemy==2.0.44" "psycopg2-binary==2.9.11"
fi
# deltalake (delta-rs's Python package), the reader tests use to check Delta tables Sluice wrote
# (its own check, so adding it never reinstalls the rest).
if ! "$PYTOOLS_PYTHON" -c "import deltalake" >/dev/null 2>&1; then
  echo "sluice: installing deltalake 1.6.6 (PyPI)" >&2
  "$PYTOOLS_VENV/bin/pip" install -q "deltalake==1.6.6"
fi
