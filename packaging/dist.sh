#!/usr/bin/env bash
# make dist: the publishable artifacts, built into dist/ from this checkout.
#
#   dist/idempotency-ledger-X.Y.Z.crate        cargo package (carries the component and the WIT)
#   dist/idempotency-ledger-cli-X.Y.Z.crate    cargo package (the operator command)
#   dist/idempotency-ledger-X.Y.Z.tgz          npm pack of bindings/js (generated/ inside)
#   dist/idempotency_ledger-X.Y.Z.tar.gz       the Python sdist (maturin: carries the Rust crates and the component)
#   dist/idempotency_ledger-X.Y.Z-*.whl        the Python wheel, built from the unpacked sdist alone
#
# Expects the component (make component: the Makefile's dist target does it).
# Builds reuse the repository's target/ (CARGO_TARGET_DIR), so only the
# project's own crates are compiled when the suites already built the rest.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DIST=$ROOT/dist
COMPONENT=target/component/idempotency_ledger.wasm
PACKAGED=bindings/rust/component/idempotency_ledger.wasm
# Pinned: the build frontend that makes the sdist and then the wheel from it
# (maturin itself is pinned by bindings/python/pyproject.toml's build-system).
BUILD_VERSION=1.6.1
TOOLS=target/dist-tools
PYTHON=${PYTHON:-python3}
export CARGO_TARGET_DIR=$ROOT/target

step() { printf '\n== dist: %s\n' "$*"; }
fail() { echo "error: dist: $*" >&2; exit 1; }

for f in "$COMPONENT" "$PACKAGED"; do
  test -f "$f" || fail "$f is missing: run 'make component' first"
done
cmp -s "$COMPONENT" "$PACKAGED" || fail "$PACKAGED differs from $COMPONENT: run 'make component'"

step "versions"
$PYTHON packaging/check-versions.py
VERSION=$($PYTHON -c 'import tomllib; print(tomllib.load(open("Cargo.toml", "rb"))["workspace"]["package"]["version"])')

rm -rf "$DIST"
mkdir -p "$DIST"

step "Rust crates (cargo package)"
start=$SECONDS
# --allow-dirty: a working tree with uncommitted changes can be packaged for
# the checks; the .crate records it (.cargo_vcs_info.json "dirty": true).
# --no-verify: cargo's verification builds each crate alone, a feature set
# the suites never compile (wasmtime again, minutes on 2 cores); make
# dist-check builds both libraries from these .crate files in a project
# outside the repository instead, and runs them.
cargo package --locked --allow-dirty --no-verify -p idempotency-ledger -p idempotency-ledger-cli
for crate in idempotency-ledger idempotency-ledger-cli; do
  cp "target/package/$crate-$VERSION.crate" "$DIST/"
done
listing=$(tar tzf "$DIST/idempotency-ledger-$VERSION.crate")
for f in component/idempotency_ledger.wasm wit/world.wit wit/session.wit wit/exchange.wit wit/types.wit wit/ledger.wit LICENSE-MIT LICENSE-APACHE README.md; do
  grep -qx "idempotency-ledger-$VERSION/$f" <<<"$listing" || fail "idempotency-ledger-$VERSION.crate lacks $f"
done
tar xzf "$DIST/idempotency-ledger-$VERSION.crate" -O "idempotency-ledger-$VERSION/component/idempotency_ledger.wasm" | cmp -s - "$COMPONENT" ||
  fail "the component inside idempotency-ledger-$VERSION.crate is not target/component's"
listing=$(tar tzf "$DIST/idempotency-ledger-cli-$VERSION.crate")
for f in LICENSE-MIT LICENSE-APACHE README.md src/main.rs; do
  grep -qx "idempotency-ledger-cli-$VERSION/$f" <<<"$listing" || fail "idempotency-ledger-cli-$VERSION.crate lacks $f"
done
echo "crates: $((SECONDS - start)) s"

