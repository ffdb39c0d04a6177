// IdempotencyLedger.exchange reads a keyed request's body before the exchange
// starts and gives a small one with the head (WIT request-start.body): what
// it read, when, and what it gave the core.
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, test } from "node:test";
import { ledgerFor, openLedgerDatabase } from "../src/node.js";
import { BODY_AT_START_MAX_BYTES } from "../src/ledger.js";

const dir = mkdtempSync(join(tmpdir(), "idem-body-first-"));
after(() => rmSync(dir, { recursive: true, force: true }));

let files = 0;
async function ledger(options = {}) {
  const db = await openLedgerDatabase(join(dir, `l${files++}.sqlite`));
  const l = ledgerFor(db, { sweep: false, ...options });
  // Notes the body each exchange started with, and how often the body was read by then.
  const started = [];
  const start = l.session.start.bind(l.session);
  l.session.start = (head, principal, now, mode, transactional, body) => {
    started.push({ body: body === undefined ? undefined : Buffer.from(body).toString(), reads: l.reads });
    return start(head, principal, now, mode, transactional, body);
  };
  l.started = started;
  l.reads = 0;
  return l;
}

const head = (headers) => ({ method: "POST", pathAndQuery: "/orders", headers: Object.entries(headers).map(([name, value]) => ({ name, value })) });

/** What an adapter does: reads `read` (bytes, or "too-large"...), runs a handler that answers 201 with the body's length. */
function io(l, read, ran) {
  return {
    readBody: async () => {
      l.reads++;
      return ["too-large", "consumed", "incomplete", "length-unknown"].includes(read) ? read : Buffer.from(read);
    },
    runHandler: async (ticket, body) => {
      ran.push(Buffer.from(body).toString());
      return { tag: "answered", val: { status: 201, headers: [], body: { tag: "text", val: String(body.byteLength) } } };
    },
  };
}

describe("the body read before the exchange starts", () => {
  test("a small keyed body goes with the head; the handler gets it; the replay too", async () => {
    const l = await ledger();
    const ran = [];
    const body = '{"sku":"A-1","qty":1}';
    const h = head({ "content-type": "application/json", "idempotency-key": "k1", "content-length": String(body.length) });
    const first = await l.exchange(h, "acct", io(l, body, ran));
    const again = await l.exchange(h, "acct", io(l, body, ran));
    assert.deepEqual([first.outcome, again.outcome], ["executed", "replayed"]);
    assert.deepEqual(ran, [body]);
    assert.deepEqual(l.started, [{ body, reads: 1 }, { body, reads: 2 }]);
  });

  test("a body over the start limit is read once and hashed at read-body", async () => {
    const l = await ledger();
    const ran = [];
    const body = "x".repeat(BODY_AT_START_MAX_BYTES + 1);
    const h = head({ "idempotency-key": "k2" });
    const outcomes = [];
    for (const b of [body, body, body.slice(0, -1) + "y"]) outcomes.push((await l.exchange(h, "acct", io(l, b, ran))).outcome);
    assert.deepEqual(outcomes, ["executed", "replayed", "key-reused"]);
    assert.deepEqual(ran, [body]);
    assert.equal(l.reads, 3, "one read per request");
    assert.deepEqual(l.started.map((s) => s.body), [undefined, undefined, undefined]);
  });

  test("a body the adapter stopped reading past the cap: 413, closed, nothing ran", async () => {
    const l = await ledger({ requestBodyCapBytes: 100 });
    const ran = [];
    const end = await l.exchange(head({ "idempotency-key": "k3" }), "acct", io(l, "too-large", ran));
    assert.equal(end.outcome, "body-too-large");
    assert.equal(end.action.val.close, true);
    assert.deepEqual(ran, []);
    assert.deepEqual(l.started, [{ body: undefined, reads: 1 }]);
  });

  test("a Content-Length over the cap, or no key: answered without reading the body", async () => {
    const l = await ledger({ requestBodyCapBytes: 100 });
    const ran = [];
    const over = await l.exchange(head({ "idempotency-key": "k4", "content-length": "1000" }), "acct", io(l, "{}", ran));
    const keyless = await l.exchange(head({ "content-type": "application/json" }), "acct", io(l, "{}", ran));
    assert.deepEqual([over.outcome, keyless.outcome], ["body-too-large", "key-required"]);
    assert.equal(l.reads, 0);
    assert.deepEqual(ran, []);
  });

  test("an unreadable Content-Length leaves the body to read-body", async () => {
    const l = await ledger();
    const ran = [];
    const end = await l.exchange(head({ "idempotency-key": "k5", "content-length": "abc" }), "acct", io(l, "{}", ran));
    assert.equal(end.outcome, "executed");
    assert.deepEqual(l.started, [{ body: undefined, reads: 0 }]);
    assert.equal(l.reads, 1);
  });
});
