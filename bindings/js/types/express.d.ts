// Express middleware (Express 4 and 5). Structural types: no @types/express needed.
import type { AdapterOptions, IdempotencyLedger, IdempotencyOptions, PgPoolLike, LedgerDb } from "./common.js";
import type { IncomingMessageLike, ServerResponseLike } from "./node-http.js";
export { NothingChangedError, sweepsDone } from "./common.js";

export type ExpressMiddleware = ((req: any, res: any, next: (error?: unknown) => void) => void) & {
  /** Error middleware: app.use(idem.errors) after your routes. */
  errors: (error: unknown, req: any, res: any, next: (error?: unknown) => void) => void;
};

/**
 * Per route: `app.post("/orders", idem, express.json(), handler)`; or
 * `app.use(idem)` (with include/exclude) before any body parser. A body
 * parser's refusal (and, app-wide, a response made before any route
 * matched) releases the key. `app.use(idem.errors)` after the routes.
 * The handler finds its context on `req.idempotency` (an IdempotencyContext).
 */
export declare function idempotency(options: AdapterOptions<IncomingMessageLike & { get(name: string): string | undefined }, object | PgPoolLike | LedgerDb>): ExpressMiddleware;
export declare function migrate(db: object | PgPoolLike | LedgerDb): void | Promise<void>;
export type { IncomingMessageLike, ServerResponseLike };
/** The ledger this entry's middleware uses for a database and an options object (cached per pair). */
export declare function ledgerFor(db: object | PgPoolLike | LedgerDb, options?: IdempotencyOptions): IdempotencyLedger;
