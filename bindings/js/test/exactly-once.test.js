// Exactly once (docs/SPEC.md 10) on Node: a transactional handler's writes
// commit with its stored answer or not at all, and a live owner that renews
// its lease is never taken over. Real better-sqlite3 files (and PostgreSQL
// when IDEMPOTENCY_PG_URL is set), the adapters over real HTTP on loopback.
// D1: exactly-once-d1.test.js; the example server as a process that dies
// right after its write: serve-node.test.js.
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { after, describe, test } from "node:test";
import Database from "better-sqlite3";
import express from "express";
import { Hono } from "hono";
import pg from "pg";
import { idempotency as honoIdempotency } from "../src/hono-node.js";
import { idempotency as expressIdempotency } from "../src/express.js";
import { idempotentFunction, idempotentHandler, LeaseLostError, ledgerFor, migrate, NothingChangedError, sweepsDone } from "../src/node.js";
import { testClock } from "../src/testing.js";
import { honoServer, listen } from "./helpers/servers.js";
import { freshDb, rows } from "./helpers/sqlite.js";
import { sqliteLedger } from "../src/sqlite.js";
import { SKIP_PG, freshSchema } from "./helpers/pg.js";

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const recorder = () => {
  const lines = [];
  const outcomes = [];
  const logger = { error: (m) => lines.push(["error", String(m)]), warn: (m) => lines.push(["warn", String(m)]), info: (m) => lines.push(["info", String(m)]) };
  return { lines, outcomes, logger, onOutcome: (o) => outcomes.push(o) };
};

const CREATE_ORDERS = "CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, owner TEXT NOT NULL)";
let ids = 0;
const orderId = () => `o_${process.pid}_${++ids}`;

async function post(base, { key, body = '{"sku":"A"}', headers = {}, path = "/orders" } = {}) {
  const h = { "content-type": "application/json", "x-user": "acct-1", ...headers };
  if (key !== undefined) h["idempotency-key"] = key;
  const r = await fetch(base + path, { method: "POST", headers: h, body });
  return { status: r.status, text: await r.text(), headers: r.headers };
}

/**
 * The same orders route in the three adapters, transactional, writing through
 * what each gives the handler; `x-fail: raise | nothing` fails after the write.
 * `write(transaction, owner)` inserts one order in the handler's transaction.
 */
async function transactionalApps(db, write, settings = {}) {
  const runs = { hono: 0, express: 0, node: 0 };
  const rec = { hono: recorder(), express: recorder(), node: recorder() };
  const opts = (name) => ({ db, principal: (x) => (x.req?.header ? x.req.header("x-user") : x.headers["x-user"]), transactional: true, ...settings, logger: rec[name].logger, onOutcome: rec[name].onOutcome });
  const failure = (how) => (how === "nothing" ? new NothingChangedError("changed nothing", { response: { status: 422, body: "nothing" } }) : new Error("payment refused"));

  const hono = new Hono();
  hono.post("/orders", honoIdempotency(opts("hono")), async (c) => {
    runs.hono++;
    const { transaction, signal, ticket } = c.get("idempotency");
    assert.ok(signal instanceof AbortSignal && ticket.generation >= 1n);
    await write(transaction, "hono");
    const fail = c.req.header("x-fail");
    if (fail) throw failure(fail);
    return c.json({ by: "hono" }, 201);
  });
  hono.onError((error, c) => (error instanceof NothingChangedError ? c.text("nothing", 422) : c.text("failed", 500)));

  const app = express();
  const idem = expressIdempotency(opts("express"));
  app.post("/orders", idem, async (req, res, next) => {
    runs.express++;
    try {
      await write(req.idempotency.transaction, "express");
      const fail = req.get("x-fail");
      if (fail) throw failure(fail);
      res.status(201).json({ by: "express" });
    } catch (error) {
      next(error);
    }
  });
  app.use(idem.errors);
  app.use((error, req, res, _next) => res.status(error instanceof NothingChangedError ? 422 : 500).send(error instanceof NothingChangedError ? "nothing" : "failed"));

  const node = createServer(
    idempotentHandler(opts("node"), async (req, res) => {
      runs.node++;
      await write(req.idempotency.transaction, "node");
      const fail = req.headers["x-fail"];
      if (fail === "nothing") {
        res.writeHead(422).end("nothing");
        throw new NothingChangedError();
      }
      if (fail) throw failure(fail);
      res.writeHead(201, { "content-type": "application/json" }).end('{"by":"node"}');
    }),
  );
  return { bases: { hono: await honoServer(hono), express: await listen(createServer(app)), node: await listen(node) }, runs, rec };
}

