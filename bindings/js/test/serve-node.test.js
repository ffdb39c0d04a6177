// The example server of `make serve-node` (examples/node/server.js) as a real
// process on a free loopback port, driven over HTTP: on a SQLite file, and on
// PostgreSQL when IDEMPOTENCY_PG_URL is set (make test-postgres).
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { createServer } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, test } from "node:test";
import { fileURLToPath } from "node:url";
import { SKIP_PG, freshSchema } from "./helpers/pg.js";
import { chunkedUpload } from "./helpers/upload.js";

const SERVER = fileURLToPath(new URL("../examples/node/server.js", import.meta.url));
const dir = mkdtempSync(join(tmpdir(), "idem-serve-node-"));
after(() => rmSync(dir, { recursive: true, force: true }));

async function freePort() {
  const server = createServer();
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address();
  await new Promise((resolve) => server.close(resolve));
  return port;
}

/** Starts the server; resolves once its first stderr line says where it listens. */
async function start(env) {
  const port = await freePort();
  const child = spawn(process.execPath, [SERVER], { env: { ...process.env, PORT: String(port), ...env }, stdio: ["ignore", "pipe", "pipe"] });
  let stderr = "";
  child.stderr.on("data", (d) => (stderr += d));
  const exited = new Promise((resolve) => child.on("exit", (code, signal) => resolve({ code, signal })));
  for (let i = 0; i < 300 && !stderr.includes("listening on"); i++) {
    if (child.exitCode !== null) break;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  assert.match(stderr, /^serve-node: listening on http:\/\/127\.0\.0\.1:\d+; database .*; settings \{/, `first line: ${stderr}`);
  if (env.IDEMPOTENCY_PREPARED_STATEMENTS === "1") assert.ok(stderr.includes('"preparedStatements":true'), `first line: ${stderr}`);
  return { port, child, exited, stderr: () => stderr, base: `http://127.0.0.1:${port}` };
}

async function post(base, { key, body = '{"sku":"A","qty":1}', token = "tok-1", query = "", headers = {} } = {}) {
  const h = { "content-type": "application/json", ...headers };
  if (token) h.authorization = `Bearer ${token}`;
  if (key !== undefined) h["idempotency-key"] = key;
  const r = await fetch(`${base}/orders${query}`, { method: "POST", headers: h, body });
  const text = await r.text();
  return { status: r.status, headers: r.headers, text, json: text ? JSON.parse(text) : undefined };
}

const count = async (base) => (await (await fetch(`${base}/orders/count`, { headers: { authorization: "Bearer tok-1" } })).json()).count;

const chunkedPost = (port, total, key) =>
  chunkedUpload({ port, headers: { authorization: "Bearer tok-1", "idempotency-key": key, "content-type": "application/json" }, total });

function suite(name, env, skip) {
  describe(`make serve-node (${name})`, { skip }, () => {
    test("retries replay, reuse is 409, a missing bearer is 401, 30 concurrent duplicates run once, the cap is 413, SIGTERM exits 0", async () => {
      const server = await start(await env());
      try {
        const { base, port } = server;
        const first = await post(base, { key: "order-1" });
        assert.equal(first.status, 201);
        assert.equal(first.headers.get("content-type"), "application/json");
        assert.match(first.json.id, /^ord_/);
        assert.deepEqual(first.json.request, { sku: "A", qty: 1 });
        assert.equal(first.headers.get("location"), `/orders/${first.json.id}`);
        const retry = await post(base, { key: "order-1" });
        assert.equal(retry.status, 201);
        assert.equal(retry.text, first.text, "the retry replays the stored answer");
        assert.equal(retry.headers.get("location"), first.headers.get("location"));
        assert.equal(await count(base), 1);

        const reused = await post(base, { key: "order-1", body: '{"sku":"B","qty":1}' });
        assert.equal(reused.status, 409);
        assert.equal(reused.json.error, "idempotency_key_reused");

        const anonymous = await post(base, { key: "order-2", token: null });
        assert.equal(anonymous.status, 401);
        assert.deepEqual(anonymous.json, { error: "unauthorized", message: "Send Authorization: Bearer <token>." }, "the app's own auth, before the idempotency layer");
        assert.equal(await count(base), 1);

        // A refused request creates nothing and releases its key: the corrected retry runs.
        const badJson = await post(base, { key: "fix", body: "{not json" });
        assert.deepEqual([badJson.status, badJson.json], [400, { error: "invalid_json", message: "The body must be JSON." }]);
        const badDelay = await post(base, { key: "fix", query: "?delay_ms=soon" });
        assert.deepEqual([badDelay.status, badDelay.json], [400, { error: "invalid_delay_ms", message: "delay_ms must be a non-negative integer." }]);
        const tooDeep = await post(base, { key: "fix", body: "[".repeat(101) + "]".repeat(101) });
        assert.deepEqual([tooDeep.status, tooDeep.json?.error], [400, "invalid_json"], "nested over 100 levels, alike in every example server");
        assert.equal((await post(base, { key: "fix", body: '{"sku":"C","qty":3}' })).status, 201, "the key was released");
        assert.equal(await count(base), 2);

        // 30 concurrent duplicates while the first runs (delay_ms): one execution.
        const burst = await Promise.all(Array.from({ length: 30 }, () => post(base, { key: "burst", query: "?delay_ms=400" })));
        const created = burst.filter((r) => r.status === 201);
        assert.ok(created.length >= 1, "the executor answers 201");
        for (const r of created) assert.equal(r.text, created[0].text, "every 201 is the executor's body");
        for (const r of burst.filter((x) => x.status !== 201)) {
          assert.equal(r.status, 409);
          assert.equal(r.json.error, "idempotency_key_in_progress");
        }
        assert.equal(await count(base), 3, "30 duplicates executed once");
        assert.equal((await post(base, { key: "burst", query: "?delay_ms=400" })).text, created[0].text);

        // The request body cap: Content-Length before reading, and a chunked body while reading.
        const big = await post(base, { key: "big", body: JSON.stringify({ pad: "x".repeat(5000) }) });
        assert.equal(big.status, 413);
        assert.equal(big.json.error, "idempotency_request_too_large");
        const chunked = await chunkedPost(port, 8 * 1024 * 1024, "big-chunked");
        assert.equal(chunked.status, 413, `chunked: ${JSON.stringify(chunked)}`);
        assert.ok(chunked.sent < 8 * 1024 * 1024, "the server answered before the whole body was sent");
        assert.equal(await count(base), 3);
        const atCap = await post(base, { key: "at-cap", body: JSON.stringify({ pad: "y".repeat(4000 - 12) }) });
        assert.equal(atCap.status, 201, "a request at the cap runs, and its echo is stored (response cap = request cap + 1024)");
        assert.equal((await post(base, { key: "at-cap", body: JSON.stringify({ pad: "y".repeat(4000 - 12) }) })).text, atCap.text);
      } finally {
        server.child.kill("SIGTERM");
      }
      const { code, signal } = await server.exited;
      assert.equal(signal, null);
      assert.equal(code, 0, `exit after SIGTERM: ${server.stderr()}`);
    });
  });
}

/** A POST the server dies on (X-Exit-After-Write): the fetch fails, the process exits. */
async function postAndDie(server, key) {
  const answer = await post(server.base, { key, headers: { "x-exit-after-write": "1" } }).catch((error) => ({ error }));
  assert.ok(answer.error, `no answer: ${JSON.stringify(answer)}`);
  const { code, signal } = await server.exited;
  assert.deepEqual({ code, signal }, { code: 3, signal: null }, `X-Exit-After-Write ends the process with status 3 right after the write: ${server.stderr()}`);
}

async function stop(server) {
  server.child.kill("SIGTERM");
  const { code } = await server.exited;
  assert.equal(code, 0, server.stderr());
}

/** Orders in the ledger's database (the example servers' exactly-once settings, README.md): crash right after the write, lease renewal. */
function exactlyOnceSuite(name, database, skip) {
  describe(`make serve-node, orders in the ledger's database (${name})`, { skip }, () => {
    test("transactional: killed right after its write, the order is not committed; the retry after the TTL writes it once", async () => {
      const env = { ...(await database()), ORDERS_IN_DATABASE: "1", IDEMPOTENCY_TRANSACTIONAL: "1", IDEMPOTENCY_PENDING_TTL_MS: "500" };
      const first = await start(env);
      assert.match(first.stderr(), /"ordersInDatabase":true,"transactional":true/);
      await postAndDie(first, "crash");
      const second = await start(env);
      try {
        assert.equal(await count(second.base), 0, "the write died with its transaction");
        await new Promise((resolve) => setTimeout(resolve, 600)); // past the TTL: the retry takes the reservation over
        const retry = await post(second.base, { key: "crash" });
        assert.equal(retry.status, 201, retry.text);
        const replay = await post(second.base, { key: "crash" });
        assert.deepEqual([replay.status, replay.text], [201, retry.text], "replayed");
        assert.equal(await count(second.base), 1, "one order for one key across the crash");
      } finally {
        await stop(second);
      }
    });

    test("not transactional: the order written before the crash stays, and the retry after the TTL writes it again", async () => {
      const env = { ...(await database()), ORDERS_IN_DATABASE: "1", IDEMPOTENCY_PENDING_TTL_MS: "500" };
      await postAndDie(await start(env), "crash-plain");
      const second = await start(env);
      try {
        assert.equal(await count(second.base), 1, "the write committed on its own");
        await new Promise((resolve) => setTimeout(resolve, 600));
        assert.equal((await post(second.base, { key: "crash-plain" })).status, 201);
        assert.equal(await count(second.base), 2, "what the transactional mode prevents: the order twice");
      } finally {
        await stop(second);
      }
    });

    test("IDEMPOTENCY_LEASE_RENEWAL: a live owner past the TTL keeps its key when on, and is taken over when off", async () => {
      for (const [renewal, status, orders] of [
        ["on", 409, 1],
        ["off", 201, 2],
      ]) {
        const server = await start({ ...(await database()), ORDERS_IN_DATABASE: "1", IDEMPOTENCY_PENDING_TTL_MS: "400", IDEMPOTENCY_LEASE_RENEWAL: renewal });
        try {
          assert.match(server.stderr(), new RegExp(`"leaseRenewal":${renewal === "on"}`));
          const key = `slow-${renewal}`;
          const slow = post(server.base, { key, query: "?delay_ms=1500" });
          await new Promise((resolve) => setTimeout(resolve, 900)); // past the TTL while the first still runs
          const second = await post(server.base, { key, query: "?delay_ms=1500" });
          assert.equal((await slow).status, 201);
          assert.equal(second.status, status, `renewal ${renewal}: ${second.text}`);
          assert.equal(await count(server.base), orders, `renewal ${renewal}`);
        } finally {
          await stop(server);
        }
      }
    });
  });
}

suite("SQLite file", async () => ({ DATABASE_URL: join(dir, `ledger-${Date.now()}.sqlite`), IDEMPOTENCY_MAX_BODY_BYTES: "4000" }), false);
let files = 0;
// The whole contract again with the orders in the ledger's database, written in the handler's transaction.
suite("SQLite file, transactional", async () => ({ DATABASE_URL: join(dir, `tx-${Date.now()}.sqlite`), IDEMPOTENCY_MAX_BODY_BYTES: "4000", ORDERS_IN_DATABASE: "1", IDEMPOTENCY_TRANSACTIONAL: "1" }), false);
exactlyOnceSuite("SQLite file", async () => ({ DATABASE_URL: join(dir, `orders-${Date.now()}-${++files}.sqlite`) }), false);

const pgs = [];
after(async () => {
  for (const pg of pgs) await pg.dispose();
});
const pgDatabase = (max) => async () => {
  const pg = await freshSchema({ max });
  pgs.push(pg);
  return { DATABASE_URL: pg.url };
};
suite(
  "PostgreSQL",
  async () => ({ ...(await pgDatabase(1)()), IDEMPOTENCY_MAX_BODY_BYTES: "4000" }),
  SKIP_PG,
);
suite(
  "PostgreSQL, statements prepared by name",
  async () => ({ ...(await pgDatabase(1)()), IDEMPOTENCY_MAX_BODY_BYTES: "4000", IDEMPOTENCY_PREPARED_STATEMENTS: "1" }),
  SKIP_PG,
);
suite("PostgreSQL, transactional", async () => ({ ...(await pgDatabase(1)()), IDEMPOTENCY_MAX_BODY_BYTES: "4000", ORDERS_IN_DATABASE: "1", IDEMPOTENCY_TRANSACTIONAL: "1" }), SKIP_PG);
exactlyOnceSuite("PostgreSQL", pgDatabase(1), SKIP_PG);

test("IDEMPOTENCY_PREPARED_STATEMENTS=1 on a SQLite file: the server does not start, and says why", () => {
  const env = { ...process.env, PORT: "0", DATABASE_URL: join(dir, "prepared.sqlite"), IDEMPOTENCY_PREPARED_STATEMENTS: "1" };
  const done = spawnSync(process.execPath, [SERVER], { env, encoding: "utf8", timeout: 30_000 });
  assert.notEqual(done.status, 0);
  assert.match(done.stderr, /IDEMPOTENCY_PREPARED_STATEMENTS=1 needs a postgresql:\/\/ DATABASE_URL/);
});
