// Child process of bench/bench.js: one small app (POST /orders: parse the JSON
// body, insert one order into SQLite, answer 201 with its id) on Hono
// (@hono/node-server) and on Express 5, each once without and once with the
// package's middleware, each on its own better-sqlite3 file (WAL,
// synchronous=NORMAL; the ledger in the same file as the orders, as an app
// would have it). Prints {"ports": {...}} on stdout once listening; exits
// when stdin closes.
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
import { migrate } from "../src/node.js";

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

const quiet = { error: (m) => process.stderr.write(`${m}\n`), warn: (m) => process.stderr.write(`${m}\n`), info: () => {} };
const settings = (db) => ({ db, principal: () => "bench", logger: quiet }); // the core's defaults otherwise

function honoApp(withLedger) {
  const { db, createOrder } = database(`hono-${withLedger ? "ledger" : "bare"}`, withLedger);
  const app = new Hono();
  if (withLedger) app.use("/orders", honoIdempotency(settings(db)));
  app.post("/orders", async (c) => {
    const order = await c.req.json();
    createOrder(order);
    return c.json({ ok: true, sku: order.sku }, 201);
  });
  return new Promise((resolve) => {
    serve({ fetch: app.fetch, hostname: "127.0.0.1", port: 0 }, (info) => resolve(info.port));
  });
}

function expressApp(withLedger) {
  const { db, createOrder } = database(`express-${withLedger ? "ledger" : "bare"}`, withLedger);
  const app = express();
  const idem = withLedger ? expressIdempotency(settings(db)) : null;
  if (idem) app.use(idem);
  app.use(express.json());
  app.post("/orders", (req, res) => {
    createOrder(req.body);
    res.status(201).json({ ok: true, sku: req.body.sku });
  });
  if (idem) app.use(idem.errors);
  return new Promise((resolve) => {
    const server = app.listen(0, "127.0.0.1", () => resolve(server.address().port));
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
process.stdin.on("end", () => process.exit(0));
