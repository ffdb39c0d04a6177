// Child process of bench/bench.js: one small app (POST /orders: parse the JSON
// body, insert one order into SQLite, answer 201 with its id) on Hono
// (@hono/node-server) and on Express 5, each once without and once with the
// package's middleware, each on its own better-sqlite3 file (WAL,
// synchronous=NORMAL; the ledger in the same file as the orders, as an app
// would have it). Prints {"ports": {...}} on stdout once listening; when
// stdin closes, prints what each server measured ({"measured": {...}}) and
// exits.
//
// Measured in the server, per request (tagged by the client's
// `x-bench-path` header): the CPU time this process spent from the request's
// arrival until its response finished (process.cpuUsage: user + system) and
// the wall time between the two; with the middleware, the time of each
// SQLite batch of the request (a LedgerDb that times the package's own
// better-sqlite3 ledger: one more promise per batch).
import { randomUUID } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { serve } from "@hono/node-server";
import Database from "better-sqlite3";
import express from "express";
import { Hono } from "hono";
import { idempotency as expressIdempotency } from "../src/express.js";
import { idempotency as honoIdempotency } from "../src/hono-node.js";
import { migrate, sqliteLedger } from "../src/node.js";

const dir = mkdtempSync(join(tmpdir(), "idem-bench-node-"));
process.on("exit", () => rmSync(dir, { recursive: true, force: true }));

function database(name, withLedger) {
  const db = new Database(join(dir, `${name}.sqlite`));
  db.pragma("journal_mode = WAL");
  db.pragma("synchronous = NORMAL");
  db.exec("CREATE TABLE orders (id TEXT PRIMARY KEY, sku TEXT NOT NULL, qty INTEGER NOT NULL, created_at INTEGER NOT NULL)");
  if (withLedger) migrate(db);
  const insert = db.prepare("INSERT INTO orders (id, sku, qty, created_at) VALUES (?, ?, ?, ?)");
  return { db, createOrder: (order) => insert.run(`ord_${randomUUID()}`, String(order.sku), Number(order.qty), Date.now()).changes };
}

// name -> path -> { cpuUs: [], wallUs: [], batchUs: [] (per request: its batches summed) }
const measured = {};
let inFlight = null; // the request being served: requests arrive one at a time
const sample = (name, path) => ((measured[name] ??= {})[path] ??= { cpuUs: [], wallUs: [], batchUs: [] });

function measure(server, name) {
  server.prependListener("request", (req, res) => {
    const path = String(req.headers["x-bench-path"] ?? "other");
    const cpu = process.cpuUsage();
    const wall = process.hrtime.bigint();
    const current = { batchUs: 0 };
    inFlight = current;
    res.once("finish", () => {
      const used = process.cpuUsage(cpu);
      const s = sample(name, path);
      s.cpuUs.push(used.user + used.system);
      s.wallUs.push(Number(process.hrtime.bigint() - wall) / 1000);
      s.batchUs.push(current.batchUs);
      if (inFlight === current) inFlight = null;
    });
  });
}

/** The package's better-sqlite3 ledger, each batch timed for the request in flight. */
function timedLedger(db) {
  const inner = sqliteLedger(db);
  return {
    ...inner,
    batch(statements) {
      const current = inFlight;
      const began = process.hrtime.bigint();
      return inner.batch(statements).then((results) => {
        if (current !== null) current.batchUs += Number(process.hrtime.bigint() - began) / 1000;
        return results;
      });
    },
  };
}

const quiet = { error: (m) => process.stderr.write(`${m}\n`), warn: (m) => process.stderr.write(`${m}\n`), info: () => {} };
const settings = (db) => ({ db, principal: () => "bench", logger: quiet }); // the core's defaults otherwise

function honoApp(withLedger) {
  const { db, createOrder } = database(`hono-${withLedger ? "ledger" : "bare"}`, withLedger);
  const app = new Hono();
  if (withLedger) app.use("/orders", honoIdempotency(settings(timedLedger(db))));
  app.post("/orders", async (c) => {
    const order = await c.req.json();
    createOrder(order);
    return c.json({ ok: true, sku: order.sku }, 201);
  });
  return new Promise((resolve) => {
    const server = serve({ fetch: app.fetch, hostname: "127.0.0.1", port: 0 }, (info) => resolve(info.port));
    measure(server, `hono ${withLedger ? "ledger" : "bare"}`);
  });
}

function expressApp(withLedger) {
  const { db, createOrder } = database(`express-${withLedger ? "ledger" : "bare"}`, withLedger);
  const app = express();
  const idem = withLedger ? expressIdempotency(settings(timedLedger(db))) : null;
  if (idem) app.use(idem);
  app.use(express.json());
  app.post("/orders", (req, res) => {
    createOrder(req.body);
    res.status(201).json({ ok: true, sku: req.body.sku });
  });
  if (idem) app.use(idem.errors);
  return new Promise((resolve) => {
    const server = app.listen(0, "127.0.0.1", () => resolve(server.address().port));
    measure(server, `express ${withLedger ? "ledger" : "bare"}`);
  });
}

const ports = {
  "hono bare": await honoApp(false),
  "hono ledger": await honoApp(true),
  "express bare": await expressApp(false),
  "express ledger": await expressApp(true),
};
process.stdout.write(`${JSON.stringify({ ports })}\n`);
process.stdin.resume();
process.stdin.on("end", () => {
  process.stdout.write(`${JSON.stringify({ measured })}\n`, () => process.exit(0));
});
