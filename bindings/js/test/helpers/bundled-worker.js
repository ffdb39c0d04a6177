// A test fixture bundled as wrangler bundles a Worker, in real workerd
// (miniflare, offline) with a real local D1.
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as esbuild from "esbuild";
import { Miniflare } from "miniflare";
import { schemaStatements } from "../../src/node.js";
import { COMPATIBILITY_DATE, PACKAGE_ROOT } from "./workerd.js";

const CORE_WASM = join(PACKAGE_ROOT, "generated/core.core.wasm");

/**
 * test/fixtures/NAME.js bundled with esbuild (node_modules included, browser
 * builds of the dependencies, the core module kept as its own wasm module)
 * and run in a Miniflare with D1 bound as DB in a fresh temporary folder,
 * the package's schema applied: `{ mf, db, close }` (`close()` disposes of
 * the Miniflare and removes the folder).
 */
export async function startBundledWorker(name) {
  const built = await esbuild.build({
    entryPoints: [join(PACKAGE_ROOT, `test/fixtures/${name}.js`)],
    bundle: true,
    format: "esm",
    platform: "browser",
    conditions: ["workerd", "worker", "browser"],
    mainFields: ["browser", "module", "main"],
    external: ["*.wasm"],
    write: false,
    logLevel: "warning",
  });
  const persist = mkdtempSync(join(tmpdir(), `idem-${name}-d1-`));
  const mf = new Miniflare({
    cf: false,
    // The bundle sits where src/ is, so its import of ../generated/core.core.wasm names the core module.
    modules: [
      { type: "ESModule", path: join(PACKAGE_ROOT, `src/${name}.bundle.js`), contents: built.outputFiles[0].text },
      { type: "CompiledWasm", path: CORE_WASM, contents: readFileSync(CORE_WASM) },
    ],
    modulesRoot: PACKAGE_ROOT,
    compatibilityDate: COMPATIBILITY_DATE,
    d1Databases: { DB: name },
    d1Persist: persist,
  });
  const close = async () => {
    await mf.dispose();
    rmSync(persist, { recursive: true, force: true });
  };
  await mf.ready;
  const db = await mf.getD1Database("DB");
  await db.batch(schemaStatements("sqlite").map((sql) => db.prepare(sql)));
  return { mf, db, close };
}
