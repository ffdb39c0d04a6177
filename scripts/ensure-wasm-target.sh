#!/usr/bin/env bash
# Adds the wasm32-unknown-unknown Rust target only when it is missing.
set -euo pipefail
target=wasm32-unknown-unknown
if rustup target list --installed 2>/dev/null | grep -qx "$target"; then
  exit 0
fi
echo "adding the Rust target $target (needed to build the component)" >&2
if ! rustup target add "$target"; then
  echo "error: could not add the Rust target $target with rustup; install it by hand (rustup target add $target) and run make again" >&2
  exit 1
fi
