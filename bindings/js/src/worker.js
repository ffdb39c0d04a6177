// Cloudflare Workers entry: the core modules are imported statically (the
// bundler / workerd hands them over as compiled WebAssembly.Module objects),
// so nothing is compiled from bytes at run time.
import coreModule from "../generated/core.core.wasm";
import coreModule2 from "../generated/core.core2.wasm";
import coreModule3 from "../generated/core.core3.wasm";
import { makeApi } from "./api.js";
import { d1Ledger, migrateD1 } from "./d1.js";
import { Core } from "./runtime.js";

const MODULES = { "core.core.wasm": coreModule, "core.core2.wasm": coreModule2, "core.core3.wasm": coreModule3 };

let core = null;
/** The isolate's one component instance (instantiated on first use). */
export function getCore() {
  if (core === null) core = new Core((name) => MODULES[name]);
  return core;
}

const dbWrappers = new WeakMap();
function wrap(db) {
  let wrapped = dbWrappers.get(db);
  if (!wrapped) dbWrappers.set(db, (wrapped = d1Ledger(db)));
  return wrapped;
}

const api = makeApi(getCore, wrap, "a D1Database binding");

export const {
  ledgerFor,
  handleIdempotentMutation,
  defaultOptions,
  computeFingerprint,
  requestFingerprint,
  validateIdempotencyKey,
  schemaStatements,
} = api;

/** Creates the ledger table and index in a D1 database (idempotent; one batch). */
export async function migrate(db) {
  await migrateD1(db, schemaStatements());
}

export { d1Ledger, fromD1Results, fromD1Value, toD1Value } from "./d1.js";
export { IdempotencyLedger, NothingRanError, requestHead, sha256Hex, toFetchResponse, toMutationResponse } from "./ledger.js";
export { Core, IdempotencyError, toLedgerError } from "./runtime.js";
