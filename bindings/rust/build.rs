//! Embeds the idempotency core component so the library is self-contained.
//!
//! Where it comes from, first found: IDEMPOTENCY_LEDGER_COMPONENT (a path);
//! the checkout's `target/component/` (built by `make component`, with the
//! component precompiled for this machine beside it); the copy that travels
//! inside the published package (`component/`). Without the precompiled form
//! the component is compiled when a process starts (same behaviour, ~0.1 s).

use std::path::PathBuf;

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    println!("cargo:rerun-if-env-changed=IDEMPOTENCY_LEDGER_COMPONENT");
    let checkout = manifest.join("../../target/component/idempotency_ledger.wasm");
    let packaged = manifest.join("component/idempotency_ledger.wasm");
    let source = match std::env::var_os("IDEMPOTENCY_LEDGER_COMPONENT") {
        Some(path) => PathBuf::from(path),
        None if checkout.exists() => checkout,
        None => packaged,
    };
    println!("cargo:rerun-if-changed={}", source.display());
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    if let Err(e) = std::fs::copy(&source, out.join("idempotency_ledger.wasm")) {
        panic!(
            "the idempotency component is missing at {} ({e}): in a checkout, build it first with `make component`",
            source.display()
        );
    }
    let precompiled = source.with_extension("cwasm");
    if precompiled.exists() {
        println!("cargo:rerun-if-changed={}", precompiled.display());
        std::fs::copy(&precompiled, out.join("idempotency_ledger.cwasm")).expect("copy the precompiled component");
    } else {
        std::fs::write(out.join("idempotency_ledger.cwasm"), b"").expect("write OUT_DIR");
    }
}
