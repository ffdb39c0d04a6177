// The Node adapter: the same handleIdempotentMutation over better-sqlite3 files.
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, describe, test } from "node:test";
import { Worker } from "node:worker_threads";
import Database from "better-sqlite3";
import {
  IdempotencyError,
  NothingChangedError,
  defaultOptions,
  handleIdempotentMutation,
  ledgerFor,
  migrate,
  openLedgerDatabase,
  schemaStatements,
  sqliteLedger,
  sweepsDone,
} from "../src/node.js";
import { fromD1Results, fromD1Value, toD1Value } from "../src/d1.js";
import { BatchFailure, databaseError } from "../src/runtime.js";
import { freshDb, rows } from "./helpers/sqlite.js";

const dir = mkdtempSync(join(tmpdir(), "idem-node-"));
after(() => rmSync(dir, { recursive: true, force: true }));

const T0 = 1_800_000_000_000;
const post = (key, body = '{"sku":"A","qty":1}', headers = {}, path = "/orders") =>
  new Request(`http://api.test${path}`, {
    method: "POST",
    headers: { "content-type": "application/json", ...(key === undefined ? {} : { "idempotency-key": key }), ...headers },
    body,
  });

/** The package's better-sqlite3 ledger with a batch counter and chosen failures in front. */
function counted(db, failOn = []) {
  const inner = sqliteLedger(db);
  const probe = { batches: 0 };
  probe.ledger = {
    dialect: "sqlite",
    async batch(statements) {
      probe.batches += 1;
      if (failOn.includes(probe.batches)) throw new BatchFailure(databaseError("SQLITE_IOERR", "disk I/O error (injected)"));
      return inner.batch(statements);
    },
  };
  return probe;
}

function mutationCounter(status = 201) {
  const m = { runs: 0, bodies: [] };
  m.run = async (bytes) => {
    m.runs += 1;
    m.bodies.push(new TextDecoder().decode(bytes));
    return { status, body: JSON.stringify({ order: `o_${m.runs}` }), headers: { "Content-Type": "application/json", Location: `/orders/o_${m.runs}`, "X-Trace": "t" } };
  };
  return m;
}

function capture() {
  const lines = [];
  return { lines, logger: { error: (m) => lines.push(String(m)) } };
}

