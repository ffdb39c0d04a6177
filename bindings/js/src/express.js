// Express middleware (Express 4 and 5): `app.post("/orders", idem, handler)`
// per route (or `app.use(idem)` with include/exclude), and
// `app.use(idem.errors)` after the routes. Node only (better-sqlite3 or pg).
import { makeApi } from "./api.js";
import { getCore, NODE_PLATFORM } from "./core-node.js";
import { adapterOptions } from "./middleware.js";
import { fail, handleNode } from "./node-http.js";
import { isBetterSqlite, sqliteLedger } from "./sqlite.js";

const api = makeApi(getCore, (db) => (isBetterSqlite(db) ? sqliteLedger(db) : null), "a better-sqlite3 Database, a pg.Pool or a LedgerDb", NODE_PLATFORM);

/**
 * The middleware. Options: `db` (a better-sqlite3 Database, a pg.Pool, a
 * LedgerDb, or `(req) => one of them`), `principal: (req) => string |
 * undefined` (your auth; undefined is answered 401 by the core), `routes` or
 * `include`/`exclude`, `onOutcome`, and every setting (see README). Mount it
 * before any body parser: it reads the body up to the core's request body
 * cap (413 past it, before buffering more) and hands it back to the stream,
 * so express.json() placed after it reads the same bytes (also on
 * `req.rawBody`); a body a parser already consumed is the core's 500.
 */
export function idempotency(options) {
  const parts = adapterOptions(options, "idempotency");
  const middleware = function idempotencyMiddleware(req, res, next) {
    handleNode(api, options, parts, req, res, () => next(), { framework: true }).catch(next);
  };
  /**
   * Error middleware: place after your routes (app.use(idem.errors)). What
   * a handler threw is reported to the core (a raised handler's error page
   * is not stored; a NothingChangedError or a body parser's refusal releases
   * the key), then Express answers it as usual.
   */
  middleware.errors = function idempotencyErrors(error, req, res, next) {
    fail(req, error);
    next(error);
  };
  return middleware;
}

export const { ledgerFor, migrate } = api;
export { LeaseLostError, NothingChangedError, sweepsDone } from "./ledger.js";