/** The rules every adapter follows on every database, through `count()` (committed orders). */
async function checkTransactionalAdapters(name, base, runs, rec, count) {
  assert.equal(await count(), 0);
  const first = await post(base, { key: `${name}-1` });
  assert.equal(first.status, 201, first.text);
  assert.equal(await count(), 1, `${name}: the write committed with the answer`);
  const replay = await post(base, { key: `${name}-1` });
  assert.deepEqual([replay.status, replay.text], [201, first.text], `${name}: replayed`);
  assert.equal(await count(), 1, `${name}: a replay writes nothing`);
  assert.equal(runs[name], 1);

  const raised = await post(base, { key: `${name}-2`, headers: { "x-fail": "raise" } });
  assert.equal(raised.status, 500, `${name}: ${raised.text}`);
  assert.equal(await count(), 1, `${name}: the write of a handler that raised was rolled back`);
  const nothing = await post(base, { key: `${name}-3`, headers: { "x-fail": "nothing" } });
  assert.equal(nothing.status, 422, `${name}: ${nothing.text}`);
  assert.equal(await count(), 1, `${name}: the write of a handler that changed nothing was rolled back`);
  // Nothing happened, so the keys were released: the retries run at once (no 409 until the TTL).
  assert.equal((await post(base, { key: `${name}-2` })).status, 201);
  assert.equal((await post(base, { key: `${name}-3` })).status, 201);
  assert.equal(await count(), 3);
  assert.equal(runs[name], 5);
  assert.deepEqual(rec[name].outcomes, ["executed", "replayed", "released", "released", "executed", "executed"], name);
}

