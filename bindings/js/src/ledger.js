// The request flow on the component's sans-IO step API (WIT 0.2.0 session):
// one database batch per decision (per poll while the core says `wait`), one
// per completion or release, sweeps off the request path. The host decides
// nothing: admission, the body cap, the decision, the response to send, what
// a failed mutation leaves, when to sweep, what an error means and every log
// line come from the core.
//
// Platform-neutral: a `LedgerDb` is anything with
//   dialect: "sqlite" | "postgres"
//   batch(statements) -> Promise<StatementResult[]>   (one atomic unit; throws BatchFailure)
// (see ./d1.js for D1, ./sqlite.js for better-sqlite3, ./pg.js for node-postgres).
import { BatchFailure, IdempotencyError, toBatchError, toWitConfig } from "./runtime.js";

const encoder = new TextEncoder();
const EMPTY = new Uint8Array(0);

/**
 * Throw this from a mutation that KNOWS it changed nothing: the core releases
 * the reservation (SPEC 9.3, `nothing-changed`) so a retry runs at once.
 */
export class NothingRanError extends Error {
  constructor(message = "the mutation did not run", options) {
    super(message, options);
    this.name = "NothingRanError";
  }
}

/** Lowercase hex SHA-256 of `prefix` (UTF-8) followed by `body`, with Web Crypto. */
export async function sha256Hex(prefix, body) {
  const head = encoder.encode(prefix);
  const bytes = body ? asBytes(body) : EMPTY;
  const combined = new Uint8Array(head.byteLength + bytes.byteLength);
  combined.set(head, 0);
  combined.set(bytes, head.byteLength);
  const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", combined));
  let hex = "";
  for (const b of digest) hex += b.toString(16).padStart(2, "0");
  return hex;
}

export function asBytes(body) {
  if (body instanceof Uint8Array) return body;
  if (body instanceof ArrayBuffer) return new Uint8Array(body);
  if (ArrayBuffer.isView(body)) return new Uint8Array(body.buffer, body.byteOffset, body.byteLength);
  if (typeof body === "string") return encoder.encode(body);
  throw new TypeError("body must be an ArrayBuffer, a typed array or a string");
}

/** The request head the protocol reads from a Fetch Request: method, path + query, every header. */
export function requestHead(request) {
  const url = new URL(request.url);
  const headers = [];
  for (const [name, value] of request.headers) headers.push({ name, value });
  return { method: request.method, pathAndQuery: url.pathname + url.search, headers };
}

/** Any header collection (Fetch Headers, [name, value] pairs, {name, value} records, a plain object) as WIT headers. */
export function headerList(headers) {
  if (!headers) return [];
  const list = [];
  if (typeof headers.get === "function" && typeof headers.forEach === "function" && !Array.isArray(headers)) {
    for (const [name, value] of headers) list.push({ name, value: String(value) });
  } else if (Array.isArray(headers)) {
    for (const pair of headers) {
      if (Array.isArray(pair)) list.push({ name: String(pair[0]), value: String(pair[1]) });
      else list.push({ name: String(pair.name), value: String(pair.value) });
    }
  } else {
    for (const [name, value] of Object.entries(headers)) {
      if (value === undefined) continue;
      if (Array.isArray(value)) for (const v of value) list.push({ name, value: String(v) });
      else list.push({ name, value: String(value) });
    }
  }
  return list;
}

/**
 * Reads a Fetch body, stopping once it passes `cap` bytes (the core's
 * request body cap): returns the bytes, or null when the body is larger (the
 * rest is never read). The stream is left unread, not cancelled: on Node,
 * cancelling destroys the socket before the 413 can be written.
 */
export async function readBodyCapped(body, cap) {
  if (!body) return EMPTY;
  const limit = typeof cap === "bigint" ? cap : BigInt(cap);
  const reader = body.getReader();
  const chunks = [];
  let total = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    total += value.byteLength;
    if (BigInt(total) > limit) {
      reader.releaseLock();
      return null;
    }
    chunks.push(value);
  }
  if (chunks.length === 1) return chunks[0];
  const out = new Uint8Array(total);
  let at = 0;
  for (const c of chunks) {
    out.set(c, at);
    at += c.byteLength;
  }
  return out;
}

