// The test kit itself (@idempotency/ledger/testing): the clock, the
// duplicates helper, the in-memory ledger's records. How a user applies it
// is examples/testing/orders.test.js.
import assert from "node:assert/strict";
import { test } from "node:test";
import { idempotentFunction, RejectedError } from "../src/node.js";
import { createTestLedger, fireDuplicates, listen, TEST_EPOCH, testClock } from "../src/testing.js";
import { idempotentHandler } from "../src/node.js";

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

test("testClock: starts at the epoch given, runs with real time unless frozen, jumps forward", async () => {
  const frozen = testClock({ frozen: true });
  assert.equal(frozen.now(), TEST_EPOCH);
  await sleep(20);
  assert.equal(frozen.now(), TEST_EPOCH, "frozen");
  assert.equal(frozen.advance(30_001), TEST_EPOCH + 30_001);
  assert.equal(frozen.set(5), 5);
  assert.equal(frozen.now(), 5);
  const running = testClock({ start: 1_000 });
  await sleep(25);
  const t = running.now();
  assert.ok(t >= 1_020 && t < 2_000, `runs with real time (${t})`);
  assert.ok(Number.isSafeInteger(t));
  assert.throws(() => running.advance(-1), TypeError);
});

test("fireDuplicates: every call starts before any finishes; results in order, a throw in its place", async () => {
  let started = 0;
  let finishedBeforeAllStarted = false;
  const results = await fireDuplicates(6, async (i) => {
    started += 1;
    await sleep(10);
    if (started < 6) finishedBeforeAllStarted = true;
    if (i === 3) throw new Error("three");
    return i * 10;
  });
  assert.equal(finishedBeforeAllStarted, false);
  assert.deepEqual(results.slice(0, 3), [0, 10, 20]);
  assert.ok(results[3] instanceof Error && results[3].message === "three");
  assert.deepEqual(results.slice(4), [40, 50]);
  await assert.rejects(fireDuplicates(0, () => 1), TypeError);
});

test("createTestLedger: outcomes and the core's log lines recorded (not printed); rows; idempotent functions on it", async () => {
  const kit = createTestLedger({ principal: () => "acct-1", route: "/jobs" });
  const charge = idempotentFunction(async (id) => ({ charged: id }), { ...kit.options, principal: "billing", key: (id) => id, name: "charge" });
  const duplicates = await fireDuplicates(4, () => charge("o-1"));
  assert.equal(duplicates.filter((r) => r instanceof RejectedError && r.outcome === "in-progress").length, 3);
  assert.deepEqual(await charge("o-1"), { charged: "o-1" });
  assert.equal(kit.count("executed"), 1);
  assert.equal(kit.count("in-progress"), 3);
  assert.equal(kit.count("replayed"), 1);
  assert.equal(kit.rows().length, 1);
  assert.equal(kit.row("billing", "o-1").status, "completed");

  const server = await listen(idempotentHandler(kit.options, (req, res) => res.writeHead(201).end("ok")));
  try {
    kit.close(); // the database goes away: the core's 500, and its log line
    const r = await fetch(`${server.url}/jobs`, { method: "POST", headers: { "idempotency-key": "k1" }, body: "{}" });
    assert.equal(r.status, 500);
    assert.equal(kit.outcomes.at(-1), "ledger-failed");
    assert.ok(kit.logs.some((l) => l.level === "error" && /database connection is not open/.test(l.message)), JSON.stringify(kit.logs));
  } finally {
    await server.close();
  }
});

test("createTestLedger with transactional: the handler's transaction is on the kit's Database; a rolled-back write is gone", async () => {
  const kit = createTestLedger({ principal: () => "acct-1", transactional: true });
  kit.db.exec("CREATE TABLE orders (id TEXT PRIMARY KEY)");
  const server = await listen(
    idempotentHandler(kit.options, (req, res) => {
      assert.equal(req.idempotency.transaction.db, kit.db);
      req.idempotency.transaction.db.prepare("INSERT INTO orders (id) VALUES (?)").run(req.headers["idempotency-key"]);
      if (req.headers["x-fail"]) throw new Error("refused");
      res.writeHead(201).end("ok");
    }),
  );
  try {
    const send = (key, headers = {}) => fetch(`${server.url}/orders`, { method: "POST", headers: { "idempotency-key": key, ...headers }, body: "{}" });
    assert.equal((await send("a")).status, 201);
    assert.equal((await send("a")).status, 201);
    assert.equal((await send("b", { "x-fail": "1" })).status, 500);
    assert.deepEqual(kit.db.prepare("SELECT id FROM orders").all(), [{ id: "a" }]);
    assert.deepEqual(kit.outcomes, ["executed", "replayed", "released"]);
  } finally {
    await server.close();
    kit.close();
  }
});
