// Express middleware (Express 4 and 5): `app.use(idempotency({...}))`, and
// `app.use(idem.errors)` after the routes so a handler that throws is
// abandoned (the core says whether its reservation is released) instead of
// its error page being stored. Node only (better-sqlite3 or pg).
import { makeApi } from "./api.js";
import { getCore, NODE_PLATFORM } from "./core-node.js";
import { adapterOptions } from "./middleware.js";
import { handleNode, markRaised } from "./node-http.js";
import { isBetterSqlite, sqliteLedger } from "./sqlite.js";

const api = makeApi(getCore, (db) => (isBetterSqlite(db) ? sqliteLedger(db) : null), "a better-sqlite3 Database, a pg.Pool or a LedgerDb", NODE_PLATFORM);

/**
 * The middleware. Options: `db` (a better-sqlite3 Database, a pg.Pool, a
 * LedgerDb, or `(req) => one of them`), `principal: (req) => string |
 * undefined` (your auth; undefined is answered 401 by the core), `routes` or
 * `include`/`exclude`, and every setting (see README). The body is read up
 * to the core's request body cap (413 past it, before buffering more) and
 * handed back to the stream, so express.json() placed after it still works;
 * the raw bytes are also on `req.rawBody`.
 */
export function idempotency(options) {
  const parts = adapterOptions(options, "idempotency");
  const middleware = function idempotencyMiddleware(req, res, next) {
    handleNode(api, options, parts, req, res, () => next()).catch(next);
  };
  /** Error middleware: place after your routes (app.use(idem.errors)). */
  middleware.errors = function idempotencyErrors(error, req, res, next) {
    markRaised(req, error);
    next(error);
  };
  return middleware;
}

export const { ledgerFor, migrate } = api;
export { NothingRanError, sweepsDone } from "./ledger.js";
