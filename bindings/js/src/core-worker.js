// The component on Cloudflare Workers: its core module is imported
// statically (the bundler / workerd hands it over as a compiled
// WebAssembly.Module), so nothing is compiled from bytes at run time.
// The instance is created on first use, not at script load.
import coreModule from "../generated/core.core.wasm";
import { Core } from "./runtime.js";

const MODULES = { "core.core.wasm": coreModule };

let core = null;
/** The isolate's one component instance (instantiated on first use). */
export function getCore() {
  if (core === null) core = new Core((name) => MODULES[name]);
  return core;
}
