// The framework adapters over real HTTP on loopback, each on its own
// better-sqlite3 file: Hono on Node (@hono/node-server, app-wide and per
// route), Express (with express.json() after it), and plain node:http. The
// core's rules: the principal policy (401), route selection, the request body
// cap while reading (413 before buffering a multi-MB chunked body; memory
// stays flat; the connection closed), raised / nothing-changed / declined
// handlers, the sweep on the core's rule; and what issue 21 found: the
// application's own headers reach the first caller (only the replay headers
// are replayed, Set-Cookie never), a body consumed before the middleware is
// the core's 500, a request the framework refused releases its key, and the
// in-progress 409 suggests Retry-After: 1.
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { createRequire } from "node:module";
import { describe, test } from "node:test";
import express from "express";
import { Hono } from "hono";
import { validator } from "hono/validator";
import { idempotency as honoIdempotency, NothingChangedError } from "../src/hono-node.js";
import { idempotency as expressIdempotency } from "../src/express.js";
import { idempotentHandler, toFetchResponse } from "../src/node.js";
import { honoServer, listen } from "./helpers/servers.js";
import { freshDb, rows } from "./helpers/sqlite.js";
import { chunkedUpload } from "./helpers/upload.js";

const quiet = () => {
  const lines = [];
  return { lines, logger: { error: (m) => lines.push(String(m)), warn: (m) => lines.push(String(m)), info: (m) => lines.push(String(m)) } };
};
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function post(base, path, { key, body = '{"sku":"A"}', user = "acct-1", headers = {} } = {}) {
  const h = { "content-type": "application/json", ...headers };
  if (key !== undefined) h["idempotency-key"] = key;
  if (user) h["x-user"] = user;
  const r = await fetch(base + path, { method: "POST", headers: h, body });
  const text = await r.text();
  return { status: r.status, headers: r.headers, text };
}

const hugeChunkedPost = (base, path, total, key = "huge") =>
  chunkedUpload({ port: Number(new URL(base).port), path, headers: { "x-user": "acct-1", "idempotency-key": key, "content-type": "application/json" }, total });

async function checkCommonRules(base, path, executions, { db }) {
  const first = await post(base, path, { key: "k1" });
  assert.equal(first.status, 201, first.text);
  assert.equal(first.headers.get("x-internal"), "1", "the first caller gets the response the application made");
  const replay = await post(base, path, { key: "k1" });
  assert.equal(replay.text, first.text, "replay");
  assert.equal(replay.headers.get("x-internal"), null, "replays carry the replay headers only");
  assert.equal(replay.headers.get("location"), first.headers.get("location"));
  assert.equal(executions(), 1);
  assert.equal((await post(base, path, { key: "k1", body: '{"sku":"B"}' })).status, 409);
  const noKey = await post(base, path, {});
  assert.equal(noKey.status, 400);
  assert.equal(JSON.parse(noKey.text).error, "idempotency_key_required");
  const anonymous = await post(base, path, { key: "k2", user: null });
  assert.equal(anonymous.status, 401, "the core's missing-principal policy: a loud 401, never a pass-through");
  assert.equal(JSON.parse(anonymous.text).error, "idempotency_principal_required");
  const big = await post(base, path, { key: "k3", body: "x".repeat(2000) });
  assert.equal(big.status, 413, "Content-Length over the cap: refused before reading");
  const huge = await hugeChunkedPost(base, path, 64 * 1024 * 1024);
  assert.equal(huge.status, 413, JSON.stringify(huge));
  assert.ok(huge.sent < 64 * 1024 * 1024, `answered before the whole body was sent (${huge.sent} bytes sent)`);
  assert.ok(huge.growth < 32 * 1024 * 1024, `memory stays flat (RSS grew ${(huge.growth / 1048576).toFixed(1)} MiB for a 64 MiB body)`);
  assert.match(huge.head, /^connection: close$/im, "the core's close: the answer says so");
  assert.equal(huge.closed, true, "and the server closed the connection");
  assert.equal(executions(), 1, "nothing ran for the refused requests");
  assert.ok(rows(db).every((r) => r.key !== "huge" && r.key !== "k3"));
}

/**
 * Issue 21, over one adapter: `app` serves POST /orders (sets X-Frame-Options,
 * X-Powered-By, Cache-Control, Set-Cookie; `?delay=ms` sleeps first; counts
 * executions), a route whose body a parser consumed before the middleware
 * (/consumed), and a route the framework refuses before the handler (bad JSON
 * at /orders for Express, the validator at /validated for Hono).
 */