/**
 * An answer to send: `{ status, headers: [{name, value}], body: string |
 * Uint8Array | null }`, from a WIT `response` (and, when the core says
 * `send-mutation-body`, the mutation's own body).
 */
export function answerOf(response, mutationBody) {
  return { status: response.status, headers: response.headers, body: mutationBody !== undefined ? mutationBody : response.body ?? null };
}

/** An answer (or a WIT `response`) as a Fetch Response. */
export function toFetchResponse(answer) {
  return new Response(answer.body ?? null, { status: answer.status, headers: headersInit(answer.headers) });
}

/**
 * WIT headers as a Fetch HeadersInit: a plain record when every name occurs
 * once (no Headers object built: @hono/node-server writes such a response
 * straight to the socket), else a Headers that keeps every value.
 */
function headersInit(list) {
  const record = Object.create(null);
  for (const { name, value } of list) {
    const lower = name.toLowerCase();
    // A name seen twice, or __proto__ (lost by a record's WebIDL conversion).
    if (lower in record || lower === "__proto__") {
      const headers = new Headers();
      for (const h of list) headers.append(h.name, h.value);
      return headers;
    }
    record[lower] = value;
  }
  return record;
}

/**
 * What a mutation returned, as `{ wit, body }`: the WIT `mutation-response`
 * (strings go over as text, the cheap way) and its own body (sent as it is
 * when the core says `send-mutation-body`). The status goes to the core as it
 * is: the core rejects what it cannot store (only a value that is not a u16
 * at all becomes 0).
 */
