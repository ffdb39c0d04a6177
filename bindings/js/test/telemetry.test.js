// OpenTelemetry through @opentelemetry/api with the SDK's in-memory exporters
// (registered globally, as an application does), over real servers on
// loopback: Hono on @hono/node-server, Express and node:http, each on its own
// better-sqlite3 file. The names and values README "Observability" lists:
// the counter idempotency.requests by outcome, method and route, the
// histogram idempotency.ledger.duration (the ledger's time only: not the
// handler, not the waits), and the span idempotency (child of the active
// span, parent of the handler's spans; outcome, generation, key hash; ERROR
// for the failure outcomes; the key and principal only with recordKeys).
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { createServer } from "node:http";
import { after, before, describe, test } from "node:test";
import express from "express";
import { Hono } from "hono";
import { idempotency as honoIdempotency } from "../src/hono-node.js";
import { idempotency as expressIdempotency } from "../src/express.js";
import { BatchFailure, databaseError, idempotentHandler } from "../src/node.js";
import { installOtel, pointWith } from "./helpers/otel.js";
import { honoServer, listen } from "./helpers/servers.js";
import { freshDb } from "./helpers/sqlite.js";

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const quiet = { error() {}, warn() {}, info() {} };
const keyHash = (principal, key) => createHash("sha256").update(`${principal}\n${key}`, "utf8").digest("hex").slice(0, 16);
const HANDLER_MS = 150;

let otel;
before(() => {
  otel = installOtel();
});
after(async () => {
  await otel.shutdown();
});

async function post(base, path, { key, body = '{"sku":"A"}', user = "acct-1" } = {}) {
  const headers = { "content-type": "application/json" };
  if (key !== undefined) headers["idempotency-key"] = key;
  if (user) headers["x-user"] = user;
  const r = await fetch(base + path, { method: "POST", headers, body });
  return { status: r.status, text: await r.text() };
}

/** The spans named `idempotency` among `spans`, in the order they ended. */
const ledgerSpans = (spans) => spans.filter((s) => s.name === "idempotency");

/**
 * What every adapter must record for: a fresh key (executed: the handler
 * sleeps HANDLER_MS, which the ledger's time must leave out), its replay, the
 * key reused, and no principal (principal-required: no ticket, no key hash).
 */
async function checkOutcomes(base, path, route) {
  // A first exchange warms the component up (its first call compiles), unmeasured.
  assert.equal((await post(base, path, { key: "warm" })).status, 201);
  await otel.metrics();
  otel.spans();

  assert.equal((await post(base, path, { key: "k1" })).status, 201);
  assert.equal((await post(base, path, { key: "k1" })).status, 201);
  assert.equal((await post(base, path, { key: "k1", body: '{"sku":"B"}' })).status, 409);
  assert.equal((await post(base, path, { key: "k2", user: null })).status, 401);

  const m = await otel.metrics();
  const routed = route === undefined ? {} : { "http.route": route };
  for (const outcome of ["executed", "replayed", "key-reused", "principal-required"]) {
    const point = pointWith(m["idempotency.requests"], { "idempotency.outcome": outcome, "http.request.method": "POST", ...routed });
    assert.ok(point, `a counter point for ${outcome} with ${JSON.stringify(routed)}: ${JSON.stringify(m["idempotency.requests"])}`);
    assert.equal(point.value, 1, outcome);
    assert.equal(point.unit, "{request}");
    assert.equal(point.scope, "@idempotency/ledger");
  }
  assert.equal(m["idempotency.requests"].length, 4, "no other counter point");
  const executed = pointWith(m["idempotency.ledger.duration"], { "idempotency.outcome": "executed" });
  assert.equal(executed.unit, "s");
  assert.equal(executed.value.count, 1);
  assert.ok(executed.value.sum > 0, "the ledger's batches took some time");
  assert.ok(executed.value.sum < HANDLER_MS / 1000 / 2, `the handler's ${HANDLER_MS} ms are not the ledger's time (recorded ${executed.value.sum} s)`);
  for (const outcome of ["replayed", "key-reused", "principal-required"]) {
    assert.equal(pointWith(m["idempotency.ledger.duration"], { "idempotency.outcome": outcome })?.value.count, 1, outcome);
  }

  const spans = ledgerSpans(otel.spans());
  assert.deepEqual(
    spans.map((s) => s.attributes),
    [
      { "idempotency.outcome": "executed", "idempotency.generation": 1, "idempotency.key_hash": keyHash("acct-1", "k1") },
      { "idempotency.outcome": "replayed" },
      { "idempotency.outcome": "key-reused" },
      { "idempotency.outcome": "principal-required" },
    ],
  );
  for (const s of spans) {
    assert.equal(s.status.code, 0, "UNSET: none of these is a failure");
    assert.equal(s.kind, 0, "INTERNAL");
    assert.equal(s.instrumentationScope.name, "@idempotency/ledger");
  }
  assert.ok(
    spans[0].duration[0] * 1000 + spans[0].duration[1] / 1e6 >= HANDLER_MS,
    "the span is around the whole exchange, the handler included",
  );
}