async function checkIssue21(base, executions, { db, refused }) {
  // Headers the application set reach the first caller; replays carry the allowlist.
  const first = await post(base, "/orders", { key: "h1" });
  assert.equal(first.status, 201, first.text);
  assert.equal(first.headers.get("x-frame-options"), "DENY");
  assert.ok(first.headers.get("x-powered-by"));
  assert.equal(first.headers.get("cache-control"), "no-store");
  assert.deepEqual(first.headers.getSetCookie(), ["session=1; HttpOnly"], "the first caller gets the cookie the application set");
  const replay = await post(base, "/orders", { key: "h1" });
  assert.equal(replay.text, first.text);
  for (const name of ["x-frame-options", "x-powered-by", "cache-control", "set-cookie"]) assert.equal(replay.headers.get(name), null, `${name} is not replayed`);
  assert.deepEqual(JSON.parse(rows(db).find((r) => r.key === "h1").response_headers), { "content-type": first.headers.get("content-type"), location: first.headers.get("location") });

  // A chunked body over the cap: 413, and the connection is closed.
  const chunked = await hugeChunkedPost(base, "/orders", 8 * 1024 * 1024, "h2");
  assert.equal(chunked.status, 413, JSON.stringify(chunked));
  assert.match(chunked.head, /^connection: close$/im);
  assert.equal(chunked.closed, true, "the server closed the connection");

  // A body consumed before the middleware: the core's 500; nothing runs, no row.
  const before = executions();
  const consumed = await post(base, "/consumed", { key: "h3" });
  assert.equal(consumed.status, 500, consumed.text);
  assert.equal(JSON.parse(consumed.text).error, "idempotency_body_unavailable");
  assert.equal(executions(), before, "nothing ran");
  assert.ok(!rows(db).some((r) => r.key === "h3"));

  // A request the framework refused before the handler releases its key.
  const bad = await post(base, refused.path, { key: "h4", body: refused.bad });
  assert.equal(bad.status, 400, bad.text);
  assert.ok(!rows(db).some((r) => r.key === "h4"), "released: no row");
  const fixed = await post(base, refused.path, { key: "h4", body: '{"sku":"fixed"}' });
  assert.equal(fixed.status, 201, `the corrected retry with the same key runs: ${fixed.text}`);
  assert.equal(executions(), before + 1);

  // The in-progress 409 suggests a short retry.
  const slow = post(base, "/orders?delay=400", { key: "h5" });
  await sleep(150);
  const busy = await post(base, "/orders?delay=400", { key: "h5" });
  assert.equal(busy.status, 409, busy.text);
  assert.equal(busy.headers.get("retry-after"), "1");
  assert.equal(JSON.parse(busy.text).error, "idempotency_key_in_progress");
  assert.equal((await slow).status, 201);
}

const SETTINGS = { requestBodyCapBytes: 1024, sweepEvery: 1 };

/** The headers issue 21 checks, as the handler sets them. */
const APP_HEADERS = { "x-frame-options": "DENY", "x-powered-by": "handler", "cache-control": "no-store" };
const COOKIE = "session=1; HttpOnly";

