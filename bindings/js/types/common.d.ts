// Types shared by the Workers (./worker.js) and Node (./node.js) entry points.
import type {
  Config,
  MutationResponse as WitMutationResponse,
  Outcome,
  ProtocolError,
  RequestHead,
  Response as WitResponse,
  Ticket,
  LogLine,
  SweepReport,
  Lease,
} from "../generated/interfaces/idempotency-ledger-types.js";
import type { Statement, StatementResult, BatchError } from "../generated/interfaces/idempotency-ledger-ledger.js";
import type { Action, Event, HandlerResult, Reply } from "../generated/interfaces/idempotency-ledger-exchange.js";

export type { Config, Outcome, ProtocolError, RequestHead, Ticket, Statement, StatementResult, BatchError, WitMutationResponse, WitResponse, LogLine, SweepReport, Lease, Action, Event, HandlerResult, Reply };

export interface IdempotencySettings {
  /** Methods that must carry Idempotency-Key (default POST, PATCH, DELETE). */
  protectedMethods?: string[];
  /** Request headers hashed into the fingerprint, in order (default content-type, x-api-version). */
  fingerprintHeaders?: string[];
  /** Response headers stored and replayed (default content-type, location). */
  replayHeaders?: string[];
  /** Age after which a pending row may be taken over (default 30 000). */
  pendingTtlMs?: number;
  /** How long rows are kept and replayable; the sweep uses this same value (default 86 400 000). */
  retentionMs?: number;
  /** Largest response body stored, in UTF-8 bytes (default 16 384). */
  bodyCapBytes?: number;
  /** Rows one sweep deletes at most (default 20). */
  sweepBatch?: number;
  /** "recipe" (default) or "ietf": which answers the core gives. */
  profile?: "recipe" | "ietf";
  /** Largest request body of a protected request (default 1 048 576): 413 past it, checked while reading. */
  requestBodyCapBytes?: number;
  /** One execution in this many sweeps afterwards (default 8; the core picks which). */
  sweepEvery?: number;
  /** false: a protected request without a key runs as a plain request (default true). */
  keyRequired?: boolean;
  /** Header added to replays with the value "true" (default none; "Idempotency-Replayed" under ietf); null for none. */
  replayHeader?: string | null;
  /** The wait the in-progress 409 suggests (default: the time left until takeover); null for the default. */
  inProgressRetryMs?: number | null;
  /** How long a duplicate waits for the first request's answer instead of a 409 (default 0). */
  waitMs?: number;
  /** What a 5xx answer or a raised mutation leaves: "store" (default) or "release". */
  onServerError?: "store" | "release";
  /** While a handler runs, renew its reservation every third of the pending TTL, so a live owner is never taken over (default true). */
  leaseRenewal?: boolean;
}

export interface IdempotencyOptions extends IdempotencySettings {
  /** Called with the outcome of every request that reached the ledger (the core's name for how it ended). */
  onOutcome?: (outcome: Outcome) => void;
  /** The ledger clock, integer ms since the epoch (default Date.now). */
  now?: () => number;
  /** Where the core's log lines go, at the core's level (default console). */
  logger?: { error(message: unknown): void; warn?(message: unknown): void; info?(message: unknown): void };
  /** false: never schedule the opportunistic sweep. */
  sweep?: boolean;
  /** The env binding that holds the database (default "DB"). */
  binding?: string;
  /** false: this ledger records no OpenTelemetry metrics or spans (default: recorded whenever a provider is registered). */
  telemetry?: boolean;
  /** true: the `idempotency` span also carries the key (`idempotency.key`) and the principal (`enduser.id`) in clear. */
  recordKeys?: boolean;
  /** The route template for the metrics' `http.route` (Hono and Express find it themselves; node:http and Workers only have this). */
  route?: string | ((ctx: any) => string | undefined);
  /**
   * The handler writes to the ledger's own database and its writes must commit
   * with the stored answer (exactly once, docs/SPEC.md 10.2): it runs in a
   * transaction (`context.transaction`): better-sqlite3 `{ db }`, pg `{ client }`,
   * D1 `{ prepare, add }`.
   */
  transactional?: boolean;
}

/** A transactional handler's transaction on better-sqlite3: the ledger's Database itself, inside a deferred BEGIN. */
export interface SqliteTransaction {
  readonly dialect: "sqlite";
  readonly db: any;
}

/** A transactional handler's transaction on PostgreSQL: the pg client checked out for the request, inside BEGIN (do not release it). */
export interface PgTransaction {
  readonly dialect: "postgres";
  readonly client: any;
}

/** A transactional handler's statements on D1: run after the fenced completion in ONE db.batch(). */
export interface D1Transaction {
  readonly dialect: "sqlite";
  /** `db.prepare(sql)` on the ledger's D1 database. */
  prepare(sql: string): any;
  /** Registers bound prepared statements that commit with the completion, in order (before the handler answers). */
  add(...statements: unknown[]): void;
}

