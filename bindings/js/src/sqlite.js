// The ledger on better-sqlite3 (Node): each step's statements run in ONE
// `BEGIN IMMEDIATE` transaction on the calling thread. Failures are reported
// as the driver gave them (SQLite's code and message); the core classifies.
//
// A transactional handler (docs/SPEC.md 10.2) runs inside a deferred `BEGIN`
// on the same Database: better-sqlite3 is one connection used from one
// thread, and its calls are synchronous, so a transaction on a second
// connection would make every other request's batch wait for SQLite's write
// lock by blocking the event loop, which the handler then cannot finish on.
// Instead, while a handler's transaction is open, every other batch of the
// ledger on that Database waits (asynchronously) until it commits or rolls
// back, at most the Database's busy timeout (then `pool-exhausted`: its one
// connection stayed in use): SQLite has one writer anyway (SPEC 10.3).
// Lease renewals run on a connection of their own (a file database), so a
// handler's open transaction does not hold its own renewals back.
import { createRequire } from "node:module";
import { BatchFailure, databaseError } from "./runtime.js";

function toSqliteValue(value) {
  switch (value.tag) {
    case "null":
      return null;
    case "integer":
      return value.val; // BigInt: better-sqlite3 binds it as INTEGER
    case "real":
      return value.val;
    case "text":
      return value.val;
    case "blob":
      return Buffer.from(value.val.buffer, value.val.byteOffset, value.val.byteLength);
    default:
      throw new BatchFailure({ tag: "host", val: `unknown value tag ${value.tag}` });
  }
}

function fromSqliteValue(value) {
  if (value === null || value === undefined) return { tag: "null" };
  if (typeof value === "bigint") return { tag: "integer", val: value };
  if (typeof value === "number") return Number.isInteger(value) ? { tag: "integer", val: BigInt(value) } : { tag: "real", val: value };
  if (typeof value === "string") return { tag: "text", val: value };
  if (value instanceof Uint8Array) return { tag: "blob", val: new Uint8Array(value) };
  throw new BatchFailure({ tag: "host", val: `SQLite returned a value of unexpected type ${typeof value}` });
}

/** A better-sqlite3 error as the driver gave it; anything else is the host's own failure. */
export function sqliteBatchError(error) {
  if (error instanceof BatchFailure) return error;
  const code = typeof error?.code === "string" && error.code.startsWith("SQLITE_") ? error.code : undefined;
  if (code || error?.name === "SqliteError") return new BatchFailure(databaseError(code, error.message), { cause: error });
  return new BatchFailure({ tag: "host", val: String(error?.message ?? error) }, { cause: error });
}

/** True for a better-sqlite3 Database (duck-typed). */
export function isBetterSqlite(db) {
  return !!db && typeof db.prepare === "function" && typeof db.transaction === "function" && typeof db.pragma === "function";
}

/**
 * One per Database (whichever entry wrapped it): the handler transaction
 * open on it, if any, and the batches waiting for it to end.
 */
const gates = new WeakMap();
function gateOf(db) {
  let gate = gates.get(db);
  if (!gate) {
    gate = { open: null, waiters: [] };
    gates.set(db, gate);
  }
  return gate;
}
function reopen(gate) {
  gate.open = null;
  const waiters = gate.waiters.splice(0);
  for (const wake of waiters) wake();
}

/**
 * How a batch or a BEGIN waits until no handler's transaction is open on the
 * Database, at most `timeoutMs` (then `pool-exhausted`: the one connection
 * stayed in use):
 *
 *   for (const deadline = Date.now() + timeoutMs; gate.open !== null; ) await gateOpened(gate, deadline, timeoutMs);
 *
 * written in the caller, which then claims or uses the connection with no
 * await in between: the gate must be found free on the caller's own turn.
 * Checked anywhere else (inside a helper it awaits), the waiters woken
 * together by `reopen` would all find it free, and the second BEGIN would
 * fail inside the first one's transaction.
 */
/** One wait for the gate to reopen (or the deadline). */
async function gateOpened(gate, deadline, timeoutMs) {
  const left = deadline - Date.now();
  if (left <= 0) throw new BatchFailure({ tag: "pool-exhausted", val: `the better-sqlite3 Database stayed in a handler's transaction for ${timeoutMs} ms` });
  let timer;
  await new Promise((resolve) => {
    gate.waiters.push(resolve);
    timer = setTimeout(resolve, left);
  });
  clearTimeout(timer);
}

/** better-sqlite3's Database class: the one `db` was made with (else the package's peer dependency). */
function databaseClass(db) {
  if (typeof db.constructor === "function" && typeof db.constructor.prototype?.prepare === "function") return db.constructor;
  return createRequire(import.meta.url)("better-sqlite3");
}

/** SQLite's rollback-journal modes (better-sqlite3 opens a file in `delete`). */
const ROLLBACK_JOURNALS = new Set(["delete", "truncate", "persist"]);
/** The Databases whose setup was already reported (once per Database per process). */
const advised = new WeakSet();

/**
 * What to warn the app about, once, when a ledger is made on `db`: a file
 * in a rollback-journal mode, where every ledger commit writes and syncs a
 * journal file beside the database (a new key commits twice) and WAL does
 * not. Null otherwise, and from the second call on.
 */
