// Hono middleware (Workers and Node). Structural: no import of hono's types,
// so it fits any Hono 4 app (c.req.raw is a Fetch Request).
import type { AdapterOptions, PgPoolLike, LedgerDb } from "./common.js";
export { NothingRanError, sweepsDone } from "./common.js";

export interface HonoContextLike {
  req: { raw: Request; path: string; header(name: string): string | undefined };
  env?: any;
  get?(key: string): any;
}
export type HonoMiddleware = (c: any, next: () => Promise<void>) => Promise<Response | void>;

/** `app.use(idempotency({ db, principal: (c) => ..., ...settings }))`, or per route. */
export declare function idempotency(options: AdapterOptions<any, object | PgPoolLike | LedgerDb>): HonoMiddleware;
export declare function migrate(db: object | PgPoolLike | LedgerDb): void | Promise<void>;
