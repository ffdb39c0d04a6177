// The PostgreSQL adapter (node-postgres) on a real server: one round trip per
// batch (counted by a TCP proxy between pg and the server), failures as the
// driver saw them and classified by the core (outcome unknown when the
// backend is terminated after the batch was sent, pool exhausted, unreachable,
// busy), and 50 concurrent same-key requests running once.
import assert from "node:assert/strict";
import { createServer, connect } from "node:net";
import { after, before, describe, test } from "node:test";
import pg from "pg";
import { handleIdempotentMutation, ledgerFor, migrate } from "../src/node.js";
import { pgLedger } from "../src/pg.js";
import { sweepsDone } from "../src/ledger.js";
import { SKIP_PG, freshSchema } from "./helpers/pg.js";

const post = (key, body = '{"sku":"A"}') =>
  new Request("http://api.test/orders", { method: "POST", headers: { "content-type": "application/json", "idempotency-key": key }, body });
const quiet = () => {
  const lines = [];
  return { lines, logger: { error: (m) => lines.push(m), warn: (m) => lines.push(m), info: (m) => lines.push(m) } };
};

/** A TCP proxy to the server that counts client->server "flights" (a write after the server last spoke). */
async function countingProxy(target) {
  const counts = { flights: 0, chunks: 0 };
  const sockets = new Set();
  const server = createServer((client) => {
    const upstream = connect(target.port, target.host);
    sockets.add(client);
    sockets.add(upstream);
    let serverSpoke = true;
    client.on("data", (d) => {
      counts.chunks++;
      if (serverSpoke) counts.flights++;
      serverSpoke = false;
      upstream.write(d);
    });
    upstream.on("data", (d) => {
      serverSpoke = true;
      client.write(d);
    });
    const close = () => {
      client.destroy();
      upstream.destroy();
    };
    client.on("error", close);
    upstream.on("error", close);
    client.on("close", close);
    upstream.on("close", close);
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    port: server.address().port,
    counts,
    async close() {
      for (const s of sockets) s.destroy();
      await new Promise((resolve) => server.close(resolve));
    },
  };
}

describe("PostgreSQL adapter (pg)", { skip: SKIP_PG }, () => {
  let pgs;
  before(async () => {
    pgs = await freshSchema({ max: 4 });
    await migrate(pgs.pool);
  });
  after(async () => pgs?.dispose());

  test("each batch is one transaction in ONE round trip (counted by a TCP proxy)", async () => {
    const url = new URL(pgs.url);
    const proxy = await countingProxy({ host: url.hostname, port: Number(url.port) });
    url.port = String(proxy.port);
    const pool = new pg.Pool({ connectionString: url.toString(), max: 1 });
    try {
      const ledger = ledgerFor(pgLedger(pool), { sweepEvery: 1, logger: quiet().logger });
      await pool.query("SELECT 1"); // connect (startup and auth are not batches)
      const before = proxy.counts.flights;
      const ran = [];
      const run = async () => (ran.push(1), { status: 201, body: "{}", headers: { "content-type": "application/json" } });
      const fresh = await ledger.handle(post("rt-1"), "acct-rt", run);
      assert.equal(fresh.response.status, 201);
      await new Promise((resolve) => setTimeout(resolve, 100)); // the background sweep (sweepEvery: 1)
      assert.equal(proxy.counts.flights - before, 3, "decision, completion, sweep: one flight each");
      const mid = proxy.counts.flights;
      const replay = await ledger.handle(post("rt-1"), "acct-rt", run);
      assert.equal(replay.outcome, "replayed");
      assert.equal(proxy.counts.flights - mid, 1, "a replay is one round trip");
      assert.equal(ran.length, 1);
    } finally {
      await pool.end();
      await proxy.close();
    }
  });

  test("a backend terminated after the decision batch was sent: outcome unknown (503), the mutation never runs", async () => {
    const pool = new pg.Pool({ connectionString: pgs.url, max: 1 });
    pool.on("error", () => {});
    const holder = await pgs.pool.connect();
    try {
      const db = pgLedger(pool);
      const ledger = ledgerFor(db, { logger: quiet().logger });
      // Hold the row's lock so the decision batch waits on the server.
      await holder.query("BEGIN");
      await holder.query(
        "INSERT INTO idempotency_keys (principal, key, fingerprint, status, generation, created_at, updated_at) VALUES ('acct-kill', 'k-kill', 'f', 'pending', 1, 0, 0)",
      );
      const client = await pool.connect();
      const { rows } = await client.query("SELECT pg_backend_pid() AS pid");
      client.release();
      let ran = false;
      const handled = ledger.handle(post("k-kill"), "acct-kill", async () => ((ran = true), { status: 201, body: "x" }));
      await new Promise((resolve) => setTimeout(resolve, 300)); // the batch is on the server, waiting for the lock
      await pgs.admin.query("SELECT pg_terminate_backend($1)", [rows[0].pid]);
      const r = await handled;
      assert.equal(r.outcome, "ledger-outcome-unknown");
      assert.equal(r.response.status, 503);
      const body = await r.response.json();
      assert.equal(body.error, "idempotency_ledger_outcome_unknown");
      assert.equal(r.response.headers.get("retry-after"), "30", "the TTL: the key may stay reserved");
      assert.equal(ran, false);
    } finally {
      await holder.query("ROLLBACK").catch(() => {});
      holder.release();
      await pool.end();
    }
  });

  test("a connection the server terminated while it sat idle costs no request (20 in a row)", async () => {
    const name = `idle_${process.pid}`;
    const pool = new pg.Pool({ connectionString: pgs.url, max: 1, application_name: name });
    pool.on("error", () => {}); // pg-pool reports the idle client's end, then drops it
    try {
      const ledger = ledgerFor(pgLedger(pool), { logger: quiet().logger });
      const run = async () => ({ status: 201, body: "{}" });
      assert.equal((await ledger.handle(post("idle-0"), "acct-idle", run)).outcome, "executed");
      const pids = async () => (await pgs.admin.query("SELECT pid FROM pg_stat_activity WHERE application_name = $1", [name])).rows;
      for (let round = 1; round <= 20; round++) {
        const before = await pids();
        assert.equal(before.length, 1, `round ${round}: one idle connection`);
        await pgs.admin.query("SELECT pg_terminate_backend($1)", [before[0].pid]);
        // Wait for that backend to exit (a background sweep may already have opened another).
        const deadline = Date.now() + 10_000;
        while ((await pids()).some((row) => row.pid === before[0].pid)) {
          assert.ok(Date.now() < deadline, `round ${round}: the terminated backend did not exit`);
          await new Promise((resolve) => setTimeout(resolve, 5));
        }
        let runs = 0;
        const r = await ledger.handle(post(`idle-${round}`), "acct-idle", async () => (runs++, run()));
        assert.equal(r.outcome, "executed", `round ${round}`);
        assert.equal(runs, 1);
      }
    } finally {
      await pool.end();
    }
  });

  test("an exhausted pool is busy (503 Retry-After: 1); an unreachable server is 500; nothing runs", async () => {
    const pool = new pg.Pool({ connectionString: pgs.url, max: 1 });
    const held = await pool.connect();
    try {
      const log = quiet();
      const ledger = ledgerFor(pgLedger(pool, { connectTimeoutMs: 200 }), { logger: log.logger });
      let ran = false;
      const r = await ledger.handle(post("k-pool"), "acct-pool", async () => ((ran = true), { status: 201, body: "x" }));
      assert.equal(r.response.status, 503);
      assert.equal(r.response.headers.get("retry-after"), "1");
      assert.equal(r.outcome, "ledger-busy");
      assert.equal(ran, false);
      assert.match(log.lines[0], /decision failed.*acct-pool/);
    } finally {
      held.release();
      await pool.end();
    }
    const closed = await new Promise((resolve) => {
      const s = createServer();
      s.listen(0, "127.0.0.1", () => {
        const { port } = s.address();
        s.close(() => resolve(port));
      });
    });
    const nowhere = new pg.Pool({ connectionString: `postgresql://postgres@127.0.0.1:${closed}/postgres`, max: 1 });
    try {
      const ledger = ledgerFor(pgLedger(nowhere), { logger: quiet().logger });
      const r = await ledger.handle(post("k-nowhere"), "acct", async () => ({ status: 201, body: "x" }));
      assert.equal(r.response.status, 500);
      assert.equal(r.outcome, "ledger-failed", "an unreachable server is io: 500");
    } finally {
      await nowhere.end();
    }
  });

  test("a row lock held past lock_timeout is busy (SQLSTATE 55P03: 503); the connection is reusable after the rollback", async () => {
    const pool = new pg.Pool({ connectionString: pgs.url, max: 1 });
    const holder = await pgs.pool.connect();
    try {
      const ledger = ledgerFor(pgLedger(pool, { lockTimeoutMs: 100 }), { logger: quiet().logger });
      await holder.query("BEGIN");
      await holder.query(
        "INSERT INTO idempotency_keys (principal, key, fingerprint, status, generation, created_at, updated_at) VALUES ('acct-lock', 'k-lock', 'f', 'pending', 1, 0, 0)",
      );
      const r = await ledger.handle(post("k-lock"), "acct-lock", async () => ({ status: 201, body: "x" }));
      assert.equal(r.response.status, 503);
      assert.equal(r.outcome, "ledger-busy");
      // lockTimeoutMs 0 is 1 ms, as in the Rust and Python hosts (PostgreSQL reads 0 as "wait forever").
      const started = Date.now();
      const zero = await ledgerFor(pgLedger(pool, { lockTimeoutMs: 0 }), { logger: quiet().logger }).handle(post("k-lock"), "acct-lock", async () => ({ status: 201, body: "x" }));
      assert.equal(zero.outcome, "ledger-busy", "a held lock is busy at once, not waited for");
      assert.ok(Date.now() - started < 3000, `answered in ${Date.now() - started} ms`);
      await holder.query("ROLLBACK");
      const ok = await ledger.handle(post("k-lock"), "acct-lock", async () => ({ status: 201, body: "ok" }));
      assert.equal(ok.response.status, 201, "the same pooled connection serves the next batch");
      assert.equal(await ok.response.text(), "ok");
    } finally {
      await holder.query("ROLLBACK").catch(() => {});
      holder.release();
      await pool.end();
    }
  });

  /** The statement names the pool's one connection holds, sorted. */
  const preparedNames = async (pool) => (await pool.query("SELECT name FROM pg_prepared_statements ORDER BY name")).rows.map((r) => r.name);

  test("preparedStatements: each protocol statement prepared once per connection, inside the batch's own flight", async (t) => {
    const url = new URL(pgs.url);
    const proxy = await countingProxy({ host: url.hostname, port: Number(url.port) });
    url.port = String(proxy.port);
    t.after(() => proxy.close());
    for (const preparedStatements of [true, false]) {
      const pool = new pg.Pool({ connectionString: url.toString(), max: 1 });
      try {
        const ledger = ledgerFor(pgLedger(pool, { preparedStatements }), { sweepEvery: 1, logger: quiet().logger });
        await pool.query("SELECT 1");
        const ran = [];
        const run = async () => (ran.push(1), { status: 201, body: '{"order":"o"}', headers: { "content-type": "application/json" } });
        for (const key of ["pp-1", "pp-2"]) {
          const before = proxy.counts.flights;
          const fresh = await ledger.handle(post(`${key}-${preparedStatements}`), "acct-pp", run);
          assert.equal(fresh.response.status, 201);
          await sweepsDone();
          assert.equal(proxy.counts.flights - before, 3, `${key}: decision, completion, sweep: one flight each, the first use's prepares in them`);
          const mid = proxy.counts.flights;
          const replay = await ledger.handle(post(`${key}-${preparedStatements}`), "acct-pp", run);
          assert.equal(replay.outcome, "replayed");
          assert.equal(await replay.response.text(), '{"order":"o"}');
          assert.equal(proxy.counts.flights - mid, 1, "a replay is one round trip");
        }
        assert.equal(ran.length, 2);
        const names = await preparedNames(pool);
        if (preparedStatements) {
          assert.deepEqual(
            names.map((n) => n.replace(/_[0-9a-f]{16}$/, "")),
            ["claim", "complete", "lookup", "sweep", "takeover"].map((q) => `idempotency_ledger_${q}`),
            "the protocol's statements used, once each; no DDL, not this listing",
          );
        } else {
          assert.deepEqual(names, [], "nothing prepared by default");
        }
      } finally {
        await pool.end();
      }
    }
  });

  test("preparedStatements: a flight that failed after preparing is mended on the same connection (Close, then Parse again)", async () => {
    const pool = new pg.Pool({ connectionString: pgs.url, max: 1 });
    const holder = await pgs.pool.connect();
    try {
      const ledger = ledgerFor(pgLedger(pool, { lockTimeoutMs: 100, preparedStatements: true }), { logger: quiet().logger });
      // The first batch on the connection parses the claim by name; its execution then waits on the held row lock and fails.
      await holder.query("BEGIN");
      await holder.query(
        "INSERT INTO idempotency_keys (principal, key, fingerprint, status, generation, created_at, updated_at) VALUES ('acct-pp', 'k-pp-lock', 'f', 'pending', 1, 0, 0)",
      );
      const busy = await ledger.handle(post("k-pp-lock"), "acct-pp", async () => ({ status: 201, body: "x" }));
      assert.equal(busy.outcome, "ledger-busy");
      assert.ok((await preparedNames(pool)).some((n) => n.startsWith("idempotency_ledger_claim_")), "the claim's Parse succeeded before its execution failed");
      await holder.query("ROLLBACK");
      // Parsing it again without closing it first would fail (42P05, prepared statement already exists).
      const ok = await ledger.handle(post("k-pp-lock"), "acct-pp", async () => ({ status: 201, body: "ok" }));
      assert.equal(ok.response.status, 201);
      assert.equal(await ok.response.text(), "ok");

      // A server that lost the connection's names (DEALLOCATE ALL here; a transaction pooler's other
      // server connection in production): one batch fails with 26000 and says why, the next prepares again.
      await pool.query("DEALLOCATE ALL");
      const log = quiet();
      const lost = await ledgerFor(pgLedger(pool, { preparedStatements: true }), { logger: log.logger }).handle(post("k-pp-gone"), "acct-pp", async () => ({ status: 201, body: "x" }));
      assert.equal(lost.response.status >= 500, true, `status ${lost.response.status}`);
      assert.ok(log.lines.some((l) => String(l).includes("26000") && String(l).includes("preparedStatements")), log.lines.join("\n"));
      const again = await ledger.handle(post("k-pp-gone"), "acct-pp", async () => ({ status: 201, body: "again" }));
      assert.equal(again.response.status, 201);
      assert.equal(await again.response.text(), "again");
    } finally {
      await holder.query("ROLLBACK").catch(() => {});
      holder.release();
      await pool.end();
    }
  });

  test("a decision or a sweep is one simple query with its parameters written in; the completion keeps its response in parameters", async () => {
    const pool = new pg.Pool({ connectionString: pgs.url, max: 1 });
    try {
      const ledger = ledgerFor(pgLedger(pool), { sweepEvery: 1, logger: quiet().logger });
      // The pool's one connection: what each batch sends on it, message by message.
      const client = await pool.connect();
      const sent = [];
      for (const method of ["query", "parse"]) {
        const original = client.connection[method].bind(client.connection);
        client.connection[method] = (arg) => (sent.push([method, typeof arg === "string" ? arg : arg.text]), original(arg));
      }
      client.release();
      const body = '{"card":"4242-secret"}';
      const run = async () => ({ status: 201, body, headers: { "content-type": "application/json" } });
      const fresh = await ledger.handle(post("sq-1"), "acct-sq", run);
      assert.equal(fresh.response.status, 201);
      await sweepsDone();
      const decision = sent.filter(([m, text]) => m === "query" && text.includes("ON CONFLICT (principal, key) DO NOTHING"));
      assert.equal(decision.length, 1, "the decision: one Query message");
      assert.match(decision[0][1], /^BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL lock_timeout = '5000ms'; INSERT .*'acct-sq', 'sq-1'.*; COMMIT$/s);
      assert.ok(sent.some(([m, text]) => m === "query" && text.includes("DELETE FROM idempotency_keys")), "the sweep: a Query message");
      const completion = sent.filter(([m, text]) => m === "parse" && text.startsWith("UPDATE idempotency_keys") && text.includes("status = 'completed'"));
      assert.equal(completion.length, 1, "the completion: parsed with parameters");
      assert.ok(!sent.some(([, text]) => text.includes("4242-secret")), "the stored response is never in a statement's text");
      sent.length = 0;
      const replay = await ledger.handle(post("sq-1"), "acct-sq", run);
      assert.equal(replay.outcome, "replayed");
      assert.equal(await replay.response.text(), body);
      assert.deepEqual(sent.map(([m]) => m), ["query"], "a replay: one Query message, nothing parsed");
    } finally {
      await pool.end();
    }
  });

  test("principals and keys with quotes, backslashes, placeholders and comments are written in exactly", async () => {
    const ledger = ledgerFor(pgLedger(pgs.pool), { logger: quiet().logger });
    const principals = ["o'brien", "back\\slash\\' OR '1'='1", "$1 $2; DROP TABLE idempotency_keys; --", "E'\\x00' /* x */", "\u{1F600} \u{e9}t\u{e9}"];
    for (const [i, principal] of principals.entries()) {
      const key = `k'${i}\\$1`;
      let runs = 0;
      const run = async () => (runs++, { status: 201, body: `{"n":${i}}`, headers: { "content-type": "application/json" } });
      const fresh = await ledger.handle(post(key), principal, run);
      const replay = await ledger.handle(post(key), principal, run);
      assert.deepEqual([fresh.outcome, replay.outcome, runs], ["executed", "replayed", 1], principal);
      assert.equal(await replay.response.text(), `{"n":${i}}`);
    }
    const stored = (await pgs.pool.query("SELECT principal, key FROM idempotency_keys WHERE key LIKE 'k''%' ORDER BY key")).rows;
    assert.deepEqual(
      stored.map((r) => [r.principal, r.key]),
      principals.map((p, i) => [p, `k'${i}\\$1`]),
    );
  });

  test("50 concurrent same-key requests on a pool of 4: one mutation, the rest replays or 409", async () => {
    let runs = 0;
    const mutation = async () => {
      runs += 1;
      await new Promise((resolve) => setTimeout(resolve, 50));
      return { status: 201, body: '{"order":"once"}', headers: { "content-type": "application/json" } };
    };
    const responses = await Promise.all(Array.from({ length: 50 }, () => handleIdempotentMutation(post("same"), { DB: pgs.pool }, undefined, "acct-c", mutation)));
    assert.equal(runs, 1);
    for (const r of responses) {
      if (r.status === 201) assert.equal(await r.text(), '{"order":"once"}');
      else assert.equal(r.status, 409);
    }
  });
});
