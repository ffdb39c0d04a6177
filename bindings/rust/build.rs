//! Embeds the component built by `make component` (or the file named by
//! IDEMPOTENCY_LEDGER_COMPONENT) so the library is self-contained, and its
//! precompiled form (`.cwasm` beside it) when there is one.

use std::path::PathBuf;

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let default = manifest.join("../../target/component/idempotency_ledger.wasm");
    let source = std::env::var_os("IDEMPOTENCY_LEDGER_COMPONENT").map(PathBuf::from).unwrap_or(default);
    let precompiled = source.with_extension("cwasm");
    println!("cargo:rerun-if-env-changed=IDEMPOTENCY_LEDGER_COMPONENT");
    println!("cargo:rerun-if-changed={}", source.display());
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    if let Err(e) = std::fs::copy(&source, out.join("idempotency_ledger.wasm")) {
        panic!("the idempotency component is missing at {} ({e}); build it first with `make component`", source.display());
    }
    // Without it the component is compiled when a process starts (slower, same behaviour).
    if precompiled.exists() {
        println!("cargo:rerun-if-changed={}", precompiled.display());
        std::fs::copy(&precompiled, out.join("idempotency_ledger.cwasm")).expect("copy the precompiled component");
    } else {
        std::fs::write(out.join("idempotency_ledger.cwasm"), b"").expect("write OUT_DIR");
    }
}
