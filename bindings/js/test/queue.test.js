// idempotentQueueConsumer in real workerd (miniflare, offline) with a real
// local D1 and miniflare's queues: messages sent through a producer binding
// and delivered by miniflare's queue broker to the Worker's queue() handler
// (test/fixtures/queue-worker.js), and the same message delivered twice
// through the Worker's queue() entry (what the broker calls), to see what
// the consumer acked and retried.
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { Miniflare } from "miniflare";
import { schemaStatements } from "../src/node.js";
import { COMPATIBILITY_DATE, PACKAGE_ROOT, workerModules } from "./helpers/workerd.js";

let mf;
let worker;
const persist = mkdtempSync(join(tmpdir(), "idem-queue-d1-"));

before(async () => {
  mf = new Miniflare({
    cf: false,
    modules: workerModules(join(PACKAGE_ROOT, "test/fixtures/queue-worker.js")),
    modulesRoot: PACKAGE_ROOT,
    compatibilityDate: COMPATIBILITY_DATE,
    d1Databases: { DB: "queue-ledger" },
    d1Persist: persist,
    queueProducers: { ORDERS: "orders", JOBS: "jobs" },
    queueConsumers: {
      orders: { maxBatchSize: 10, maxBatchTimeout: 1, maxRetries: 5 },
      jobs: { maxBatchSize: 10, maxBatchTimeout: 1, maxRetries: 5 },
    },
  });
  await mf.ready;
  const db = await mf.getD1Database("DB");
  await db.batch([
    ...schemaStatements("sqlite").map((sql) => db.prepare(sql)),
    db.prepare("CREATE TABLE charges (id TEXT PRIMARY KEY, order_id TEXT NOT NULL, amount INTEGER NOT NULL, message_id TEXT NOT NULL, attempt INTEGER NOT NULL)"),
  ]);
  worker = await mf.getWorker();
});

after(async () => {
  await mf?.dispose();
  rmSync(persist, { recursive: true, force: true });
});

const state = async () => (await mf.dispatchFetch("http://queue.test/state")).json();

async function send(queue, bodies) {
  const r = await mf.dispatchFetch(`http://queue.test/send?queue=${queue}`, { method: "POST", body: JSON.stringify(bodies) });
  assert.equal(r.status, 204);
}

