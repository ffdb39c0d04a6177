// Node.js entry (better-sqlite3 v12).
import type { AdapterOptions, PgPoolLike, Core, HandleIdempotentMutation, IdempotencyContext, IdempotencyLedger, IdempotencyOptions, IdempotentFunctionWrapper, LedgerDb, SqlStatement, StatementResult } from "./common.js";
export * from "./common.js";

/** The parts of a better-sqlite3 (v12) Database this package uses. */
export interface Database {
  prepare(sql: string): any;
  transaction<F extends (...args: any[]) => any>(fn: F): any;
  pragma(source: string, options?: { simple?: boolean }): any;
  close(): unknown;
}

/** The same handler as on Workers; env.DB is a better-sqlite3 Database (or any LedgerDb). ctx is optional. */
export declare const handleIdempotentMutation: HandleIdempotentMutation;

export declare function ledgerFor(db: Database | PgPoolLike | LedgerDb, options?: IdempotencyOptions): IdempotencyLedger;
export declare function migrate(db: Database | PgPoolLike | LedgerDb): void | Promise<void>;
/** Opens (creating and migrating) a WAL-mode SQLite ledger with a busy timeout. */
export declare function openLedgerDatabase(path: string, options?: { busyTimeoutMs?: number }): Promise<Database>;
export declare function sqliteLedger(db: Database): LedgerDb & { batchSync(statements: SqlStatement[]): StatementResult[] };
export declare function pgLedger(pool: PgPoolLike, options?: { connectTimeoutMs?: number; lockTimeoutMs?: number; preparedStatements?: boolean }): LedgerDb;
export declare function createPgPool(url: string, options?: { max?: number; connectTimeoutMs?: number }): Promise<PgPoolLike>;
/** The plain node:http adapter. */
export declare function idempotentHandler(
  options: AdapterOptions<import("./node-http.js").IncomingMessageLike, Database | PgPoolLike | LedgerDb>,
  handler: (req: import("./node-http.js").IncomingMessageLike & { rawBody?: Uint8Array; idempotency: IdempotencyContext }, res: import("./node-http.js").ServerResponseLike) => unknown,
): (req: any, res: any) => void;
export declare function getCore(): Core;
/** A fresh component instance of its own. */
export declare function newCore(): Core;

/** `fn` at most once per (principal, key), its ledger on a better-sqlite3 Database, a pg.Pool or a LedgerDb. */
export declare const idempotentFunction: IdempotentFunctionWrapper<Database | PgPoolLike | LedgerDb>;