describe("Hono on Node (@hono/node-server)", () => {
  test("app.use(idempotency()) with the handler reading c.req.json(); the core's rules over HTTP", async () => {
    const db = freshDb();
    const log = quiet();
    let n = 0;
    const outcomes = [];
    const app = new Hono();
    app.use(honoIdempotency({ db, principal: (c) => c.req.header("x-user"), logger: log.logger, exclude: ["/health"], onOutcome: (o) => outcomes.push(o), ...SETTINGS }));
    app.post("/orders", async (c) => {
      const body = await c.req.json();
      n += 1;
      return c.json({ n, body }, 201, { location: `/orders/${n}`, "x-internal": "1" });
    });
    app.post("/health", (c) => c.text("ok"));
    app.post("/nothing", () => {
      throw new NothingChangedError("validation failed before any write");
    });
    app.post("/boom", () => {
      throw new Error("boom");
    });
    const base = await honoServer(app);
    await checkCommonRules(base, "/orders", () => n, { db });
    assert.deepEqual(outcomes.slice(0, 6), ["executed", "replayed", "key-reused", "key-required", "principal-required", "body-too-large"], "onOutcome hears the core's outcome of each request");
    assert.equal((await post(base, "/health", {})).status, 200, "an excluded route never meets the ledger (no 400 without a key)");
    assert.equal((await post(base, "/nothing", { key: "n1" })).status, 500, "Hono's own error answer");
    assert.ok(!rows(db).some((r) => r.key === "n1"), "nothing-changed: the core released the reservation");
    assert.equal((await post(base, "/boom", { key: "b1" })).status, 500);
    assert.equal(rows(db).find((r) => r.key === "b1").status, "pending", "raised under on-server-error store: pending until the TTL");
    assert.ok(log.lines.some((l) => /b1/.test(l)), "the abandonment is logged as the core words it");
    assert.ok(outcomes.includes("released") && outcomes.includes("abandoned"));
    assert.equal((await post(base, "/nope", { key: "nf" })).status, 404, "no route: Hono's 404");
    assert.ok(!rows(db).some((r) => r.key === "nf"), "no route ran: the key is released (declined)");
  });

  test("per route, with onServerError: release and the ietf profile", async () => {
    const db = freshDb();
    let n = 0;
    const app = new Hono();
    const idem = honoIdempotency({ db, principal: (c) => c.req.header("x-user"), profile: "ietf", onServerError: "release", logger: quiet().logger });
    app.post("/orders", idem, async (c) => {
      n += 1;
      return c.json({ n }, n === 1 ? 503 : 201);
    });
    app.post("/free", async (c) => c.json({ free: true }, 201));
    // The middleware read the body; the handler still reads it from the raw Request.
    app.post("/raw", idem, async (c) => {
      const raw = c.req.raw;
      return c.json({ text: await raw.text(), type: raw.headers.get("content-type"), url: new URL(raw.url).pathname, live: raw.signal.aborted === false }, 201);
    });
    // Every way of reading the body after the middleware: c.req (text decoded
    // as Response.text() does, invalid UTF-8 replaced) and c.req.raw again.
    app.post("/both", idem, async (c) => {
      const json = await c.req.json();
      const text = await c.req.text();
      const bytes = [...new Uint8Array(await c.req.arrayBuffer())].length;
      return c.json({ json, text, bytes, raw: await c.req.raw.text() }, 201);
    });
    app.post("/stream", idem, async (c) => {
      const chunks = [];
      for await (const chunk of c.req.raw.body) chunks.push(...chunk);
      return c.json({ bytes: chunks.length }, 201);
    });
    app.post("/bytes", idem, async (c) => c.json({ text: await c.req.text() }, 201));
    const base = await honoServer(app);
    const failed = await post(base, "/orders", { key: "r1" });
    assert.equal(failed.status, 503, "this caller still gets the 5xx");
    assert.equal(rows(db).length, 0, "released: the retry runs again at once");
    const retried = await post(base, "/orders", { key: "r1" });
    assert.equal(retried.status, 201);
    const replay = await post(base, "/orders", { key: "r1" });
    assert.equal(replay.headers.get("idempotency-replayed"), "true", "ietf's replay marker");
    assert.equal((await post(base, "/orders", { key: "r1", body: "{}" })).status, 422, "ietf: a reused key is 422");
    assert.equal((await post(base, "/free", {})).status, 201, "a route without the middleware");
    const raw = await post(base, "/raw", { key: "raw-1", body: '{"sku":"R"}' });
    assert.deepEqual(JSON.parse(raw.text), { text: '{"sku":"R"}', type: "application/json", url: "/raw", live: true });
    assert.equal((await post(base, "/raw", { key: "raw-1", body: '{"sku":"R"}' })).text, raw.text, "replayed");
    const both = await post(base, "/both", { key: "both-1", body: '{"sku":"é"}' });
    assert.deepEqual(JSON.parse(both.text), { json: { sku: "é" }, text: '{"sku":"é"}', bytes: 12, raw: '{"sku":"é"}' });
    assert.deepEqual(JSON.parse((await post(base, "/stream", { key: "stream-1", body: '{"sku":"S"}' })).text), { bytes: 11 }, "the body as a stream");
    const invalid = new Uint8Array([0xef, 0xbb, 0xbf, 0x61, 0xff, 0x62]); // BOM, "a", an invalid byte, "b"
    const decoded = await post(base, "/bytes", { key: "bytes-1", body: invalid });
    assert.equal(JSON.parse(decoded.text).text, await new Response(invalid).text(), "as Response.text() decodes");
  });

  test("issue 21: the application's headers, the closed 413, a consumed body, a validator's refusal, Retry-After: 1", async () => {
    const db = freshDb();
    let n = 0;
    const app = new Hono();
    const idem = honoIdempotency({ db, principal: (c) => c.req.header("x-user"), logger: quiet().logger, ...SETTINGS });
    const order = async (c) => {
      const delay = Number(c.req.query("delay") ?? 0);
      if (delay) await sleep(delay);
      n += 1;
      c.header("set-cookie", COOKIE);
      return c.json({ n, body: await c.req.json() }, 201, { location: `/orders/${n}`, ...APP_HEADERS });
    };
    app.post("/orders", idem, order);
    // A body read before the middleware (a parser mounted first).
    app.post("/consumed", async (c, next) => (await c.req.json(), next()), idem, order);
    // hono/validator: malformed JSON (HTTPException 400) or a missing sku (its 400) before the handler.
    const valid = validator("json", (value, c) => (typeof value.sku === "string" ? value : c.json({ error: "invalid" }, 400)));
    app.post("/validated", idem, valid, order);
    const base = await honoServer(app);
    await checkIssue21(base, () => n, { db, refused: { path: "/validated", bad: '{"qty":1}' } });
    const malformed = await post(base, "/validated", { key: "h6", body: "{not json" });
    assert.equal(malformed.status, 400, malformed.text);
    assert.ok(!rows(db).some((r) => r.key === "h6"), "malformed JSON refused by the validator: released");
    assert.equal((await post(base, "/validated", { key: "h6", body: '{"sku":"ok"}' })).status, 201);
  });

  test("an application on Hono's CommonJS build (this package is an ES module): completed, replayed and declined as on the ES build", async () => {
    // What a CommonJS application gets from require("hono") and require("@hono/node-server").
    const require = createRequire(import.meta.url);
    const { Hono: CommonJsHono } = require("hono");
    const { serve: commonJsServe } = require("@hono/node-server");
    assert.notEqual(CommonJsHono, Hono, "two copies of Hono in one process");
    const db = freshDb();
    let n = 0;
    const app = new CommonJsHono();
    const idem = honoIdempotency({ db, principal: (c) => c.req.header("x-user"), logger: quiet().logger });
    app.post("/orders", idem, async (c) => {
      n += 1;
      return c.json({ n, sku: (await c.req.json()).sku }, 201);
    });
    // A middleware after this one answers before the route handler: declined.
    app.post("/refused", idem, async (c) => c.json({ error: "refused" }, 400), async (c) => c.json({ unreachable: true }, 201));
    const server = await new Promise((resolve) => {
      const s = commonJsServe({ fetch: app.fetch, hostname: "127.0.0.1", port: 0 }, () => resolve(s));
    });
    try {
      const base = `http://127.0.0.1:${server.address().port}`;
      const first = await post(base, "/orders", { key: "cjs-1" });
      assert.equal(first.status, 201, first.text);
      assert.equal(rows(db).find((r) => r.key === "cjs-1").status, "completed", "the completion committed before the answer");
      const replay = await post(base, "/orders", { key: "cjs-1" });
      assert.equal(replay.status, 201);
      assert.equal(replay.text, first.text);
      assert.equal(n, 1);
      assert.equal((await post(base, "/refused", { key: "cjs-2" })).status, 400);
      assert.ok(!rows(db).some((r) => r.key === "cjs-2"), "declined: the key released");
    } finally {
      server.closeAllConnections?.();
      await new Promise((resolve) => server.close(resolve));
    }
  });
});

