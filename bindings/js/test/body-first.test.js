// IdempotencyLedger.exchange reads a keyed request's body before the exchange
// starts and gives a small one with the head (WIT request-start.body): what
// it read, when, and what it gave the core.
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { createServer, request as httpRequest } from "node:http";
import { connect } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, test } from "node:test";
import { ledgerFor, openLedgerDatabase } from "../src/node.js";
import { BODY_AT_START_MAX_BYTES } from "../src/ledger.js";
import { readNodeBodyNow } from "../src/node-http.js";

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

describe("readNodeBodyNow on a real node:http server", () => {
  /**
   * Serves one request: after the handler's first await (where a middleware
   * reads), `read(req)` runs; then the rest of the stream is read as an app's
   * body parser would. Resolves with what both saw.
   */
  function serveOne(read, send) {
    return new Promise((resolve, reject) => {
      const server = createServer(async (req, res) => {
        await Promise.resolve();
        const first = read(req);
        const sync = !(first instanceof Promise);
        const body = await first;
        const rest = [];
        req.on("data", (c) => rest.push(c));
        req.on("end", () => {
          res.end("ok");
          server.close();
          resolve({ sync, body: typeof body === "string" ? body : body.toString(), rest: Buffer.concat(rest).toString() });
        });
        req.resume();
      });
      server.on("error", reject);
      server.listen(0, "127.0.0.1", () => send(server.address().port).catch(reject));
    });
  }
  const post = (headers, chunks) => (port) =>
    new Promise((resolve, reject) => {
      const req = httpRequest({ host: "127.0.0.1", port, method: "POST", path: "/", headers }, (res) => {
        res.resume();
        res.on("end", resolve);
      });
      req.on("error", reject);
      for (const c of chunks.slice(0, -1)) req.write(c);
      req.end(chunks.at(-1));
    });

  test("a body with its Content-Length, arrived with the head: read at once, put back for the app", async () => {
    const seen = await serveOne((req) => readNodeBodyNow(req, 1000n), post({ "content-length": "11" }, ["hello world"]));
    assert.deepEqual(seen, { sync: true, body: "hello world", rest: "hello world" });
  });

  test("putBack false: read at once, the stream left drained", async () => {
    const seen = await serveOne((req) => readNodeBodyNow(req, 1000n, { putBack: false }), post({ "content-length": "5" }, ["hello"]));
    assert.deepEqual(seen, { sync: true, body: "hello", rest: "" });
  });

  test("a body still arriving (bytes missing from its Content-Length): read as it comes", async () => {
    const seen = await serveOne(
      (req) => readNodeBodyNow(req, 1000n),
      (port) =>
        new Promise((resolve, reject) => {
          // The head and part of the body, the rest a moment later.
          const socket = connect(port, "127.0.0.1", () => {
            socket.write("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\nConnection: close\r\n\r\nhello");
            setTimeout(() => socket.write("world"), 20);
          });
          socket.on("error", reject);
          socket.on("close", resolve);
          socket.resume();
        }),
    );
    assert.deepEqual(seen, { sync: false, body: "helloworld", rest: "helloworld" });
  });

  test("a chunked body over the cap: too-large, whichever way it is read", async () => {
    const seen = await serveOne((req) => readNodeBodyNow(req, 4n, { putBack: false }), post({ "transfer-encoding": "chunked" }, ["hel", "lo"]));
    assert.equal(seen.body, "too-large");
  });

  test("a stream something read before: consumed", async () => {
    const seen = await serveOne(
      (req) => {
        req.read();
        return readNodeBodyNow(req, 1000n);
      },
      post({ "content-length": "5" }, ["hello"]),
    );
    assert.equal(seen.body, "consumed");
  });
});
