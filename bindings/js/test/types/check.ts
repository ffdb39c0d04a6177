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
  void pgLedger(pool, { connectTimeoutMs: 5000, lockTimeoutMs: 5000, preparedStatements: true });
  return r.status;
}

// Idempotent functions and a Queues consumer (README "Jobs, queues, webhooks").
import { idempotentFunction, RejectedError, canonicalJson } from "@idempotency/ledger/node";
import { idempotentQueueConsumer, idempotentFunction as workerFunction } from "@idempotency/ledger/worker";

export async function jobs(db: Awaited<ReturnType<typeof openLedgerDatabase>>): Promise<string> {
  const charge = idempotentFunction(async (order: { id: string; amount: number }) => ({ chargeId: `ch_${order.id}`, amount: order.amount }), {
    db,
    principal: "billing",
    key: (order) => order.id,
    payload: (order) => order,
  });
  const { chargeId } = await charge({ id: "o-1", amount: 5 });
  try {
    await charge({ id: "o-1", amount: 6 });
  } catch (e) {
    if (e instanceof RejectedError && e.outcome === "key-reused") return canonicalJson({ chargeId, status: e.status });
  }
  const viaEnv = workerFunction(async (n: number, env: Env) => n * 2, { db: (_n, env) => env.DB, principal: "p", key: (n) => String(n) });
  void viaEnv;
  return chargeId;
}

export const queueWorker = {
  queue: idempotentQueueConsumer<{ orderId: string }, Env>(async (message, env) => {
    await env.DB.prepare("INSERT INTO charges (order_id) VALUES (?)").bind(message.body.orderId).run();
    return { charged: message.body.orderId };
  }, { key: (m) => m.body.orderId, principal: "billing", onMessage: ({ outcome, ack }) => void [outcome, ack] }),
};

// The test kit (README "Testing your handlers").
import { createTestLedger, fireDuplicates, testClock } from "@idempotency/ledger/testing";

export async function kit(): Promise<number> {
  const ledger = createTestLedger({ principal: () => "acct-1", waitMs: 1000, clock: testClock({ frozen: true }) });
  const mw = hono(ledger.options);
  void mw;
  ledger.clock.advance(30_001);
  const results = await fireDuplicates(3, async (i) => i);
  const deleted: number = await ledger.sweep();
  return results.length + deleted + ledger.count("executed") + ledger.rows().length;
}

// Exactly once (README "Exactly once"): transactional routes per database, the lease's signal.
import { LeaseLostError, type IdempotencyContext, type SqliteTransaction, type PgTransaction, type D1Transaction } from "@idempotency/ledger/node";

export async function exactlyOnce(db: Awaited<ReturnType<typeof openLedgerDatabase>>): Promise<void> {
  const txOptions: IdempotencyOptions = { transactional: true, leaseRenewal: true };
  void txOptions;
  // Workers + D1: the handler registers its statements; they run after the completion in one batch.
  const worker = async (request: Request, env: Env, ctx: { waitUntil(p: Promise<unknown>): void }) =>
    handleIdempotentMutation(request, env, ctx, "acct", async (_body, _request, { transaction, signal }) => {
      const tx = transaction as D1Transaction;
      tx.add(tx.prepare("INSERT INTO orders (id) VALUES (?)").bind("o-1"));
      if (signal.aborted && signal.reason instanceof LeaseLostError) throw signal.reason;
      return { status: 201, body: "{}" };
    }, { transactional: true });
  void worker;
  // node:http on better-sqlite3: req.idempotency.
  const listener = idempotentHandler({ db, principal: () => "acct", transactional: true }, async (req, res) => {
    const tx = req.idempotency.transaction as SqliteTransaction;
    tx.db.prepare("INSERT INTO orders (id) VALUES (?)").run("o-2");
    res.end();
  });
  void listener;
  // Hono on PostgreSQL: c.get("idempotency").
  const honoTx = async (c: { get(key: "idempotency"): IdempotencyContext }) => {
    const tx = c.get("idempotency").transaction as PgTransaction;
    await tx.client.query("INSERT INTO orders (id) VALUES ($1)", ["o-3"]);
  };
  void honoTx;
  // An idempotent function gets the context after its own arguments.
  const charge = idempotentFunction(async (order: { id: string }, { transaction }: IdempotencyContext) => {
    (transaction as SqliteTransaction).db.prepare("INSERT INTO charges (id) VALUES (?)").run(order.id);
    return { charged: order.id };
  }, { db, principal: "billing", key: (order) => order.id, transactional: true });
  const { charged }: { charged: string } = await charge({ id: "o-4" });
  void charged;
}
