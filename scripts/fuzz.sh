#!/usr/bin/env bash
# A longer fuzz run than the test command's property tests: libFuzzer (cargo-fuzz, nightly) on
# one target for a while, starting from the seed corpus kept in the crates. New inputs go to
# fuzz/corpus/<target> (not committed); a crash is saved in fuzz/artifacts/<target>. Once the
# bug is fixed, copy the crashing input into the seed corpus so every `cargo test` replays it.
#   scripts/fuzz.sh body|decoder|copy|pgoutput [seconds, default 600] [more libFuzzer flags]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
target="${1:?target: body, decoder, copy or pgoutput}"
seconds="${2:-600}"
shift $(( $# < 2 ? $# : 2 ))
case "$target" in
  pgoutput) seeds="crates/connectors/tests/fuzz_corpus/pgoutput" ;;
  body|decoder|copy) seeds="crates/core/tests/fuzz_corpus/$target" ;;
  *) echo "unknown target $target" >&2; exit 2 ;;
esac
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
mkdir -p "fuzz/corpus/$target"
cd fuzz
exec cargo +nightly fuzz run "$target" "corpus/$target" "../$seeds" -- -max_total_time="$seconds" "$@"
