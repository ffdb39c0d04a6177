// Hono middleware (Workers and Node). Structural: no import of hono's types,
// so it fits any Hono 4 app (c.req.raw is a Fetch Request).
import type { AdapterOptions, IdempotencyContext, IdempotencyLedger, IdempotencyOptions, PgPoolLike, LedgerDb } from "./common.js";
export type { IdempotencyContext };
export { NothingChangedError, sweepsDone } from "./common.js";

export interface HonoContextLike {
  req: { raw: Request; path: string; header(name: string): string | undefined };
  env?: any;
  get?(key: string): any;
}
export type HonoMiddleware = (c: any, next: () => Promise<void>) => Promise<Response | void>;

/**
 * Per route: `app.post("/orders", idempotency({ db, principal: (c) => ..., ...settings }), handler)`;
 * or app-wide with include/exclude. A response made before the route handler
 * ran (a validator's 400, a middleware's answer, no route) releases the key.
 * The handler reads its context with `c.get("idempotency")` (an IdempotencyContext:
 * its transaction on a `transactional` route, the lease's AbortSignal, the ticket).
 */
export declare function idempotency(options: AdapterOptions<any, object | PgPoolLike | LedgerDb>): HonoMiddleware;
export declare function migrate(db: object | PgPoolLike | LedgerDb): void | Promise<void>;
/** The ledger this entry's middleware uses for a database and an options object (cached per pair). */
export declare function ledgerFor(db: object | PgPoolLike | LedgerDb, options?: IdempotencyOptions): IdempotencyLedger;
