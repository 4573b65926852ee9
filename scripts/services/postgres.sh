# Sourced: makes sure PostgreSQL 15 server binaries are installed (Debian packages). Tests start
# their own throwaway cluster with wal_level=logical on a free 127.0.0.1 port.
export PG_BIN=/usr/lib/postgresql/15/bin
if [ ! -x "$PG_BIN/initdb" ]; then
  echo "sluice: installing PostgreSQL 15 (Debian packages)" >&2
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql-15 postgresql-client-15 >/dev/null
fi
# openssl: the TLS test makes a throwaway CA and server certificate.
if ! command -v openssl >/dev/null 2>&1; then
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openssl >/dev/null
fi