function setupAdvice(db) {
  if (advised.has(db) || db.memory || !db.name) return null;
  advised.add(db);
  let mode;
  try {
    mode = String(db.pragma("journal_mode", { simple: true })).toLowerCase();
  } catch {
    return null; // a closed Database: its batches fail on their own
  }
  if (!ROLLBACK_JOURNALS.has(mode)) return null;
  return (
    `idempotency ledger: the better-sqlite3 Database ${db.name} is in journal_mode=${mode} (better-sqlite3's default for a file): ` +
    "every ledger commit writes and syncs a rollback journal, twice per new key. Open it with openLedgerDatabase(path) " +
    '(WAL, synchronous=NORMAL, a busy timeout) or run db.pragma("journal_mode = WAL") once.'
  );
}

/** The ledger over a better-sqlite3 Database. */
export function sqliteLedger(db) {
  if (!isBetterSqlite(db)) throw new TypeError("sqliteLedger needs a better-sqlite3 Database");
  const gate = gateOf(db);
  let waitMs = 5000;
  try {
    waitMs = Number(db.pragma("busy_timeout", { simple: true })) || 0;
  } catch {
    // a closed Database: its batches fail on their own
  }
  const cache = new Map();
  const prepare = (sql) => {
    let statement = cache.get(sql);
    if (!statement) {
      statement = db.prepare(sql);
      statement.safeIntegers(true);
      if (statement.reader) statement.raw(true);
      cache.set(sql, statement);
    }
    return statement;
  };
  const runAll = (statements) =>
    statements.map((s) => {
      const statement = prepare(s.sql);
      const params = s.params.map(toSqliteValue);
      if (statement.reader) {
        const rows = statement.all(...params).map((row) => row.map(fromSqliteValue));
        // A RETURNING statement changed exactly the rows it returned.
        const changes = /^\s*select\b/i.test(s.sql) ? 0n : BigInt(rows.length);
        return { rows, changes };
      }
      const info = statement.run(...params);
      return { rows: [], changes: BigInt(info.changes) };
    });
  const run = db.transaction(runAll);
  const batchSync = (statements) => {
    if (gate.open !== null) throw new BatchFailure({ tag: "host", val: "a handler's transaction is open on this better-sqlite3 Database; a synchronous batch cannot wait for it" });
    try {
      return run.immediate(statements);
    } catch (error) {
      throw sqliteBatchError(error);
    }
  };

  /**
   * Opens a transactional handler's transaction (a deferred BEGIN: no lock
   * until its first statement) once no other is open on this Database. The
   * handler gets `handle`: `{ db, dialect }`, the Database itself, inside the
   * transaction. Every other batch of the ledger on this Database waits until
   * `commit()` or `rollback()` ends it.
   */
  async function begin() {
    for (const deadline = Date.now() + waitMs; gate.open !== null; ) await gateOpened(gate, deadline, waitMs);
    // Free on this turn: claimed below, with no await in between.
    try {
      db.exec("BEGIN");
    } catch (error) {
      throw sqliteBatchError(error);
    }
    let open = true;
    const tx = {};
    gate.open = tx;
    const end = () => {
      if (!open) return;
      open = false;
      reopen(gate);
    };
    const inside = () => {
      if (!open) throw new BatchFailure({ tag: "host", val: "the handler's transaction has ended" });
      if (!db.inTransaction) throw new BatchFailure({ tag: "host", val: "the handler's transaction is no longer open on the Database (the handler committed or rolled it back)" });
    };
    Object.assign(tx, {
      handle: Object.freeze({ dialect: "sqlite", db }),
      /** Statements inside the open transaction (no COMMIT): one result each; the first failure is thrown, the transaction stays open. */
      async execute(statements) {
        inside();
        try {
          return runAll(statements);
        } catch (error) {
          throw sqliteBatchError(error);
        }
      },
      async commit() {
        inside();
        try {
          db.exec("COMMIT");
        } catch (error) {
          // SQLite keeps a transaction whose COMMIT failed busy: it stays ours until the rollback.
          if (!db.inTransaction) end();
          throw sqliteBatchError(error);
        }
        end();
      },
      async rollback() {
        if (!open) return;
        try {
          if (db.inTransaction) db.exec("ROLLBACK");
        } catch {
          // a rollback that fails still ends the transaction (SQLite rolls back on its own)
        }
        end();
      },
    });
    return tx;
  }

  /**
   * A lease renewal's batch (docs/SPEC.md 10.1: never on a handler's
   * transaction): on a file database, on a connection of its own, opened
   * for it and closed after it, with no busy wait (a write lock held
   * meanwhile, by a handler's transaction here or by another process, makes
   * it SQLITE_BUSY at once: the lease is `unknown` and the renewals go on;
   * that lock also keeps any takeover out). An in-memory database has no
   * second connection: its renewals wait for the gate like any batch.
   */
  async function renewalBatch(statements) {
    if (db.memory || !db.name) return batch(statements);
    let other;
    try {
      const Class = databaseClass(db);
      other = new Class(db.name, { fileMustExist: true, timeout: 0 });
      return sqliteLedger(other).batchSync(statements);
    } catch (error) {
      throw sqliteBatchError(error);
    } finally {
      other?.close();
    }
  }

  async function batch(statements) {
    for (const deadline = Date.now() + waitMs; gate.open !== null; ) await gateOpened(gate, deadline, waitMs);
    return batchSync(statements);
  }

  return {
    db,
    dialect: "sqlite",
    batch,
    /** The same, synchronously (the driven API's ledger import). */
    batchSync,
    begin,
    renewalBatch,
    /** A warning about how the Database is set up, the first time it is asked for; else null. */
    setupAdvice: () => setupAdvice(db),
  };
}
