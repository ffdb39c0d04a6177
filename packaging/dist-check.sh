#!/usr/bin/env bash
# make dist-check: installs each artifact of dist/ into a fresh project in a
# temporary directory OUTSIDE the repository and runs the README's first
# example through the public API only (packaging/smoke/):
#
#   rust     a new cargo project: a path dependency on the unpacked
#            idempotency-ledger .crate; Ledger::open + handle twice
#            (executed, then replayed)
#   cli      the unpacked idempotency-ledger-cli .crate built beside it
#            ([patch.crates-io] for the library): schema, inspect, show
#   node     a new npm project: npm install of the tarball and better-sqlite3
#            (the lockfile's version); the node:http example over SQLite
#   wheel    a fresh venv: pip install dist/*.whl; the plain-Python example
#   sdist    a fresh venv: pip install dist/*.tar.gz (built by pip through
#            the pinned maturin); the plain-Python example
#   no-wasm  the sdist without the component must refuse to build
#
# Cargo builds use the repository's target/ (CARGO_TARGET_DIR), so only this
# project's crates are compiled: the dependencies the suites built are
# reused (the smoke project mirrors the workspace's dev profile overrides).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DIST=$ROOT/dist
PYTHON=${PYTHON:-python3}
export CARGO_TARGET_DIR=$ROOT/target
VERSION=$($PYTHON -c 'import tomllib; print(tomllib.load(open("Cargo.toml", "rb"))["workspace"]["package"]["version"])')
WORK=$(mktemp -d "${TMPDIR:-/tmp}/idempotency-ledger-dist-check.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
case "$WORK" in "$ROOT"/*) echo "error: the temporary directory $WORK is inside the repository" >&2; exit 1 ;; esac

SUMMARY=()
step() { printf '\n== dist-check: %s\n' "$*"; STEP_START=$SECONDS; }
done_step() { SUMMARY+=("$(printf '%-8s %4d s  %s' "$1" $((SECONDS - STEP_START)) "$2")"); }
fail() { echo "error: dist-check: $*" >&2; exit 1; }

for f in "idempotency-ledger-cli-$VERSION.crate" "idempotency-ledger-$VERSION.crate" "idempotency-ledger-$VERSION.tgz" "idempotency_ledger-$VERSION.tar.gz"; do
  test -f "$DIST/$f" || fail "dist/$f is missing: run 'make dist'"
done
WHEELS=("$DIST"/idempotency_ledger-"$VERSION"-*.whl)
test -f "${WHEELS[0]}" || fail "dist/ has no wheel: run 'make dist'"

step "versions move together"
$PYTHON packaging/check-versions.py
# The check must fail on drift: a copy of the versioned files with one bumped.
mkdir -p "$WORK/versions"
(git ls-files -z wit Cargo.toml CHANGELOG.md Makefile '*/Cargo.toml' bindings/js/package.json bindings/js/package-lock.json bindings/python/pyproject.toml |
  xargs -0 tar cf - | tar xf - -C "$WORK/versions")
sed -i 's/^version = "\([^"]*\)"/version = "\1-drift"/' "$WORK/versions/bindings/python/pyproject.toml"
if $PYTHON packaging/check-versions.py --root "$WORK/versions" >"$WORK/versions.out" 2>&1; then
  cat "$WORK/versions.out"; fail "check-versions.py accepted a pyproject.toml whose version differs"
fi
grep -q "versions do not move together" "$WORK/versions.out" || { cat "$WORK/versions.out"; fail "check-versions.py failed without saying why"; }
echo "a pyproject.toml version of $VERSION-drift is refused: $(grep -m1 'versions differ' "$WORK/versions.out" | sed 's/^ *- //')"
done_step versions "check-versions.py: $VERSION everywhere; a drifted copy is refused"

step "Rust: a cargo project depending on the unpacked .crate files"
mkdir -p "$WORK/rust/crates" "$WORK/rust/src"
for crate in idempotency-ledger idempotency-ledger-cli; do
  # --touch: the sources get the current time (the .crate's fixed mtimes
  # would let cargo take an older build of the same paths for fresh).
  tar xzf "$DIST/$crate-$VERSION.crate" --touch -C "$WORK/rust/crates"
