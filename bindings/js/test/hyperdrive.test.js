// Workers on PostgreSQL through Hyperdrive, as far as it can run here: real
// workerd (miniflare) with its local Hyperdrive binding, which proxies to the
// throwaway PostgreSQL; node-postgres bundled for workerd with esbuild under
// nodejs_compat (what wrangler does), reaching the proxy over
// cloudflare:sockets. The fixture is the README's recipe: a pool per request
// over env.HYPERDRIVE.connectionString, passed to handleIdempotentMutation.
import assert from "node:assert/strict";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import * as esbuild from "esbuild";
import { Miniflare } from "miniflare";
import { SKIP_PG, freshSchema, PG_URL } from "./helpers/pg.js";
import { COMPATIBILITY_DATE, PACKAGE_ROOT, workerModules } from "./helpers/workerd.js";

/** `pg` as one CommonJS module for workerd (Node built-ins come from nodejs_compat). */
async function pgBundle() {
  const built = await esbuild.build({
    stdin: { contents: 'module.exports = require("pg");', resolveDir: PACKAGE_ROOT },
    bundle: true,
    format: "cjs",
    platform: "node",
    conditions: ["workerd", "worker"],
    external: ["cloudflare:sockets", "pg-native"],
    write: false,
    logLevel: "warning",
  });
  return built.outputFiles[0].text;
}

describe("Workers + Hyperdrive (miniflare's local binding) + pg", { skip: SKIP_PG }, () => {
  let mf;
  let store;
  const post = (key, { body = '{"sku":"A"}', user = "acct-1" } = {}) => {
    const headers = { "content-type": "application/json", "idempotency-key": key };
    if (user) headers["x-user"] = user;
    return mf.dispatchFetch("http://api.test/orders", { method: "POST", headers, body });
  };
  const orders = async () => (await store.admin.query(`SELECT count(*)::int AS n FROM "${store.schema}".orders`)).rows[0].n;

  before(async () => {
    store = await freshSchema({ max: 1 });
    const script = join(PACKAGE_ROOT, "test/fixtures/hyperdrive-worker.js");
    const bundle = join(PACKAGE_ROOT, "test/fixtures/pg-bundle.cjs");
    const target = new URL(PG_URL);
    if (!target.password) target.password = "unused"; // miniflare insists on one; the throwaway server trusts loopback
    mf = new Miniflare({
      cf: false,
      modules: workerModules(script, { [bundle]: { type: "CommonJS", contents: await pgBundle() } }),
      modulesRoot: PACKAGE_ROOT,
      compatibilityDate: COMPATIBILITY_DATE,
      compatibilityFlags: ["nodejs_compat"],
      hyperdrives: { HYPERDRIVE: target.toString() },
      bindings: { SCHEMA: store.schema },
    });
    const migrated = await mf.dispatchFetch("http://api.test/migrate");
    assert.equal(migrated.status, 200, await migrated.text());
  });

  after(async () => {
    await mf?.dispose();
    await store?.dispose();
  });

  test("fresh, replay, reuse and a missing principal, with the rows in PostgreSQL", async () => {
    const first = await post("k1");
    const firstText = await first.text();
    assert.equal(first.status, 201, firstText);
    const replay = await post("k1");
    assert.equal(replay.status, 201);
    assert.equal(await replay.text(), firstText, "the stored answer, byte for byte");
    assert.equal(replay.headers.get("location"), first.headers.get("location"));
    const reused = await post("k1", { body: '{"sku":"B"}' });
    assert.equal(reused.status, 409);
    assert.equal(JSON.parse(await reused.text()).error, "idempotency_key_reused");
    const anonymous = await post("k2", { user: null });
    assert.equal(anonymous.status, 401);
    await anonymous.arrayBuffer();
    assert.equal(await orders(), 1, "one execution");
    const rows = (await store.admin.query(`SELECT key, status, principal FROM "${store.schema}".idempotency_keys`)).rows;
    assert.deepEqual(rows, [{ key: "k1", status: "completed", principal: "acct-1" }]);
  });

  test("10 concurrent duplicates of one key run it once", async () => {
    const before = await orders();
    const answers = await Promise.all(Array.from({ length: 10 }, () => post("race").then(async (r) => ({ status: r.status, text: await r.text() }))));
    const created = answers.filter((a) => a.status === 201);
    assert.ok(created.length >= 1, JSON.stringify(answers));
    assert.ok(answers.every((a) => a.status === 201 || a.status === 409), JSON.stringify(answers));
    assert.equal(new Set(created.map((a) => a.text)).size, 1, "every 201 is the same answer");
    assert.equal((await orders()) - before, 1, "exactly one execution");
  });

  test("transactional: the insert on the request's client commits with the answer; a handler that throws after it leaves nothing", async () => {
    const before = await orders();
    const send = (key, headers = {}) => mf.dispatchFetch("http://api.test/tx/orders", { method: "POST", headers: { "idempotency-key": key, "x-user": "acct-1", ...headers }, body: "{}" });
    const first = await send("tx-1");
    const text = await first.text();
    assert.equal(first.status, 201, text);
    const replay = await send("tx-1");
    assert.equal(await replay.text(), text);
    assert.equal((await orders()) - before, 1, "one order, committed with the answer");
    const failed = await send("tx-2", { "x-fail": "1" });
    await failed.arrayBuffer();
    assert.equal(failed.status, 500);
    assert.equal((await orders()) - before, 1, "the failed handler's insert was rolled back");
    const rows = (await store.admin.query(`SELECT key FROM "${store.schema}".idempotency_keys WHERE key LIKE 'tx-%'`)).rows;
    assert.deepEqual(rows, [{ key: "tx-1" }], "the failed one's key was released");
  });
});
