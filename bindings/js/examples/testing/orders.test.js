// How to test your own protected handlers with @idempotency/ledger/testing
// (README "Testing your handlers"; run by `make -C bindings/js test`).
// The app under test: POST /orders creates an order, protected per route.
import assert from "node:assert/strict";
import { test } from "node:test";
import express from "express";
import { Hono } from "hono";
import { idempotency } from "@idempotency/ledger/hono";
import { idempotency as expressIdempotency } from "@idempotency/ledger/express";
import { createTestLedger, fireDuplicates, listen } from "@idempotency/ledger/testing";

/** Your app, built around the ledger options it is given (in production: a file or PostgreSQL). */
function ordersApp(ledgerOptions, { failFirst = false } = {}) {
  const orders = [];
  let failures = failFirst ? 1 : 0;
  const app = new Hono();
  app.post("/orders", idempotency(ledgerOptions), async (c) => {
    const order = await c.req.json();
    await new Promise((resolve) => setTimeout(resolve, 50)); // some real work
    if (failures > 0) {
      failures -= 1;
      throw new Error("the payment provider timed out");
    }
    orders.push(order);
    return c.json({ id: `ord_${orders.length}`, ...order }, 201);
  });
  app.onError((error, c) => c.json({ error: error.message }, 502));
  return { app, orders };
}

const post = (key, body = { sku: "A-1", qty: 2 }) => ({
  method: "POST",
  headers: { "idempotency-key": key, "content-type": "application/json", authorization: "Bearer acct-1" },
  body: JSON.stringify(body),
});

test("ten concurrent duplicates create one order, and every caller gets its answer", async () => {
  const ledger = createTestLedger({ principal: (c) => c.req.header("authorization"), waitMs: 2_000 });
  const { app, orders } = ordersApp(ledger.options);

  const responses = await fireDuplicates(10, () => app.request("/orders", post("order-1")));

  assert.deepEqual(responses.map((r) => r.status), Array(10).fill(201));
  const bodies = await Promise.all(responses.map((r) => r.json()));
  assert.ok(bodies.every((b) => b.id === "ord_1"));
  assert.equal(orders.length, 1);
  assert.equal(ledger.count("executed"), 1);
  assert.equal(ledger.count("replayed-after-wait"), 9);
});

test("without waitMs a duplicate in flight gets 409 and Retry-After", async () => {
  const ledger = createTestLedger({ principal: (c) => c.req.header("authorization") });
  const { app, orders } = ordersApp(ledger.options);
  const [first, second] = await fireDuplicates(2, () => app.request("/orders", post("order-2")));
  const statuses = [first.status, second.status].sort();
  assert.deepEqual(statuses, [201, 409]);
  const conflict = first.status === 409 ? first : second;
  assert.equal(conflict.headers.get("retry-after"), "1");
  assert.equal(orders.length, 1);
});

test("a crashed handler keeps the key until the pending TTL; past it, the retry takes over", async () => {
  const ledger = createTestLedger({ principal: (c) => c.req.header("authorization"), pendingTtlMs: 30_000 });
  const { app, orders } = ordersApp(ledger.options, { failFirst: true });

  assert.equal((await app.request("/orders", post("order-3"))).status, 502);
  assert.equal((await app.request("/orders", post("order-3"))).status, 409, "still in progress");

  ledger.clock.advance(30_001);
  const retry = await app.request("/orders", post("order-3"));
  assert.equal(retry.status, 201);
  assert.equal(orders.length, 1);
  assert.deepEqual(ledger.outcomes, ["abandoned", "in-progress", "taken-over"]);
  assert.equal(ledger.row("Bearer acct-1", "order-3").generation, 2);
});

test("past the retention and a sweep, the same key is a new request", async () => {
  const ledger = createTestLedger({ principal: (c) => c.req.header("authorization"), retentionMs: 60_000 });
  const { app, orders } = ordersApp(ledger.options);
  assert.equal((await app.request("/orders", post("order-4"))).status, 201);
  assert.equal((await app.request("/orders", post("order-4"))).status, 201, "a replay");
  assert.equal(orders.length, 1);

  ledger.clock.advance(60_001);
  assert.equal(await ledger.sweep(), 1);
  assert.equal((await app.request("/orders", post("order-4"))).status, 201);
  assert.equal(orders.length, 2, "the swept key ran again");
});

test("an Express app over loopback HTTP", async () => {
  const ledger = createTestLedger({ principal: (req) => req.get("authorization"), waitMs: 2_000 });
  const created = [];
  const app = express();
  app.post("/orders", expressIdempotency(ledger.options), express.json(), (req, res) => {
    created.push(req.body);
    setTimeout(() => res.status(201).json({ id: `ord_${created.length}` }), 50);
  });
  const server = await listen(app);
  try {
    const responses = await fireDuplicates(5, () => fetch(`${server.url}/orders`, post("order-5")));
    assert.deepEqual(responses.map((r) => r.status), [201, 201, 201, 201, 201]);
    assert.equal(created.length, 1);
  } finally {
    await server.close();
  }
});
