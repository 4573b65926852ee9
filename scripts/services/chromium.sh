# Sourced: makes sure Debian's Chromium and its WebDriver (chromedriver) are installed, for the
# browser tests of the page (tests/page_browser.rs drives chromedriver over the W3C WebDriver
# protocol). Nothing is downloaded by the tests themselves.
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  echo "sluice: installing chromium and chromium-driver (Debian packages)" >&2
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium chromium-driver fonts-dejavu-core >/dev/null
fi
export SLUICE_CHROMEDRIVER="$(command -v chromedriver)"
export SLUICE_CHROMIUM="$(command -v chromium)"
