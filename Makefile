# Idempotency-Key ledger: one WebAssembly core, every host.
CARGO ?= cargo
COMPONENT_WASM := target/component/idempotency_ledger.wasm
COMPONENT_CWASM := target/component/idempotency_ledger.cwasm
PACKAGED_WASM := bindings/rust/component/idempotency_ledger.wasm
CORE_MODULE := target/wasm32-unknown-unknown/component/idempotency_ledger_guest.wasm
COMPONENTIZE := $(CARGO) run --quiet -p idempotency-ledger-componentize --
GUEST_SOURCES := $(shell find wit guest -name '*.wit' -o -name '*.rs' -o -name 'Cargo.toml') Cargo.toml Cargo.lock

.PHONY: faults-build test-faults faults soak failover test-failover pooler-suites serve-rust help component wit demo demo-postgres test test-rust test-js test-python serve-python test-postgres postgres-suites check-imports vectors simulate fuzz bench bench-instructions size-profile clean dist dist-check check-versions

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{ printf "  %-15s %s\n", $$1, $$2 }'

component: $(COMPONENT_WASM) $(PACKAGED_WASM) ## Build the component (wasm32-unknown-unknown, wrapped with wit-component)

$(COMPONENT_WASM): $(GUEST_SOURCES)
	./scripts/ensure-wasm-target.sh
	$(CARGO) build --locked -p idempotency-ledger-guest --target wasm32-unknown-unknown --profile component
	@mkdir -p $(dir $@)
	$(COMPONENTIZE) new $(CORE_MODULE) -o $@
	$(COMPONENTIZE) precompile $@ -o $(COMPONENT_CWASM)

# The copy that travels inside the Rust crate's package (cargo package).
$(PACKAGED_WASM): $(COMPONENT_WASM)
	@mkdir -p $(dir $@) && cp $< $@

wit: $(COMPONENT_WASM) ## Print the component's WIT world (what wasm-tools component wit prints)
	$(COMPONENTIZE) wit $(COMPONENT_WASM)

check-imports: $(COMPONENT_WASM) ## Fail unless the component imports only the ledger interface
	@imports="$$($(COMPONENTIZE) imports $(COMPONENT_WASM))"; echo "component imports: $$imports"; \
	  test "$$imports" = "idempotency:ledger/ledger@0.3.0" || { echo "error: unexpected imports" >&2; exit 1; }

PG_URL ?=
demo: $(COMPONENT_WASM) ## Run the demo against an embedded SQLite file (PG_URL=postgresql://...: on that server)
	$(CARGO) run --locked --quiet -p idempotency-ledger-cli -- demo $(if $(PG_URL),--postgres $(PG_URL),--db target/demo.sqlite)

demo-postgres: $(COMPONENT_WASM) ## Run the demo on a throwaway local PostgreSQL (installed with apt-get if missing)
	$(CARGO) build --locked --quiet -p idempotency-ledger-cli
	./scripts/postgres.sh run -- sh -c 'target/debug/idempotency-ledger demo --postgres "$$IDEMPOTENCY_PG_URL"'

serve-node: $(COMPONENT_WASM) ## The example Hono server on Node (PORT=8080, DATABASE_URL=file or postgresql://, IDEMPOTENCY_*) until SIGTERM/SIGINT
	$(MAKE) --no-print-directory -C bindings/js build
	cd bindings/js && exec node examples/node/server.js

test: test-rust test-js test-python test-postgres test-faults test-failover dist-check ## Run every suite (Rust, JavaScript, Python, PostgreSQL, faults, failover), then the packages from outside

# Every debug cargo command of make test builds the workspace's default
# members with the same features (RUST_FEATURES; PG_FEATURES adds test
# targets only), so wasmtime is compiled once for them all: with `-p` or
# `cargo build` instead, the features its dependencies are unified with
# change, and each such command compiled wasmtime again (minutes on 2 cores).
# `cargo test` also builds the examples (target/debug/examples/serve).
RUST_FEATURES := idempotency-ledger/tower,idempotency-ledger/opentelemetry,idempotency-ledger/testing
PG_FEATURES := $(RUST_FEATURES),idempotency-ledger-host-test/postgres-tests,idempotency-ledger-cli/postgres-tests
RUST_DEBUG_BUILD := $(CARGO) test --locked --no-run --features $(PG_FEATURES)

