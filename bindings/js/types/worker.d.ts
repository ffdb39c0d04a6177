// Cloudflare Workers entry (D1).
import type { AdapterOptions, PgPoolLike, HandleIdempotentMutation, IdempotencyLedger, IdempotencyOptions, IdempotentFunctionWrapper, LedgerDb, Statement, StatementResult, Core } from "./common.js";
export * from "./common.js";

/** The parts of Cloudflare's D1Database this package uses. */
export interface D1DatabaseLike {
  prepare(sql: string): { bind(...values: unknown[]): unknown };
  batch(statements: unknown[]): Promise<Array<{ results?: Array<Record<string, unknown>>; meta?: { changes?: number } }>>;
}

/**
 * The recipe's drop-in handler. Reads the body once as bytes, runs one
 * env.DB.batch() to decide and one to complete, schedules the sweep with
 * ctx.waitUntil, logs fenced-out completions with console.error.
 */
export declare const handleIdempotentMutation: HandleIdempotentMutation;

export declare function ledgerFor(db: D1DatabaseLike | PgPoolLike | LedgerDb, options?: IdempotencyOptions): IdempotencyLedger;
/** Creates the ledger table and index (idempotent; one batch). Prefer `wrangler d1 migrations` with migrations/0001_idempotency_keys.sql. */
export declare function migrate(db: D1DatabaseLike | PgPoolLike | LedgerDb): Promise<void>;
export declare function pgLedger(pool: PgPoolLike, options?: { connectTimeoutMs?: number; lockTimeoutMs?: number; preparedStatements?: boolean }): LedgerDb;
export declare function getCore(): Core;
export declare function d1Ledger(db: D1DatabaseLike): LedgerDb;
export declare function toD1Value(value: Statement["params"][number]): unknown;
export declare function fromD1Value(value: unknown): Statement["params"][number];
export declare function fromD1Results(results: unknown, expected: number): StatementResult[];

/** `fn` at most once per (principal, key), its ledger on a D1 binding, a pg.Pool (Hyperdrive) or a LedgerDb. */
export declare const idempotentFunction: IdempotentFunctionWrapper<D1DatabaseLike | PgPoolLike | LedgerDb>;