export type HandlerTransactionHandle = SqliteTransaction | PgTransaction | D1Transaction;

/** What a handler gets besides its request. */
export interface IdempotencyContext {
  /** The handler's transaction (transactional routes), else undefined. */
  readonly transaction: HandlerTransactionHandle | undefined;
  /** Aborted (reason: a LeaseLostError) once a renewal found the reservation taken over: stop before any effect outside the database. */
  readonly signal: AbortSignal;
  /** The won claim or takeover the handler runs under (undefined when the ledger passed the request through). */
  readonly ticket: Ticket | undefined;
}

/** The reason of `IdempotencyContext.signal`: the lease was lost (the message is the core's log line). */
export declare class LeaseLostError extends Error {}

/** What runMutation may return: a plain result (the recipe's shape) or a Response. */
export interface MutationResult {
  status: number;
  /** A string goes to the core as text (cheapest); bytes are checked for UTF-8 before storing. */
  body?: string | ArrayBuffer | ArrayBufferView | null;
  headers?: Headers | Record<string, string> | Array<[string, string]>;
}

export type RunMutation = (bodyBytes: ArrayBuffer, request: Request, context: IdempotencyContext) => Promise<MutationResult | Response> | MutationResult | Response;

/** handleIdempotentMutation, the same on every entry (what env.DB may be is the entry's). */
export type HandleIdempotentMutation = (
  request: Request,
  env: object,
  ctx: ExecutionContextLike | undefined,
  principal: string | undefined,
  runMutation: RunMutation,
  options?: IdempotencyOptions,
) => Promise<Response>;

export interface ExecutionContextLike {
  waitUntil(promise: Promise<unknown>): void;
}

/** One atomic batch of statements (a D1 batch(), a SQLite or PostgreSQL transaction); throws BatchFailure. */
/** One statement of a batch as a LedgerDb runs it: the core's query, its SQL in the LedgerDb's dialect, its parameters. */
export interface SqlStatement {
  query: Statement["query"];
  sql: string;
  params: Statement["params"];
}

export interface LedgerDb {
  dialect: "sqlite" | "postgres";
  batch(statements: SqlStatement[]): Promise<StatementResult[]>;
  /** Opens a transactional handler's transaction (optional: without it, transactional routes fail). */
  begin?(): Promise<LedgerTransaction>;
  /** A lease renewal's batch on another connection than a handler's transaction (optional: `batch` otherwise). */
  renewalBatch?(statements: SqlStatement[]): Promise<StatementResult[]>;
}

/** An open transaction of a transactional handler (the ledger completes, commits or rolls it back). */
export interface LedgerTransaction {
  readonly handle: HandlerTransactionHandle;
  execute(statements: SqlStatement[]): Promise<StatementResult[]>;
  commit(): Promise<void>;
  rollback(): Promise<void>;
}

/** A failure of a LedgerDb as the driver saw it: the core classifies `batchError`. */
export declare class BatchFailure extends Error {
  constructor(batchError: BatchError, options?: ErrorOptions);
  readonly batchError: BatchError;
}

/** Options every framework adapter takes, on top of the settings. */
export interface AdapterOptions<Ctx, Db> extends IdempotencyOptions {
  /** The ledger's database, or a function of the request/context returning it. */
  db: Db | ((ctx: Ctx) => Db | Promise<Db>);
  /** Your auth layer's principal; undefined (or "") is answered 401 by the core. */
  principal: (ctx: Ctx) => string | undefined | null | Promise<string | undefined | null>;
  /** Which requests go through the ledger at all (others run untouched). */
  routes?: (method: string, path: string) => boolean;
  /** Paths (exact, "prefix*" or RegExp) to include (default all) ... */
  include?: string | RegExp | Array<string | RegExp>;
  /** ... and to exclude. */
  exclude?: string | RegExp | Array<string | RegExp>;
}

export interface Handled {
  response: Response;
  outcome: Outcome;
}

/** What a framework adapter does for an exchange (IdempotencyLedger.exchange). */
export interface ExchangeIo {
  /** The body (at most `cap` bytes), or why it cannot be had. */
  readBody(cap: bigint): Uint8Array | "too-large" | "consumed" | "incomplete" | "length-unknown" | Promise<Uint8Array | "too-large" | "consumed" | "incomplete" | "length-unknown">;
  /** Runs the handler under `ticket`; a throw counts as raised (nothing-changed for a NothingChangedError). */
  runHandler(ticket: Ticket, body: Uint8Array, context: IdempotencyContext): Promise<HandlerResult> | HandlerResult;
}

