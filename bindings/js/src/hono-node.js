// Hono middleware on Node (@hono/node-server): the component loaded from generated/.
import { makeApi } from "./api.js";
import { getCore } from "./core-node.js";
import { makeHonoIdempotency } from "./hono.js";
import { isBetterSqlite, sqliteLedger } from "./sqlite.js";

const api = makeApi(getCore, (db) => (isBetterSqlite(db) ? sqliteLedger(db) : null), "a better-sqlite3 Database, a pg.Pool, a D1 binding or a LedgerDb");

/** `app.use(idempotency({ db, principal: (c) => ..., ...settings }))`. */
export const idempotency = makeHonoIdempotency(api);
export const { ledgerFor, migrate } = api;
export { NothingRanError } from "./ledger.js";
