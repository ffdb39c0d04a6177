// The component on Node: the core module read from generated/ and compiled
// once per process, instantiated on first use.
import { readFileSync } from "node:fs";
import { Core, CORE_MODULE_NAMES } from "./runtime.js";

const GENERATED = new URL("../generated/", import.meta.url);
let modules = null;
function getCoreModule(name) {
  if (modules === null) {
    modules = {};
    for (const n of CORE_MODULE_NAMES) modules[n] = new WebAssembly.Module(readFileSync(new URL(n, GENERATED)));
  }
  return modules[name];
}

let core = null;
/** The process's shared component instance (instantiated on first use). */
export function getCore() {
  if (core === null) core = new Core(getCoreModule);
  return core;
}

/** A fresh component instance of its own. */
export function newCore() {
  return new Core(getCoreModule);
}
