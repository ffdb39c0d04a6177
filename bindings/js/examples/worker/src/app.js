// The example application: an idempotent `POST /orders` on D1. `hooks` exist
// so the test harness can wrap the D1 binding, drive the clock and shape the
// mutation; the deployable Worker (index.js) passes none.
import { handleIdempotentMutation } from "@idempotency/ledger";

const json = (status, body, headers = {}) =>
  new Response(JSON.stringify(body), { status, headers: { "content-type": "application/json", ...headers } });

/** The caller's account, derived on the server from its bearer token (never from a client-chosen header). */
export function authenticate(request, env) {
  const match = /^Bearer (\S+)$/.exec(request.headers.get("authorization") ?? "");
  if (!match) return null;
  let tokens;
  try {
    tokens = JSON.parse(env.API_TOKENS ?? "{}");
  } catch {
    return null;
  }
  return Object.prototype.hasOwnProperty.call(tokens, match[1]) ? tokens[match[1]] : null;
}

/** The ledger settings the Worker's vars ask for (SPEC defaults otherwise). */
export function optionsFromEnv(env) {
  const options = {};
  if (env.IDEMPOTENCY_PENDING_TTL_MS) options.pendingTtlMs = Number(env.IDEMPOTENCY_PENDING_TTL_MS);
  if (env.IDEMPOTENCY_RETENTION_MS) options.retentionMs = Number(env.IDEMPOTENCY_RETENTION_MS);
  return options;
}

export function createOrdersWorker(hooks = {}) {
  let envOptions = null;
  return {
    async fetch(request, env, ctx) {
      const url = new URL(request.url);
      if (url.pathname !== "/orders" && !url.pathname.startsWith("/orders/")) return json(404, { error: "not_found" });
      const principal = authenticate(request, env);
      if (principal === null) return json(401, { error: "unauthorized" });
      const db = hooks.db ? hooks.db(env, request) : env.DB;
      const options = hooks.options ? hooks.options(request, env) : (envOptions ??= optionsFromEnv(env));
      const mutation = async (bodyBytes) => {
        if (request.method === "GET") {
          const { results } = await db
            .prepare("SELECT id, sku, qty, created_at FROM orders WHERE principal = ? ORDER BY created_at, id")
            .bind(principal)
            .all();
          return { status: 200, body: JSON.stringify({ orders: results }), headers: { "content-type": "application/json" } };
        }
        if (request.method !== "POST" || url.pathname !== "/orders") {
          return { status: 405, body: JSON.stringify({ error: "method_not_allowed" }), headers: { "content-type": "application/json" } };
        }
        let order;
        try {
          order = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(bodyBytes));
        } catch {
          return { status: 422, body: JSON.stringify({ error: "invalid_json" }), headers: { "content-type": "application/json" } };
        }
        if (typeof order?.sku !== "string" || !Number.isInteger(order?.qty) || order.qty < 1) {
          return { status: 422, body: JSON.stringify({ error: "invalid_order" }), headers: { "content-type": "application/json" } };
        }
        const id = `ord_${crypto.randomUUID()}`;
        const createdAt = Date.now();
        await db
          .prepare("INSERT INTO orders (id, principal, sku, qty, created_at) VALUES (?, ?, ?, ?, ?)")
          .bind(id, principal, order.sku, order.qty, createdAt)
          .run();
        return {
          status: 201,
          body: JSON.stringify({ id, sku: order.sku, qty: order.qty }),
          headers: { "content-type": "application/json", location: `/orders/${id}` },
        };
      };
      const run = hooks.mutation ? hooks.mutation(request, mutation) : mutation;
      return handleIdempotentMutation(request, { DB: db }, ctx, principal, run, options);
    },
  };
}
