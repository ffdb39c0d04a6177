#!/usr/bin/env bash
# Runs every fuzz target for SECONDS each (default 30) with cargo fuzz on the
# nightly toolchain, growing the committed corpus in fuzz/corpus/<target>.
# FUZZ_TARGETS="a b" runs only those (two such runs side by side use two cores).
set -euo pipefail
seconds=${1:-30}
cd "$(dirname "$0")/../fuzz"
if ! rustup toolchain list | grep -q '^nightly'; then
  echo "error: cargo fuzz needs a nightly toolchain (rustup toolchain install nightly)" >&2; exit 1
fi
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
for target in ${FUZZ_TARGETS:-$(cargo +nightly fuzz list)}; do
  mkdir -p "corpus/$target"
  echo "== $target: ${seconds}s"
  cargo +nightly fuzz run "$target" "corpus/$target" -- -max_total_time="$seconds" -max_len=4096 -print_final_stats=1 2>&1 \
    | grep -E "^(#[0-9]+.*DONE|Done|stat::number_of_executed_units|stat::peak_rss|==[0-9]+==|SUMMARY|thread .* panicked)" || true
done