describe("Hono on Node", () => {
  test("counter by outcome, method and route (c.req.routePath); ledger time without the handler; spans with the key hash", async () => {
    const db = freshDb();
    const app = new Hono();
    app.post("/orders/:id", honoIdempotency({ db, principal: (c) => c.req.header("x-user"), logger: quiet }), async (c) => {
      await sleep(HANDLER_MS);
      return c.json({ id: c.req.param("id") }, 201);
    });
    await checkOutcomes(await honoServer(app), "/orders/7", "/orders/:id");
  });

  test("app-wide: the route is the handler's; no route matched: no http.route; the span's parent is the active span and the handler's spans are its children", async () => {
    const db = freshDb();
    const app = new Hono();
    // What an HTTP server instrumentation does: a server span active around the app.
    app.use(async (c, next) => {
      const span = otel.tracer.startSpan("server");
      c.header("x-server-span", span.spanContext().spanId);
      try {
        await otel.api.context.with(otel.api.trace.setSpan(otel.api.context.active(), span), next);
      } finally {
        span.end();
      }
    });
    app.use(honoIdempotency({ db, principal: (c) => c.req.header("x-user"), logger: quiet }));
    app.post("/items/:sku/reserve", async (c) => {
      await otel.tracer.startActiveSpan("handler-work", async (span) => {
        await sleep(5);
        span.end();
      });
      return c.json({ ok: true }, 201);
    });
    const base = await honoServer(app);
    await otel.metrics();
    otel.spans();
    assert.equal((await post(base, "/items/A-1/reserve", { key: "r1" })).status, 201);
    assert.equal((await post(base, "/items/A-1/reserve", { key: "r1" })).status, 201);
    assert.equal((await post(base, "/nowhere", { key: "r2" })).status, 404);
    const m = await otel.metrics();
    assert.equal(pointWith(m["idempotency.requests"], { "idempotency.outcome": "executed", "http.request.method": "POST", "http.route": "/items/:sku/reserve" })?.value, 1);
    assert.equal(pointWith(m["idempotency.requests"], { "idempotency.outcome": "replayed", "http.request.method": "POST", "http.route": "/items/:sku/reserve" })?.value, 1);
    assert.equal(pointWith(m["idempotency.requests"], { "idempotency.outcome": "released", "http.request.method": "POST" })?.value, 1, "no route: released, and no http.route");
    const spans = otel.spans();
    const servers = spans.filter((s) => s.name === "server");
    const ledger = ledgerSpans(spans);
    assert.equal(servers.length, 3);
    assert.equal(ledger.length, 3);
    for (let i = 0; i < 3; i++) {
      assert.equal(ledger[i].spanContext().traceId, servers[i].spanContext().traceId);
      assert.equal(ledger[i].parentSpanContext?.spanId, servers[i].spanContext().spanId, "child of the active span");
    }
    const work = spans.filter((s) => s.name === "handler-work");
    assert.equal(work.length, 1, "the handler ran once");
    assert.equal(work[0].parentSpanContext?.spanId, ledger[0].spanContext().spanId, "the handler runs inside the idempotency span");
  });
});

