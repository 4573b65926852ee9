# Sourced: makes sure MariaDB server binaries are installed (Debian packages; Debian 12 has no
# MySQL server). Tests start their own throwaway server on a free 127.0.0.1 port.
if ! command -v mariadbd >/dev/null 2>&1 || ! command -v mariadb-install-db >/dev/null 2>&1; then
  echo "sluice: installing MariaDB (Debian packages)" >&2
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mariadb-server mariadb-client >/dev/null
fi
export MARIADBD_BIN="$(command -v mariadbd)"