describe("exactly once on better-sqlite3", () => {
  test("Hono, Express and node:http: the handler writes through the ledger's Database in its transaction; the write commits with the answer, a replay writes nothing, a failing handler's write is rolled back and its key runs again", async () => {
    for (const name of ["hono", "express", "node"]) {
      const db = freshDb();
      db.exec(CREATE_ORDERS);
      const { bases, runs, rec } = await transactionalApps(db, async (transaction, owner) => {
        assert.equal(transaction.dialect, "sqlite");
        assert.equal(transaction.db, db, "the handler gets the ledger's Database");
        assert.ok(db.inTransaction, "inside the transaction");
        transaction.db.prepare("INSERT INTO orders (id, owner) VALUES (?, ?)").run(orderId(), owner);
      });
      const reader = new Database(db.name, { readonly: true });
      await checkTransactionalAdapters(name, bases[name], runs, rec, async () => reader.prepare("SELECT COUNT(*) AS n FROM orders").get().n);
      reader.close();
      db.close();
    }
  });

  test("a superseded owner's write is rolled back and its caller gets the new owner's stored answer (two servers on one file)", async () => {
    const a = freshDb();
    a.exec(CREATE_ORDERS);
    const b = new Database(a.name, { timeout: 5000 });
    const clock = testClock({ frozen: true });
    const recA = recorder();
    // Renewal off for the stalled owner: it stopped renewing (the case a takeover is for).
    const optionsA = { now: clock.now, transactional: true, leaseRenewal: false, logger: recA.logger, onOutcome: recA.onOutcome };
    const optionsB = { now: clock.now, transactional: true, logger: recorder().logger };
    const request = () => new Request("http://api.test/orders", { method: "POST", headers: { "idempotency-key": "k-stall", "content-type": "application/json" }, body: "{}" });
    const { response, outcome } = await ledgerFor(a, optionsA).handle(request(), "acct", async (_body, _req, { transaction }) => {
      clock.advance(30_001); // past the TTL: server B takes the key over and completes it
      const byB = await ledgerFor(b, optionsB).handle(request(), "acct", async (_b, _r, ctx) => {
        ctx.transaction.db.prepare("INSERT INTO orders (id, owner) VALUES (?, ?)").run(orderId(), "B");
        return { status: 201, body: '{"by":"B"}', headers: { "content-type": "application/json" } };
      });
      assert.equal(byB.outcome, "taken-over");
      transaction.db.prepare("INSERT INTO orders (id, owner) VALUES (?, ?)").run(orderId(), "A");
      return { status: 201, body: '{"by":"A"}', headers: { "content-type": "application/json" } };
    });
    assert.equal(outcome, "fenced-out");
    assert.equal(await response.text(), '{"by":"B"}', "the stored answer, never one for writes that were undone");
    assert.deepEqual(a.prepare("SELECT owner FROM orders").all().map((r) => r.owner), ["B"], "A's write was rolled back");
    assert.ok(recA.lines.some(([level, line]) => level === "error" && line.includes("fenced out")), "the core's fenced-out line");
    b.close();
    a.close();
  });

  test("over HTTP, a fenced-out handler's answer is never sent: Hono, Express and node:http send the new owner's stored answer instead", async () => {
    for (const name of ["hono", "express", "node"]) {
      const a = freshDb();
      a.exec(CREATE_ORDERS);
      const b = new Database(a.name, { timeout: 5000 });
      const clock = testClock({ frozen: true });
      const recA = recorder();
      const optionsA = { db: a, principal: () => "acct", now: clock.now, transactional: true, leaseRenewal: false, logger: recA.logger, onOutcome: recA.onOutcome };
      const optionsB = { now: clock.now, transactional: true, logger: recorder().logger };
      const body = '{"sku":"A"}';
      // Server A's handler stalls past the TTL; server B takes the key over and completes it first.
      const takeOver = async () => {
        clock.advance(30_001);
        const request = new Request("http://api.test/orders", { method: "POST", headers: { "idempotency-key": `k-${name}`, "content-type": "application/json" }, body });
        const byB = await ledgerFor(b, optionsB).handle(request, "acct", async (_body, _req, ctx) => {
          ctx.transaction.db.prepare("INSERT INTO orders (id, owner) VALUES (?, ?)").run(orderId(), "B");
          return { status: 201, body: '{"by":"B"}', headers: { "content-type": "application/json" } };
        });
        assert.equal(byB.outcome, "taken-over");
      };
      const writeA = (db) => db.prepare("INSERT INTO orders (id, owner) VALUES (?, ?)").run(orderId(), "A");
      let base;
      if (name === "hono") {
        const app = new Hono();
        app.post("/orders", honoIdempotency(optionsA), async (c) => {
          await takeOver();
          writeA(c.get("idempotency").transaction.db);
          c.header("x-by", "A");
          return c.json({ by: "A" }, 202);
        });
        base = await honoServer(app);
      } else if (name === "express") {
        const app = express();
        const idem = expressIdempotency(optionsA);
        app.post("/orders", idem, async (req, res) => {
          await takeOver();
          writeA(req.idempotency.transaction.db);
          res.set("x-by", "A").status(202).json({ by: "A" });
        });
        app.use(idem.errors);
        base = await listen(createServer(app));
      } else {
        base = await listen(
          createServer(
            idempotentHandler(optionsA, async (req, res) => {
              await takeOver();
              writeA(req.idempotency.transaction.db);
              res.writeHead(202, { "content-type": "application/json", "x-by": "A" }).end('{"by":"A"}');
            }),
          ),
        );
      }
      const answer = await post(base, { key: `k-${name}`, body });
      assert.deepEqual([answer.status, answer.text, answer.headers.get("x-by")], [201, '{"by":"B"}', null], `${name}: the stored answer, never the fenced-out handler's`);
      assert.deepEqual(recA.outcomes, ["fenced-out"], name);
      assert.deepEqual(a.prepare("SELECT owner FROM orders").all().map((r) => r.owner), ["B"], `${name}: A's write was rolled back`);
      b.close();
      a.close();
    }
  });

  test("while a handler's transaction is open, the ledger's other batches on that Database wait for it, at most the busy timeout (then 503 busy)", async () => {
    const db = freshDb();
    db.pragma("busy_timeout = 300");
    db.exec(CREATE_ORDERS);
    const rec = recorder();
    const server = createServer(
      idempotentHandler({ db, principal: () => "acct", transactional: true, logger: rec.logger, onOutcome: rec.onOutcome }, async (req, res) => {
        const ms = Number(req.headers["x-stall-ms"] ?? 0);
        req.idempotency.transaction.db.prepare("INSERT INTO orders (id, owner) VALUES (?, ?)").run(orderId(), "x");
        await sleep(ms);
        res.writeHead(201).end("made");
      }),
    );
    const base = await listen(server);
    // A short stall: the other request's decision waits for the transaction, then runs.
    const short = post(base, { key: "s1", headers: { "x-stall-ms": "100" } });
    await sleep(30);
    const other = await post(base, { key: "s2" });
    assert.equal(other.status, 201);
    assert.equal((await short).status, 201);
    // A stall past the busy timeout: the other request is answered busy, nothing ran for it.
    const long = post(base, { key: "l1", headers: { "x-stall-ms": "800" } });
    await sleep(30);
    const busy = await post(base, { key: "l2" });
    assert.equal(busy.status, 503, busy.text);
    assert.equal((await long).status, 201);
    assert.equal(db.prepare("SELECT COUNT(*) AS n FROM orders").get().n, 3);
    assert.deepEqual(rec.outcomes.sort(), ["executed", "executed", "executed", "ledger-busy"]);
    assert.equal((await post(base, { key: "l2" })).status, 201, "the busy request's key was never claimed");
    db.close();
  });

  test("concurrent transactional handlers on one better-sqlite3 Database take turns: every one commits, none begins inside another's transaction", async () => {
    const db = freshDb();
    db.exec(CREATE_ORDERS);
    const rec = recorder();
    const ledger = ledgerFor(db, { principal: () => "acct", transactional: true, logger: rec.logger, onOutcome: rec.onOutcome });
    // Each handler awaits while its transaction is open, so the others queue
    // at the gate and are woken together when it ends.
    const answers = await Promise.all(
      Array.from({ length: 8 }, (_, i) =>
        ledger.handle(new Request("http://api.test/orders", { method: "POST", headers: { "idempotency-key": `turn-${i}` }, body: "{}" }), "acct", async (_b, _r, { transaction }) => {
          transaction.db.prepare("INSERT INTO orders (id, owner) VALUES (?, ?)").run(orderId(), `turn-${i}`);
          await sleep(5);
          return { status: 201 };
        }),
      ),
    );
    assert.deepEqual(answers.map((a) => a.response.status), Array(8).fill(201), rec.lines.map(([, l]) => l).join("\n"));
    assert.deepEqual(rec.outcomes, Array(8).fill("executed"));
    assert.equal(db.prepare("SELECT COUNT(*) AS n FROM orders").get().n, 8);
    db.close();
  });

  test("a transaction that cannot begin: the handler never runs, every adapter sends the core's answer, the key is released", async () => {
    const file = freshDb();
    // A LedgerDb without begin(): its transactional routes cannot open a transaction.
    const db = { dialect: "sqlite", batch: sqliteLedger(file).batch };
    let runs = 0;
    const rec = recorder();
    const settings = { db, principal: () => "acct", transactional: true, logger: rec.logger, onOutcome: rec.onOutcome };
    const hono = new Hono();
    hono.post("/orders", honoIdempotency(settings), (c) => (runs++, c.text("ran", 201)));
    const app = express();
    const idem = expressIdempotency(settings);
    app.post("/orders", idem, (req, res) => (runs++, res.status(201).send("ran")));
    app.use(idem.errors);
    const node = createServer(idempotentHandler(settings, (req, res) => (runs++, res.writeHead(201).end("ran"))));
    const answers = [];
    for (const base of [await honoServer(hono), await listen(createServer(app)), await listen(node)]) {
      answers.push(await post(base, { key: "no-tx" }));
      assert.equal((await post(base, { key: "no-tx" })).status, 500, "released: the retry is decided afresh (and fails the same way)");
    }
    const { response } = await ledgerFor(db, settings).handle(new Request("http://api.test/orders", { method: "POST", headers: { "idempotency-key": "no-tx" }, body: "{}" }), "acct", () => {
      runs++;
      return { status: 201 };
    });
    answers.push({ status: response.status, text: await response.text() });
    assert.equal(runs, 0, "the handler never ran");
    for (const a of answers) {
      assert.equal(a.status, 500);
      const answer = JSON.parse(a.text);
      assert.equal(answer.error, "idempotency_ledger_unavailable", "the ledger's answer: the transaction could not begin");
      assert.match(answer.message, /not executed/);
    }
    assert.deepEqual([...new Set(rec.outcomes)], ["ledger-failed"]);
    assert.ok(rec.lines.some(([, line]) => line.includes("the handler's transaction could not begin")), "the core's line names why");
    assert.deepEqual(rows(file), [], "nothing left reserved");
    file.close();
  });

  test("a request the ledger passes through (no key where keys are optional) still runs in a transaction of its own on a transactional route", async () => {
    const db = freshDb();
    db.exec(CREATE_ORDERS);
    const server = createServer(
      idempotentHandler({ db, principal: () => "acct", transactional: true, keyRequired: false, logger: recorder().logger }, async (req, res) => {
        assert.equal(req.idempotency.ticket, undefined, "no reservation");
        req.idempotency.transaction.db.prepare("INSERT INTO orders (id, owner) VALUES (?, ?)").run(orderId(), "plain");
        if (req.headers["x-fail"]) throw new Error("failed after the write");
        res.writeHead(201).end("made");
      }),
    );
    const base = await listen(server);
    assert.equal((await post(base, {})).status, 201);
    assert.equal(db.prepare("SELECT COUNT(*) AS n FROM orders").get().n, 1, "committed");
    await post(base, { headers: { "x-fail": "1" } }).catch(() => {});
    assert.equal(db.prepare("SELECT COUNT(*) AS n FROM orders").get().n, 1, "rolled back");
    assert.equal(db.inTransaction, false);
    db.close();
  });

  test("idempotentFunction, transactional: the function's write commits with its stored result, once per key; a failing one writes nothing", async () => {
    const db = freshDb();
    db.exec(CREATE_ORDERS);
    let runs = 0;
    const charge = idempotentFunction(
      async (order, { transaction, signal }) => {
        runs++;
        assert.ok(signal instanceof AbortSignal);
        transaction.db.prepare("INSERT INTO orders (id, owner) VALUES (?, ?)").run(order.id, "fn");
        if (order.fail) throw new Error("refused");
        return { charged: order.id };
      },
      { db, principal: "billing", key: (order) => order.id, name: "charge", transactional: true, logger: recorder().logger },
    );
    assert.deepEqual(await charge({ id: "c1" }), { charged: "c1" });
    assert.deepEqual(await charge({ id: "c1" }), { charged: "c1" });
    await assert.rejects(charge({ id: "c2", fail: true }), /refused/);
    assert.deepEqual(db.prepare("SELECT id FROM orders").all(), [{ id: "c1" }]);
    assert.equal(runs, 2);
    db.close();
  });
});

