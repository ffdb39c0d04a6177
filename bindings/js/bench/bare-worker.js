// Start-cost baseline: bench/worker.js without the idempotency package (the same D1 insert, the same answer).
const insert = (env) =>
  env.DB.prepare("INSERT INTO orders (id, principal, sku, qty, created_at) VALUES (?, ?, ?, ?, ?)")
    .bind(crypto.randomUUID(), "bench", "B", 1, Date.now())
    .run();

export default {
  async fetch(request, env) {
    if (new URL(request.url).pathname === "/probe") return Response.json(null);
    await request.arrayBuffer();
    await insert(env);
    return new Response('{"ok":true}', { status: 201, headers: { "content-type": "application/json" } });
  },
};