test("the core's answer as a Fetch Response keeps every header value", () => {
  const once = toFetchResponse({ status: 201, headers: [{ name: "Content-Type", value: "application/json" }, { name: "__proto__", value: "x" }], body: undefined });
  assert.equal(once.status, 201);
  assert.deepEqual([...once.headers], [["__proto__", "x"], ["content-type", "application/json"]]);
  const twice = toFetchResponse({ status: 200, headers: [{ name: "Vary", value: "a" }, { name: "vary", value: "b" }, { name: "Set-Cookie", value: "s=1" }, { name: "set-cookie", value: "t=2" }], body: undefined });
  assert.equal(twice.headers.get("vary"), "a, b");
  assert.deepEqual(twice.headers.getSetCookie(), ["s=1", "t=2"]);
});

describe("Express", () => {
  test("app.use(idempotency()) before express.json(); errors middleware marks raised handlers", async () => {
    const db = freshDb();
    const log = quiet();
    let n = 0;
    const app = express();
    const idem = expressIdempotency({ db, principal: (req) => req.get("x-user"), logger: log.logger, routes: (method, path) => path.startsWith("/orders"), ...SETTINGS });
    app.use(idem);
    app.use(express.json());
    app.post("/orders", (req, res) => {
      n += 1;
      res.status(201).set("x-internal", "1").location(`/orders/${n}`).json({ n, body: req.body, raw: req.rawBody.length });
    });
    app.post("/orders/nothing", () => {
      throw new NothingChangedError("nothing");
    });
    app.post("/orders/boom", () => {
      throw new Error("boom");
    });
    app.use(idem.errors);
    const base = await listen(createServer(app));
    await checkCommonRules(base, "/orders", () => n, { db });
    const first = JSON.parse((await post(base, "/orders", { key: "k1" })).text);
    assert.deepEqual(first.body, { sku: "A" }, "express.json() read the same body after the middleware");
    assert.equal((await post(base, "/orders/nothing", { key: "n1" })).status, 500, "Express's own error answer");
    assert.ok(!rows(db).some((r) => r.key === "n1"));
    assert.equal((await post(base, "/orders/boom", { key: "b1" })).status, 500);
    assert.equal(rows(db).find((r) => r.key === "b1").status, "pending", "the error page is not stored");
    assert.equal((await post(base, "/orders-nope", { key: "nf" })).status, 404, "no route: Express's 404");
    assert.ok(!rows(db).some((r) => r.key === "nf"), "no route ran: the key is released (declined)");
  });

  test("issue 21: the application's headers, the closed 413, a consumed body, a JSON parse failure, Retry-After: 1", async () => {
    const db = freshDb();
    let n = 0;
    const idem = expressIdempotency({ db, principal: (req) => req.get("x-user"), logger: quiet().logger, include: ["/orders"], ...SETTINGS });
    const order = async (req, res) => {
      const delay = Number(req.query.delay ?? 0);
      if (delay) await sleep(delay);
      n += 1;
      res.status(201).set(APP_HEADERS).append("set-cookie", COOKIE).location(`/orders/${n}`).json({ n, body: req.body });
    };
    const app = express();
    app.use(idem); // app-wide, for /orders only (include)
    app.use(express.json());
    app.post("/orders", order);
    // express.json() mounted before the middleware consumed the body.
    app.post("/consumed", express.json(), expressIdempotency({ db, principal: (req) => req.get("x-user"), logger: quiet().logger }), order);
    app.use(idem.errors);
    const base = await listen(createServer(app));
    await checkIssue21(base, () => n, { db, refused: { path: "/orders", bad: "{not json" } });
    // Per route, with the parser inside the route: its refusal releases the key too.
    const perRoute = express();
    const routeIdem = expressIdempotency({ db: freshDb(), principal: (req) => req.get("x-user"), logger: quiet().logger });
    perRoute.post("/p", routeIdem, express.json(), (req, res) => res.status(201).json(req.body));
    perRoute.use(routeIdem.errors);
    const pbase = await listen(createServer(perRoute));
    assert.equal((await post(pbase, "/p", { key: "p1", body: "{bad" })).status, 400);
    assert.equal((await post(pbase, "/p", { key: "p1", body: '{"ok":1}' })).status, 201, "the corrected retry runs");
  });

  test("a held response ends with the methods it inherits, and a wrapper another middleware set on it before stays in place", async () => {
    const METHODS = ["writeHead", "flushHeaders", "write", "end"];
    const db = freshDb();
    const finished = [];
    let wrapped = 0;
    const app = express();
    app.use((req, res, next) => {
      res.on("finish", () => finished.push({ path: req.path, own: METHODS.filter((name) => Object.hasOwn(res, name)) }));
      next();
    });
    // As compression or on-headers do: res.end replaced on the response itself.
    app.use("/wrapped", (req, res, next) => {
      const end = res.end;
      res.end = function wrappedEnd(...args) {
        wrapped += 1;
        return end.apply(this, args);
      };
      next();
    });
    const idem = expressIdempotency({ db, principal: (req) => req.get("x-user"), logger: quiet().logger });
    app.post(["/plain", "/wrapped"], idem, express.json(), (req, res) => res.status(201).json({ sku: req.body.sku }));
    const base = await listen(createServer(app));
    for (const path of ["/plain", "/wrapped"]) {
      const first = await post(base, path, { key: `held${path}` });
      assert.equal(first.status, 201, first.text);
      assert.deepEqual(JSON.parse(first.text), { sku: "A" });
      const replay = await post(base, path, { key: `held${path}` });
      assert.equal(replay.text, first.text);
    }
    assert.deepEqual(finished, [
      { path: "/plain", own: [] },
      { path: "/plain", own: [] },
      { path: "/wrapped", own: ["end"] },
      { path: "/wrapped", own: ["end"] },
    ]);
    assert.equal(wrapped, 2, "the wrapper ran once per response: the held one when it was sent, the replay");
  });
});

