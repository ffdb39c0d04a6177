// 50 concurrent same-key requests into one workerd isolate (one component
// instance shared by every request), with a real local D1.
import assert from "node:assert/strict";
import { test } from "node:test";
import { startHarness } from "./helpers/harness.js";
import { order, orderCount, send, stats, uniqueKey } from "./helpers/http.js";

const { mf, db } = await startHarness();

test("50 concurrent same-key requests: exactly one mutation, the rest replays or 409 in-progress", async (t) => {
  const key = uniqueKey("same");
  const sku = uniqueKey("sku");
  const body = order(sku, 3);
  const requests = Array.from({ length: 50 }, (_, i) =>
    send(mf, { key, body, id: `${key}-${i}`, headers: { "x-test-delay-ms": "300" } }),
  );
  // Interleave requests with their own keys: none may get another's answer.
  const others = Array.from({ length: 20 }, (_, i) => {
    const otherSku = `${sku}-other-${i}`;
    return send(mf, { key: `${key}-other-${i}`, body: order(otherSku, i + 1), id: `${key}-other-${i}` }).then((r) => ({ r, otherSku, qty: i + 1 }));
  });
  const responses = await Promise.all(requests);
  const otherResponses = await Promise.all(others);

  assert.equal(await orderCount(db, sku), 1, "the mutation ran exactly once");
  let started = 0;
  for (const r of responses) started += (await stats(mf, r.id)).mutationsStarted;
  assert.equal(started, 1, "exactly one request executed");

  const created = responses.filter((r) => r.status === 201);
  const inProgress = responses.filter((r) => r.status === 409);
  assert.equal(created.length + inProgress.length, 50, `unexpected statuses: ${responses.map((r) => r.status)}`);
  assert.ok(created.length >= 1);
  t.diagnostic(`same key: ${created.length} x 201 (1 executed, ${created.length - 1} replayed), ${inProgress.length} x 409 in-progress`);
  const stored = await db.prepare("SELECT response_body FROM orders o JOIN idempotency_keys k ON k.key = ? WHERE o.sku = ?").bind(key, sku).first();
  for (const r of created) {
    assert.equal(r.text, stored.response_body, "every 201 is the one stored response");
    assert.equal(r.json.sku, sku);
    assert.equal(r.json.qty, 3);
  }
  for (const r of inProgress) {
    assert.equal(r.json.error, "idempotency_key_in_progress");
    assert.equal(r.json.retry_after_ms, 1000, "the default hint (in-progress-retry-ms), well under the time left until takeover");
    assert.equal(r.headers.get("retry-after"), "1");
  }
  for (const { r, otherSku, qty } of otherResponses) {
    assert.equal(r.status, 201);
    assert.equal(r.json.sku, otherSku, "no response crossed over between concurrent requests");
    assert.equal(r.json.qty, qty);
    assert.equal(await orderCount(db, otherSku), 1);
  }

  // Once completed, another 50 concurrent retries all replay the same answer.
  const replays = await Promise.all(Array.from({ length: 50 }, (_, i) => send(mf, { key, body, id: `${key}-replay-${i}` })));
  for (const r of replays) {
    assert.equal(r.status, 201);
    assert.equal(r.text, stored.response_body);
  }
  assert.equal(await orderCount(db, sku), 1);
});

test("50 concurrent requests with distinct keys and bodies each get their own response", async () => {
  const base = uniqueKey("distinct");
  const responses = await Promise.all(
    Array.from({ length: 50 }, (_, i) => send(mf, { key: `${base}-${i}`, body: order(`${base}-sku-${i}`, i + 1), headers: { "x-test-delay-ms": String(i % 5) } })),
  );
  const ids = new Set();
  responses.forEach((r, i) => {
    assert.equal(r.status, 201);
    assert.equal(r.json.sku, `${base}-sku-${i}`);
    assert.equal(r.json.qty, i + 1);
    ids.add(r.json.id);
  });
  assert.equal(ids.size, 50);
  for (let i = 0; i < 50; i++) assert.equal(await orderCount(db, `${base}-sku-${i}`), 1);
});
