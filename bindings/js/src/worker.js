// Cloudflare Workers entry: D1 (or PostgreSQL through Hyperdrive with pg).
// The core modules are imported statically by ./core-worker.js; nothing is
// compiled from bytes at run time, and the component is instantiated on the
// first request that needs it.
import { makeApi } from "./api.js";
import { getCore } from "./core-worker.js";

const api = makeApi(getCore, () => null, "a D1Database binding, a pg.Pool (Hyperdrive) or a LedgerDb");

export const {
  toLedgerDb,
  ledgerFor,
  handleIdempotentMutation,
  defaultOptions,
  schemaStatements,
  idempotentFunction,
  idempotentQueueConsumer,
  migrate,
} = api;

export { getCore };
export { d1Ledger, fromD1Results, fromD1Value, toD1Value } from "./d1.js";
export { pgLedger } from "./pg.js";
export { IdempotencyLedger, LeaseLostError, NothingChangedError, sweepsDone, sha256Hex, sessionFor } from "./ledger.js";
export { requestHead, readFetchBody, toFetchResponse, mutationOf } from "./fetch.js";
export { RejectedError } from "./function.js";
export { canonicalJson, canonicalJsonBytes } from "./canonical-json.js";
export { Core, Session, Exchange, BatchFailure, ComponentFault, IdempotencyError, SETTING_NAMES, toWitConfig, databaseError } from "./runtime.js";
