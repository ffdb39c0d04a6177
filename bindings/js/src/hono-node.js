// Hono middleware on Node (@hono/node-server): the component loaded from
// generated/ and node:crypto's SHA-256. The body and the answer go through
// Hono's public Request / Response (no @hono/node-server internals).
import { makeApi } from "./api.js";
import { getCore, NODE_PLATFORM } from "./core-node.js";
import { makeHonoIdempotency } from "./hono.js";
import { isBetterSqlite, sqliteLedger } from "./sqlite.js";

const api = makeApi(getCore, (db) => (isBetterSqlite(db) ? sqliteLedger(db) : null), "a better-sqlite3 Database, a pg.Pool, a D1 binding or a LedgerDb", NODE_PLATFORM);

/** `app.use(idempotency({ db, principal: (c) => ..., ...settings }))`. */
export const idempotency = makeHonoIdempotency(api);
export const { ledgerFor, migrate } = api;
export { LeaseLostError, NothingChangedError, sweepsDone } from "./ledger.js";