describe("node:http", () => {
  test("http.createServer(idempotentHandler(options, handler))", async () => {
    const db = freshDb();
    const log = quiet();
    let n = 0;
    const handler = idempotentHandler({ db, principal: (req) => req.headers["x-user"], logger: log.logger, ...SETTINGS }, async (req, res) => {
      if (req.url === "/throw") throw new Error("handler failed");
      if (req.url === "/nothing") {
        res.writeHead(422, { "content-type": "text/plain" }).end("refused");
        throw new NothingChangedError("refused before any write");
      }
      if (req.url === "/nothing-response") throw new NothingChangedError("refused", { response: { status: 409, headers: { "content-type": "text/plain" }, body: "conflict" } });
      n += 1;
      res.writeHead(201, { "content-type": "application/json", location: `/orders/${n}`, "x-internal": "1" });
      res.write('{"n":');
      res.end(`${n},"len":${req.rawBody?.length ?? 0}}`);
    });
    const base = await listen(createServer(handler));
    await checkCommonRules(base, "/orders", () => n, { db });
    const t = await post(base, "/throw", { key: "t1" });
    assert.equal(t.status, 500);
    assert.equal(JSON.parse(t.text).error, "idempotency_handler_failed", "the core's answer for a failure node:http cannot re-raise");
    assert.equal(rows(db).find((r) => r.key === "t1").status, "pending");
    const nothing = await post(base, "/nothing", { key: "n1" });
    assert.deepEqual([nothing.status, nothing.text], [422, "refused"], "the handler's own response, unstored");
    assert.ok(!rows(db).some((r) => r.key === "n1"));
    const given = await post(base, "/nothing-response", { key: "n2" });
    assert.deepEqual([given.status, given.text], [409, "conflict"], "the NothingChangedError's response");
    assert.ok(!rows(db).some((r) => r.key === "n2"));
    const get = await fetch(`${base}/orders`, { headers: { "x-user": "acct-1" } });
    assert.equal(get.status, 201, "GET passes through (unprotected)");
  });

  test("issue 21: the application's headers, the closed 413, a consumed body, Retry-After: 1", async () => {
    const db = freshDb();
    let n = 0;
    const handler = idempotentHandler({ db, principal: (req) => req.headers["x-user"], logger: quiet().logger, ...SETTINGS }, async (req, res) => {
      const delay = Number(new URL(req.url, "http://x").searchParams.get("delay") ?? 0);
      if (delay) await sleep(delay);
      if (new URL(req.url, "http://x").pathname === "/validated") {
        const body = JSON.parse(req.rawBody);
        if (typeof body.sku !== "string") {
          res.writeHead(400, { "content-type": "application/json" }).end('{"error":"invalid"}');
          throw new NothingChangedError("no sku");
        }
      }
      n += 1;
      res.setHeader("set-cookie", COOKIE);
      res.writeHead(201, { "content-type": "application/json", location: `/orders/${n}`, ...APP_HEADERS });
      res.end(JSON.stringify({ n }));
    });
    // A body read before the handler (something in front of it consumed the stream).
    const server = createServer(async (req, res) => {
      if (req.url === "/consumed") for await (const chunk of req) void chunk;
      handler(req, res);
    });
    const base = await listen(server);
    await checkIssue21(base, () => n, { db, refused: { path: "/validated", bad: '{"qty":1}' } });
  });
});