export interface ExchangeEnd {
  /** The final action: pass-through, respond or propagate. */
  action: Action;
  outcome: Outcome;
  /** What the handler threw, when it did. */
  error?: unknown;
  /** Whether the handler ran (a transactional handler whose transaction could not begin did not: send a propagate's response). */
  handlerRan: boolean;
}

export declare class IdempotencyError extends Error {
  constructor(protocolError: ProtocolError, options?: ErrorOptions);
  readonly protocolError: ProtocolError;
}

/** The component trapped: the request is answered with its session's fault reply; a fresh instance serves the next. */
export declare class ComponentFault extends Error {}

/**
 * Throw from a handler that changed nothing: the key is released and the
 * framework's answer to the error (or `options.response`) goes out unstored.
 */
export declare class NothingChangedError extends Error {
  constructor(message?: string, options?: ErrorOptions & { response?: MutationResult; value?: unknown });
  readonly response?: MutationResult;
  /** What an idempotent function returns when it throws this (the key is released). */
  readonly value?: unknown;
}

/**
 * An idempotent call the core answered instead of running it, or ran and
 * could not store: `outcome` is the core's name (`key-reused`, `in-progress`,
 * `principal-required`, `key-invalid`, `ledger-busy`, ...).
 */
export declare class RejectedError extends Error {
  readonly outcome: Outcome;
  /** The same as `outcome` (Python's Rejected.reason). */
  readonly reason: Outcome;
  readonly status: number;
  readonly headers: Array<{ name: string; value: string }>;
  readonly body: string | null;
  /** The core's Retry-After in seconds, when its answer has one. */
  readonly retryAfterSeconds: number | undefined;
}

/** Options of idempotentFunction: where the ledger is, whose and which key, what is fingerprinted; plus every setting. */
export interface IdempotentFunctionOptions<A extends unknown[], Db> extends IdempotencyOptions {
  /** The ledger's database, or a function of the call's arguments returning it (or pass `ledger`). */
  db?: Db | ((...args: A) => Db | Promise<Db>);
  /** An IdempotencyLedger to use instead of `db`. */
  ledger?: IdempotencyLedger;
  /** The principal (a string, or a function of the arguments); none: every call is rejected principal-required. */
  principal: string | undefined | ((...args: A) => string | undefined | null | Promise<string | undefined | null>);
  /** The Idempotency-Key of a call (1-255 printable ASCII characters). */
  key: (...args: A) => string | Promise<string>;
  /** What is fingerprinted, as canonical JSON (default: the arguments array). */
  payload?: (...args: A) => unknown;
  /** The synthetic path's last part, /functions/<name> (default fn.name). */
  name?: string;
}

/**
 * idempotentFunction over the databases `Db` of an entry: `fn` at most once per (principal, key),
 * an async function with the caller's arguments returning its (stored, replayed) result.
 * `fn` gets one more argument after the caller's: the IdempotencyContext (its transaction when `transactional`, the lease's signal, the ticket).
 */
export interface IdempotentFunctionWrapper<Db> {
  <A extends unknown[], R>(fn: (...args: [...A, IdempotencyContext]) => R | Promise<R>, options: IdempotentFunctionOptions<A, Db>): (...args: A) => Promise<R>;
  <A extends unknown[], R>(fn: (...args: A) => R | Promise<R>, options: IdempotentFunctionOptions<A, Db>): (...args: A) => Promise<R>;
}

/** The parts of a Cloudflare Queues Message the consumer uses. */
export interface QueueMessageLike<Body = unknown> {
  readonly id: string;
  readonly body: Body;
  readonly attempts: number;
  ack(): void;
  retry(options?: { delaySeconds?: number }): void;
}

/** The parts of a Cloudflare Queues MessageBatch the consumer uses. */
export interface QueueBatchLike<Body = unknown> {
  readonly queue: string;
  readonly messages: readonly QueueMessageLike<Body>[];
}

/** Options of idempotentQueueConsumer; plus every setting (inProgressRetryMs defaults to null: the time left until a takeover). */
export interface QueueConsumerOptions<Body, Env> extends IdempotencyOptions {
  /** The ledger's database as a function of env (default env[binding ?? "DB"]). */
  db?: object | ((env: Env) => object | Promise<object>);
  /** A message's key (default message.id). */
  key?: (message: QueueMessageLike<Body>) => string | Promise<string>;
  /** What is fingerprinted (default message.body). */
  payload?: (message: QueueMessageLike<Body>) => unknown;
  /** The principal (default `queue:<queue name>`). */
  principal?: string | ((message: QueueMessageLike<Body>, env: Env) => string | undefined | Promise<string | undefined>);
  /** The synthetic path's last part (default the queue's name). */
  name?: string;
  /** Told what happened to each message. */
  onMessage?: (report: { message: QueueMessageLike<Body>; outcome: Outcome; ack: boolean; delaySeconds?: number; error?: unknown }) => void;
}

