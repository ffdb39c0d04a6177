// Workers rules, checked on the built package: no WebAssembly compiled from
// bytes at run time, core modules imported statically, no WASI imports, no
// Node built-ins in anything a Worker loads.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { PACKAGE_ROOT, workerModules } from "./helpers/workerd.js";

const read = (path) => readFileSync(new URL(`../${path}`, import.meta.url), "utf8");

test("the jco glue compiles nothing from bytes and imports nothing", () => {
  const glue = read("generated/core.js");
  assert.doesNotMatch(glue, /WebAssembly\.compile|WebAssembly\.instantiate\(|new WebAssembly\.Module|atob\(|fetch\(/);
  assert.doesNotMatch(glue, /^import /m, "no imports: in particular no WASI preview2 shim");
  assert.match(glue, /["'`]core\.core\.wasm["'`]/, "the glue asks the host for its core modules by name");
  const dts = read("generated/core.d.ts");
  assert.match(dts, /'idempotency:ledger\/ledger@0\.2\.0': typeof/);
  assert.doesNotMatch(dts, /wasi:/, "the component imports only the ledger interface");
});

test("the Workers core loader imports every core module statically", () => {
  const loader = read("src/core-worker.js");
  const glue = read("generated/core.js");
  const wanted = [...new Set([...glue.matchAll(/["'`](core\.core\d*\.wasm)["'`]/g)].map((m) => m[1]))];
  assert.ok(wanted.length >= 1);
  for (const name of wanted) assert.match(loader, new RegExp(`^import \\w+ from "\\.\\./generated/${name.replace(/\./g, "\\.")}";$`, "m"), name);
});

test("what a Worker loads (package entry, Hono entry, pg adapter) compiles nothing and needs no Node built-in", () => {
  for (const entry of ["src/worker.js", "src/hono-worker.js", "src/pg.js"]) {
    for (const m of workerModules(join(PACKAGE_ROOT, entry))) {
      if (m.type !== "ESModule" || m.path.endsWith("generated/core.js")) continue;
      assert.doesNotMatch(String(m.contents), /WebAssembly\.(compile|instantiate)\b|new WebAssembly\.Module|from "node:|import\("node:|require\(/, m.path);
    }
  }
});
