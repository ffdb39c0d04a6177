// The framework adapters over real HTTP on loopback, each on its own
// better-sqlite3 file: Hono on Node (@hono/node-server, app-wide and per
// route), Express (with express.json() after it), and plain node:http. The
// core's rules: the principal policy (401), route selection, the request body
// cap while reading (413 before buffering a multi-MB chunked body; memory
// stays flat), raised / nothing-changed mutations, the sweep on the core's rule.
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { describe, test } from "node:test";
import express from "express";
import { Hono } from "hono";
import { idempotency as honoIdempotency, NothingRanError } from "../src/hono-node.js";
import { idempotency as expressIdempotency } from "../src/express.js";
import { idempotentHandler, toFetchResponse } from "../src/node.js";
import { honoServer, listen } from "./helpers/servers.js";
import { freshDb, rows } from "./helpers/sqlite.js";
import { chunkedUpload } from "./helpers/upload.js";

const quiet = () => {
  const lines = [];
  return { lines, logger: { error: (m) => lines.push(m), warn: (m) => lines.push(m), info: (m) => lines.push(m) } };
};

async function post(base, path, { key, body = '{"sku":"A"}', user = "acct-1", headers = {} } = {}) {
  const h = { "content-type": "application/json", ...headers };
  if (key !== undefined) h["idempotency-key"] = key;
  if (user) h["x-user"] = user;
  const r = await fetch(base + path, { method: "POST", headers: h, body });
  const text = await r.text();
  return { status: r.status, headers: r.headers, text };
}

const hugeChunkedPost = (base, path, total) =>
  chunkedUpload({ port: Number(new URL(base).port), path, headers: { "x-user": "acct-1", "idempotency-key": "huge", "content-type": "application/json" }, total });

async function checkCommonRules(base, path, executions, { db, log }) {
  const first = await post(base, path, { key: "k1" });
  assert.equal(first.status, 201, first.text);
  assert.equal(first.headers.get("x-internal"), null, "only the replay headers are sent, as replays will be");
  assert.equal((await post(base, path, { key: "k1" })).text, first.text, "replay");
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
  assert.equal(executions(), 1, "nothing ran for the refused requests");
  assert.ok(rows(db).every((r) => r.key !== "huge" && r.key !== "k3"));
  void log;
}

const SETTINGS = { requestBodyCapBytes: 1024, sweepEvery: 1 };

describe("Hono on Node (@hono/node-server)", () => {
  test("app.use(idempotency()) with the handler reading c.req.json(); the core's rules over HTTP", async () => {
    const db = freshDb();
    const log = quiet();
    let n = 0;
    const app = new Hono();
    app.use(honoIdempotency({ db, principal: (c) => c.req.header("x-user"), logger: log.logger, exclude: ["/health"], ...SETTINGS }));
    app.post("/orders", async (c) => {
      const body = await c.req.json();
      n += 1;
      return c.json({ n, body }, 201, { location: `/orders/${n}`, "x-internal": "1" });
    });
    app.post("/health", (c) => c.text("ok"));
    app.post("/nothing", () => {
      throw new NothingRanError("validation failed before any write");
    });
    app.post("/boom", () => {
      throw new Error("boom");
    });
    const base = await honoServer(app);
    await checkCommonRules(base, "/orders", () => n, { db, log });
    assert.equal((await post(base, "/health", {})).status, 200, "an excluded route never meets the ledger (no 400 without a key)");
    assert.equal((await post(base, "/nothing", { key: "n1" })).status, 500);
    assert.ok(!rows(db).some((r) => r.key === "n1"), "nothing-changed: the core released the reservation");
    assert.equal((await post(base, "/boom", { key: "b1" })).status, 500);
    assert.equal(rows(db).find((r) => r.key === "b1").status, "pending", "raised under on-server-error store: pending until the TTL");
    assert.ok(log.lines.some((l) => /b1/.test(l)), "the abandonment is logged as the core words it");
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
    const invalid = new Uint8Array([0xef, 0xbb, 0xbf, 0x61, 0xff, 0x62]); // BOM, "a", an invalid byte, "b"
    const decoded = await post(base, "/bytes", { key: "bytes-1", body: invalid });
    assert.equal(JSON.parse(decoded.text).text, await new Response(invalid).text(), "as Response.text() decodes");
  });
});

test("the core's answer as a Fetch Response keeps every header value", () => {
  const once = toFetchResponse({ status: 201, headers: [{ name: "Content-Type", value: "application/json" }, { name: "__proto__", value: "x" }], body: null });
  assert.equal(once.status, 201);
  assert.deepEqual([...once.headers], [["__proto__", "x"], ["content-type", "application/json"]]);
  const twice = toFetchResponse({ status: 200, headers: [{ name: "Vary", value: "a" }, { name: "vary", value: "b" }, { name: "Set-Cookie", value: "s=1" }, { name: "set-cookie", value: "t=2" }], body: null });
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
      throw new NothingRanError("nothing");
    });
    app.post("/orders/boom", () => {
      throw new Error("boom");
    });
    app.use(idem.errors);
    const base = await listen(createServer(app));
    await checkCommonRules(base, "/orders", () => n, { db, log });
    const first = JSON.parse((await post(base, "/orders", { key: "k1" })).text);
    assert.deepEqual(first.body, { sku: "A" }, "express.json() read the same body after the middleware");
    assert.equal((await post(base, "/orders/nothing", { key: "n1" })).status, 500);
    assert.ok(!rows(db).some((r) => r.key === "n1"));
    assert.equal((await post(base, "/orders/boom", { key: "b1" })).status, 500);
    assert.equal(rows(db).find((r) => r.key === "b1").status, "pending", "the error page is not stored");
  });
});

describe("node:http", () => {
  test("http.createServer(idempotentHandler(options, handler))", async () => {
    const db = freshDb();
    const log = quiet();
    let n = 0;
    const handler = idempotentHandler({ db, principal: (req) => req.headers["x-user"], logger: log.logger, ...SETTINGS }, async (req, res) => {
      if (req.url === "/throw") throw new Error("handler failed");
      n += 1;
      res.writeHead(201, { "content-type": "application/json", location: `/orders/${n}`, "x-internal": "1" });
      res.write('{"n":');
      res.end(`${n},"len":${req.rawBody?.length ?? 0}}`);
    });
    const base = await listen(createServer(handler));
    await checkCommonRules(base, "/orders", () => n, { db, log });
    const t = await post(base, "/throw", { key: "t1" });
    assert.equal(t.status, 500);
    assert.equal(rows(db).find((r) => r.key === "t1").status, "pending");
    const get = await fetch(`${base}/orders`, { headers: { "x-user": "acct-1" } });
    assert.equal(get.status, 201, "GET passes through (unprotected)");
  });
});