/**
 * A Queues `queue(batch, env, ctx)` handler running `handler` at most once
 * per message key, one message after the other; acks a message once the
 * handler ran or its stored result was found, else retries it.
 */
export declare function idempotentQueueConsumer<Body = unknown, Env = any>(
  handler: (message: QueueMessageLike<Body>, env: Env, ctx: ExecutionContextLike | undefined, context: IdempotencyContext) => unknown,
  options?: QueueConsumerOptions<Body, Env>,
): (batch: QueueBatchLike<Body>, env: Env, ctx?: ExecutionContextLike) => Promise<void>;

/** RFC 8785 canonical JSON (BigInt as digits, bytes as one code point per byte); see README. */
export declare function canonicalJson(value: unknown): string;
/** The same, as UTF-8 bytes. */
export declare function canonicalJsonBytes(value: unknown): Uint8Array;

export declare function sweepsDone(): Promise<void>;

/** The component instance (all calls synchronous; shareable by concurrent requests). */
export declare class Core {
  constructor(getCoreModule: (name: string) => WebAssembly.Module);
  ready(): this;
  defaultConfig(profile?: "recipe" | "ietf"): Config;
  schema(dialect?: "sqlite" | "postgres"): string[];
  queries(dialect?: "sqlite" | "postgres"): Record<Statement["query"], string>;
  open(config: Config): Session;
}

export declare class Exchange {
  step(now: number, event: Event): Action;
  drop(): void;
}

export declare class Session {
  readonly config: Config;
  readonly protectedMethods: Set<string>;
  /** The request headers an exchange reads, lower-cased: `start` copies no other into the component. */
  readonly requestHeaders: Set<string>;
  /** The handler's response headers an exchange reads (its replay-headers), lower-cased: `Exchange.step` copies no other into the component. */
  readonly responseHeaders: Set<string>;
  readonly faultReply: Reply;
  readonly sql: Record<Statement["query"], string>;
  protects(method: string): boolean;
  start(head: RequestHead, principal: string | undefined, now: number, mode?: "stepped" | "driven", transactional?: boolean): { action: Action; exchange?: Exchange };
  migration(): Statement[];
  sweep(now: number): Statement[];
  swept(result: { tag: "ok"; val: StatementResult[] } | { tag: "err"; val: BatchError }): SweepReport;
  renewal(ticket: Ticket, now: number): Statement[];
  renewed(ticket: Ticket, result: { tag: "ok"; val: StatementResult[] } | { tag: "err"; val: BatchError }): Lease;
}

export declare class IdempotencyLedger {
  constructor(core: Core, db: LedgerDb, options?: IdempotencyOptions);
  readonly session: Session;
  /** One request's exchange, stepped; the final action for the adapter to send. */
  exchange(
    head: RequestHead,
    principal: string | undefined,
    io: ExchangeIo,
    ctx?: { waitUntil?: (p: Promise<unknown>) => void; route?: string | (() => string | undefined); transactional?: boolean },
  ): Promise<ExchangeEnd>;
  sweep(now?: number): Promise<SweepReport>;
  sweepAll(now?: number): Promise<number>;
  migrate(): Promise<void>;
  handle(
    request: Request,
    principal: string | undefined,
    runMutation: RunMutation,
    ctx?: { waitUntil?: (p: Promise<unknown>) => void; route?: string | (() => string | undefined); transactional?: boolean },
  ): Promise<Handled>;
}

export type HeadersInput = Headers | Iterable<[string, string]> | Array<{ name: string; value: string }> | Record<string, string>;

export declare function defaultOptions(options?: IdempotencySettings): Required<IdempotencySettings>;
export declare function schemaStatements(dialect?: "sqlite" | "postgres"): string[];
export declare function sha256Hex(prefix: string, body?: Uint8Array): Promise<string>;
export declare function requestHead(request: Request): RequestHead;
/** A Fetch body read up to `cap` bytes (the core's read-body cap), or why it cannot be. */
export declare function readFetchBody(request: Request, cap: bigint | number): Promise<Uint8Array | "too-large" | "consumed" | "incomplete">;
/** The core's response as a Fetch Response (`close`: with the header that makes a Node server close the connection). */
export declare function toFetchResponse(response: WitResponse, close?: boolean): Response;
/** What a mutation returned, as the core stores it (`wit`) and as it is sent (`response`). */
export declare function mutationOf(result: MutationResult | Response): Promise<{ wit: WitMutationResponse; readonly response: Response }>;
export declare function databaseError(code: string | undefined | null, message: string): BatchError;

/** The parts of a node-postgres Pool the package uses. */
export interface PgPoolLike {
  connect(): Promise<unknown>;
  query(...args: any[]): Promise<unknown>;
  readonly totalCount: number;
}