describe("Express", () => {
  test("per route and under a router: http.route is the matched route (req.baseUrl + req.route.path)", async () => {
    const db = freshDb();
    const idem = expressIdempotency({ db, principal: (req) => req.get("x-user"), logger: quiet });
    const app = express();
    const handler = async (req, res) => {
      await sleep(HANDLER_MS);
      res.status(201).json({ id: req.params.id });
    };
    app.post("/orders/:id", idem, express.json(), handler);
    const router = express.Router();
    router.post("/orders/:id", idem, express.json(), (req, res) => res.status(201).json({ id: req.params.id }));
    app.use("/api", router);
    app.use(idem.errors);
    const base = await listen(createServer(app));
    await checkOutcomes(base, "/orders/9", "/orders/:id");
    assert.equal((await post(base, "/api/orders/9", { key: "a1" })).status, 201);
    const m = await otel.metrics();
    assert.equal(pointWith(m["idempotency.requests"], { "idempotency.outcome": "executed", "http.request.method": "POST", "http.route": "/api/orders/:id" })?.value, 1);
    otel.spans();
  });

  test("mounted app-wide: the route once matched; a replay (no route ran) has none", async () => {
    const db = freshDb();
    const idem = expressIdempotency({ db, principal: (req) => req.get("x-user"), logger: quiet });
    const app = express();
    app.use(idem);
    app.use(express.json());
    app.post("/carts/:id/checkout", (req, res) => res.status(201).json({ ok: true }));
    app.use(idem.errors);
    const base = await listen(createServer(app));
    await otel.metrics();
    assert.equal((await post(base, "/carts/3/checkout", { key: "c1" })).status, 201);
    assert.equal((await post(base, "/carts/3/checkout", { key: "c1" })).status, 201);
    const m = await otel.metrics();
    assert.equal(pointWith(m["idempotency.requests"], { "idempotency.outcome": "executed", "http.request.method": "POST", "http.route": "/carts/:id/checkout" })?.value, 1);
    assert.equal(pointWith(m["idempotency.requests"], { "idempotency.outcome": "replayed", "http.request.method": "POST" })?.value, 1);
    otel.spans();
  });
});