done
{
  cat <<EOF
[package]
name = "idempotency-ledger-dist-check"
version = "0.0.0"
edition = "2021"
publish = false

# The command's crate builds beside the smoke project, on the unpacked library.
[workspace]
members = [".", "crates/idempotency-ledger-cli-$VERSION"]

[dependencies]
idempotency-ledger = { path = "crates/idempotency-ledger-$VERSION" }
# Declared as the repository's host-test declares it: then cargo builds
# wasmtime's proc-macro dependencies (serde_json's own dependencies shared
# with a normal serde_json) as the same units as make test-postgres does, and
# wasmtime itself is reused, not compiled again.
serde_json = { version = "1", default-features = false, features = ["alloc", "std"] }

# The command depends on idempotency-ledger from crates.io: the unpacked one stands in.
[patch.crates-io]
idempotency-ledger = { path = "crates/idempotency-ledger-$VERSION" }

EOF
  # The repository workspace's dev profile (debug info, cranelift optimised), so
  # the dependencies it compiled are the same units and are reused.
  $PYTHON - <<'EOF'
import tomllib
import json
def toml_value(value):
    return str(value).lower() if isinstance(value, bool) else json.dumps(value)
dev = tomllib.load(open("Cargo.toml", "rb")).get("profile", {}).get("dev", {})
print("[profile.dev]")
for key, value in dev.items():
    if key != "package":
        print(f"{key} = {toml_value(value)}")
for name, settings in dev.get("package", {}).items():
    print(f"[profile.dev.package.{json.dumps(name)}]")
    for key, value in settings.items():
        print(f"{key} = {toml_value(value)}")
EOF
} >"$WORK/rust/Cargo.toml"
cp packaging/smoke/rust/main.rs "$WORK/rust/src/main.rs"
# The repository's lockfile: the same dependency versions as its builds.
cp Cargo.lock "$WORK/rust/Cargo.lock"
build_start=$SECONDS
(cd "$WORK/rust" && cargo build --quiet --workspace --message-format=json-render-diagnostics) >"$WORK/rust/build.json" 2>"$WORK/rust/build.err" ||
  { cat "$WORK/rust/build.err"; fail "the cargo project outside the repository did not build"; }
build_seconds=$((SECONDS - build_start))
read -r fresh compiled compiled_names < <($PYTHON - "$WORK/rust/build.json" <<'EOF'
import json, sys
fresh, built = 0, []
for line in open(sys.argv[1]):
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact":
        if m["fresh"]:
            fresh += 1
        else:
            built.append(m["target"]["name"])
print(fresh, len(built), ",".join(built) or "-")
EOF
)
echo "cargo build: ${build_seconds} s; ${fresh} units reused from target/, ${compiled} compiled: ${compiled_names}"
reuse_note=""
case ",$compiled_names," in
  *,wasmtime,*)
    reuse_note=" WARNING: wasmtime compiled again"
    echo "warning: wasmtime was compiled again: the build make test-postgres made of it was not reused (run the suites first; or the dependencies' features or the dev profile changed)" >&2 ;;
esac
"$CARGO_TARGET_DIR/debug/idempotency-ledger-dist-check" "$WORK/rust/ledger.sqlite"
done_step rust "cargo build ${build_seconds} s (${fresh} units reused, compiled: ${compiled_names}); Ledger::open + handle twice: executed, replayed$reuse_note"

step "Rust: the operator command from its .crate, on the ledger the smoke project wrote"
CLI="$CARGO_TARGET_DIR/debug/idempotency-ledger"
"$CLI" schema --dialect postgres | grep -q "CREATE TABLE IF NOT EXISTS idempotency_keys" || fail "idempotency-ledger schema printed no migration"
"$CLI" inspect --database "$WORK/rust/ledger.sqlite" --json | $PYTHON -c 'import json, sys; rows = json.load(sys.stdin); print("inspect:", json.dumps(rows)[:200])'
set +e
"$CLI" show no-such-key --principal nobody --database "$WORK/rust/ledger.sqlite" >/dev/null 2>&1
code=$?
set -e
test "$code" = 1 || fail "idempotency-ledger show of a missing key exited $code, not 1"
done_step cli "built from idempotency-ledger-cli-$VERSION.crate; schema, inspect --json, show (exit 1 for a missing key)"

