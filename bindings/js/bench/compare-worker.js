// Bench Worker for `make bench`: the package's handler (/component) and the
// recipe's plain-JS handler (/recipe) over the same D1 binding and the same
// mutation. Routes:
//   POST /component, /recipe              the two handlers (principal "bench")
//   POST /count/component, /count/recipe  the same, D1 wrapped by a counting
//                                         wrapper; answers the D1 calls as JSON
//   POST /seed?path=/x&key=K&age=ms       a pending row for K whose fingerprint
//                                         matches this request's body sent to path
//   GET  /iso?impl=component|recipe&path=P&n=N   mean in-isolate time of N handler calls on one path
import { handleIdempotentMutation } from "../src/worker.js";
import { computeFingerprint, handleIdempotentMutation as recipeHandle } from "./recipe.js";

const PRINCIPAL = "bench";
const BODY = '{"sku":"B","qty":1}';
const OTHER_BODY = '{"sku":"B","qty":2}';
const EXPECTED = { fresh: 201, replay: 201, reuse: 409, inProgress: 409 };
// The recipe's constants (pending TTL 30 s, retention 24 h, sweep batch 20),
// which are also the core's defaults; one object, reused: one core session.
const IDEMPOTENCY = { pendingTtlMs: 30_000, retentionMs: 24 * 60 * 60 * 1000 };

// The same mutation for both handlers: one order insert, a 201 with JSON.
const mutation = (env) => async () => {
  await env.DB.prepare("INSERT INTO orders (id, principal, sku, qty, created_at) VALUES (?, ?, ?, ?, ?)")
    .bind(crypto.randomUUID(), PRINCIPAL, "B", 1, Date.now())
    .run();
  return { status: 201, body: '{"ok":true}', headers: new Headers({ "content-type": "application/json" }) };
};

const HANDLERS = {
  component: (request, env, ctx) => handleIdempotentMutation(request, env, ctx, PRINCIPAL, mutation(env), IDEMPOTENCY),
  recipe: (request, env, ctx) => recipeHandle(request, env, ctx, PRINCIPAL, mutation(env)),
};

function kindOf(sql) {
  const s = sql.replace(/\s+/g, " ").trim();
  if (s.startsWith("INSERT INTO orders")) return "mutation";
  if (/^DELETE FROM idempotency_keys/.test(s)) return "sweep";
  if (s.startsWith("INSERT INTO idempotency_keys")) return "claim";
  if (s.startsWith("SELECT")) return "select";
  if (/^UPDATE idempotency_keys SET generation/.test(s)) return "takeover";
  if (/^UPDATE idempotency_keys SET status = 'completed'/.test(s)) return "completion";
  return s.slice(0, 24);
}

/** The real D1 binding behind a wrapper that logs every round trip (one per run/first/all/raw, one per batch). */
function counting(db, log) {
  const statement = (real, sql) => {
    const call = (method) => (...args) => {
      log.push(kindOf(sql));
      return real[method](...args);
    };
    return { bind: (...a) => statement(real.bind(...a), sql), first: call("first"), run: call("run"), all: call("all"), raw: call("raw"), real, sql };
  };
  return {
    prepare: (sql) => statement(db.prepare(sql), sql),
    batch(statements) {
      log.push(`batch(${statements.map((s) => kindOf(s.sql)).join("+")})`);
      return db.batch(statements.map((s) => s.real));
    },
    exec: (sql) => db.exec(sql),
  };
}

/** A pending row for `key` whose fingerprint matches a POST of `body` with `headers` to `path`, `ageMs` old. */
async function seedRow(env, path, key, ageMs, headers, body) {
  const fingerprint = await computeFingerprint("POST", path, headers, body);
  const at = Date.now() - ageMs;
  await env.DB.prepare(
    "INSERT INTO idempotency_keys (principal, key, fingerprint, status, generation, created_at, updated_at) VALUES (?, ?, ?, 'pending', 1, ?, ?)",
  )
    .bind(PRINCIPAL, key, fingerprint, at, at)
    .run();
}

/**
 * Per-request cost without the Node -> workerd hop: n calls of one handler on
 * one path, each timed around the handler alone (its setup untimed). The
 * isolate clock has 1 ms resolution, so only the mean over n is meaningful.
 */
async function inIsolate(env, ctx, impl, pathName, n) {
  const handler = HANDLERS[impl];
  const path = `/${impl}`;
  const headers = { "content-type": "application/json" };
  const req = (key, body) => new Request(`http://bench.test${path}`, { method: "POST", headers: { ...headers, "idempotency-key": key }, body });
  // waitUntil work (sweeps) is kept and awaited before each timed call, so every
  // timed call starts on a quiet D1 (the same for both handlers).
  const pending = [];
  const quietCtx = { waitUntil: (p) => (pending.push(p), ctx.waitUntil(p)), passThroughOnException: () => {} };
  const settle = async () => {
    while (pending.length) await Promise.allSettled(pending.splice(0));
  };
  let total = 0;
  for (let i = 0; i < n; i++) {
    const key = `iso-${crypto.randomUUID()}`;
    if (pathName === "replay" || pathName === "reuse") await (await handler(req(key, BODY), env, quietCtx)).arrayBuffer();
    if (pathName === "inProgress") await seedRow(env, path, key, 0, new Headers(headers), new TextEncoder().encode(BODY));
    await settle();
    const request = req(key, pathName === "reuse" ? OTHER_BODY : BODY);
    const t = performance.now();
    const response = await handler(request, env, quietCtx);
    await response.arrayBuffer();
    total += performance.now() - t;
    if (response.status !== EXPECTED[pathName]) throw new Error(`${impl} ${pathName} answered ${response.status}`);
  }
  await settle();
  return { meanMs: total / n, n };
}

export default {
  async fetch(request, env, ctx) {
    const url = new URL(request.url);
    const path = url.pathname;
    if (path === "/component" || path === "/recipe") return HANDLERS[path.slice(1)](request, env, ctx);
    if (path === "/count/component" || path === "/count/recipe") {
      const log = [];
      const pending = [];
      const wrappedCtx = { waitUntil: (p) => pending.push(p), passThroughOnException: () => {} };
      const inner = new Request(new URL(path.slice("/count".length), url), request);
      const response = await HANDLERS[path.slice("/count/".length)](inner, { ...env, DB: counting(env.DB, log) }, wrappedCtx);
      await response.arrayBuffer();
      const onRequestPath = log.length; // the response is ready: what was issued so far
      await Promise.allSettled(pending);
      return Response.json({ status: response.status, log, onRequestPath });
    }
    if (path === "/seed") {
      await seedRow(env, url.searchParams.get("path"), url.searchParams.get("key"), Number(url.searchParams.get("age") ?? 0), request.headers, await request.arrayBuffer());
      return new Response(null, { status: 204 });
    }
    if (path === "/iso") {
      return Response.json(await inIsolate(env, ctx, url.searchParams.get("impl"), url.searchParams.get("path"), Number(url.searchParams.get("n") ?? 20)));
    }
    return new Response("not found", { status: 404 });
  },
};
