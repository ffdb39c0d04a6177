// Start-cost Worker: bench/bare-worker.js (the same D1 insert) behind the
// package's handleIdempotentMutation. GET /probe answers what the isolate's
// first protected request spent (isolate clock, 1 ms resolution) instantiating
// the component and opening the core session.
import { getCore, handleIdempotentMutation, ledgerFor } from "../src/worker.js";

const IDEMPOTENCY = {}; // the core's defaults; one object, reused: one core session

const insert = (env) =>
  env.DB.prepare("INSERT INTO orders (id, principal, sku, qty, created_at) VALUES (?, ?, ?, ?, ?)")
    .bind(crypto.randomUUID(), "bench", "B", 1, Date.now())
    .run();
const created = () => ({ status: 201, body: '{"ok":true}', headers: { "content-type": "application/json" } });

let first = null;

export default {
  async fetch(request, env, ctx) {
    if (new URL(request.url).pathname === "/probe") return Response.json(first);
    if (first === null) {
      // What the first handled request does anyway, timed in parts.
      const t0 = performance.now();
      getCore().ready();
      const t1 = performance.now();
      ledgerFor(env.DB, IDEMPOTENCY);
      first = { instantiateMs: t1 - t0, sessionMs: performance.now() - t1 };
    }
    return handleIdempotentMutation(
      request,
      env,
      ctx,
      "bench",
      async () => {
        await insert(env);
        return created();
      },
      IDEMPOTENCY,
    );
  },
};
