// PostgreSQL through node-postgres (Node; on Workers through Hyperdrive).
import type { LedgerDb, PgPoolLike } from "./common.js";

/** The ledger over a pg.Pool: one transaction per batch in one round trip. */
export declare function pgLedger(pool: PgPoolLike, options?: { connectTimeoutMs?: number; lockTimeoutMs?: number; preparedStatements?: boolean }): LedgerDb & { pool: PgPoolLike };
export declare function isPgPool(db: unknown): boolean;
/** Node only: a pg.Pool for a postgresql:// URL (idle errors logged). */
export declare function createPgPool(url: string, options?: { max?: number; connectTimeoutMs?: number; logger?: { warn?(m: string): void } }): Promise<PgPoolLike>;