step "npm package (make -C bindings/js build, npm pack)"
start=$SECONDS
make --no-print-directory -C bindings/js build
(cd bindings/js && npm pack --silent --pack-destination "$DIST" >/dev/null)
TGZ=$DIST/idempotency-ledger-$VERSION.tgz
test -f "$TGZ" || fail "npm pack made no $TGZ"
listing=$(tar tzf "$TGZ")
for f in package.json README.md LICENSE-MIT LICENSE-APACHE generated/core.core.wasm src/node.js types/node.d.ts migrations/0001_idempotency_keys.sql; do
  grep -qx "package/$f" <<<"$listing" || fail "$(basename "$TGZ") lacks $f"
done
echo "npm: $((SECONDS - start)) s"

step "Python sdist, then the wheel from the unpacked sdist (build==$BUILD_VERSION, maturin per pyproject.toml)"
start=$SECONDS
make --no-print-directory -C bindings/python sqlite-dev
if ! "$TOOLS/bin/python" -c "import build, sys; sys.exit(build.__version__ != '$BUILD_VERSION')" 2>/dev/null; then
  rm -rf "$TOOLS"
  $PYTHON -m venv "$TOOLS"
  "$TOOLS/bin/python" -m pip install --quiet --disable-pip-version-check "build==$BUILD_VERSION"
fi
"$TOOLS/bin/python" -m build --sdist --outdir "$DIST" bindings/python
SDIST=$DIST/idempotency_ledger-$VERSION.tar.gz
test -f "$SDIST" || fail "no $SDIST"
listing=$(tar tzf "$SDIST")
for f in pyproject.toml PKG-INFO Cargo.toml Cargo.lock LICENSE-MIT LICENSE-APACHE \
         bindings/python/Cargo.toml bindings/python/src/lib.rs \
         bindings/rust/Cargo.toml bindings/rust/build.rs bindings/rust/src/lib.rs bindings/rust/component/idempotency_ledger.wasm \
         bindings/rust/wit/session.wit bindings/rust/wit/exchange.wit src/idempotency_ledger/__init__.py src/idempotency_ledger/py.typed; do
  grep -qx "idempotency_ledger-$VERSION/$f" <<<"$listing" || fail "$(basename "$SDIST") lacks $f"
done
tar xzf "$SDIST" -O "idempotency_ledger-$VERSION/bindings/rust/component/idempotency_ledger.wasm" | cmp -s - "$COMPONENT" ||
  fail "the component inside the sdist is not target/component's"
metadata=$(tar xzf "$SDIST" -O "idempotency_ledger-$VERSION/PKG-INFO")
for field in "License-Expression: MIT OR Apache-2.0" "License-File: LICENSE-MIT" "License-File: LICENSE-APACHE" "Keywords: " "Project-URL: Repository, " "Classifier: " "Summary: "; do
  grep -q "^$field" <<<"$metadata" || fail "the sdist's PKG-INFO has no '$field'"
done
# The wheel from the unpacked sdist alone (in an isolated environment with
# the pinned maturin): nothing of the checkout but what the sdist carries.
# --touch: the sdist's entries have one fixed old mtime, which would let
# cargo take an earlier build of the same relative paths in target/ for
# fresh; with the current time the crates in it are compiled from it.
UNPACKED=$(mktemp -d "${TMPDIR:-/tmp}/idempotency-ledger-sdist.XXXXXX")
trap 'rm -rf "$UNPACKED"' EXIT
tar xzf "$SDIST" --touch -C "$UNPACKED"
"$TOOLS/bin/python" -m build --wheel --outdir "$DIST" "$UNPACKED/idempotency_ledger-$VERSION"
WHEEL=$(ls "$DIST"/idempotency_ledger-"$VERSION"-*.whl)
listing=$($PYTHON -c 'import sys, zipfile; print("\n".join(zipfile.ZipFile(sys.argv[1]).namelist()))' "$WHEEL")
for f in idempotency_ledger/_native.abi3.so idempotency_ledger/py.typed idempotency_ledger/__init__.py \
         "idempotency_ledger-$VERSION.dist-info/licenses/LICENSE-MIT" "idempotency_ledger-$VERSION.dist-info/licenses/LICENSE-APACHE"; do
  grep -qx "$f" <<<"$listing" || fail "$(basename "$WHEEL") lacks $f"
done
echo "python: $((SECONDS - start)) s"

step "dist/"
(cd "$DIST" && ls -l)
