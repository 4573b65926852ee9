#!/usr/bin/env bash
# The 10-minute soak of the hardening issue: four pushers, a kill -9 every minute, PATCHes and
# bad events mixed in (the test command runs the same test for 45 s with a kill every 15 s).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
SLUICE_SOAK_SECONDS="${SLUICE_SOAK_SECONDS:-600}" SLUICE_SOAK_KILL_EVERY="${SLUICE_SOAK_KILL_EVERY:-60}" \
  cargo test -p sluice --test main --locked -- --exact soak::soak_pushers_kills_patches_and_bad_events_lose_nothing --nocapture
