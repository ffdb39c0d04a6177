// Types shared by the Workers (./worker.js) and Node (./node.js) entry points.
import type {
  Admission,
  Config,
  Decision,
  MutationResponse as WitMutationResponse,
  ProtocolError,
  RequestHead,
  Response as WitResponse,
  Ticket,
} from "../generated/interfaces/idempotency-ledger-types.js";
import type { Statement, StatementResult, BatchError } from "../generated/interfaces/idempotency-ledger-ledger.js";
import type { LedgerError } from "../generated/interfaces/idempotency-ledger-types.js";

export type { Admission, Config, Decision, ProtocolError, RequestHead, Ticket, Statement, StatementResult, LedgerError, BatchError, WitMutationResponse, WitResponse };

/** The SPEC settings (times in milliseconds). Every field is optional: the SPEC defaults apply. */
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
}

export interface IdempotencyOptions extends IdempotencySettings {
  /** The ledger clock, integer ms since the epoch (default Date.now). */
  now?: () => number;
  /** Where the core's log lines go, at the core's level (default console). */
  logger?: { error(message: string): void; warn?(message: string): void; info?(message: string): void };
  /** false: never schedule the opportunistic sweep. */
  sweep?: boolean;
  /** The env binding that holds the database (default "DB"). */
  binding?: string;
}

/** What runMutation may return: a plain result (the recipe's shape) or a Response. */
export interface MutationResult {
  status: number;
  /** A string goes to the core as text (cheapest); bytes are checked for UTF-8 before storing. */
  body?: string | ArrayBuffer | ArrayBufferView | null;
  headers?: Headers | Record<string, string> | Array<[string, string]>;
}

export type RunMutation = (bodyBytes: ArrayBuffer, request: Request) => Promise<MutationResult | Response> | MutationResult | Response;

export interface ExecutionContextLike {
  waitUntil(promise: Promise<unknown>): void;
}

/** One atomic batch of statements (a D1 batch(), a SQLite or PostgreSQL transaction); throws BatchFailure. */
export interface LedgerDb {
  dialect: "sqlite" | "postgres";
  batch(statements: Statement[]): Promise<StatementResult[]>;
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

export type Outcome = "pass-through" | "rejected" | "replayed" | "executed" | "unavailable";

export interface Handled {
  response: Response;
  outcome: Outcome;
  /** For "rejected": key-required | key-invalid | key-reused | in-progress | retry | record-corrupt. */
  reason?: string;
  /** For "executed": whether this response became the stored one. */
  stored?: "completed" | "released" | "fenced-out" | "failed";
  ticket?: Ticket;
  error?: unknown;
}

/** A protocol call failed; nothing ran on its account. */
export declare class IdempotencyError extends Error {
  constructor(protocolError: ProtocolError, options?: ErrorOptions);
  readonly protocolError: ProtocolError;
  /** Set when a completion batch failed: the response the caller should still get. */
  response?: WitResponse;
}

/** Throw from a mutation that KNOWS it changed nothing: the reservation is released and the error rethrown. */
export declare class NothingRanError extends Error {
  constructor(message?: string, options?: ErrorOptions);
}

/**
 * Resolves once every background sweep started so far has finished: at
 * shutdown, after the server stopped taking requests, before closing the
 * database. (Workers need not: waitUntil keeps the sweeps.)
 */
export declare function sweepsDone(): Promise<void>;

/** The component instance (all calls synchronous; shareable by concurrent requests). */
export declare class Core {
  constructor(getCoreModule: (name: string) => WebAssembly.Module);
  ready(): this;
  defaultConfig(profile?: "recipe" | "ietf"): Config;
  schema(dialect?: "sqlite" | "postgres"): string[];
  open(config: Config): Session;
}

/** One core session: settings validated once. */
export declare class Session {
  readonly config: Config;
  readonly policy: { protectedMethods: string[]; requestBodyCapBytes: bigint; nullBodyStatuses: Uint16Array };
  protects(method: string): boolean;
  admit(head: RequestHead, principal?: string): Admission;
  fingerprintPrefix(head: RequestHead): string;
  errorResponse(error: ProtocolError): WitResponse;
  classify(error: BatchError): LedgerError;
}

/** The whole SPEC flow and its steps, for one database and one set of options. */
export declare class IdempotencyLedger {
  constructor(core: Core, db: LedgerDb, options?: IdempotencyOptions);
  readonly session: Session;
  admit(head: RequestHead, principal?: string): Admission;
  fingerprint(head: RequestHead, body: ArrayBuffer | ArrayBufferView): Promise<string>;
  /** One batch: claim, fenced takeover, lookup. */
  decide(principal: string, key: string, fingerprint: string, now?: number, waitingSince?: number): Promise<Decision>;
  /** The decision, sleeping while the core says `wait`. */
  decideWaiting(principal: string, key: string, fingerprint: string): Promise<Decision>;
  /** One batch: the fenced completion (or release). */
  finish(ticket: Ticket, result: MutationResult | Response, now?: number): Promise<{ answer: Answer; stored: "completed" | "released" | "fenced-out" | "failed"; sweepDue: boolean }>;
  abandon(ticket: Ticket, reason: "raised" | "nothing-changed", detail?: string): Promise<boolean>;
  sweep(now?: number): Promise<{ deleted: bigint; more: boolean }>;
  sweepAll(now?: number): Promise<number>;
  handle(request: Request, principal: string | undefined, runMutation: RunMutation, ctx?: { waitUntil?: (p: Promise<unknown>) => void }): Promise<Handled>;
}

export interface KeyCheckOk {
  ok: true;
  key: string;
}
export interface KeyCheckFailed {
  ok: false;
  reason: "key-required" | "key-invalid";
  response: Response;
}

export type HeadersInput = Headers | Iterable<[string, string]> | Array<{ name: string; value: string }> | Record<string, string>;

export declare function computeFingerprint(
  method: string,
  pathAndQuery: string,
  headers: HeadersInput,
  bodyBytes: ArrayBuffer | ArrayBufferView,
  options?: IdempotencySettings,
): Promise<string>;
export declare function requestFingerprint(request: Request, options?: IdempotencySettings): Promise<string>;
export declare function validateIdempotencyKey(key: string | null | undefined, options?: IdempotencySettings): KeyCheckOk | KeyCheckFailed | { ok: true; key: null };
export declare function defaultOptions(options?: IdempotencySettings): Required<IdempotencySettings>;
export declare function schemaStatements(dialect?: "sqlite" | "postgres"): string[];
export declare function sha256Hex(prefix: string, body?: ArrayBuffer | ArrayBufferView | string): Promise<string>;
export declare function requestHead(request: Request): RequestHead;
export declare function toFetchResponse(response: WitResponse): Response;
export declare function toMutationResponse(result: MutationResult | Response): Promise<{ wit: WitMutationResponse; body: string | Uint8Array }>;
export declare function databaseError(code: string | undefined | null, message: string): BatchError;

/** What to send: status, headers, body. */
export interface Answer {
  status: number;
  headers: Array<{ name: string; value: string }>;
  body: string | Uint8Array | null;
}

/** The parts of a node-postgres Pool the package uses. */
export interface PgPoolLike {
  connect(): Promise<unknown>;
  query(...args: any[]): Promise<unknown>;
  readonly totalCount: number;
}