describe("Node adapter (better-sqlite3)", () => {
  test("openLedgerDatabase creates, migrates (idempotently) and uses WAL", async () => {
    const path = join(dir, "open.sqlite");
    const db = await openLedgerDatabase(path);
    assert.equal(db.pragma("journal_mode", { simple: true }), "wal");
    migrate(db);
    const tables = db.prepare("SELECT name FROM sqlite_master WHERE type IN ('table', 'index') AND name LIKE '%idempotency%' AND name NOT LIKE 'sqlite_%' ORDER BY name").all();
    assert.deepEqual(tables.map((t) => t.name), ["idempotency_keys", "idx_idempotency_keys_updated_at"]);
    assert.equal(schemaStatements().length, 2);
    db.close();
  });

  test("a Database in a rollback-journal mode is reported once, through the logger; WAL and :memory: are not", async () => {
    const warnings = [];
    const logger = { warn: (m) => warnings.push(String(m)), error: (m) => assert.fail(`unexpected error line: ${m}`) };
    const path = join(dir, "rollback-journal.sqlite");
    const plain = new Database(path); // better-sqlite3's defaults: journal_mode=delete
    migrate(plain);
    const first = ledgerFor(plain, { logger });
    ledgerFor(plain, { logger, pendingTtlMs: 60_000 }); // another ledger on the same Database
    assert.equal(warnings.length, 1);
    assert.match(warnings[0], /rollback-journal\.sqlite is in journal_mode=delete/);
    assert.match(warnings[0], /openLedgerDatabase\(path\)/);
    // Only a warning: the ledger works on it as it is, and leaves its journal mode alone.
    const m = mutationCounter();
    const response = await first.handle(post("k-journal"), "acct", m.run);
    assert.equal(response.response.status, 201);
    assert.equal(plain.pragma("journal_mode", { simple: true }), "delete");
    plain.close();

    const truncated = new Database(join(dir, "truncate-journal.sqlite"));
    truncated.pragma("journal_mode = TRUNCATE");
    ledgerFor(truncated, { logger });
    assert.equal(warnings.length, 2);
    assert.match(warnings[1], /journal_mode=truncate/);
    truncated.close();

    const wal = await openLedgerDatabase(join(dir, "wal-journal.sqlite"));
    ledgerFor(wal, { logger });
    wal.close();
    const memory = new Database(":memory:");
    ledgerFor(memory, { logger });
    memory.close();
    assert.equal(warnings.length, 2);
  });

  test("openLedgerDatabase: workers opening one new file at once all open it (SQLite's busy at the switch to WAL is waited out)", async () => {
    const workers = 8;
    const paths = Array.from({ length: 30 }, (_, round) => join(dir, `together-${round}.sqlite`));
    const gate = new SharedArrayBuffer(4 * paths.length);
    const outcomes = await Promise.all(
      Array.from({ length: workers }, () => {
        const worker = new Worker(new URL("./helpers/open-at-barrier.js", import.meta.url), { workerData: { paths, gate, workers } });
        return new Promise((resolve, reject) => {
          worker.once("message", resolve);
          worker.once("error", reject);
        }).finally(() => worker.terminate());
      }),
    );
    assert.equal(outcomes.flat().length, workers * paths.length);
    assert.deepEqual(outcomes.flat().filter((o) => !o.opened), []);
    for (const path of paths) {
      const db = new Database(path);
      assert.equal(db.pragma("journal_mode", { simple: true }), "wal");
      db.close();
    }
  });

  test("the same handler API: executes once, replays, one batch to decide and one to complete", async () => {
    const db = freshDb();
    const probe = counted(db);
    const m = mutationCounter();
    const env = { DB: probe.ledger };
    const scheduled = [];
    const ctx = { waitUntil: (p) => scheduled.push(p) };
    const options = { now: () => T0 };
    const first = await handleIdempotentMutation(post("k-1"), env, ctx, "acct-1", m.run, options);
    assert.equal(first.status, 201);
    assert.deepEqual([...first.headers], [["content-type", "application/json"], ["location", "/orders/o_1"], ["x-trace", "t"]], "the mutation's own response");
    const firstText = await first.text();
    assert.equal(probe.batches, 2, "the sweep has not run before the response is returned");
    assert.equal(scheduled.length, 1, "the sweep is handed to waitUntil");
    await Promise.all(scheduled);
    assert.equal(probe.batches, 3);
    const again = await handleIdempotentMutation(post("k-1"), env, ctx, "acct-1", m.run, options);
    assert.equal(await again.text(), firstText);
    assert.deepEqual([...again.headers], [["content-type", "application/json"], ["location", "/orders/o_1"]], "the replay headers only");
    assert.equal(probe.batches, 4, "a replay is one batch");
    assert.equal(m.runs, 1);
    assert.deepEqual(m.bodies, ['{"sku":"A","qty":1}'], "the mutation gets the raw body bytes");
    const [row] = rows(db);
    assert.equal(row.status, "completed");
    assert.equal(row.created_at, T0);
  });

  test("sweepsDone() resolves once the background sweeps finished, so the database can close then", async () => {
    const db = freshDb();
    const probe = counted(db);
    const lines = capture();
    const ledger = ledgerFor(probe.ledger, { sweepEvery: 1, logger: lines.logger }); // every execution asks for a sweep
    const m = mutationCounter();
    const { response, outcome } = await ledger.handle(post("shutdown-1"), "acct-1", m.run);
    assert.equal(response.status, 201);
    assert.equal(outcome, "executed");
    assert.equal(probe.batches, 2, "the sweep runs after the answer");
    await sweepsDone();
    assert.equal(probe.batches, 3, "sweepsDone() waited for the sweep's batch");
    db.close();
    await sweepsDone(); // nothing in flight: resolves at once
    assert.deepEqual(lines.lines, [], "no sweep met the closed database");
  });

  test("better-sqlite3 Database objects work directly as env.DB", async () => {
    const db = freshDb();
    const m = mutationCounter();
    const r1 = await handleIdempotentMutation(post("k"), { DB: db }, undefined, "p", m.run);
    const r2 = await handleIdempotentMutation(post("k"), { DB: db }, undefined, "p", m.run);
    assert.equal(await r1.text(), await r2.text());
    assert.equal(m.runs, 1);
  });

  test("400s, pass-through, reuse and in-progress, as in workerd", async () => {
    const db = freshDb();
    const probe = counted(db);
    const env = { DB: probe.ledger };
    const m = mutationCounter();
    const missing = await handleIdempotentMutation(post(undefined), env, undefined, "p", m.run);
    assert.equal(missing.status, 400);
    assert.deepEqual(await missing.json(), { error: "idempotency_key_required" });
    const invalid = await handleIdempotentMutation(post("x".repeat(256)), env, undefined, "p", m.run);
    assert.deepEqual(await invalid.json(), { error: "idempotency_key_invalid", message: "Idempotency-Key must be 1-255 printable ASCII characters." });
    const get = await handleIdempotentMutation(new Request("http://api.test/orders"), env, undefined, "p", async () => ({ status: 200, body: "list", headers: { "x-any": "kept" } }));
    assert.equal(get.status, 200);
    assert.equal(get.headers.get("x-any"), "kept", "a pass-through response is the handler's own");
    assert.equal(await get.text(), "list");
    assert.equal(probe.batches, 0, "no ledger access for 400s and pass-through");
    assert.equal(m.runs, 0);

    const lines = capture();
    const options = { now: () => T0, logger: lines.logger, inProgressRetryMs: null };
    await assert.rejects(
      handleIdempotentMutation(post("k"), env, undefined, "p", async () => {
        throw new Error("boom");
      }, options),
      /boom/,
    );
    assert.equal(rows(db)[0].status, "pending");
    const busy = await handleIdempotentMutation(post("k"), env, undefined, "p", m.run, options);
    assert.equal(busy.status, 409);
    assert.equal(busy.headers.get("retry-after"), "30", "without a hint: the time left until a takeover");
    const hinted = await handleIdempotentMutation(post("k"), env, undefined, "p", m.run, { now: () => T0 });
    assert.equal(hinted.headers.get("retry-after"), "1", "the default hint: 1 s");
    const reused = await handleIdempotentMutation(post("k", "{}"), env, undefined, "p", m.run, options);
    assert.deepEqual(await reused.json(), { error: "idempotency_key_reused" });
    assert.equal(m.runs, 0);
    const later = { now: () => T0 + 30_001 };
    const takeover = await handleIdempotentMutation(post("k"), env, undefined, "p", m.run, later);
    assert.equal(takeover.status, 201);
    assert.equal(rows(db)[0].generation, 2);
  });

  test("a fenced-out completion answers anyway and is logged with console.error by default", async () => {
    const db = freshDb();
    let release;
    const gate = new Promise((resolve) => (release = resolve));
    let started;
    const running = new Promise((resolve) => (started = resolve));
    const slow = handleIdempotentMutation(post("k"), { DB: db }, undefined, "acct-f", async () => {
      started();
      await gate;
      return { status: 201, body: "slow" };
    }, { now: () => T0 });
    await running;
    const fast = await handleIdempotentMutation(post("k"), { DB: db }, undefined, "acct-f", async () => ({ status: 201, body: "fast" }), { now: () => T0 + 30_001 });
    assert.equal(await fast.text(), "fast");
    const errors = [];
    const original = console.error;
    console.error = (...args) => errors.push(args.join(" "));
    try {
      release();
      const slowResponse = await slow;
      assert.equal(await slowResponse.text(), "slow", "the superseded owner still answers its caller");
    } finally {
      console.error = original;
    }
    assert.equal(errors.length, 1);
    assert.match(errors[0], /acct-f/);
    assert.match(errors[0], /generation=1|generation 1/);
    assert.equal(rows(db)[0].response_body, "fast");
  });

  test("failure injection: a failed decision never runs the mutation; a failed completion stays pending and is reported", async () => {
    const db = freshDb();
    const m = mutationCounter();
    const failDecision = counted(db, [1]);
    const lines = capture();
    const r = await handleIdempotentMutation(post("k"), { DB: failDecision.ledger }, undefined, "p", m.run, { logger: lines.logger });
    assert.equal(r.status, 500);
    assert.equal((await r.json()).error, "idempotency_ledger_unavailable");
    assert.equal(m.runs, 0);
    assert.deepEqual(rows(db), []);
    assert.match(lines.lines[0], /did not run/);

    const failCompletion = counted(db, [2]);
    const lines2 = capture();
    const ledger = ledgerFor(failCompletion.ledger, { logger: lines2.logger, now: () => T0 });
    const handled = await ledger.handle(post("k"), "p", m.run);
    assert.equal(handled.outcome, "completion-failed");
    assert.equal(handled.response.status, 201);
    assert.equal(m.runs, 1);
    assert.equal(rows(db)[0].status, "pending");
    assert.equal(lines2.lines.length, 1);
    assert.match(lines2.lines[0], /completion/, "worded by the core (log-line completion-failed)");
  });

  test("NothingChangedError releases the reservation (rethrown, or answered with its response); other errors keep it", async () => {
    const db = freshDb();
    const outcomes = [];
    const options = { onOutcome: (o) => outcomes.push(o), logger: capture().logger };
    await assert.rejects(
      handleIdempotentMutation(post("k"), { DB: db }, undefined, "p", async () => {
        throw new NothingChangedError("validation failed before any write");
      }, options),
      NothingChangedError,
    );
    assert.deepEqual(rows(db), []);
    const refused = await handleIdempotentMutation(post("k"), { DB: db }, undefined, "p", async () => {
      throw new NothingChangedError("invalid", { response: { status: 422, body: "invalid", headers: { "x-why": "sku" } } });
    }, options);
    assert.deepEqual([refused.status, await refused.text(), refused.headers.get("x-why")], [422, "invalid", "sku"]);
    assert.deepEqual(rows(db), []);
    const m = mutationCounter();
    assert.equal((await handleIdempotentMutation(post("k"), { DB: db }, undefined, "p", m.run, options)).status, 201);
    await assert.rejects(handleIdempotentMutation(post("k2"), { DB: db }, undefined, "p", async () => {
      throw new Error("boom");
    }, options), /boom/);
    assert.equal(rows(db).find((r) => r.key === "k2").status, "pending");
    assert.deepEqual(outcomes, ["released", "released", "executed", "abandoned"]);
  });

  test("50 concurrent same-key requests in one process: one mutation, the rest 409 in-progress or replays", async () => {
    const db = freshDb();
    let runs = 0;
    const mutation = async () => {
      runs += 1;
      await new Promise((resolve) => setTimeout(resolve, 50));
      return { status: 201, body: JSON.stringify({ order: "o_once" }), headers: { "content-type": "application/json" } };
    };
    const responses = await Promise.all(Array.from({ length: 50 }, () => handleIdempotentMutation(post("same"), { DB: db }, undefined, "p", mutation)));
    assert.equal(runs, 1);
    for (const r of responses) {
      const body = await r.json();
      if (r.status === 201) assert.deepEqual(body, { order: "o_once" });
      else {
        assert.equal(r.status, 409);
        assert.equal(body.error, "idempotency_key_in_progress");
      }
    }
  });

  test("a mutation may return a Response; bytes, 204 and the body cap follow the SPEC", async () => {
    const db = freshDb();
    const made = new Response("made", { status: 202, headers: { "content-type": "text/plain", "x-kept": "1" } });
    const r = await handleIdempotentMutation(post("resp"), { DB: db }, undefined, "p", async () => made);
    assert.equal(r, made, "the mutation's own Response object goes out");
    assert.equal(r.status, 202);
    assert.equal(await r.text(), "made");
    assert.equal(r.headers.get("x-kept"), "1");
    const replayed = await handleIdempotentMutation(post("resp"), { DB: db }, undefined, "p", async () => made);
    assert.deepEqual([replayed.status, await replayed.text(), replayed.headers.get("x-kept")], [202, "made", null]);
    const none = await handleIdempotentMutation(post("204"), { DB: db }, undefined, "p", async () => ({ status: 204, body: "x" }));
    assert.equal(none.status, 204);
    assert.equal(await none.text(), "");
    const big = await handleIdempotentMutation(post("big"), { DB: db }, undefined, "p", async () => ({ status: 200, body: new Uint8Array(40) }), { bodyCapBytes: 32, logger: capture().logger });
    assert.equal(big.status, 500);
    assert.match(await big.text(), /40 bytes.*32 bytes/, "the 500 names the size and the cap");
    const odd = await handleIdempotentMutation(post("odd"), { DB: db }, undefined, "p", async () => ({ status: 150, body: "x" }), { logger: capture().logger });
    assert.equal(odd.status, 500, "a status Fetch cannot send is stored as the SPEC's 500");
  });

  test("lower-level pieces: the fingerprint stored, defaults, bad options", async () => {
    const fresh = freshDb();
    const empty = new Request("http://api.test/orders", { method: "POST", headers: { "idempotency-key": "fp" } });
    await handleIdempotentMutation(empty, { DB: fresh }, undefined, "p", async () => ({ status: 201, body: "" }));
    assert.equal(rows(fresh)[0].fingerprint, "fc4d6d6663d197e95ef43ecc071614db7227f117beb78b985980d692380c7654", "recipe reference: empty POST /orders");
    assert.deepEqual(defaultOptions(), {
      profile: "recipe",
      protectedMethods: ["POST", "PATCH", "DELETE"],
      fingerprintHeaders: ["content-type", "x-api-version"],
      replayHeaders: ["content-type", "location"],
      pendingTtlMs: 30000,
      retentionMs: 86400000,
      bodyCapBytes: 16384,
      requestBodyCapBytes: 1048576,
      sweepBatch: 20,
      sweepEvery: 8,
      keyRequired: true,
      replayHeader: null,
      inProgressRetryMs: 1000,
      waitMs: 0,
      onServerError: "store",
      leaseRenewal: true,
    });
    assert.equal(defaultOptions({ profile: "ietf" }).replayHeader, "Idempotency-Replayed");
    assert.equal(defaultOptions({ leaseRenewal: false }).leaseRenewal, false);
    const db = freshDb();
    assert.throws(() => ledgerFor(db, { pendingTtlMs: 0 }), (e) => e instanceof IdempotencyError && e.protocolError.tag === "invalid-config");
    assert.throws(() => ledgerFor(db, { retentionMs: 10, pendingTtlMs: 1000 }), IdempotencyError);
    assert.throws(() => ledgerFor(db, { sweepBatch: -1 }), IdempotencyError);
  });

  test("hostile input never crashes the host", async () => {
    const db = freshDb();
    const m = mutationCounter();
    const weird = [
      post("k\u007f"),
      post("k", "x", { "content-type": "\u00ff\u00fe" }),
      new Request("http://api.test/%ZZ/../orders?%%", { method: "POST", headers: { "idempotency-key": "k2" }, body: new Uint8Array([0, 255]) }),
      new Request("http://api.test/orders", { method: "PATCH", headers: { "idempotency-key": " " } }),
      new Request("http://api.test/orders", { method: "DELETE", headers: { "idempotency-key": "x".repeat(10_000) } }),
    ];
    for (const request of weird) {
      const r = await handleIdempotentMutation(request, { DB: db }, undefined, "p".repeat(100), m.run);
      assert.ok([201, 400].includes(r.status), String(r.status));
    }
    const runsBefore = m.runs;
    const longPrincipal = await handleIdempotentMutation(post("k3"), { DB: db }, undefined, "p".repeat(5000), m.run, { logger: capture().logger });
    assert.equal(longPrincipal.status, 500, "an over-long principal is refused (invalid-argument)");
    assert.equal(m.runs, runsBefore, "nothing ran");
    assert.equal(rows(db).filter((r) => r.principal.length === 5000).length, 0);
  });

  test("D1 value conversion (used by the Workers adapter)", () => {
    assert.equal(toD1Value({ tag: "integer", val: 5n }), 5);
    assert.throws(() => toD1Value({ tag: "integer", val: 2n ** 60n }));
    assert.deepEqual(fromD1Value(7), { tag: "integer", val: 7n });
    assert.deepEqual(fromD1Value(1.5), { tag: "real", val: 1.5 });
    assert.deepEqual(fromD1Value(null), { tag: "null" });
    assert.deepEqual(fromD1Value("t"), { tag: "text", val: "t" });
    assert.deepEqual(fromD1Value([1, 2]), { tag: "blob", val: Uint8Array.from([1, 2]) });
    assert.deepEqual(fromD1Value(new Uint8Array([3]).buffer), { tag: "blob", val: Uint8Array.from([3]) });
    const results = fromD1Results([{ results: [{ a: 1, b: "x" }], meta: { changes: 1 } }, { results: [], meta: { changes: 0 } }], 2);
    assert.deepEqual(results, [
      { rows: [[{ tag: "integer", val: 1n }, { tag: "text", val: "x" }]], changes: 1n },
      { rows: [], changes: 0n },
    ]);
    assert.throws(() => fromD1Results([], 1));
  });

  test("D1's messages (no code) are classified by the core", async () => {
    // D1 gives messages only; the core classifies them (no table in JS).
    const outcomeOf = async (batchError) => {
      const failing = { dialect: "sqlite", batch: async () => Promise.reject(new BatchFailure(batchError)) };
      const { outcome, response } = await ledgerFor(failing, { logger: capture().logger }).handle(post("d1"), "p", async () => ({ status: 201 }));
      return [outcome, response.status];
    };
    const d1 = (message) => outcomeOf(databaseError(undefined, message));
    assert.deepEqual(await d1("D1_ERROR: database is locked: SQLITE_BUSY"), ["ledger-busy", 503]);
    assert.deepEqual(await d1("D1_ERROR: no such table: idempotency_keys: SQLITE_ERROR"), ["ledger-failed", 500]);
    assert.deepEqual(await d1("D1_ERROR: UNIQUE constraint failed: SQLITE_CONSTRAINT"), ["ledger-failed", 500]);
    assert.deepEqual(await d1("D1_ERROR: Network connection lost."), ["ledger-outcome-unknown", 503], "D1 cannot say whether the batch ran");
    assert.deepEqual(await outcomeOf({ tag: "host", val: "weird" }), ["ledger-failed", 500]);
  });

  test("two connections to one file share the ledger", async () => {
    const path = join(dir, "shared.sqlite");
    const a = await openLedgerDatabase(path);
    const b = new Database(path);
    const m = mutationCounter();
    const r1 = await handleIdempotentMutation(post("shared"), { DB: a }, undefined, "p", m.run);
    const r2 = await handleIdempotentMutation(post("shared"), { DB: b }, undefined, "p", m.run);
    assert.equal(await r1.text(), await r2.text());
    assert.equal(m.runs, 1);
    a.close();
    b.close();
  });
});
