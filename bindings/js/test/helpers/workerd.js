// Starts real workerd (via miniflare, offline: cf: false) with a real local D1.
import { readFileSync } from "node:fs";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
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
    modules: true,
    scriptPath,
    modulesRoot: PACKAGE_ROOT,
    modulesRules: [
      { type: "ESModule", include: ["**/*.js"] },
      { type: "CompiledWasm", include: ["**/*.wasm"] },
    ],
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