describe("lease renewal on better-sqlite3", () => {
  /** Express over loopback: POST /orders sleeps `delayMs` in the handler (a live but slow owner). */
  async function slowApp(settings, delayMs) {
    const db = freshDb();
    const runs = { n: 0 };
    const rec = recorder();
    const app = express();
    app.post("/orders", expressIdempotency({ db, principal: () => "acct", ...settings, logger: rec.logger, onOutcome: rec.onOutcome }), async (req, res) => {
      runs.n++;
      await sleep(delayMs);
      res.status(201).json({ run: runs.n });
    });
    return { base: await listen(createServer(app)), runs, rec, db };
  }

  test("a live owner past a short TTL is not taken over with renewal on, and is with it off", async () => {
    for (const [renewal, expectedRuns] of [
      [true, 1],
      [false, 2],
    ]) {
      const { base, runs, rec, db } = await slowApp({ pendingTtlMs: 300, leaseRenewal: renewal }, 1200);
      const first = post(base, { key: "slow" });
      await sleep(700); // well past the 300 ms TTL while the first handler still runs
      const second = await post(base, { key: "slow" });
      const statuses = [(await first).status, second.status];
      assert.equal(runs.n, expectedRuns, `renewal ${renewal}: statuses ${statuses}`);
      if (renewal) {
        assert.deepEqual(statuses, [201, 409], "the live owner kept its key; the duplicate was told it is in progress");
        assert.deepEqual(rec.outcomes.sort(), ["executed", "in-progress"]);
      } else {
        assert.deepEqual(statuses, [201, 201]);
        assert.deepEqual(rec.outcomes.sort(), ["fenced-out", "taken-over"]);
      }
      db.close();
    }
  });

  test("a renewal that finds the lease lost aborts the handler's signal with the core's line; the transactional write is rolled back", async () => {
    const db = freshDb();
    db.exec(CREATE_ORDERS);
    const other = new Database(db.name, { timeout: 2000 });
    const rec = recorder();
    let reason;
    const server = createServer(
      idempotentHandler({ db, principal: () => "acct", transactional: true, pendingTtlMs: 600, logger: rec.logger, onOutcome: rec.onOutcome }, async (req, res) => {
        const { signal } = req.idempotency;
        // Another server takes the reservation over meanwhile (its generation moves on).
        other.prepare("UPDATE idempotency_keys SET generation = generation + 1").run();
        reason = await new Promise((resolve) => {
          const timer = setTimeout(() => resolve("never aborted"), 3000);
          signal.addEventListener("abort", () => {
            clearTimeout(timer);
            resolve(signal.reason);
          });
        });
        req.idempotency.transaction.db.prepare("INSERT INTO orders (id, owner) VALUES (?, ?)").run(orderId(), "late");
        res.writeHead(201).end("made");
      }),
    );
    const base = await listen(server);
    const answer = await post(base, { key: "lost" });
    assert.ok(reason instanceof LeaseLostError, `aborted: ${reason}`);
    const lost = rec.lines.find(([, line]) => line === reason.message);
    assert.ok(lost, "the reason is the core's logged line");
    assert.equal(lost[0], "error");
    assert.equal(rec.outcomes[0], "fenced-out");
    assert.equal(answer.status, 409, "the current owner is still running: in progress, never an answer for the undone write");
    assert.equal(db.prepare("SELECT COUNT(*) AS n FROM orders").get().n, 0);
    other.close();
    db.close();
  });
});

