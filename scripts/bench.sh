#!/usr/bin/env bash
# make bench: every host's measurements side by side, written to bench/RESULTS.md.
set -euo pipefail
cd "$(dirname "$0")/.."
out=bench/RESULTS.md
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
started=$(date +%s)
cargo build --locked --release -p idempotency-ledger-bench
# Rust and Python compare PostgreSQL with SQLite on a throwaway local server.
# The RESULTS.md this run replaces: its figures are printed beside the new ones.
cp "$out" "$tmp/previous.md" 2>/dev/null || : > "$tmp/previous.md"
./scripts/postgres.sh run -- ./target/release/idempotency-ledger-bench "$tmp/rust.md" "$tmp/previous.md"
# The JS bench compares the pg ledger with a bare INSERT on the same throwaway server.
if [ -f bindings/js/Makefile ]; then
  ./scripts/postgres.sh run -- make -s --no-print-directory -C bindings/js bench | tee "$tmp/js.md"
fi
if [ -f bindings/python/Makefile ]; then
  ./scripts/postgres.sh run -- make -s --no-print-directory -C bindings/python bench | tee "$tmp/python.md"
fi
{
  echo "# Benchmark results"
  echo
  echo "Produced by \`make bench\` on $(date -u +%Y-%m-%d) in $(( $(date +%s) - started )) s."
  echo "Machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(free -g | awk '/Mem:/ {print $2}') GiB;"
  pg_bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
  echo "PostgreSQL $("$pg_bin/postgres" --version | awk '{print $3}') on loopback (scripts/postgres.sh);"
  echo "rustc $(rustc --version | cut -d' ' -f2), node $(node --version 2>/dev/null || echo absent), $(python3 --version 2>&1)."
  echo "Timings are medians (with p99) over repeated runs after warm-up, both sides measured in the same process."
  echo
  cat "$tmp/rust.md"
  for part in js python; do
    if [ -s "$tmp/$part.md" ]; then echo; cat "$tmp/$part.md"; fi
  done
} > "$out"
echo "wrote $out"