test-rust: check-imports ## Rust: native core tests, the component under wasmtime over SQLite, the tower layer and the example server
	$(CARGO) test --locked --features $(RUST_FEATURES)
	$(CARGO) test --locked -p idempotency-ledger-guest

SEEDS ?= 0..1000
STEPS ?= 2000
COMPONENT ?=
POSTGRES ?=
simulate: $(COMPONENT_WASM) ## Deterministic simulation: make simulate SEEDS=0..1000 [STEPS=2000] [COMPONENT=1] [POSTGRES=1]
	$(CARGO) build --locked --quiet -p idempotency-ledger-host-test --bin simulate
	$(if $(POSTGRES),./scripts/postgres.sh run --) target/debug/simulate --seeds $(SEEDS) --steps $(STEPS) $(if $(COMPONENT),--component) $(if $(POSTGRES),--postgres)

serve-rust: $(COMPONENT_WASM) ## The example server (axum + the tower layer) on 127.0.0.1:$$PORT (default 8080); DATABASE_URL = a SQLite path or postgresql://
	$(CARGO) build --locked --release -p idempotency-ledger --features tower --example serve
	exec target/release/examples/serve

bench: $(COMPONENT_WASM) ## Benchmarks side by side (Rust, JS, Python); writes bench/RESULTS.md
	./scripts/bench.sh

bench-instructions: $(COMPONENT_WASM) ## Instructions per request, component against native, counted by callgrind (a table on stdout; part of make bench)
	$(CARGO) build --locked --release -p idempotency-ledger-bench
	BENCH_ONLY=instructions ./target/release/idempotency-ledger-bench

size-profile: ## What the component's bytes are made of (a build with symbols, by crate and function)
	./scripts/ensure-wasm-target.sh
	CARGO_PROFILE_COMPONENT_STRIP=false $(CARGO) build --locked -p idempotency-ledger-guest --target wasm32-unknown-unknown --profile component --target-dir target/size-profile
	$(COMPONENTIZE) sizes target/size-profile/wasm32-unknown-unknown/component/idempotency_ledger_guest.wasm

FUZZ_SECONDS ?= 30
fuzz: ## Run every cargo-fuzz target FUZZ_SECONDS each (nightly), growing fuzz/corpus
	./scripts/fuzz.sh $(FUZZ_SECONDS)

vectors: ## Regenerate conformance/vectors.json (commit the result)
	python3 conformance/generate.py

test-js: $(COMPONENT_WASM) ## JavaScript: workerd + D1 via miniflare, Node + better-sqlite3, vectors
	$(MAKE) -C bindings/js test

test-python: $(COMPONENT_WASM) ## Python: the native extension (PyO3 over the Rust crate), middleware, races, vectors
	$(MAKE) -C bindings/python test

# Serves in the foreground until SIGTERM / SIGINT (Ctrl-C). PORT (default
# 8080), DATABASE_URL (a SQLite path or postgresql://...), IDEMPOTENCY_*.
serve-python: $(COMPONENT_WASM) ## Example FastAPI server on the Python package (PORT, DATABASE_URL, IDEMPOTENCY_* settings)
	@$(MAKE) --no-print-directory -C bindings/python venv >&2
	cd bindings/python && exec .venv/bin/python examples/server.py

RACE_KEYS ?= 200
test-postgres: $(COMPONENT_WASM) ## PostgreSQL: a throwaway local server, every host's suites on it, a 4-process race; then again through PgBouncer (transaction mode)
	$(RUST_DEBUG_BUILD)
	$(MAKE) -C bindings/python venv
	$(MAKE) --no-print-directory -C bindings/js build
	./scripts/postgres.sh run -- sh -c '$(MAKE) --no-print-directory postgres-suites && ./scripts/pgbouncer.sh run -- $(MAKE) --no-print-directory pooler-suites'

