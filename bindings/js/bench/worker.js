// Bench Worker: the same D1 insert bare (/bare) and behind the idempotency handler (/idem).
// GET /probe answers how long the isolate's first component instantiation took
// (timed inside the first /idem request; the isolate clock has 1 ms resolution).
import { getCore, handleIdempotentMutation } from "../src/worker.js";

const insert = (env) =>
  env.DB.prepare("INSERT INTO orders (id, principal, sku, qty, created_at) VALUES (?, ?, ?, ?, ?)")
    .bind(crypto.randomUUID(), "bench", "B", 1, Date.now())
    .run();
const created = () => ({ status: 201, body: '{"ok":true}', headers: { "content-type": "application/json" } });

let firstInstantiateMs = null;

export default {
  async fetch(request, env, ctx) {
    const { pathname } = new URL(request.url);
    if (pathname === "/bare") {
      await request.arrayBuffer();
      await insert(env);
      const r = created();
      return new Response(r.body, { status: r.status, headers: r.headers });
    }
    if (pathname === "/idem") {
      if (firstInstantiateMs === null) {
        const t = performance.now();
        getCore().ready(); // what the first handled request does anyway
        firstInstantiateMs = performance.now() - t;
      }
      return handleIdempotentMutation(request, env, ctx, "bench", async () => {
        await insert(env);
        return created();
      });
    }
    if (pathname === "/probe") return Response.json({ firstInstantiateMs });
    return new Response("not found", { status: 404 });
  },
};
