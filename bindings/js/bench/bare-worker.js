// Cold-start baseline: the bench Worker's /bare route without the idempotency package.
const insert = (env) =>
  env.DB.prepare("INSERT INTO orders (id, principal, sku, qty, created_at) VALUES (?, ?, ?, ?, ?)")
    .bind(crypto.randomUUID(), "bench", "B", 1, Date.now())
    .run();

export default {
  async fetch(request, env) {
    await request.arrayBuffer();
    await insert(env);
    return new Response('{"ok":true}', { status: 201, headers: { "content-type": "application/json" } });
  },
};