# Needs IDEMPOTENCY_PG_URL naming a transaction pooler (test-postgres runs it
# inside scripts/pgbouncer.sh run: PgBouncer 1.18, pool_mode transaction). The
# Rust SPEC, vector, concurrency, failure and hostile suites (Python's
# extension runs the same crate) and the three example servers as processes:
# the contract, 4 s of load, renewal under load, the exactly-once probes.
POOLER_PARTS ?= contract,load,renewal,exactly-once
pooler-suites:
	@test -n "$$IDEMPOTENCY_PG_POOLER" || { echo "error: IDEMPOTENCY_PG_POOLER is not set (use make test-postgres, or scripts/pgbouncer.sh run -- ...)" >&2; exit 1; }
	IDEMPOTENCY_TEST_BACKEND=postgres $(CARGO) test --locked --features $(PG_FEATURES) \
	  --test spec --test vectors --test concurrency --test failures --test hostile
	FAULTS_RUST_PROFILE=debug $(FAULTS_PY) faults/run.py short --db postgres --parts $(POOLER_PARTS)

# Needs IDEMPOTENCY_PG_URL (test-postgres sets it): the same SPEC, vector,
# concurrency, failure and hostile tests as over SQLite, in the postgres dialect;
# the SPEC, vector and concurrency ones again with statements prepared by name
# (PoolSettings::prepared_statements; a direct connection only); the Rust
# example server's HTTP contract, its statements unnamed and prepared.
postgres-suites:
	@test -n "$$IDEMPOTENCY_PG_URL" || { echo "error: IDEMPOTENCY_PG_URL is not set (use make test-postgres)" >&2; exit 1; }
	IDEMPOTENCY_TEST_BACKEND=postgres $(CARGO) test --locked --features $(PG_FEATURES) \
	  --test spec --test vectors --test concurrency --test failures --test hostile --test postgres
	IDEMPOTENCY_TEST_BACKEND=postgres IDEMPOTENCY_TEST_PG_PREPARED=1 $(CARGO) test --locked --features $(PG_FEATURES) \
	  --test spec --test vectors --test concurrency
	$(CARGO) test --locked --features $(PG_FEATURES) --test layer -- --ignored --exact the_example_server_keeps_its_contract_on_postgres
	$(MAKE) -C bindings/python test-postgres
	$(MAKE) -C bindings/js test-postgres
	bindings/python/.venv/bin/python host-test/pg_race.py --rust-worker target/debug/pg-race-worker --keys $(RACE_KEYS)
	bindings/python/.venv/bin/python host-test/pg_race.py --rust-worker target/debug/pg-race-worker --js-worker bindings/js/test/pg-race-worker.js --keys $(RACE_KEYS)

# Packaging (packaging/): the publishable artifacts and their check from
# outside the repository. Both reuse target/: run after the suites (as
# `make test` does), only this project's crates are compiled.
dist: component ## Build the packages into dist/: the two .crate files, the npm tarball, the Python sdist and the wheel built from it
	./packaging/dist.sh

dist-check: dist ## Install each dist/ artifact into a fresh project outside the repository and run its README example
	./packaging/dist-check.sh

check-versions: ## Fail unless the WIT, the crates, package.json and pyproject.toml carry one version
	python3 packaging/check-versions.py

clean: ## Remove build output
	$(CARGO) clean

# faults/: the example servers as real processes under SIGKILL, database
# faults and sustained load (see faults/README.md). The harness runs on the
# Python package's venv (make -C bindings/python venv), for its pinned psycopg.
FAULTS_PY ?= bindings/python/.venv/bin/python
HOST ?= rust
DB ?= sqlite
MINUTES ?= 10
ROUNDS ?= 5
CYCLES ?= 3
NICE ?= 10
FAULTS_PG = $(if $(filter postgres,$(DB)),./scripts/postgres.sh run --)

