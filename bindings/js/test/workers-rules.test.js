// Workers rules, checked on the built package: no WebAssembly compiled from
// bytes at run time, the core module imported statically, no WASI imports, no
// Node built-ins in anything a Worker loads.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { CORE_MODULE_NAMES } from "../src/runtime.js";
import { PACKAGE_ROOT, workerModules } from "./helpers/workerd.js";

const read = (path) => readFileSync(new URL(`../${path}`, import.meta.url), "utf8");

test("the component binding compiles nothing from bytes and imports only its engine and type table", async () => {
  const binding = read("src/component.js");
  assert.doesNotMatch(binding, /WebAssembly\.compile|WebAssembly\.instantiate\(|new WebAssembly\.Module|atob\(|fetch\(/);
  assert.match(binding, /^import \{[^}]*\} from "\.\.\/generated\/wit\.js";$/m, "its one import: the generated type table");
  assert.match(binding, /^import \{[^}]*\} from "\.\/abi\.js";$/m);
  assert.equal([...binding.matchAll(/^import /gm)].length, 2, "no other import: in particular no WASI preview2 shim");
  const abi = read("src/abi.js");
  assert.doesNotMatch(abi, /WebAssembly\.compile|WebAssembly\.instantiate\(|new WebAssembly\.Module|atob\(|fetch\(|^import /m);
  assert.doesNotMatch(read("generated/wit.js"), /^import |WebAssembly|\beval\b|new Function/m, "the type table and its lift and lower functions import nothing and compile nothing");
  const dts = read("generated/core.d.ts");
  const { PACKAGE } = await import("../generated/wit.js");
  assert.ok(dts.includes(`'idempotency:ledger/ledger@${PACKAGE.split("@")[1]}': typeof`), "jco's types are of the same WIT version");
  assert.doesNotMatch(dts, /wasi:/, "the component imports only the ledger interface");
});

test("the Workers core loader imports every core module statically, and a Worker loads no jco glue", () => {
  const loader = read("src/core-worker.js");
  for (const name of CORE_MODULE_NAMES) assert.match(loader, new RegExp(`^import \\w+ from "\\.\\./generated/${name.replace(/\./g, "\\.")}";$`, "m"), name);
  const loaded = workerModules(join(PACKAGE_ROOT, "src/worker.js")).map((m) => m.path);
  assert.deepEqual(loaded.filter((p) => p.includes("/generated/")).sort(), [...CORE_MODULE_NAMES, "wit.js"].map((n) => join(PACKAGE_ROOT, "generated", n)).sort(), "the core module and the type table, no jco glue");
});

test("what a Worker loads (package entry, Hono entry, pg adapter) compiles nothing and needs no Node built-in", () => {
  for (const entry of ["src/worker.js", "src/hono-worker.js", "src/pg.js"]) {
    for (const m of workerModules(join(PACKAGE_ROOT, entry))) {
      if (m.type !== "ESModule") continue;
      assert.doesNotMatch(String(m.contents), /WebAssembly\.(compile|instantiate)\b|new WebAssembly\.Module|from "node:|import\("node:|require\(/, m.path);
    }
  }
});
