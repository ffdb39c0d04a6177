// Node.js entry: the same API over better-sqlite3 (v12 on Node 20) or
// PostgreSQL (pg), plus the plain node:http adapter.
import { makeApi } from "./api.js";
import { getCore, newCore, NODE_PLATFORM } from "./core-node.js";
import { makeIdempotentHandler } from "./node-http.js";
import { isBetterSqlite, sqliteLedger } from "./sqlite.js";

const api = makeApi(getCore, (db) => (isBetterSqlite(db) ? sqliteLedger(db) : null), "a better-sqlite3 Database, a pg.Pool or a LedgerDb", NODE_PLATFORM);

export const {
  toLedgerDb,
  ledgerFor,
  handleIdempotentMutation,
  defaultOptions,
  schemaStatements,
  idempotentFunction,
  idempotentQueueConsumer,
} = api;

/** Creates the ledger table and index (idempotent). A better-sqlite3 Database migrates synchronously; others return a promise. */
export function migrate(db) {
  if (isBetterSqlite(db)) {
    const run = db.transaction(() => {
      for (const sql of schemaStatements("sqlite")) db.prepare(sql).run();
    });
    run.immediate();
    return undefined;
  }
  return api.migrate(db);
}

/** The plain node:http adapter: `http.createServer(idempotentHandler(options, handler))`. */
export const idempotentHandler = makeIdempotentHandler(api);

/**
 * Turns the file to WAL (a no-op when it is already). The switch needs the
 * file's exclusive lock, and where two connections would deadlock upgrading
 * their locks (processes of one server opening a new file together) SQLite
 * answers SQLITE_BUSY at once instead of waiting for the timeout: so retry,
 * within the same busy timeout.
 */
async function enableWal(db, busyTimeoutMs) {
  const deadline = Date.now() + busyTimeoutMs;
  for (let pauseMs = 1; ; pauseMs = Math.min(pauseMs * 2, 20)) {
    try {
      db.pragma("journal_mode = WAL");
      return;
    } catch (error) {
      if (error?.code !== "SQLITE_BUSY" || Date.now() >= deadline) throw error;
      await new Promise((resolve) => setTimeout(resolve, pauseMs));
    }
  }
}

/**
 * Opens (creating and migrating) a SQLite ledger file in WAL mode with a busy
 * timeout, so several connections and processes can share it.
 */
export async function openLedgerDatabase(path, { busyTimeoutMs = 5000 } = {}) {
  const { default: Database } = await import("better-sqlite3");
  const db = new Database(path, { timeout: busyTimeoutMs });
  await enableWal(db, busyTimeoutMs);
  db.pragma("synchronous = NORMAL");
  migrate(db);
  return db;
}

export { getCore, newCore };
export { sqliteLedger } from "./sqlite.js";
export { pgLedger } from "./pg.js";
export { createPgPool } from "./pg-node.js";
export { d1Ledger } from "./d1.js";
export { routeFilter } from "./middleware.js";
export { readNodeBody } from "./node-http.js";
export { nodeHead } from "./middleware.js";
export { IdempotencyLedger, LeaseLostError, NothingChangedError, sweepsDone, sha256Hex, sessionFor } from "./ledger.js";
export { requestHead, readFetchBody, toFetchResponse, mutationOf } from "./fetch.js";
export { RejectedError } from "./function.js";
export { canonicalJson, canonicalJsonBytes } from "./canonical-json.js";
export { Core, Session, Exchange, BatchFailure, ComponentFault, IdempotencyError, SETTING_NAMES, toWitConfig, databaseError } from "./runtime.js";
