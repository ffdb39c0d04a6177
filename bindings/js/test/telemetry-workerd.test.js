// OpenTelemetry in a Worker, in real workerd (miniflare, offline) with a real
// local D1: test/fixtures/otel-worker.js registers the SDK's providers with
// in-memory exporters and imports the package's `opentelemetry` entry; it is
// bundled with esbuild as wrangler bundles a Worker (browser builds of the
// SDK, the core module kept as its own wasm module).
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { after, before, test } from "node:test";
import { startBundledWorker } from "./helpers/bundled-worker.js";

let mf;
const keyHash = (principal, key) => createHash("sha256").update(`${principal}\n${key}`, "utf8").digest("hex").slice(0, 16);

let close;
before(async () => {
  ({ mf, close } = await startBundledWorker("otel-worker"));
});

after(async () => {
  await close?.();
});

async function post(key, { body = '{"sku":"A"}', user = "acct-w", delay } = {}) {
  const headers = { "content-type": "application/json", "idempotency-key": key };
  if (user) headers["x-user"] = user;
  if (delay) headers["x-delay-ms"] = String(delay);
  const r = await mf.dispatchFetch("http://worker.test/orders", { method: "POST", headers, body });
  await r.arrayBuffer();
  return r.status;
}

test("a Worker on D1 records the counter, the ledger's time and the spans through the SDK", async () => {
  assert.equal(await post("warm"), 201);
  await (await mf.dispatchFetch("http://worker.test/__otel")).json(); // drop what the warm-up recorded
  assert.equal(await post("w1", { delay: 200 }), 201);
  assert.equal(await post("w1"), 201);
  assert.equal(await post("w1", { body: '{"sku":"B"}' }), 409);
  assert.equal(await post("w2", { user: null }), 401);
  const { metrics, spans } = await (await mf.dispatchFetch("http://worker.test/__otel")).json();

  const counted = metrics["idempotency.requests"].map((p) => [p.attributes, p.value, p.unit]);
  assert.deepEqual(
    counted,
    ["executed", "replayed", "key-reused", "principal-required"].map((outcome) => [
      { "idempotency.outcome": outcome, "http.request.method": "POST", "http.route": "/orders" },
      1,
      "{request}",
    ]),
  );
  const durations = Object.fromEntries(metrics["idempotency.ledger.duration"].map((p) => [p.attributes["idempotency.outcome"], p]));
  assert.deepEqual(Object.keys(durations).sort(), ["executed", "key-reused", "principal-required", "replayed"]);
  for (const p of Object.values(durations)) {
    assert.equal(p.unit, "s");
    assert.equal(p.value.count, 1);
  }
  // workerd's clock moves only across I/O: what is timed is the D1 batches; the mutation's 200 ms are left out.
  assert.ok(durations.executed.value.sum < 0.1, `the mutation's time is not the ledger's (${durations.executed.value.sum} s)`);

  assert.deepEqual(
    spans.map((s) => [s.name, s.attributes, s.status.code, s.kind]),
    [
      ["idempotency", { "idempotency.outcome": "executed", "idempotency.generation": 1, "idempotency.key_hash": keyHash("acct-w", "w1") }, 0, 0],
      ["idempotency", { "idempotency.outcome": "replayed" }, 0, 0],
      ["idempotency", { "idempotency.outcome": "key-reused" }, 0, 0],
      ["idempotency", { "idempotency.outcome": "principal-required" }, 0, 0],
    ],
  );
});
