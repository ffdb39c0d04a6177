// The example Worker exactly as deployed (examples/worker/src/index.js), in
// workerd with a persisted local D1: the data survives a restart.
import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, test } from "node:test";
import { schemaStatements } from "../src/node.js";
import { PACKAGE_ROOT, migrationStatements, startWorker } from "./helpers/workerd.js";

const persist = mkdtempSync(join(tmpdir(), "idem-example-d1-"));
after(() => rmSync(persist, { recursive: true, force: true }));
const script = join(PACKAGE_ROOT, "examples/worker/src/index.js");

async function post(mf, key, body, token = "tok-a") {
  const response = await mf.dispatchFetch("http://orders.test/orders", {
    method: "POST",
    headers: { authorization: `Bearer ${token}`, "idempotency-key": key, "content-type": "application/json" },
    body,
  });
  return { status: response.status, text: await response.text(), location: response.headers.get("location") };
}

test("POST /orders is idempotent across a workerd restart on the persisted D1", async () => {
  let { mf } = await startWorker({ scriptPath: script, persist });
  const first = await post(mf, "order-7f3a", '{"sku":"A-1","qty":2}');
  assert.equal(first.status, 201);
  assert.match(first.location, /^\/orders\/ord_/);
  const replay = await post(mf, "order-7f3a", '{"sku":"A-1","qty":2}');
  assert.deepEqual(replay, first);
  const unauthenticated = await mf.dispatchFetch("http://orders.test/orders", { method: "POST", body: "{}" });
  assert.equal(unauthenticated.status, 401);
  await mf.dispose();

  ({ mf } = await startWorker({ scriptPath: script, persist }));
  try {
    const afterRestart = await post(mf, "order-7f3a", '{"sku":"A-1","qty":2}');
    assert.deepEqual(afterRestart, first, "the stored response survived the restart");
    const reused = await post(mf, "order-7f3a", '{"sku":"A-1","qty":3}');
    assert.equal(reused.status, 409);
    const list = await mf.dispatchFetch("http://orders.test/orders", { headers: { authorization: "Bearer tok-a" } });
    const { orders } = await list.json();
    assert.equal(orders.length, 1, "one order for two POSTs, a restart and a replay");
    const invalid = await post(mf, "order-bad-json", "{not json");
    assert.equal(invalid.status, 422);
  } finally {
    await mf.dispose();
  }
});

test("the migration files for wrangler d1 migrations are the component's schema", () => {
  for (const file of ["migrations/0001_idempotency_keys.sql", "examples/worker/migrations/0001_idempotency_keys.sql"]) {
    assert.deepEqual(migrationStatements(join(PACKAGE_ROOT, file)), schemaStatements(), file);
  }
  const toml = readFileSync(join(PACKAGE_ROOT, "examples/worker/wrangler.toml"), "utf8");
  assert.match(toml, /\[\[d1_databases\]\][\s\S]*binding = "DB"[\s\S]*migrations_dir = "migrations"/);
});
