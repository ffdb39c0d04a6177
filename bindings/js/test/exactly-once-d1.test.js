// Exactly once on D1, in real workerd with a real local D1 (miniflare):
// D1 has no interactive transactions, so a transactional handler registers
// its prepared statements and the package runs them after the core's fenced
// completion in ONE db.batch() (test/fixtures/exactly-once-worker.js, the
// Workers function and the Hono middleware). The fence is made to fire for
// real: a handler stalls past the TTL with lease renewal off, another request
// takes its key over and completes, and the stalled owner's batch aborts:
// none of its statements committed, and its caller gets the new owner's
// stored answer. With renewal on (timers in workerd), the live owner keeps
// its key.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { startBundledWorker } from "./helpers/bundled-worker.js";

let mf;
let close;
before(async () => {
  let db;
  ({ mf, db, close } = await startBundledWorker("exactly-once-worker"));
  await db.prepare("CREATE TABLE tx_orders (id TEXT PRIMARY KEY, owner TEXT NOT NULL)").run();
});
after(async () => {
  await close?.();
});

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
let n = 0;
async function post(path, { key, owner, delayMs = 0, renewal = "on", bad = false }) {
  const id = `${owner}-${++n}`;
  const headers = { "idempotency-key": key, "content-type": "application/json", "x-owner": owner, "x-delay-ms": String(delayMs), "x-test-id": id, "x-renewal": renewal };
  if (bad) headers["x-bad-statement"] = "1";
  const r = await mf.dispatchFetch(`http://orders.test${path}`, { method: "POST", headers, body: "{}" });
  return { id, status: r.status, text: await r.text() };
}
const seen = async (id) => (await mf.dispatchFetch(`http://orders.test/__seen?id=${encodeURIComponent(id)}`)).json();
const orders = async () => (await mf.dispatchFetch("http://orders.test/__orders")).json();

for (const path of ["/fn/orders", "/hono/orders"]) {
  describe(`transactional on D1 (${path})`, () => {
    test("the handler's statements commit in the completion's batch; a replay runs none", async () => {
      const key = `plain-${path}`;
      const before_ = await orders();
      const first = await post(path, { key, owner: `plain${path}` });
      assert.equal(first.status, 201, first.text);
      assert.equal((await post(path, { key, owner: `plain${path}` })).text, first.text, "replayed");
      assert.deepEqual((await orders()).length, before_.length + 1);
      assert.ok((await orders()).includes(`plain${path}`));
      assert.deepEqual((await seen(first.id)).outcomes, ["executed"]);
    });

    test("the fence fires: an owner taken over between its handler and its completion commits none of its statements, and its caller gets the new owner's answer", async () => {
      const key = `fence-${path}`;
      const stalled = post(path, { key, owner: `A${path}`, delayMs: 1200, renewal: "off" });
      await sleep(600); // past the 300 ms TTL; the stalled owner does not renew
      const takeover = await post(path, { key, owner: `B${path}` });
      assert.equal(takeover.status, 201, takeover.text);
      const a = await stalled;
      const sawA = await seen(a.id);
      assert.equal(sawA.added, 1, "the stalled handler registered its statement");
      assert.deepEqual(sawA.outcomes, ["fenced-out"]);
      assert.ok(sawA.lines.some((line) => line.includes("fenced out")), "the core's fenced-out line");
      assert.deepEqual((await seen(takeover.id)).outcomes, ["taken-over"]);
      assert.deepEqual([a.status, a.text], [201, takeover.text], "the stored answer of the new owner, never one for statements that did not commit");
      const owners = await orders();
      assert.ok(owners.includes(`B${path}`), "the new owner's statement committed");
      assert.ok(!owners.includes(`A${path}`), "the fenced batch aborted before the stalled owner's statement committed");
    });

    test("with renewal on, a live owner past the TTL keeps its key (renewed from workerd's timers): the duplicate is in progress, one order", async () => {
      const key = `renew-${path}`;
      const live = post(path, { key, owner: `L${path}`, delayMs: 1200 });
      await sleep(600);
      const duplicate = await post(path, { key, owner: `D${path}` });
      assert.equal(duplicate.status, 409, duplicate.text);
      const l = await live;
      assert.equal(l.status, 201, l.text);
      assert.deepEqual((await seen(l.id)).outcomes, ["executed"]);
      assert.equal((await seen(l.id)).aborted, null);
      const owners = await orders();
      assert.ok(owners.includes(`L${path}`) && !owners.includes(`D${path}`));
    });

    test("a statement of the handler that fails aborts the whole batch: nothing commits, the answer is the core's 503, and the key is released", async () => {
      const key = `bad-${path}`;
      const failed = await post(path, { key, owner: `X${path}`, bad: true });
      assert.equal(failed.status, 503, failed.text);
      assert.equal(JSON.parse(failed.text).error, "idempotency_rolled_back");
      assert.deepEqual((await seen(failed.id)).outcomes, ["rolled-back"]);
      assert.ok(!(await orders()).includes(`X${path}`), "the valid statement before it did not commit either");
      const retried = await post(path, { key, owner: `Y${path}` });
      assert.equal(retried.status, 201, "released: the retry runs at once");
      assert.ok((await orders()).includes(`Y${path}`));
    });
  });
}
