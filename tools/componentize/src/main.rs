//! `componentize new CORE.wasm -o OUT.wasm`: the component (what
//! `wasm-tools component new` does). `componentize wit COMPONENT.wasm`: its
//! WIT (what `wasm-tools component wit` prints). `componentize imports
//! COMPONENT.wasm`: one imported interface per line.

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
        _ => bail!("usage: componentize new CORE.wasm -o OUT.wasm | wit COMPONENT.wasm | imports COMPONENT.wasm"),
    }
    Ok(())
}

fn decode(input: &str) -> Result<DecodedWasm> {
    let bytes = std::fs::read(input).with_context(|| format!("reading {input}"))?;
    wit_component::decode(&bytes).with_context(|| format!("decoding {input}"))
}
