// Compiled (not run) by the suite: the README's Worker against the package's types.
import { handleIdempotentMutation, validateIdempotencyKey, computeFingerprint, type IdempotencyOptions } from "../../src/worker.js";
import { openLedgerDatabase, handleIdempotentMutation as nodeHandle } from "../../src/node.js";

interface Env {
  DB: { prepare(sql: string): { bind(...v: unknown[]): { run(): Promise<unknown> } }; batch(s: unknown[]): Promise<any[]> };
}
const options: IdempotencyOptions = { pendingTtlMs: 60_000, retentionMs: 86_400_000, bodyCapBytes: 8192 };

export default {
  async fetch(request: Request, env: Env, ctx: { waitUntil(p: Promise<unknown>): void }): Promise<Response> {
    const check = validateIdempotencyKey(request.headers.get("Idempotency-Key"));
    if (!check.ok && check.reason === "key-invalid") return check.response;
    const fp: string = await computeFingerprint("POST", "/orders", request.headers, new Uint8Array());
    void fp;
    return handleIdempotentMutation(request, env, ctx, "acct-42", async (body: ArrayBuffer) => {
      await env.DB.prepare("INSERT INTO orders (id) VALUES (?)").bind(body.byteLength).run();
      return { status: 201, body: JSON.stringify({ ok: true }), headers: { "content-type": "application/json" } };
    }, options);
  },
};

export async function node(): Promise<number> {
  const db = await openLedgerDatabase(":memory:");
  const r = await nodeHandle(new Request("http://x/orders", { method: "POST" }), { DB: db }, undefined, "p", () => ({ status: 200, body: "ok" }));
  return r.status;
}
