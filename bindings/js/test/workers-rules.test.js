// Workers rules, checked on the built package: no WebAssembly compiled from
// bytes at run time, core modules imported statically, no WASI imports.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";

const read = (path) => readFileSync(new URL(`../${path}`, import.meta.url), "utf8");

test("the jco glue compiles nothing from bytes and imports nothing", () => {
  const glue = read("generated/core.js");
  assert.doesNotMatch(glue, /WebAssembly\.compile|WebAssembly\.instantiate\(|new WebAssembly\.Module|atob\(|fetch\(/);
  assert.doesNotMatch(glue, /^import /m, "no imports: in particular no WASI preview2 shim");
  assert.match(glue, /["'`]core\.core\.wasm["'`]/, "the glue asks the host for its core modules by name");
  const dts = read("generated/core.d.ts");
  assert.match(dts, /'idempotency:ledger\/ledger@0\.1\.0': typeof/);
  assert.doesNotMatch(dts, /wasi:/, "the component imports only the ledger interface");
});

test("the Workers entry imports every core module statically", () => {
  const worker = read("src/worker.js");
  const glue = read("generated/core.js");
  const wanted = [...new Set([...glue.matchAll(/["'`](core\.core\d*\.wasm)["'`]/g)].map((m) => m[1]))];
  assert.ok(wanted.length >= 1);
  for (const name of wanted) assert.match(worker, new RegExp(`^import \\w+ from "\\.\\./generated/${name.replace(/\./g, "\\.")}";$`, "m"), name);
  for (const path of ["src/worker.js", "src/runtime.js", "src/ledger.js", "src/d1.js", "src/api.js"]) {
    assert.doesNotMatch(read(path), /WebAssembly\.(compile|instantiate)\b|new WebAssembly\.Module|node:/, path);
  }
});
