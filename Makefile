# Idempotency-Key ledger: one WebAssembly core, every host.
CARGO ?= cargo
COMPONENT_WASM := target/component/idempotency_ledger.wasm
CORE_MODULE := target/wasm32-unknown-unknown/component/idempotency_ledger_guest.wasm
COMPONENTIZE := $(CARGO) run --quiet -p idempotency-ledger-componentize --
GUEST_SOURCES := $(shell find wit guest -name '*.wit' -o -name '*.rs' -o -name 'Cargo.toml') Cargo.toml Cargo.lock

.PHONY: help component wit demo test test-rust test-js test-python check-imports vectors simulate fuzz bench size-profile clean

help: ## List the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{ printf "  %-15s %s\n", $$1, $$2 }'

component: $(COMPONENT_WASM) ## Build the component (wasm32-unknown-unknown, wrapped with wit-component)

$(COMPONENT_WASM): $(GUEST_SOURCES)
	./scripts/ensure-wasm-target.sh
	$(CARGO) build --locked -p idempotency-ledger-guest --target wasm32-unknown-unknown --profile component
	@mkdir -p $(dir $@)
	$(COMPONENTIZE) new $(CORE_MODULE) -o $@

wit: $(COMPONENT_WASM) ## Print the component's WIT world (what wasm-tools component wit prints)
	$(COMPONENTIZE) wit $(COMPONENT_WASM)

check-imports: $(COMPONENT_WASM) ## Fail unless the component imports only the ledger interface
	@imports="$$($(COMPONENTIZE) imports $(COMPONENT_WASM))"; echo "component imports: $$imports"; \
	  test "$$imports" = "idempotency:ledger/ledger@0.1.0" || { echo "error: unexpected imports" >&2; exit 1; }

demo: $(COMPONENT_WASM) ## Run the demo against an embedded SQLite file
	$(CARGO) run --locked --quiet -p idempotency-ledger --bin idempotency-ledger -- demo --db target/demo.sqlite

test: test-rust test-js test-python ## Run every suite (Rust, JavaScript, Python)

test-rust: check-imports ## Rust: native core tests, then the component under wasmtime over SQLite
	$(CARGO) test --locked

SEEDS ?= 0..1000
STEPS ?= 2000
COMPONENT ?=
simulate: $(COMPONENT_WASM) ## Deterministic simulation: make simulate SEEDS=0..1000 [STEPS=2000] [COMPONENT=1]
	$(CARGO) run --locked --quiet -p idempotency-ledger-host-test --bin simulate -- --seeds $(SEEDS) --steps $(STEPS) $(if $(COMPONENT),--component)

bench: $(COMPONENT_WASM) ## Benchmarks side by side (Rust, JS, Python); writes bench/RESULTS.md
	./scripts/bench.sh

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

test-python: $(COMPONENT_WASM) ## Python: wasmtime-py + sqlite3, middleware, races, vectors
	$(MAKE) -C bindings/python test

clean: ## Remove build output
	$(CARGO) clean
