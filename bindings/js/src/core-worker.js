// The component on Cloudflare Workers: the core modules are imported
// statically (the bundler / workerd hands them over as compiled
// WebAssembly.Module objects), so nothing is compiled from bytes at run time.
// The instance is created on first use, not at script load.
import coreModule from "../generated/core.core.wasm";
import coreModule2 from "../generated/core.core2.wasm";
import coreModule3 from "../generated/core.core3.wasm";
import { Core } from "./runtime.js";

const MODULES = { "core.core.wasm": coreModule, "core.core2.wasm": coreModule2, "core.core3.wasm": coreModule3 };

let core = null;
/** The isolate's one component instance (instantiated on first use). */
export function getCore() {
  if (core === null) core = new Core((name) => MODULES[name]);
  return core;
}