describe("exactly once on PostgreSQL", { skip: SKIP_PG }, () => {
  const pools = [];
  after(async () => {
    for (const p of pools) await p.dispose();
  });
  async function schema(max = 4) {
    const p = await freshSchema({ max });
    pools.push(p);
    await migrate(p.pool);
    await p.pool.query(CREATE_ORDERS);
    return p;
  }
  const count = (p) => async () => Number((await p.admin.query(`SELECT COUNT(*) AS n FROM "${p.schema}".orders`)).rows[0].n);

  test("Hono, Express and node:http: the handler gets a client checked out for the request, inside BEGIN; the write commits with the answer or is rolled back", async () => {
    for (const name of ["hono", "express", "node"]) {
      const p = await schema();
      const { pool } = p;
      const { bases, runs, rec } = await transactionalApps(pool, async (transaction, owner) => {
        assert.equal(transaction.dialect, "postgres");
        const { client } = transaction;
        assert.equal(client.getTransactionStatus(), "T", "inside BEGIN");
        assert.throws(() => client.release(), /open transaction/, "never released to the pool mid-transaction");
        assert.ok(pool.idleCount < pool.totalCount, "checked out of the pool");
        await client.query("INSERT INTO orders (id, owner) VALUES ($1, $2)", [orderId(), owner]);
      });
      await checkTransactionalAdapters(name, bases[name], runs, rec, count(p));
      await sweepsDone(); // a background sweep the core asked for holds a client while it runs
      assert.equal(pool.idleCount, pool.totalCount, "every client went back to the pool");
    }
  });

  test("a superseded owner's write is rolled back and its caller gets the new owner's stored answer", async () => {
    const p = await schema();
    const clock = testClock({ frozen: true });
    const recA = recorder();
    const optionsA = { now: clock.now, transactional: true, leaseRenewal: false, logger: recA.logger, onOutcome: recA.onOutcome };
    const optionsB = { now: clock.now, transactional: true, logger: recorder().logger };
    const request = () => new Request("http://api.test/orders", { method: "POST", headers: { "idempotency-key": "k-stall" }, body: "{}" });
    const { response, outcome } = await ledgerFor(p.pool, optionsA).handle(request(), "acct", async (_body, _req, { transaction }) => {
      await transaction.client.query("INSERT INTO orders (id, owner) VALUES ($1, 'A')", [orderId()]);
      clock.advance(30_001);
      const byB = await ledgerFor(p.pool, optionsB).handle(request(), "acct", async (_b, _r, ctx) => {
        await ctx.transaction.client.query("INSERT INTO orders (id, owner) VALUES ($1, 'B')", [orderId()]);
        return { status: 201, body: '{"by":"B"}' };
      });
      assert.equal(byB.outcome, "taken-over");
      return { status: 201, body: '{"by":"A"}' };
    });
    assert.equal(outcome, "fenced-out");
    assert.equal(await response.text(), '{"by":"B"}');
    const { rows } = await p.admin.query(`SELECT owner FROM "${p.schema}".orders`);
    assert.deepEqual(rows.map((r) => r.owner), ["B"], "A's write was rolled back");
    assert.equal(p.pool.idleCount, p.pool.totalCount);
  });

  test("renewal runs on the pool, not on the handler's client: a live transactional owner past a short TTL keeps its key (on), or is taken over and rolled back (off)", async () => {
    for (const renewal of [true, false]) {
      const p = await schema();
      let runs = 0;
      const rec = recorder();
      const app = new Hono();
      app.post("/orders", honoIdempotency({ db: p.pool, principal: () => "acct", transactional: true, pendingTtlMs: 300, leaseRenewal: renewal, logger: rec.logger, onOutcome: rec.onOutcome }), async (c) => {
        const run = ++runs;
        await c.get("idempotency").transaction.client.query("INSERT INTO orders (id, owner) VALUES ($1, $2)", [orderId(), `run-${run}`]);
        if (run === 1) await sleep(1200);
        return c.json({ run }, 201);
      });
      const base = await honoServer(app);
      const first = post(base, { key: "slow" });
      await sleep(700);
      const second = await post(base, { key: "slow" });
      const firstAnswer = await first;
      assert.equal(await count(p)(), 1, `renewal ${renewal}: one order whatever happened`);
      if (renewal) {
        assert.deepEqual([firstAnswer.status, second.status, runs], [201, 409, 1]);
        assert.deepEqual(rec.outcomes.sort(), ["executed", "in-progress"]);
      } else {
        assert.equal(runs, 2, "taken over: the handler ran again");
        assert.deepEqual(rec.outcomes.sort(), ["fenced-out", "taken-over"]);
        assert.equal(firstAnswer.text, second.text, "the superseded owner's caller gets the new owner's answer");
        assert.deepEqual((await p.admin.query(`SELECT owner FROM "${p.schema}".orders`)).rows, [{ owner: "run-2" }]);
      }
    }
  });

  test("the handler's connection terminated mid-handler: nothing commits, the broken client is discarded, the key is released", async () => {
    const p = await schema(2);
    const killer = new pg.Client({ connectionString: p.url });
    await killer.connect();
    const rec = recorder();
    const server = createServer(
      idempotentHandler({ db: p.pool, principal: () => "acct", transactional: true, logger: rec.logger, onOutcome: rec.onOutcome }, async (req, res) => {
        const { client } = req.idempotency.transaction;
        await client.query("INSERT INTO orders (id, owner) VALUES ($1, 'x')", [orderId()]);
        if (req.headers["x-kill"]) {
          const { rows } = await client.query("SELECT pg_backend_pid() AS pid");
          await killer.query("SELECT pg_terminate_backend($1)", [rows[0].pid]);
          await sleep(100);
        }
        res.writeHead(201).end("made");
      }),
    );
    const base = await listen(server);
    const killed = await post(base, { key: "kill", headers: { "x-kill": "1" } });
    assert.equal(killed.status, 503, killed.text);
    assert.equal(rec.outcomes[0], "rolled-back");
    assert.equal(await count(p)(), 0);
    const retried = await post(base, { key: "kill" });
    assert.equal(retried.status, 201, "released: the retry runs at once");
    assert.equal(await count(p)(), 1);
    await killer.end();
  });
});