export async function toMutationResponse(result) {
  if (typeof Response !== "undefined" && result instanceof Response) {
    const bytes = new Uint8Array(await result.arrayBuffer());
    return { wit: { status: result.status, headers: headerList(result.headers), body: { tag: "bytes", val: bytes } }, body: bytes };
  }
  if (!result || typeof result !== "object") throw new TypeError("the mutation must return { status, body, headers } or a Response");
  const status = Number.isInteger(result.status) && result.status >= 0 && result.status <= 0xffff ? result.status : 0;
  const body = result.body;
  let witBody;
  let own;
  if (body === null || body === undefined) {
    witBody = { tag: "text", val: "" };
    own = "";
  } else if (typeof body === "string") {
    witBody = { tag: "text", val: body };
    own = body;
  } else {
    own = asBytes(body);
    witBody = { tag: "bytes", val: own };
  }
  return { wit: { status, headers: headerList(result.headers), body: witBody }, body: own };
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** The WIT protocol-error of anything a flow step threw. */
export function protocolErrorOf(error) {
  if (error instanceof IdempotencyError) return error.protocolError;
  return { tag: "ledger", val: { tag: "other", val: String(error?.message ?? error) } };
}

// One session per (core, options object, dialect): the config is validated
// once, by the core, and never passed again.
const sessionsByCore = new WeakMap();
const NO_OPTIONS = Object.freeze({});

/** The session for `options` (cached per options object) in `dialect`. */
export function sessionFor(core, options = NO_OPTIONS, dialect = "sqlite") {
  let byOptions = sessionsByCore.get(core);
  if (!byOptions) sessionsByCore.set(core, (byOptions = new WeakMap()));
  const key = options && typeof options === "object" ? options : NO_OPTIONS;
  let byDialect = byOptions.get(key);
  if (!byDialect) byOptions.set(key, (byDialect = new Map()));
  let session = byDialect.get(dialect);
  if (!session) byDialect.set(dialect, (session = core.open(toWitConfig(core, key, dialect))));
  return session;
}

function clockOf(options) {
  const clock = typeof options.now === "function" ? options.now : Date.now;
  return () => {
    const now = clock();
    if (!Number.isSafeInteger(now)) throw new TypeError(`the clock returned ${now}, not integer milliseconds`);
    return now;
  };
}

const PASS_THROUGH = Object.freeze({ kind: "pass-through" });

/** Background sweeps started and not yet finished (every ledger of this module). */
const sweepsInFlight = new Set();

/**
 * Resolves once every background sweep started so far has finished. At
 * shutdown, await it after the server stopped taking requests and before
 * closing the database (else a sweep still queued meets a closed pool or
 * connection and is logged as failed). Workers need not: waitUntil keeps them.
 */
export function sweepsDone() {
  return Promise.all([...sweepsInFlight]).then(() => undefined);
}

/**
 * The ledger for one database and one options object: the whole SPEC flow
 * and its steps. `options` carry the settings (see README: `profile`,
 * `protectedMethods`, ... `onServerError`) plus `now()` (ms clock) and
 * `logger` (default console; called as logger[level](message) with the
 * core's level and wording).
 */
export class IdempotencyLedger {
  /**
   * `digest(prefix, body)`: lowercase hex SHA-256 of the prefix (UTF-8) and
   * the body, a string or a promise of one (default: Web Crypto; the Node
   * entries pass node:crypto's, synchronous).
   */
  constructor(core, db, options = NO_OPTIONS, { digest = sha256Hex } = {}) {
    if (!db || typeof db.batch !== "function") throw new TypeError("IdempotencyLedger needs a LedgerDb (batch(statements))");
    this.digest = digest;
    this.core = core;
    this.db = db;
    this.options = options;
    this.session = sessionFor(core, options, db.dialect ?? "sqlite");
    this.policy = this.session.policy;
    this.now = clockOf(options);
    this.logger = options.logger ?? console;
  }

  /** Writes a core-worded log line through the logger at the core's level. */
  log(line) {
    const write = this.logger[line.level] ?? this.logger.error ?? console.error;
    try {
      write.call(this.logger, line.message);
    } catch {
      // a broken logger must not break a request
    }
  }

  /** Logs a host-side event (WIT `log-event`) as the core words it. */
  logEvent(event) {
    let line;
    try {
      line = this.session.logLine(event);
    } catch (error) {
      line = { level: "error", message: `[idempotency] ${event.tag} (the core could not word it: ${error.message})` };
    }
    this.log(line);
  }

  /** Runs one batch; a failure is reported as the driver saw it and classified by the core. */
  async batch(statements) {
    try {
      return await this.db.batch(statements);
    } catch (error) {
      const batchError = toBatchError(error);
      const classified = this.session.classify(batchError);
      throw new IdempotencyError({ tag: "ledger", val: classified }, { cause: error });
    }
  }

  /** How the core classifies a request head (no ledger access); an unprotected method passes through without a call. */
  admit(head, principal) {
    if (!this.session.protects(head.method)) return PASS_THROUGH_ADMISSION;
    return this.session.admit(head, principal);
  }

  /** The fingerprint of a head and raw body bytes: SHA-256 over the core's prefix and the body. */
  async fingerprint(head, body) {
    return this.fingerprintOf(this.session.fingerprintPrefix(head), body);
  }

  /** Lowercase hex SHA-256 of the core's fingerprint prefix (UTF-8) followed by the body (a string, or a promise of one). */
  fingerprintOf(prefix, body) {
    return this.digest(prefix, body);
  }

  /** One decision round trip: claim, fenced takeover and lookup in ONE batch. Returns the WIT `decision`. */
  async decide(principal, key, fingerprint, now = this.now(), waitingSince = now) {
    const statements = this.session.planDecision(principal, key, fingerprint, now);
    const results = await this.batch(statements);
    return this.session.decide(principal, key, fingerprint, now, waitingSince, results);
  }

  /** The decision, sleeping and deciding again (same `waitingSince`) while the core says `wait`. */
  async decideWaiting(principal, key, fingerprint) {
    const since = this.now();
    let now = since;
    for (;;) {
      const decision = await this.decide(principal, key, fingerprint, now, since);
      if (decision.tag !== "wait") return decision;
      await sleep(decision.val);
      now = this.now();
    }
  }

  /**
   * Admission, the body (read up to the core's cap), the fingerprint and the
   * decision. `readBody(cap)` returns the bytes, or null once the body passed
   * `cap` (it must stop reading there). Returns
   *   { kind: "pass-through" }                      run the handler, no ledger
   *   { kind: "answer", answer, outcome, reason? }  send it; nothing runs
   *   { kind: "execute", ticket, body }             run the mutation once, then finish / abandon
   * Never throws for a ledger failure: that is an answer (the core's 5xx).
   */
  async begin(head, principal, readBody) {
    if (!this.session.protects(head.method)) return PASS_THROUGH;
    let admission;
    try {
      admission = this.session.admit(head, principal);
    } catch (error) {
      return this.#unavailable(error);
    }
    if (admission.tag === "pass-through") return PASS_THROUGH;
    if (admission.tag === "reject") return rejected(admission.val);
    const { key, fingerprintPrefix } = admission.val;
    const body = await readBody(this.policy.requestBodyCapBytes);
    if (body === null) return rejected(this.session.bodyTooLarge());
    const who = String(principal);
    let decision;
    try {
      let fingerprint = this.fingerprintOf(fingerprintPrefix, body);
      if (typeof fingerprint !== "string") fingerprint = await fingerprint;
      decision = await this.decideWaiting(who, key, fingerprint);
    } catch (error) {
      return this.#unavailable(error, who, key);
    }
    if (decision.tag === "execute") return { kind: "execute", ticket: decision.val, body };
    if (decision.tag === "replay") return { kind: "answer", answer: answerOf(decision.val), outcome: "replayed" };
    return rejected(decision.val);
  }

  /**
   * Completes `ticket` with what the mutation returned (a `{ status, body,
   * headers }` result or a Response): the core shapes the response and plans
   * the fenced completion (or release), run as ONE batch. Returns
   * `{ answer, stored: "completed" | "released" | "fenced-out" | "failed", sweepDue, error? }`;
   * the caller sends `answer` whatever happened to the batch.
   */
  async finish(ticket, result, now) {
    const produced = await toMutationResponse(result);
    let plan;
    try {
      plan = this.session.planCompletion(ticket, produced.wit, now ?? this.now());
    } catch (error) {
      this.logEvent({ tag: "completion-failed", val: { ticket, error: protocolErrorOf(error) } });
      return { answer: answerOf(this.session.errorResponse(protocolErrorOf(error))), stored: "failed", sweepDue: false, error };
    }
    if (plan.log) this.log(plan.log);
    const answer = answerOf(plan.response, plan.sendMutationBody ? produced.body : undefined);
    let outcome;
    try {
      const results = await this.batch(plan.statements);
      outcome = this.session.finishCompletion(plan.action, results);
    } catch (error) {
      this.logEvent({ tag: "completion-failed", val: { ticket, error: protocolErrorOf(error) } });
      return { answer, stored: "failed", sweepDue: false, error };
    }
    if (outcome === "fenced-out") this.logEvent({ tag: "fenced-out", val: ticket });
    const stored = outcome === "stored" ? "completed" : outcome;
    return { answer, stored, sweepDue: plan.sweepDue };
  }

  /**
   * What a mutation without a response leaves (SPEC 9.3): `reason` "raised"
   * (released only under on-server-error: release) or "nothing-changed"
   * (always released). Logged as the core words it; true when released.
   */
  async abandon(ticket, reason, detail = "") {
    try {
      const statements = this.session.planAbandon(ticket, reason);
      let released = false;
      if (statements) released = this.session.finishRelease(await this.batch(statements));
      this.logEvent({ tag: "abandoned", val: { ticket, reason, released, detail: String(detail) } });
      return released;
    } catch (error) {
      this.logEvent({ tag: "release-failed", val: { ticket, error: protocolErrorOf(error) } });
      return false;
    }
  }

  /** The abandon reason of a thrown error. */
  static reasonOf(error) {
    return error instanceof NothingRanError ? "nothing-changed" : "raised";
  }

  /** One bounded sweep batch at `now`. Returns the WIT `sweep-result` ({ deleted, more }). */
  async sweep(now = this.now()) {
    const statements = this.session.planSweep(now);
    return this.session.finishSweep(await this.batch(statements));
  }

  /** Sweep batches until one is not full (`more` false). Returns the rows deleted. */
  async sweepAll(now = this.now()) {
    let deleted = 0n;
    for (;;) {
      const result = await this.sweep(now);
      deleted += result.deleted;
      if (!result.more) return Number(deleted);
    }
  }

  /**
   * Runs sweepAll off the request path (on a later turn, so a synchronous
   * database sweeps after the response was handed back): handed to
   * `waitUntil` on Workers, a detached promise elsewhere. Failures are logged
   * as the core words them. Returns the promise.
   */
  scheduleSweep(waitUntil) {
    const run = sleep(0)
      .then(() => this.sweepAll())
      .catch((error) => this.logEvent({ tag: "sweep-failed", val: protocolErrorOf(error) }));
    sweepsInFlight.add(run);
    run.then(() => sweepsInFlight.delete(run));
    if (typeof waitUntil === "function") waitUntil(run);
    return run;
  }

  /** The answer for a call that failed before anything ran (the core's 5xx). */
  errorAnswer(error) {
    return answerOf(this.session.errorResponse(protocolErrorOf(error)));
  }

  #unavailable(error, principal, key) {
    if (principal !== undefined) this.logEvent({ tag: "decision-failed", val: { principal, key, error: protocolErrorOf(error) } });
    else this.log({ level: "error", message: `[idempotency] request not executed: ${error?.message ?? error}` });
    return { kind: "answer", answer: this.errorAnswer(error), outcome: "unavailable", error };
  }

  /**
   * The whole SPEC for one Fetch Request. Returns { response, outcome, ... }
   * where outcome is "pass-through" | "rejected" | "replayed" | "executed" |
   * "unavailable"; for "executed", `stored` is "completed" | "released" |
   * "fenced-out" | "failed". The body is read once as bytes (a protected
   * request's up to the core's cap) and handed to runMutation. A throwing
   * mutation is abandoned (the core says whether its reservation is
   * released) and the error rethrown.
   */
  async handle(request, principal, runMutation, { waitUntil } = {}) {
    let head;
    try {
      head = requestHead(request);
    } catch (error) {
      const a = this.#unavailable(error);
      return { response: toFetchResponse(a.answer), outcome: a.outcome, error };
    }
    const begun = await this.begin(head, principal, (cap) => readBodyCapped(request.body, cap));
    if (begun.kind === "answer") {
      return { response: toFetchResponse(begun.answer), outcome: begun.outcome, reason: begun.reason, error: begun.error };
    }
    if (begun.kind === "pass-through") {
      const body = new Uint8Array(await request.arrayBuffer());
      const result = await runMutation(body.buffer, request);
      if (typeof Response !== "undefined" && result instanceof Response) return { response: result, outcome: "pass-through" };
      return { response: this.passThroughResponse(result), outcome: "pass-through" };
    }
    const { ticket, body } = begun;
    let result;
    try {
      result = await runMutation(bufferOf(body), request);
    } catch (error) {
      await this.abandon(ticket, IdempotencyLedger.reasonOf(error), error?.message ?? String(error));
      throw error;
    }
    const done = await this.finish(ticket, result);
    if (done.sweepDue && this.options.sweep !== false) this.scheduleSweep(waitUntil);
    return { response: toFetchResponse(done.answer), outcome: "executed", stored: done.stored, ticket, error: done.error };
  }

  /** A pass-through result as a Fetch Response (no body for the core's null-body statuses). */
  passThroughResponse(result) {
    const headers = new Headers();
    for (const { name, value } of headerList(result?.headers)) headers.append(name, value);
    const noBody = this.policy.nullBodyStatuses.includes(result.status);
    const body = result.body === undefined || noBody ? null : result.body;
    return new Response(body, { status: result.status, headers });
  }
}

const PASS_THROUGH_ADMISSION = Object.freeze({ tag: "pass-through" });

function rejected(rejection) {
  return { kind: "answer", answer: answerOf(rejection.response), outcome: "rejected", reason: rejection.reason };
}

/** The ArrayBuffer holding exactly `bytes` (copied only when it is a view on a larger buffer). */
function bufferOf(bytes) {
  if (bytes.byteOffset === 0 && bytes.byteLength === bytes.buffer.byteLength) return bytes.buffer;
  return bytes.slice().buffer;
}

export { BatchFailure, IdempotencyError };
