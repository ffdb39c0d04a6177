// Only the handler's response headers the core reads (its `response-headers`:
// the replay-headers) cross into the component: Exchange.step copies no
// other, and the answers are the ones all the headers would have given.
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, test } from "node:test";
import { getCore, ledgerFor, openLedgerDatabase } from "../src/node.js";
import { intercepted, interceptSession } from "./helpers/intercept.js";

const dir = mkdtempSync(join(tmpdir(), "idem-response-headers-"));
after(() => rmSync(dir, { recursive: true, force: true }));

const head = (key) => ({
  method: "POST",
  pathAndQuery: "/orders",
  headers: [
    { name: "Idempotency-Key", value: key },
    { name: "Content-Type", value: "application/json" },
  ],
});

test("the session names the replay-headers, lower-cased, each once", () => {
  const core = getCore();
  assert.deepEqual([...core.open(core.defaultConfig()).responseHeaders], ["content-type", "location"]);
  const custom = core.open({ ...core.defaultConfig(), replayHeaders: ["Content-Type", "X-Order-Id", "content-type"] });
  assert.deepEqual([...custom.responseHeaders], ["content-type", "x-order-id"]);
});

test("a handler's answer crosses with only those headers, and replays as with all of them", async () => {
  const db = await openLedgerDatabase(join(dir, "ledger.sqlite"));
  const l = ledgerFor(db, { sweep: false, replayHeaders: ["content-type", "X-Order-Id"] });
  const given = [];
  // Every handler answer the component's exchange.step receives, as it receives it.
  const step = (exchange, now, event) => {
    if (event.tag === "handler-done" && event.val.tag === "answered") given.push(event.val.val.headers.map((h) => `${h.name}: ${h.value}`));
    return exchange.step(now, event);
  };
  interceptSession(l.session, {
    start: (session, request) => {
      const started = session.start(request);
      return started.exchange === undefined ? started : { action: started.action, exchange: intercepted(started.exchange, { step }) };
    },
  });
  const body = Buffer.from('{"sku":"A-1"}');
  const headers = [
    { name: "Content-Type", value: "application/json" },
    { name: "Set-Cookie", value: "session=abc" },
    { name: "X-Frame-Options", value: "DENY" },
    { name: "Cache-Control", value: "no-store" },
    { name: "x-order-id", value: "o_1" },
    { name: "X-Order-Id", value: "o_1b" },
  ];
  let ran = 0;
  const io = { readBody: () => body, runHandler: () => (ran++, { tag: "answered", val: { status: 201, headers, body: { tag: "text", val: '{"order":"o_1"}' } } }) };
  const first = await l.exchange(head("k-1"), "acct", io);
  const replay = await l.exchange(head("k-1"), "acct", io);
  assert.deepEqual([first.outcome, replay.outcome, ran], ["executed", "replayed", 1]);
  assert.deepEqual(given, [["Content-Type: application/json", "x-order-id: o_1", "X-Order-Id: o_1b"]]);
  const sent = replay.action.val.send.val;
  assert.deepEqual(
    sent.headers.map((h) => [h.name, h.value]),
    [
      ["content-type", "application/json"],
      ["x-order-id", "o_1, o_1b"],
    ],
  );
  db.close();
});

test("Express and node:http over loopback: a repeated replay header is read as set, in any case; the first caller gets every header", async () => {
  const { createServer } = await import("node:http");
  const { default: express } = await import("express");
  const { idempotency } = await import("../src/express.js");
  const { idempotentHandler } = await import("../src/node.js");
  const { listen } = await import("./helpers/servers.js");
  const { freshDb } = await import("./helpers/sqlite.js");
  const settings = { sweep: false, principal: () => "acct", replayHeaders: ["Content-Type", "X-Order-Id"] };
  const respond = (res) => {
    res.statusCode = 201;
    res.setHeader("Content-Type", "application/json");
    res.setHeader("X-ORDER-ID", ["o_1", "o_1b"]);
    res.setHeader("Set-Cookie", "session=abc");
    res.setHeader("X-Frame-Options", "DENY");
    res.end('{"order":"o_1"}');
  };
  const app = express();
  app.post("/orders", idempotency({ db: freshDb(), ...settings }), (req, res) => respond(res));
  const bases = [await listen(createServer(app)), await listen(createServer(idempotentHandler({ db: freshDb(), ...settings }, (req, res) => respond(res))))];
  for (const base of bases) {
    const send = () => fetch(`${base}/orders`, { method: "POST", headers: { "content-type": "application/json", "idempotency-key": "k-1" }, body: "{}" });
    const first = await send();
    assert.equal(first.status, 201);
    assert.deepEqual([first.headers.get("x-order-id"), first.headers.get("set-cookie"), first.headers.get("x-frame-options")], ["o_1, o_1b", "session=abc", "DENY"]);
    const replay = await send();
    assert.equal(replay.status, 201);
    assert.equal(await replay.text(), '{"order":"o_1"}');
    assert.deepEqual([replay.headers.get("content-type"), replay.headers.get("x-order-id"), replay.headers.get("set-cookie"), replay.headers.get("x-frame-options")], ["application/json", "o_1, o_1b", null, null]);
  }
});
