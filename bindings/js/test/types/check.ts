// Compiled (not run) by the suite: the README's usage against the package's
// types, by the package's own name (package.json "exports" -> types/).
import { handleIdempotentMutation, NothingChangedError, type IdempotencyOptions, type Outcome } from "@idempotency/ledger/worker";
import { openLedgerDatabase, handleIdempotentMutation as nodeHandle, idempotentHandler, pgLedger, ledgerFor as nodeLedgerFor } from "@idempotency/ledger/node";
import { idempotency as hono, ledgerFor as honoLedgerFor, NothingChangedError as HonoNothingChanged } from "@idempotency/ledger/hono";
import { idempotency as expressIdempotency, ledgerFor as expressLedgerFor } from "@idempotency/ledger/express";
import { createPgPool } from "@idempotency/ledger/pg";
import { ERROR_OUTCOMES, REQUESTS, useOpenTelemetryApi } from "@idempotency/ledger/opentelemetry";

interface Env {
  DB: { prepare(sql: string): { bind(...v: unknown[]): { run(): Promise<unknown> } }; batch(s: unknown[]): Promise<any[]> };
}
const outcomes: Outcome[] = [];
const options: IdempotencyOptions = {
  pendingTtlMs: 60_000, retentionMs: 86_400_000, bodyCapBytes: 8192, profile: "ietf", waitMs: 1000, onServerError: "release", replayHeader: null,
  onOutcome: (outcome) => outcomes.push(outcome),
  route: "/orders", recordKeys: false, telemetry: true,
};
const counterName: "idempotency.requests" = REQUESTS;
void counterName;
void ERROR_OUTCOMES.has("fenced-out");
void useOpenTelemetryApi;

export default {
  async fetch(request: Request, env: Env, ctx: { waitUntil(p: Promise<unknown>): void }): Promise<Response> {
    return handleIdempotentMutation(request, env, ctx, "acct-42", async (body: ArrayBuffer) => {
      if (body.byteLength === 0) throw new NothingChangedError("empty", { response: { status: 400, body: "empty" } });
      await env.DB.prepare("INSERT INTO orders (id) VALUES (?)").bind(body.byteLength).run();
      return { status: 201, body: JSON.stringify({ ok: true }), headers: { "content-type": "application/json" } };
    }, options);
  },
};

export async function node(): Promise<number> {
  const db = await openLedgerDatabase(":memory:");
  const r = await nodeHandle(new Request("http://x/orders", { method: "POST" }), { DB: db }, undefined, "p", () => ({ status: 200, body: "ok" }));
  const listener = idempotentHandler({ db, principal: (req) => String(req.headers["x-user"] ?? "") }, async (_req, _res) => {});
  void listener;
  const honoMw = hono({ db: (c: { env: Env }) => c.env.DB, principal: () => "acct", include: ["/orders*"] });
  const expressMw = expressIdempotency({ db, principal: (req) => req.get("x-user"), routes: (method, path) => method === "POST" && path === "/orders" });
  void honoMw;
  void expressMw.errors;
  void new HonoNothingChanged();
  const { outcome } = await nodeLedgerFor(db).handle(new Request("http://x/orders", { method: "POST" }), "p", () => ({ status: 201 }));
  const same: Outcome = outcome;
  void same;
  void honoLedgerFor(db, options).session.protects("POST");
  void expressLedgerFor(db).sweepAll();
  const pool = await createPgPool("postgresql://localhost/app", { max: 5 });
  void pgLedger(pool);
  return r.status;
}
