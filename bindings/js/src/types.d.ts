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
import type { Statement, StatementResult, LedgerError } from "../generated/interfaces/idempotency-ledger-ledger.js";

export type { Admission, Config, Decision, ProtocolError, RequestHead, Ticket, Statement, StatementResult, LedgerError, WitMutationResponse, WitResponse };

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
}

export interface IdempotencyOptions extends IdempotencySettings {
  /** The ledger clock, integer ms since the epoch (default Date.now). */
  now?: () => number;
  /** Where fenced-out completions and ledger failures are reported (default console). */
  logger?: { error(message: string): void };
  /** false: never schedule the opportunistic sweep. */
  sweep?: boolean;
  /** The env binding that holds the database (default "DB"). */
  binding?: string;
  /** Called when a completion batch failed (the row stays pending); also logged. */
  onCompletionError?: (error: IdempotencyError, ticket: Ticket) => void;
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

/** One atomic batch of statements: a D1 batch(), a SQLite transaction. */
export interface LedgerDb {
  batch(statements: Statement[]): Promise<StatementResult[]>;
}

export type Outcome = "pass-through" | "rejected" | "replayed" | "executed" | "unavailable";

export interface Handled {
  response: Response;
  outcome: Outcome;
  /** For "rejected": key-required | key-invalid | key-reused | in-progress | retry | record-corrupt. */
  reason?: string;
  /** For "executed": whether this response became the stored one. */
  stored?: "completed" | "fenced-out" | "failed";
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

/** The component instance (all calls synchronous; shareable by concurrent requests). */
export declare class Core {
  constructor(getCoreModule: (name: string) => WebAssembly.Module, executeBatch?: (statements: Statement[]) => StatementResult[]);
  ready(): this;
  call<T>(fn: (exports: any) => T): T;
  defaultConfig(): Config;
  config(options?: IdempotencySettings): Config;
  schema(): string[];
  errorResponse(error: ProtocolError): WitResponse;
  fencedOutMessage(ticket: Ticket): string;
}

/** The whole SPEC flow and its steps, for one database and one set of options. */
export declare class IdempotencyLedger {
  constructor(core: Core, db: LedgerDb, options?: IdempotencyOptions);
  readonly config: Config;
  admit(head: RequestHead): Admission;
  fingerprintPrefix(head: RequestHead): string;
  fingerprint(head: RequestHead, body: ArrayBuffer | ArrayBufferView): Promise<string>;
  fingerprintInComponent(head: RequestHead, body: ArrayBuffer | ArrayBufferView): string;
  /** One batch: claim, fenced takeover, lookup. */
  decide(principal: string, key: string, fingerprint: string, now?: number): Promise<Decision>;
  /** One batch: the fenced completion. stored false = fenced out (logged). */
  complete(ticket: Ticket, response: WitMutationResponse, now?: number): Promise<{ response: WitResponse; stored: boolean }>;
  release(ticket: Ticket): Promise<boolean>;
  sweep(now?: number): Promise<number>;
  errorResponse(error: unknown): Response;
  handle(request: Request, principal: string, runMutation: RunMutation, ctx?: { waitUntil?: (p: Promise<unknown>) => void }): Promise<Handled>;
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
export declare function validateIdempotencyKey(key: string | null | undefined): KeyCheckOk | KeyCheckFailed;
export declare function defaultOptions(): Required<IdempotencySettings>;
export declare function schemaStatements(): string[];
export declare function sha256Hex(prefix: string, body?: ArrayBuffer | ArrayBufferView | string): Promise<string>;
export declare function requestHead(request: Request): RequestHead;
export declare function toFetchResponse(response: WitResponse): Response;
export declare function toMutationResponse(result: MutationResult | Response): Promise<WitMutationResponse>;
export declare function toLedgerError(error: unknown): LedgerError;
