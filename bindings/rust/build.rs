//! Embeds the component built by `make component` (or the file named by
//! IDEMPOTENCY_LEDGER_COMPONENT) so the library is self-contained.

use std::path::PathBuf;

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let default = manifest.join("../../target/component/idempotency_ledger.wasm");
    let source = std::env::var_os("IDEMPOTENCY_LEDGER_COMPONENT").map(PathBuf::from).unwrap_or(default);
    println!("cargo:rerun-if-env-changed=IDEMPOTENCY_LEDGER_COMPONENT");
    println!("cargo:rerun-if-changed={}", source.display());
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("idempotency_ledger.wasm");
    match std::fs::copy(&source, &out) {
        Ok(_) => {}
        Err(e) => panic!(
            "the idempotency component is missing at {} ({e}); build it first with `make component`",
            source.display()
        ),
    }
}
