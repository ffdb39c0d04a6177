// Starts real workerd (via miniflare, offline: cf: false) with a real local D1.
import { readFileSync } from "node:fs";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { dirname, relative } from "node:path";
import { fileURLToPath } from "node:url";
import { Miniflare } from "miniflare";

export const PACKAGE_ROOT = fileURLToPath(new URL("../../", import.meta.url));
export const EXAMPLE_MIGRATIONS = [
  join(PACKAGE_ROOT, "examples/worker/migrations/0001_idempotency_keys.sql"),
  join(PACKAGE_ROOT, "examples/worker/migrations/0002_orders.sql"),
];
export const COMPATIBILITY_DATE = "2025-09-01";
export const TOKENS = { "tok-a": "acct-a", "tok-b": "acct-b" };

const temporary = [];
process.on("exit", () => {
  for (const dir of temporary) rmSync(dir, { recursive: true, force: true });
});

/** The statements of a wrangler migration file (split on `;` at line ends; comments dropped). */
export function migrationStatements(path) {
  const text = readFileSync(path, "utf8")
    .split("\n")
    .filter((line) => !line.trimStart().startsWith("--"))
    .join("\n");
  return text
    .split(/;\s*\n/)
    .map((s) => s.trim().replace(/;$/, ""))
    .filter(Boolean);
}

// The package's own name, resolved as wrangler resolves it for Workers
// (package.json "exports", `workerd` condition).
const PACKAGE_SPECIFIERS = {
  "@idempotency/ledger": "src/worker.js",
  "@idempotency/ledger/worker": "src/worker.js",
  "@idempotency/ledger/hono": "src/hono-worker.js",
  "@idempotency/ledger/pg": "src/pg.js",
};

/**
 * The ES modules and compiled wasm modules `scriptPath` needs, found by
 * following its static imports (relative ones, and the package's own name);
 * `provided` maps paths to modules the caller made ({ type, contents }).
 * workerd resolves a bare specifier next to the importing module, so the
 * package name becomes a one-line alias module there (what a bundler such as
 * wrangler does with node_modules); everything else is the files as they are.
 */
export function workerModules(scriptPath, provided = {}) {
  const modules = [];
  const seen = new Set();
  const visit = (path) => {
    if (seen.has(path)) return;
    seen.add(path);
    if (path in provided) {
      // A module made by the test (a bundle), not a file.
      modules.push({ path, ...provided[path] });
      return;
    }
    if (path.endsWith(".wasm")) {
      modules.push({ type: "CompiledWasm", path, contents: readFileSync(path) });
      return;
    }
    const text = readFileSync(path, "utf8");
    modules.push({ type: "ESModule", path, contents: text });
    const specifiers = [...text.matchAll(/^\s*(?:import|export)\s[^;]*?from\s*"([^"]+)"|^\s*import\s*"([^"]+)"/gm)].map((m) => m[1] ?? m[2]);
    for (const spec of specifiers) {
      if (spec.startsWith(".")) visit(join(dirname(path), spec));
      else if (spec in PACKAGE_SPECIFIERS) {
        const alias = join(dirname(path), spec);
        if (!seen.has(alias)) {
          seen.add(alias);
          const target = join(PACKAGE_ROOT, PACKAGE_SPECIFIERS[spec]);
          let rel = relative(dirname(alias), target);
          if (!rel.startsWith(".")) rel = `./${rel}`;
          modules.push({ type: "ESModule", path: alias, contents: `export * from "${rel}";\n` });
          visit(target);
        }
      }
    }
  };
  visit(scriptPath);
  return modules;
}

/**
 * A Miniflare running `scriptPath` (an ES module; its imports, .wasm included,
 * are collected by miniflare) with D1 bound as DB, persisted under a fresh
 * temporary folder unless `persist` is given.
 */
export async function startWorker({ scriptPath, persist, bindings = {}, port } = {}) {
  let d1Persist = persist;
  if (d1Persist === undefined) {
    d1Persist = mkdtempSync(join(tmpdir(), "idem-d1-"));
    temporary.push(d1Persist);
  }
  const mf = new Miniflare({
    cf: false,
    modules: workerModules(scriptPath),
    modulesRoot: PACKAGE_ROOT,
    compatibilityDate: COMPATIBILITY_DATE,
    d1Databases: { DB: "idempotent-orders" },
    d1Persist,
    bindings: { API_TOKENS: JSON.stringify(TOKENS), ...bindings },
    // Only when asked (the example's dev server): loopback, never another address.
    ...(port === undefined ? {} : { host: "127.0.0.1", port }),
  });
  await mf.ready;
  const db = await mf.getD1Database("DB");
  for (const file of EXAMPLE_MIGRATIONS) {
    await db.batch(migrationStatements(file).map((sql) => db.prepare(sql)));
  }
  return { mf, db, d1Persist };
}
