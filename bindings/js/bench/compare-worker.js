// Bench Worker for `make bench`: the package's handler (/component) and the
// recipe's plain-JS handler (/recipe) over the same D1 binding and the same
// mutation, plus in-isolate micro-benchmarks. Routes:
//   POST /component, /recipe           the two handlers (principal "bench")
//   POST /count/component, /count/recipe  the same, D1 wrapped by a counting
//                                      wrapper; answers the D1 calls as JSON
//   POST /seed?path=/x&key=K&age=ms    a pending row for K whose fingerprint
//                                      matches this request's body sent to path
//   GET  /fp?size=N&samples=R&warm=W&target=ms   fingerprint throughput
//   GET  /instantiate?n=N              fresh component instances from the compiled modules
//   GET  /iso?impl=component|recipe&path=P&n=N   mean in-isolate time of N handler calls on one path
//   GET  /cpu                          the component's calls of a fresh and a replay request, without D1
import coreModule from "../generated/core.core.wasm";
import coreModule2 from "../generated/core.core2.wasm";
import coreModule3 from "../generated/core.core3.wasm";
import { Core, d1Ledger, getCore, handleIdempotentMutation, requestHead, sha256Hex, toD1Value, toFetchResponse, toMutationResponse } from "../src/worker.js";
import { computeFingerprint, handleIdempotentMutation as recipeHandle } from "./recipe.js";

const MODULES = { "core.core.wasm": coreModule, "core.core2.wasm": coreModule2, "core.core3.wasm": coreModule3 };
const PRINCIPAL = "bench";
const BODY = '{"sku":"B","qty":1}';
const OTHER_BODY = '{"sku":"B","qty":2}';
const EXPECTED = { fresh: 201, replay: 201, reuse: 409, inProgress: 409, takeover: 201 };
const IDEMPOTENCY = { pendingTtlMs: 30_000, retentionMs: 24 * 60 * 60 * 1000 }; // the SPEC defaults, one object reused

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
  if (/^DELETE FROM idempotency_keys WHERE \(principal, key\) IN/.test(s)) return "sweep";
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

function randomBytes(size) {
  const bytes = new Uint8Array(size);
  for (let i = 0; i < size; i += 65536) crypto.getRandomValues(bytes.subarray(i, Math.min(size, i + 65536)));
  return bytes;
}

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
};

// The isolate clock has 1 ms resolution: each sample runs enough iterations to last >= target ms.
async function timed(fn, n) {
  const t = performance.now();
  for (let i = 0; i < n; i++) await fn();
  return performance.now() - t;
}

async function calibrate(fn, target) {
  let n = 1;
  for (;;) {
    if ((await timed(fn, n)) >= target || n >= 1 << 20) return n;
    n *= 2;
  }
}

async function fingerprintBench(size, samples, warm, target) {
  const core = getCore();
  const config = core.config(IDEMPOTENCY);
  const head = { method: "POST", pathAndQuery: "/orders", headers: [{ name: "content-type", value: "application/json" }] };
  const body = randomBytes(size);
  const prefix = core.call((c) => c.protocol.fingerprintPrefix(config, head));
  const impls = {
    // the component's in-wasm fingerprint: prefix, body copied into linear memory, SHA-256, hex
    wasm: () => core.call((c) => c.protocol.fingerprint(config, head, body)),
    // what the package's handler does after admission (prefix from the component): Web Crypto over prefix + body
    subtle: () => sha256Hex(prefix, body),
  };
  const a = impls.wasm();
  const b = await impls.subtle();
  if (a !== b) throw new Error(`fingerprints differ for ${size} bytes: ${a} vs ${b}`);
  const n = {};
  for (const [name, fn] of Object.entries(impls)) n[name] = await calibrate(fn, target);
  const perOp = { wasm: [], subtle: [] };
  for (let i = 0; i < warm + samples; i++) {
    const order = i % 2 ? ["wasm", "subtle"] : ["subtle", "wasm"];
    for (const name of order) {
      const ms = (await timed(impls[name], n[name])) / n[name];
      if (i >= warm) perOp[name].push(ms);
    }
  }
  return { size, samples, warm, iterations: n, perOpMs: perOp, medianMs: { wasm: median(perOp.wasm), subtle: median(perOp.subtle) } };
}