/** Polls the fixture's state until `done(state)` holds (at most `ms`). */
async function until(done, what, ms = 20_000) {
  const deadline = Date.now() + ms;
  for (;;) {
    const s = await state();
    if (done(s)) return s;
    if (Date.now() > deadline) assert.fail(`timed out waiting for ${what}: ${JSON.stringify(s)}`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

let serial = 0;
const message = (body, id = `msg-${++serial}`) => ({ id, timestamp: new Date(), body, attempts: 1 });

test("through miniflare's queues: two messages with one order id charge once, both acked", async () => {
  await send("orders", [
    { orderId: "o-1", amount: 100 },
    { orderId: "o-1", amount: 100 },
    { orderId: "o-2", amount: 250 },
  ]);
  const s = await until((x) => x.deliveries.filter((d) => d.queue === "orders").length >= 3, "three deliveries");
  const seen = s.deliveries.filter((d) => d.queue === "orders");
  assert.deepEqual(
    seen.map((d) => [d.orderId, d.outcome, d.ack]),
    [
      ["o-1", "executed", true],
      ["o-1", "replayed", true],
      ["o-2", "executed", true],
    ],
  );
  assert.notEqual(seen[0].id, seen[1].id, "two messages (two ids), one order");
  assert.deepEqual(
    s.charges.filter((c) => c.order_id.startsWith("o-")).map((c) => c.order_id),
    ["o-1", "o-2"],
    "one charge per order",
  );
});

test("through miniflare's queues: a handler that throws is retried after the pending TTL and taken over", async () => {
  await send("jobs", [{ orderId: "j-1", failUntil: 2 }]);
  const s = await until((x) => x.deliveries.some((d) => d.orderId === "j-1" && d.ack), "the retried delivery");
  const seen = s.deliveries.filter((d) => d.orderId === "j-1");
  assert.deepEqual(
    seen.map((d) => [d.attempts, d.outcome, d.ack, d.delaySeconds]),
    [
      [1, "abandoned", false, 2],
      [2, "taken-over", true, null],
    ],
  );
  assert.equal(seen[0].id, seen[1].id, "the same message, redelivered");
  assert.deepEqual(
    s.charges.filter((c) => c.order_id === "j-1").map((c) => c.attempt),
    [2],
  );
});

test("the same message delivered twice: the second is a replay, acked, and the handler ran once", async () => {
  const m = message({ orderId: "d-1", amount: 7 });
  const first = await worker.queue("jobs", [m]);
  assert.equal(first.outcome, "ok");
  assert.deepEqual(first.explicitAcks, [m.id]);
  assert.deepEqual(first.retryMessages, []);
  const second = await worker.queue("jobs", [{ ...m, attempts: 2 }]);
  assert.deepEqual(second.explicitAcks, [m.id]);
  const s = await state();
  assert.deepEqual(
    s.deliveries.filter((d) => d.id === m.id).map((d) => d.outcome),
    ["executed", "replayed"],
  );
  assert.equal(s.charges.filter((c) => c.order_id === "d-1").length, 1);
});

test("two deliveries at once: one runs, the other is retried when the pending row can be taken over", async () => {
  const m = message({ orderId: "c-1", delayMs: 600 });
  const [a, b] = await Promise.all([worker.queue("jobs", [m]), worker.queue("jobs", [m])]);
  const acked = [a, b].filter((r) => r.explicitAcks.includes(m.id));
  const retried = [a, b].filter((r) => r.retryMessages.length > 0);
  assert.equal(acked.length, 1, JSON.stringify([a, b]));
  assert.equal(retried.length, 1);
  const [retry] = retried[0].retryMessages;
  assert.equal(retry.msgId, m.id);
  assert.equal(retry.delaySeconds, 2, "the core's Retry-After: the time left until a takeover (TTL 2 s)");
  const s = await state();
  assert.deepEqual(
    s.deliveries.filter((d) => d.id === m.id).map((d) => d.outcome).sort(),
    ["executed", "in-progress"],
  );
  assert.equal(s.charges.filter((c) => c.order_id === "c-1").length, 1);
});

test("transactional: the charge commits with the stored result; a handler that throws after registering it charges nothing and is retried at once", async () => {
  const m = message({ orderId: "t-1", amount: 3 });
  const first = await worker.queue("txjobs", [m]);
  assert.deepEqual(first.explicitAcks, [m.id]);
  const again = await worker.queue("txjobs", [{ ...m, attempts: 2 }]);
  assert.deepEqual(again.explicitAcks, [m.id]);
  const failing = message({ orderId: "t-2", failUntil: 2 });
  const failed = await worker.queue("txjobs", [failing]);
  assert.deepEqual(failed.explicitAcks, []);
  assert.deepEqual(failed.retryMessages.map((r) => [r.msgId, r.delaySeconds]), [[failing.id, undefined]], "released: retried at once");
  const retried = await worker.queue("txjobs", [{ ...failing, attempts: 2 }]);
  assert.deepEqual(retried.explicitAcks, [failing.id]);
  const s = await state();
  assert.deepEqual(
    s.deliveries.filter((d) => d.queue === "txjobs").map((d) => [d.orderId, d.outcome, d.ack]),
    [
      ["t-1", "executed", true],
      ["t-1", "replayed", true],
      ["t-2", "released", false],
      ["t-2", "executed", true],
    ],
  );
  assert.deepEqual(s.charges.filter((c) => c.order_id.startsWith("t-")).map((c) => [c.order_id, c.attempt]), [["t-1", 1], ["t-2", 2]], "the failed attempt's charge never committed");
});
