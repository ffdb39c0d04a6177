//! `componentize precompile COMPONENT.wasm -o OUT.cwasm`: the component
//! compiled ahead of time for this machine, with the host crate's engine
//! settings (`idempotency_ledger::engine_config`, repeated below).
//! `componentize new CORE.wasm -o OUT.wasm`: the component (what
//! `wasm-tools component new` does). `componentize wit COMPONENT.wasm`: its
//! WIT (what `wasm-tools component wit` prints). `componentize imports
//! COMPONENT.wasm`: one imported interface per line. `componentize sizes
//! CORE.wasm`: a size profile of a core module built with symbols (sections,
//! then the largest functions grouped by crate).

use anyhow::{bail, Context, Result};
use wit_component::{ComponentEncoder, DecodedWasm, WitPrinter};

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["new", input, "-o", output] => {
            let module = std::fs::read(input).with_context(|| format!("reading {input}"))?;
            let component = ComponentEncoder::default()
                .module(&module)
                .context("reading the module's component-type section")?
                .validate(true)
                .encode()
                .context("encoding the component")?;
            std::fs::write(output, &component).with_context(|| format!("writing {output}"))?;
            eprintln!("componentize: {input} ({} bytes) -> {output} ({} bytes)", module.len(), component.len());
        }
        ["precompile", input, "-o", output] => {
            let component = std::fs::read(input).with_context(|| format!("reading {input}"))?;
            // Must match bindings/rust/src/runtime.rs `engine_config`; a
            // mismatch is refused at load (the host then compiles instead,
            // which its tests catch).
            let mut config = wasmtime::Config::new();
            config.wasm_component_model(true);
            let engine = wasmtime::Engine::new(&config).map_err(|e| anyhow::anyhow!("{e:#}"))?;
            let started = std::time::Instant::now();
            let compiled =
                engine.precompile_component(&component).map_err(|e| anyhow::anyhow!("precompiling the component: {e:#}"))?;
            std::fs::write(output, &compiled).with_context(|| format!("writing {output}"))?;
            eprintln!("componentize: {input} -> {output} ({} bytes, compiled in {:?})", compiled.len(), started.elapsed());
        }
        ["wit", input] => {
            let decoded = decode(input)?;
            let mut printer = WitPrinter::default();
            printer.print(decoded.resolve(), decoded.package(), &[])?;
            print!("{}", printer.output);
        }
        ["imports", input] => {
            let decoded = decode(input)?;
            let DecodedWasm::Component(resolve, world) = &decoded else { bail!("{input} is not a component") };
            for key in resolve.worlds[*world].imports.keys() {
                println!("{}", resolve.name_world_key(key));
            }
        }
        ["sizes", input] => sizes(input)?,
        _ => bail!(
            "usage: componentize new CORE.wasm -o OUT.wasm | precompile COMPONENT.wasm -o OUT.cwasm | wit COMPONENT.wasm | imports COMPONENT.wasm | sizes CORE.wasm"
        ),
    }
    Ok(())
}

fn decode(input: &str) -> Result<DecodedWasm> {
    let bytes = std::fs::read(input).with_context(|| format!("reading {input}"))?;
    wit_component::decode(&bytes).with_context(|| format!("decoding {input}"))
}

fn sizes(input: &str) -> Result<()> {
    use std::collections::HashMap;
    use wasmparser::{Name, Parser, Payload};
    let bytes = std::fs::read(input).with_context(|| format!("reading {input}"))?;
    let mut sections: Vec<(String, usize)> = Vec::new();
    let mut bodies: Vec<usize> = Vec::new();
    let mut imported = 0u32;
    let mut names: HashMap<u32, String> = HashMap::new();
    for payload in Parser::new(0).parse_all(&bytes) {
        match payload? {
            Payload::ImportSection(reader) => {
                for import in reader.into_imports() {
                    if matches!(import?.ty, wasmparser::TypeRef::Func(_)) {
                        imported += 1;
                    }
                }
            }
            Payload::CodeSectionStart { size, .. } => sections.push(("code".into(), size as usize)),
            Payload::CodeSectionEntry(body) => { let r = body.range(); bodies.push((r.end - r.start) as usize) },
            Payload::DataSection(reader) => { let r = reader.range(); sections.push(("data".into(), (r.end - r.start) as usize)) },
            Payload::CustomSection(reader) => {
                sections.push((format!("custom {}", reader.name()), reader.data().len()));
                if let wasmparser::KnownCustom::Name(name_reader) = reader.as_known() {
                    for name in name_reader {
                        if let Name::Function(map) = name? {
                            for naming in map {
                                let naming = naming?;
                                names.insert(naming.index, format!("{:#}", rustc_demangle::demangle(naming.name)));
                            }
                        }
                    }
                }
            }
            _ => {}
        }
    }
    println!("{input}: {} bytes", bytes.len());
    for (name, size) in &sections {
        println!("  section {name}: {size} bytes");
    }
    let mut by_crate: HashMap<String, usize> = HashMap::new();
    let mut functions: Vec<(usize, String)> = Vec::new();
    for (i, size) in bodies.iter().enumerate() {
        let name = names.get(&(imported + i as u32)).cloned().unwrap_or_else(|| format!("func[{}]", imported + i as u32));
        let krate = if name.contains('#') || name.starts_with("cabi_") {
            "(wit-bindgen exports)".to_string()
        } else {
            name.trim_start_matches('<').split("::").next().unwrap_or("?").to_string()
        };
        *by_crate.entry(krate).or_default() += size;
        functions.push((*size, name));
    }
    let mut crates: Vec<_> = by_crate.into_iter().collect();
    crates.sort_by(|a, b| b.1.cmp(&a.1));
    println!("code by crate (first path segment of the symbol):");
    for (krate, size) in crates.iter().take(15) {
        println!("  {size:>8}  {krate}");
    }
    functions.sort_by(|a, b| b.0.cmp(&a.0));
    println!("largest functions:");
    for (size, name) in functions.iter().take(15) {
        println!("  {size:>8}  {}", name.chars().take(110).collect::<String>());
    }
    Ok(())
}