describe("node:http", () => {
  test("no route unless given; the route option; the handler's time left out", async () => {
    const db = freshDb();
    const handler = async (req, res) => {
      await sleep(HANDLER_MS);
      res.writeHead(201, { "content-type": "application/json" }).end('{"ok":true}');
    };
    const plain = await listen(createServer(idempotentHandler({ db, principal: (req) => req.headers["x-user"], logger: quiet }, handler)));
    await checkOutcomes(plain, "/orders", undefined);
    const routed = await listen(createServer(idempotentHandler({ db: freshDb(), principal: (req) => req.headers["x-user"], logger: quiet, route: "/orders" }, handler)));
    await checkOutcomes(routed, "/orders", "/orders");
  });

  test("a duplicate's wait is not the ledger's time: replayed-after-wait", async () => {
    const db = freshDb();
    const server = idempotentHandler({ db, principal: () => "acct-1", logger: quiet, waitMs: 5000 }, async (req, res) => {
      await sleep(400);
      res.writeHead(201, { "content-type": "application/json" }).end('{"ok":true}');
    });
    const base = await listen(createServer(server));
    assert.equal((await post(base, "/w", { key: "warm" })).status, 201);
    await otel.metrics();
    otel.spans();
    const first = post(base, "/w", { key: "w1" });
    await sleep(100);
    const second = await post(base, "/w", { key: "w1" });
    assert.equal((await first).status, 201);
    assert.equal(second.status, 201);
    const m = await otel.metrics();
    const waited = pointWith(m["idempotency.ledger.duration"], { "idempotency.outcome": "replayed-after-wait" });
    assert.equal(waited?.value.count, 1, JSON.stringify(m["idempotency.ledger.duration"]));
    assert.ok(waited.value.sum < 0.15, `about 300 ms of sleeping left out (recorded ${waited.value.sum} s)`);
    const spans = ledgerSpans(otel.spans());
    const span = spans.find((s) => s.attributes["idempotency.outcome"] === "replayed-after-wait");
    assert.ok(span.duration[0] * 1000 + span.duration[1] / 1e6 >= 250, "the span covers the wait");
  });

  test("failure outcomes set the span status to ERROR: ledger-failed, ledger-busy", async () => {
    let fail = databaseError("SQLITE_IOERR", "disk I/O error");
    const failing = { dialect: "sqlite", batch: async () => { throw new BatchFailure(fail); } };
    const base = await listen(createServer(idempotentHandler({ db: failing, principal: () => "acct-1", logger: quiet, route: "/f" }, (req, res) => res.end("ran"))));
    await otel.metrics();
    otel.spans();
    assert.equal((await post(base, "/f", { key: "f1" })).status, 500);
    fail = databaseError("SQLITE_BUSY", "database is locked");
    assert.equal((await post(base, "/f", { key: "f2" })).status, 503);
    const m = await otel.metrics();
    for (const outcome of ["ledger-failed", "ledger-busy"]) {
      assert.equal(pointWith(m["idempotency.requests"], { "idempotency.outcome": outcome, "http.request.method": "POST", "http.route": "/f" })?.value, 1, outcome);
    }
    const spans = ledgerSpans(otel.spans());
    assert.deepEqual(
      spans.map((s) => [s.attributes["idempotency.outcome"], s.status.code, s.status.message]),
      [
        ["ledger-failed", 2, "ledger-failed"],
        ["ledger-busy", 2, "ledger-busy"],
      ],
    );
  });

  test("a takeover: generation 2; recordKeys adds the key and the principal in clear", async () => {
    let now = 1_900_000_000_000;
    let fail = true;
    const options = { db: freshDb(), principal: () => "acct-9", logger: quiet, recordKeys: true, now: () => now, route: "/t" };
    const base = await listen(
      createServer(
        idempotentHandler(options, (req, res) => {
          if (fail) throw new Error("crashed");
          res.writeHead(201).end("done");
        }),
      ),
    );
    await otel.metrics();
    otel.spans();
    assert.equal((await post(base, "/t", { key: "t-1" })).status, 500);
    now += 30_001;
    fail = false;
    assert.equal((await post(base, "/t", { key: "t-1" })).status, 201);
    const spans = ledgerSpans(otel.spans());
    const hash = keyHash("acct-9", "t-1");
    assert.deepEqual(
      spans.map((s) => s.attributes),
      [
        { "idempotency.outcome": "abandoned", "idempotency.generation": 1, "idempotency.key_hash": hash, "idempotency.key": "t-1", "enduser.id": "acct-9" },
        { "idempotency.outcome": "taken-over", "idempotency.generation": 2, "idempotency.key_hash": hash, "idempotency.key": "t-1", "enduser.id": "acct-9" },
      ],
    );
    const m = await otel.metrics();
    assert.equal(pointWith(m["idempotency.requests"], { "idempotency.outcome": "taken-over", "http.request.method": "POST", "http.route": "/t" })?.value, 1);
  });

  test("telemetry: false records nothing for that ledger", async () => {
    const base = await listen(createServer(idempotentHandler({ db: freshDb(), principal: () => "acct-1", logger: quiet, telemetry: false }, (req, res) => res.writeHead(201).end("ok"))));
    await otel.metrics();
    otel.spans();
    assert.equal((await post(base, "/x", { key: "x1" })).status, 201);
    assert.equal((await post(base, "/x", { key: "x1" })).status, 201);
    assert.deepEqual(await otel.metrics(), {});
    assert.deepEqual(ledgerSpans(otel.spans()), []);
  });
});
