// Node.js entry: the same API over better-sqlite3 (v12 on Node 20).
import { readFileSync } from "node:fs";
import { makeApi } from "./api.js";
import { Core, CORE_MODULE_NAMES } from "./runtime.js";
import { sqliteLedger } from "./sqlite.js";

const GENERATED = new URL("../generated/", import.meta.url);
let modules = null;
function getCoreModule(name) {
  if (modules === null) {
    modules = {};
    for (const n of CORE_MODULE_NAMES) modules[n] = new WebAssembly.Module(readFileSync(new URL(n, GENERATED)));
  }
  return modules[name];
}

let core = null;
/** The process's shared component instance (instantiated on first use). */
export function getCore() {
  if (core === null) core = new Core(getCoreModule);
  return core;
}

/** A fresh component instance (for example for the driven API with its own database). */
export function newCore(executeBatch) {
  return new Core(getCoreModule, executeBatch);
}

const dbWrappers = new WeakMap();
function wrap(db) {
  if (db && typeof db.batch === "function" && typeof db.transaction !== "function") return db; // already a LedgerDb
  let wrapped = dbWrappers.get(db);
  if (!wrapped) dbWrappers.set(db, (wrapped = sqliteLedger(db)));
  return wrapped;
}

const api = makeApi(getCore, wrap, "a better-sqlite3 Database");

export const {
  ledgerFor,
  handleIdempotentMutation,
  defaultOptions,
  computeFingerprint,
  requestFingerprint,
  validateIdempotencyKey,
  schemaStatements,
} = api;

/** Creates the ledger table and index (idempotent). */
export function migrate(db) {
  const run = db.transaction(() => {
    for (const sql of schemaStatements()) db.prepare(sql).run();
  });
  run.immediate();
}

/**
 * Opens (creating and migrating) a SQLite ledger file in WAL mode with a busy
 * timeout, so several connections and processes can share it.
 */
export async function openLedgerDatabase(path, { busyTimeoutMs = 5000 } = {}) {
  const { default: Database } = await import("better-sqlite3");
  const db = new Database(path, { timeout: busyTimeoutMs });
  db.pragma("journal_mode = WAL");
  db.pragma("synchronous = NORMAL");
  migrate(db);
  return db;
}

export { sqliteLedger } from "./sqlite.js";
export { IdempotencyLedger, NothingRanError, requestHead, sha256Hex, toFetchResponse, toMutationResponse } from "./ledger.js";
export { Core, IdempotencyError, toLedgerError } from "./runtime.js";