async function instantiateBench(n) {
  const per = [];
  for (let round = 0; round < 7; round++) {
    const t = performance.now();
    for (let i = 0; i < n; i++) new Core((name) => MODULES[name]).ready();
    per.push((performance.now() - t) / n);
  }
  return { perInstanceMs: per, medianMs: median(per.slice(2)), n };
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
    if (pathName === "takeover") await seedRow(env, path, key, 60_000, new Headers(headers), new TextEncoder().encode(BODY));
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

/**
 * Where the component's CPU goes on one request: each call the package makes
 * on the fresh and replay paths, repeated on inputs captured from one real run
 * against D1 (so no D1 time is included). Microseconds per call, median of samples.
 */
async function componentCpu(env, samples = 9, target = 30) {
  const core = getCore();
  const config = core.config(IDEMPOTENCY);
  const db = d1Ledger(env.DB);
  const key = `cpu-${crypto.randomUUID()}`;
  const request = new Request("http://bench.test/component", {
    method: "POST",
    headers: { "content-type": "application/json", "idempotency-key": key },
    body: BODY,
  });
  const body = await request.clone().arrayBuffer();
  const at = BigInt(Date.now());
  const admission = core.call((c) => c.protocol.admit(config, requestHead(request)));
  const fp = await sha256Hex(admission.val.fingerprintPrefix, body);
  const decisionStatements = core.call((c) => c.steps.planDecision(config, PRINCIPAL, key, fp, at));
  const freshResults = await db.batch(decisionStatements);
  const ticket = core.call((c) => c.steps.decide(config, PRINCIPAL, key, fp, at, freshResults)).val;
  const produced = { status: 201, body: '{"ok":true}', headers: new Headers({ "content-type": "application/json" }) };
  const mutationResponse = await toMutationResponse(produced);
  const plan = core.call((c) => c.steps.planCompletion(config, ticket, mutationResponse, at));
  const completionResults = await db.batch(plan.statements);
  const replayResults = await db.batch(core.call((c) => c.steps.planDecision(config, PRINCIPAL, key, fp, at + 1n)));
  const replay = core.call((c) => c.steps.decide(config, PRINCIPAL, key, fp, at + 1n, replayResults));
  if (replay.tag !== "replay") throw new Error(`expected a replay decision, got ${replay.tag}`);
  const stages = {
    "requestHead + admit": () => core.call((c) => c.protocol.admit(config, requestHead(request))),
    "fingerprint (Web Crypto over the prefix)": () => sha256Hex(admission.val.fingerprintPrefix, body),
    planDecision: () => core.call((c) => c.steps.planDecision(config, PRINCIPAL, key, fp, at)),
    "decision batch statements (prepare + bind, not sent)": () => decisionStatements.map((st) => env.DB.prepare(st.sql).bind(...st.params.map(toD1Value))),
    "decide (claim won)": () => core.call((c) => c.steps.decide(config, PRINCIPAL, key, fp, at, freshResults)),
    "toMutationResponse + planCompletion": async () => {
      const m = await toMutationResponse(produced);
      return core.call((c) => c.steps.planCompletion(config, ticket, m, at));
    },
    finishCompletion: () => core.call((c) => c.steps.finishCompletion(completionResults)),
    "toFetchResponse (answer)": () => toFetchResponse(plan.response),
    "decide (replay)": () => core.call((c) => c.steps.decide(config, PRINCIPAL, key, fp, at + 1n, replayResults)),
    "toFetchResponse (replay)": () => toFetchResponse(replay.val),
  };
  const out = {};
  for (const [name, fn] of Object.entries(stages)) {
    const n = await calibrate(fn, target);
    const per = [];
    for (let i = 0; i < samples + 1; i++) {
      const ms = (await timed(fn, n)) / n;
      if (i > 0) per.push(ms);
    }
    out[name] = { us: median(per) * 1000, iterations: n };
  }
  return out;
}

export default {
  async fetch(request, env, ctx) {
    const url = new URL(request.url);
    const path = url.pathname;
    const q = (name, fallback) => Number(url.searchParams.get(name) ?? fallback);
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
      await seedRow(env, url.searchParams.get("path"), url.searchParams.get("key"), q("age", 0), request.headers, await request.arrayBuffer());
      return new Response(null, { status: 204 });
    }
    if (path === "/iso") return Response.json(await inIsolate(env, ctx, url.searchParams.get("impl"), url.searchParams.get("path"), q("n", 20)));
    if (path === "/fp") return Response.json(await fingerprintBench(q("size", 1024), q("samples", 15), q("warm", 3), q("target", 40)));
    if (path === "/cpu") return Response.json(await componentCpu(env));
    if (path === "/instantiate") return Response.json(await instantiateBench(q("n", 20)));
    return new Response("not found", { status: 404 });
  },
};
