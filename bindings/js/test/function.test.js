// idempotentFunction on Node: a plain async function at most once per key,
// on better-sqlite3 files and (with IDEMPOTENCY_PG_URL) on PostgreSQL. The
// synthetic request is checked byte for byte against the rows the core
// wrote: the fingerprint is SHA-256 over the documented head and the
// canonical JSON of the payload, the stored body the canonical JSON of the
// result.
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { after, describe, test } from "node:test";
import { canonicalJson, idempotentFunction, ledgerFor, migrate, NothingChangedError, RejectedError } from "../src/node.js";
import { freshSchema, pgRows, SKIP_PG } from "./helpers/pg.js";
import { freshDb, rows } from "./helpers/sqlite.js";

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const quiet = { error() {}, warn() {}, info() {} };
/** The fingerprint README documents for a call of `name` with `payload`. */
const fingerprintOf = (name, payload) =>
  createHash("sha256").update(`POST\n/functions/${name}\ncontent-type:application/json\nx-api-version:\n`).update(canonicalJson(payload), "utf8").digest("hex");

/** A charge function counting its runs, over `db`. */
function charges(db, extra = {}) {
  const runs = [];
  const charge = idempotentFunction(
    async (order, attempt = 1) => {
      runs.push({ order, attempt });
      if (order.delayMs) await sleep(order.delayMs);
      if (order.fail) throw new Error(`card declined (${order.id})`);
      if (order.nothing) throw new NothingChangedError("not yet", { value: { skipped: order.id } });
      return { chargeId: `ch_${order.id}`, amount: order.amount, at: undefined, tags: new Set(order.tags ?? []).size };
    },
    { db, principal: "billing", key: (order) => order.id, payload: (order) => order, logger: quiet, name: "charge", ...extra },
  );
  return { charge, runs };
}

