// `@idempotency/ledger/testing`: what a user needs to test their own
// protected handler (Node; better-sqlite3): an in-memory SQLite ledger, a
// clock they control, a helper that fires N concurrent duplicates, and a
// loopback server for node:http / Express apps. See README "Testing your
// handlers".
import { createServer } from "node:http";
import Database from "better-sqlite3";
import { ledgerFor, migrate } from "./node.js";

/** 2030-01-01T00:00:00Z: the default start of a test clock. */
export const TEST_EPOCH = Date.UTC(2030, 0, 1);

/**
 * A clock for the ledger's `now` option: it starts at `start` (ms since the
 * epoch) and runs with real time (so a duplicate's wait ends), unless
 * `frozen`; `advance(ms)` jumps it forward (past the pending TTL, past the
 * retention), `set(ms)` sets it.
 */
export function testClock({ start = TEST_EPOCH, frozen = false } = {}) {
  let base = start;
  let origin = performance.now();
  const elapsed = () => (frozen ? 0 : Math.floor(performance.now() - origin));
  const clock = {
    /** The time now, integer ms: pass as the `now` option (a function; no need to bind). */
    now: () => base + elapsed(),
    /** Moves the clock `ms` forward; returns the new time. */
    advance(ms) {
      if (!Number.isSafeInteger(ms) || ms < 0) throw new TypeError("advance(ms): a non-negative integer");
      base += ms;
      return clock.now();
    },
    /** Sets the clock to `ms`; returns it. */
    set(ms) {
      if (!Number.isSafeInteger(ms)) throw new TypeError("set(ms): an integer");
      base = ms;
      origin = performance.now();
      return ms;
    },
  };
  return clock;
}

/**
 * An in-memory SQLite ledger (better-sqlite3 `:memory:`, migrated) for
 * tests. `settings` are the adapter options you would pass (`principal`,
 * `pendingTtlMs`, `waitMs`, `route`, ...); the kit adds `db`, `now` (its
 * clock), `onOutcome` (recorded), `logger` (recorded, not printed) and
 * `sweep: false` (sweep explicitly with `sweep()`). Returns the kit:
 *   options     pass to the adapter as is: idempotency(kit.options)
 *   db, clock   the database and the clock
 *   outcomes    every outcome so far, in order; `count(outcome)` counts one
 *   logs        the core's log lines ({ level, message })
 *   rows()      the ledger's rows; row(principal, key) one of them
 *   sweep()     sweeps everything older than the retention (at the clock's now)
 *   close()     closes the database
 */
export function createTestLedger(settings = {}) {
  const db = new Database(":memory:");
  migrate(db);
  const clock = settings.clock ?? testClock();
  const outcomes = [];
  const logs = [];
  const line = (level) => (message) => logs.push({ level, message: String(message) });
  const options = {
    ...settings,
    db,
    now: clock.now,
    sweep: settings.sweep ?? false,
    logger: settings.logger ?? { error: line("error"), warn: line("warn"), info: line("info") },
    onOutcome: (outcome) => {
      outcomes.push(outcome);
      settings.onOutcome?.(outcome);
    },
  };
  delete options.clock;
  const select = db.prepare("SELECT * FROM idempotency_keys ORDER BY principal, key");
  const one = db.prepare("SELECT * FROM idempotency_keys WHERE principal = ? AND key = ?");
  return {
    options,
    db,
    clock,
    outcomes,
    logs,
    count: (outcome) => outcomes.filter((o) => o === outcome).length,
    rows: () => select.all(),
    row: (principal, key) => one.get(principal, key),
    sweep: () => ledgerFor(db, options).sweepAll(clock.now()),
    close: () => db.close(),
  };
}

/**
 * Calls `send(i)` n times at once (all started in the same turn, none
 * awaited before the others start) and resolves with the n results in
 * order; a call that threw has its error in its place.
 */
export async function fireDuplicates(n, send) {
  if (!Number.isSafeInteger(n) || n < 1) throw new TypeError("fireDuplicates(n, send): n is a positive integer");
  let open;
  const gate = new Promise((resolve) => (open = resolve));
  const calls = [];
  for (let i = 0; i < n; i++) calls.push(gate.then(() => send(i)).catch((error) => error));
  open();
  return Promise.all(calls);
}

/**
 * Serves a node:http listener (an Express app, `idempotentHandler(...)`) on
 * 127.0.0.1 and a free port: { url, close() }.
 */
export async function listen(listener) {
  const server = typeof listener === "function" ? createServer(listener) : listener;
  await new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(0, "127.0.0.1", resolve);
  });
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    server,
    close: () =>
      new Promise((resolve) => {
        server.closeAllConnections?.();
        server.close(() => resolve());
      }),
  };
}
