// Express middleware (Express 4 and 5). Structural types: no @types/express needed.
import type { AdapterOptions, PgPoolLike, LedgerDb } from "./common.js";
import type { IncomingMessageLike, ServerResponseLike } from "./node-http.js";
export { NothingRanError, sweepsDone } from "./common.js";

export type ExpressMiddleware = ((req: any, res: any, next: (error?: unknown) => void) => void) & {
  /** Error middleware: app.use(idem.errors) after your routes. */
  errors: (error: unknown, req: any, res: any, next: (error?: unknown) => void) => void;
};

export declare function idempotency(options: AdapterOptions<IncomingMessageLike & { get(name: string): string | undefined }, object | PgPoolLike | LedgerDb>): ExpressMiddleware;
export declare function migrate(db: object | PgPoolLike | LedgerDb): void | Promise<void>;
export type { IncomingMessageLike, ServerResponseLike };