describe("better-sqlite3", () => {
  test("runs once per key; the replay is the stored JSON; the rows are the documented synthetic request", async () => {
    const db = freshDb();
    const { charge, runs } = charges(db);
    const first = await charge({ id: "o-1", amount: 1250, currency: "EUR" });
    assert.deepEqual(first, { chargeId: "ch_o-1", amount: 1250, at: undefined, tags: 0 }, "the function's own value");
    const again = await charge({ currency: "EUR", amount: 1250, id: "o-1" }, 2);
    assert.deepEqual(again, { amount: 1250, chargeId: "ch_o-1", tags: 0 }, "the stored result (undefined members are not JSON)");
    assert.equal(runs.length, 1, "members in another order are the same payload: a replay");
    const [row] = rows(db);
    assert.equal(row.principal, "billing");
    assert.equal(row.key, "o-1");
    assert.equal(row.status, "completed");
    assert.equal(row.fingerprint, fingerprintOf("charge", { id: "o-1", amount: 1250, currency: "EUR" }));
    assert.equal(row.response_status, 200);
    assert.equal(row.response_body, '{"amount":1250,"chargeId":"ch_o-1","tags":0}');
    assert.equal(row.response_headers, '{"content-type":"application/json"}');
  });

  test("the key reused with another payload, no principal, an invalid key: RejectedError with the core's outcome", async () => {
    const db = freshDb();
    const { charge, runs } = charges(db);
    await charge({ id: "o-2", amount: 1 });
    await assert.rejects(charge({ id: "o-2", amount: 2 }), (e) => e instanceof RejectedError && e.outcome === "key-reused" && e.reason === "key-reused" && e.status === 409);
    const anonymous = idempotentFunction(async () => "ran", { db, principal: () => undefined, key: () => "k", name: "anon", logger: quiet });
    await assert.rejects(anonymous(), (e) => e instanceof RejectedError && e.outcome === "principal-required" && e.status === 401);
    await assert.rejects(charge({ id: "caf\u00e9" }), (e) => e instanceof RejectedError && e.outcome === "key-invalid" && e.status === 400);
    assert.equal(runs.length, 1);
  });

  test("concurrent duplicates: one runs; the others get in-progress (with Retry-After) or, with waitMs, its result", async () => {
    const db = freshDb();
    const { charge, runs } = charges(db);
    const settled = await Promise.allSettled(Array.from({ length: 8 }, () => charge({ id: "o-3", amount: 5, delayMs: 150 })));
    assert.equal(runs.length, 1);
    assert.equal(settled.filter((s) => s.status === "fulfilled").length, 1);
    for (const s of settled.filter((x) => x.status === "rejected")) {
      assert.ok(s.reason instanceof RejectedError && s.reason.outcome === "in-progress", String(s.reason));
      assert.equal(s.reason.retryAfterSeconds, 1);
    }
    const waiting = charges(freshDb(), { waitMs: 5000 });
    const values = await Promise.all(Array.from({ length: 8 }, () => waiting.charge({ id: "o-4", amount: 7, delayMs: 150 })));
    assert.equal(waiting.runs.length, 1);
    for (const v of values) assert.equal(v.chargeId, "ch_o-4");
  });

  test("a function that throws: rethrown, its key pending until the TTL, then taken over; NothingChangedError releases and returns its value", async () => {
    let now = 1_900_000_000_000;
    let failing = true;
    const outcomes = [];
    const runs = [];
    const db = freshDb();
    const charge = idempotentFunction(
      async (order) => {
        runs.push(order.id);
        if (failing) throw new Error(`card declined (${order.id})`);
        return { ok: order.id };
      },
      { db, principal: "billing", key: (o) => o.id, payload: (o) => o, now: () => now, logger: quiet, onOutcome: (o) => outcomes.push(o), name: "charge" },
    );
    await assert.rejects(charge({ id: "o-5" }), /card declined \(o-5\)/);
    assert.equal(rows(db)[0].status, "pending");
    await assert.rejects(charge({ id: "o-5" }), (e) => e instanceof RejectedError && e.outcome === "in-progress" && e.retryAfterSeconds === 1);
    now += 30_001;
    failing = false;
    assert.deepEqual(await charge({ id: "o-5" }), { ok: "o-5" });
    assert.deepEqual(outcomes, ["abandoned", "in-progress", "taken-over"]);
    assert.equal(runs.length, 2);
    assert.equal(rows(db)[0].status, "completed");
    assert.equal(rows(db)[0].generation, 2);

    const released = charges(freshDb());
    assert.deepEqual(await released.charge({ id: "o-6", nothing: true }), { skipped: "o-6" });
    assert.deepEqual(await released.charge({ id: "o-6", nothing: true }), { skipped: "o-6" });
    assert.equal(released.runs.length, 2, "released: the next call runs again");
  });

  test("a result that is not JSON is the function's failure; a result over the body cap is refused", async () => {
    const db = freshDb();
    const bad = idempotentFunction(async () => new Map([["a", 1]]), { db, principal: "p", key: () => "m1", name: "bad", logger: quiet });
    await assert.rejects(bad(), /a Map is not JSON/);
    const big = idempotentFunction(async () => "x".repeat(20_000), { db, principal: "p", key: () => "b1", name: "big", logger: quiet });
    await assert.rejects(big(), (e) => e instanceof RejectedError && e.status === 500 && e.outcome === "executed", "it ran; the core stored its 500");
  });

  test("name, this, the default payload (the arguments array) and a ledger given directly", async () => {
    const db = freshDb();
    const ledger = ledgerFor(db, { logger: quiet });
    const target = {
      factor: 3,
      times: idempotentFunction(
        async function times(x, y) {
          return { product: x * y * this.factor };
        },
        { ledger, principal: (x) => `p${x}`, key: (x, y) => `${x}x${y}` },
      ),
    };
    assert.equal(target.times.name, "times");
    assert.deepEqual(await target.times(2, 5), { product: 30 });
    const [row] = rows(db);
    assert.equal(row.principal, "p2");
    assert.equal(row.fingerprint, createHash("sha256").update("POST\n/functions/times\ncontent-type:application/json\nx-api-version:\n[2,5]").digest("hex"));
    assert.throws(() => idempotentFunction(async () => 1, { db, principal: "p", key: () => "k" }), /options\.name/);
    assert.throws(() => idempotentFunction(async function f() {}, { db, principal: "p" }), /options\.key/);
  });
});

describe("PostgreSQL", { skip: SKIP_PG }, () => {
  const handles = [];
  after(async () => {
    for (const h of handles) await h.dispose();
  });

  test("runs once per key, concurrent duplicates included; the rows as on SQLite", async () => {
    const store = await freshSchema({ max: 4 });
    handles.push(store);
    await migrate(store.pool);
    const { charge, runs } = charges(store.pool, { waitMs: 5000 });
    const values = await Promise.all(Array.from({ length: 6 }, () => charge({ id: "pg-1", amount: 42, delayMs: 100 })));
    for (const v of values) assert.equal(v.chargeId, "ch_pg-1");
    assert.equal(runs.length, 1);
    assert.deepEqual(await charge({ delayMs: 100, amount: 42, id: "pg-1" }), { amount: 42, chargeId: "ch_pg-1", tags: 0 });
    await assert.rejects(charge({ id: "pg-1", amount: 43 }), (e) => e instanceof RejectedError && e.outcome === "key-reused");
    const [row] = await pgRows(store.pool);
    assert.equal(row.status, "completed");
    assert.equal(row.fingerprint, fingerprintOf("charge", { id: "pg-1", amount: 42, delayMs: 100 }));
    assert.equal(row.response_body, '{"amount":42,"chargeId":"ch_pg-1","tags":0}');
    assert.equal(runs.length, 1);
  });
});
