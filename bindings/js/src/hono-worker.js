// Hono middleware on Cloudflare Workers: the core modules imported statically.
import { makeApi } from "./api.js";
import { getCore } from "./core-worker.js";
import { makeHonoIdempotency } from "./hono.js";

const api = makeApi(getCore, () => null, "a D1 binding, a pg.Pool (Hyperdrive) or a LedgerDb");

/** `app.use(idempotency({ db: (c) => c.env.DB, principal: (c) => ..., ...settings }))`. */
export const idempotency = makeHonoIdempotency(api);
export const { ledgerFor, migrate } = api;
export { LeaseLostError, NothingChangedError, sweepsDone } from "./ledger.js";