faults-build: $(COMPONENT_WASM) ## Build the three example servers as their serve-* targets do
	$(CARGO) build --locked --release -p idempotency-ledger --features tower --example serve
	$(MAKE) --no-print-directory -C bindings/js build
	$(MAKE) --no-print-directory -C bindings/python venv

# The example servers with the ledger's statements prepared by name
# (IDEMPOTENCY_PREPARED_STATEMENTS=1), on PostgreSQL: connections replaced
# by the database faults prepare them again.
PREPARED_PARTS ?= contract,load,dbfaults,exactly-once
# In make test the Rust server is the debug build test-rust made (a release
# build of wasmtime would cost CI minutes); faults and soak use the release one.
test-faults: $(COMPONENT_WASM) ## Faults, short: SIGKILL at chosen points, database faults, 4 s of load, live owners past the TTL under load and the exactly-once probes per host, on SQLite and PostgreSQL
	$(RUST_DEBUG_BUILD)
	$(MAKE) --no-print-directory -C bindings/js build
	$(MAKE) --no-print-directory -C bindings/python venv
	FAULTS_RUST_PROFILE=debug $(FAULTS_PY) faults/run.py short --db sqlite
	FAULTS_RUST_PROFILE=debug ./scripts/postgres.sh run -- sh -c '$(FAULTS_PY) faults/run.py short --db postgres && \
	  $(FAULTS_PY) faults/run.py short --db postgres --parts $(PREPARED_PARTS) --server-env IDEMPOTENCY_PREPARED_STATEMENTS=1'

faults: faults-build ## Crashes, database faults, renewal under load and the exactly-once probes at depth: make faults HOST=rust|python|node DB=sqlite|postgres [ROUNDS=5 CYCLES=3]
	$(FAULTS_PG) sh -c '$(FAULTS_PY) faults/run.py crash --host $(HOST) --db $(DB) --rounds $(ROUNDS) && $(FAULTS_PY) faults/run.py dbfaults --host $(HOST) --db $(DB) --cycles $(CYCLES) && $(FAULTS_PY) faults/run.py renewal --host $(HOST) --db $(DB) && $(FAULTS_PY) faults/run.py exactly-once --host $(HOST) --db $(DB) --rounds $(ROUNDS) --cycles $(CYCLES)'

# Failover (faults/failover.py): a primary and a streaming replica of their
# own (scripts/postgres.sh, scripts/pg-replica.sh) on FAILOVER_PORTS, a
# switchable proxy as the endpoint; needs no other server.
SYNC ?= on
FAILOVER_PORTS ?= 25435,25436
failover: faults-build ## Failover under load: make failover HOST=rust|python|node SYNC=on|off (kill, read-only old primary, multi-host URL; plain and exactly-once)
	$(FAULTS_PY) faults/run.py failover --host $(HOST) --sync $(SYNC) --pg-ports $(FAILOVER_PORTS)

# In make test: the Rust server (debug build) through one failover with
# synchronous replication in the exactly-once mode, and the read-only switchover.
test-failover: $(COMPONENT_WASM) ## Failover, short: Rust, synchronous replication: the primary killed (exactly-once mode), the old primary read-only
	$(RUST_DEBUG_BUILD)
	$(MAKE) --no-print-directory -C bindings/python venv
	FAULTS_RUST_PROFILE=debug $(FAULTS_PY) faults/run.py failover --host rust --sync on --kinds kill,readonly --orders exactly-once \
	  --clients 4 --warm-seconds 1 --outage-seconds 1 --after-seconds 3 --grace-seconds 2 --pg-ports $(FAILOVER_PORTS)

soak: faults-build ## Sustained load: make soak HOST=rust|python|node DB=sqlite|postgres MINUTES=10 [SERVER_ENV=NAME=VALUE]
	$(FAULTS_PG) nice -n $(NICE) $(FAULTS_PY) faults/run.py soak --host $(HOST) --db $(DB) --minutes $(MINUTES) $(if $(SERVER_ENV),--server-env '$(SERVER_ENV)')