step "JavaScript: an npm project installing the tarball"
BETTER_SQLITE3=$(node -p 'require("./bindings/js/package-lock.json").packages["node_modules/better-sqlite3"].version')
mkdir -p "$WORK/node"
cp packaging/smoke/node/smoke.mjs "$WORK/node/"
(cd "$WORK/node" && cat >package.json <<EOF
{ "name": "idempotency-ledger-dist-check", "version": "0.0.0", "private": true, "type": "module" }
EOF
)
# better-sqlite3 is a native addon: with its install script it would be
# compiled again (no prebuilt binaries are reachable here), so the scripts
# are skipped and the addon the repository's npm ci built for this Node
# (the same version, checked) is copied in. Our package has no install script.
(cd "$WORK/node" && npm install --no-audit --no-fund --ignore-scripts --loglevel=error \
  "$DIST/idempotency-ledger-$VERSION.tgz" "better-sqlite3@$BETTER_SQLITE3")
REPO_ADDON=bindings/js/node_modules/better-sqlite3
test "$(node -p "require('./$REPO_ADDON/package.json').version")" = "$BETTER_SQLITE3" ||
  fail "$REPO_ADDON is not better-sqlite3 $BETTER_SQLITE3: run make -C bindings/js install"
test -f "$REPO_ADDON/build/Release/better_sqlite3.node" || fail "$REPO_ADDON has no compiled addon: run make -C bindings/js install"
mkdir -p "$WORK/node/node_modules/better-sqlite3/build/Release"
cp "$REPO_ADDON/build/Release/better_sqlite3.node" "$WORK/node/node_modules/better-sqlite3/build/Release/"
installed=$(node -p 'require("'"$WORK"'/node/node_modules/@idempotency/ledger/package.json").version')
test "$installed" = "$VERSION" || fail "installed @idempotency/ledger $installed, expected $VERSION"
(cd "$WORK/node" && node smoke.mjs "$WORK/node/ledger.sqlite")
done_step node "npm install of the tarball + better-sqlite3 $BETTER_SQLITE3; node:http: 201, replayed 201, handler ran once, 401 without principal"

step "Python: a fresh venv installing the wheel"
$PYTHON -m venv "$WORK/venv-wheel"
"$WORK/venv-wheel/bin/python" -m pip install --quiet --disable-pip-version-check "${WHEELS[0]}"
(cd "$WORK" && "$WORK/venv-wheel/bin/python" "$ROOT/packaging/smoke/python/smoke.py")
done_step wheel "pip install $(basename "${WHEELS[0]}"); the README's plain example: executed, replayed"

step "Python: a fresh venv building from the sdist (pip, maturin per pyproject.toml)"
$PYTHON -m venv "$WORK/venv-sdist"
"$WORK/venv-sdist/bin/python" -m pip install --quiet --disable-pip-version-check "$DIST/idempotency_ledger-$VERSION.tar.gz"
(cd "$WORK" && "$WORK/venv-sdist/bin/python" "$ROOT/packaging/smoke/python/smoke.py")
done_step sdist "pip install idempotency_ledger-$VERSION.tar.gz (built from the sdist); the README's plain example: executed, replayed"

step "Python: the sdist without the component refuses to build"
mkdir -p "$WORK/no-wasm"
tar xzf "$DIST/idempotency_ledger-$VERSION.tar.gz" -C "$WORK/no-wasm"
rm "$WORK/no-wasm/idempotency_ledger-$VERSION/bindings/rust/component/idempotency_ledger.wasm"
tar czf "$WORK/idempotency_ledger-$VERSION.tar.gz" -C "$WORK/no-wasm" "idempotency_ledger-$VERSION"
if "$WORK/venv-sdist/bin/python" -m pip wheel --no-deps --disable-pip-version-check --wheel-dir "$WORK/no-wasm/wheels" \
     "$WORK/idempotency_ledger-$VERSION.tar.gz" >"$WORK/no-wasm/build.log" 2>&1; then
  fail "an sdist without bindings/rust/component/idempotency_ledger.wasm built a wheel"
fi
grep -q "the idempotency component is missing" "$WORK/no-wasm/build.log" ||
  { tail -30 "$WORK/no-wasm/build.log"; fail "the build without the component failed, but not because the component is missing"; }
echo "refused: $(grep -m1 -o "the idempotency component is missing at [^ ]*" "$WORK/no-wasm/build.log" | sed "s|$WORK/no-wasm/||")"
done_step no-wasm "an sdist without the component: the build stops (\"the idempotency component is missing\")"

printf '\n== dist-check: every artifact installed outside the repository and ran its README example\n'
printf '  %s\n' "${SUMMARY[@]}"
