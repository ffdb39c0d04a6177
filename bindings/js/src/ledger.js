// The request flow on the component's sans-IO step API: one database batch
// per decision, one per completion, one per sweep (off the critical path).
// Platform-neutral: a `LedgerDb` is anything with
//   batch(statements) -> Promise<StatementResult[]>   (one atomic unit)
// (see ./d1.js for D1 and ./sqlite.js for better-sqlite3).
import { IdempotencyError, toLedgerError } from "./runtime.js";

const encoder = new TextEncoder();

/** Throw this from a mutation that KNOWS it changed nothing: the reservation is released (SPEC 9) and the error rethrown. */
export class NothingRanError extends Error {
  constructor(message = "the mutation did not run", options) {
    super(message, options);
    this.name = "NothingRanError";
  }
}

/** Lowercase hex SHA-256 of `prefix` (UTF-8) followed by `body`, with Web Crypto. */
export async function sha256Hex(prefix, body) {
  const head = encoder.encode(prefix);
  const bytes = body ? asBytes(body) : new Uint8Array(0);
  const combined = new Uint8Array(head.byteLength + bytes.byteLength);
  combined.set(head, 0);
  combined.set(bytes, head.byteLength);
  const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", combined));
  let hex = "";
  for (const b of digest) hex += b.toString(16).padStart(2, "0");
  return hex;
}

function asBytes(body) {
  if (body instanceof Uint8Array) return body;
  if (body instanceof ArrayBuffer) return new Uint8Array(body);
  if (ArrayBuffer.isView(body)) return new Uint8Array(body.buffer, body.byteOffset, body.byteLength);
  if (typeof body === "string") return encoder.encode(body);
  throw new TypeError("body must be an ArrayBuffer, a typed array or a string");
}

/** The request head the protocol reads: method, path + query as received, every header. */
export function requestHead(request) {
  const url = new URL(request.url);
  const headers = [];
  for (const [name, value] of request.headers) headers.push({ name, value });
  return { method: request.method, pathAndQuery: url.pathname + url.search, headers };
}

function headerList(headers) {
  if (!headers) return [];
  const list = [];
  if (typeof headers.forEach === "function" && !Array.isArray(headers) && typeof headers.get === "function") {
    // Fetch Headers: names lower-cased, repeats combined as Headers.get does.
    for (const [name, value] of headers) list.push({ name, value: String(value) });
  } else if (Array.isArray(headers)) {
    for (const pair of headers) {
      if (Array.isArray(pair)) list.push({ name: String(pair[0]), value: String(pair[1]) });
      else list.push({ name: String(pair.name), value: String(pair.value) });
    }
  } else {
    for (const [name, value] of Object.entries(headers)) list.push({ name, value: String(value) });
  }
  return list;
}

/** A WIT `response` as a Fetch Response. */
export function toFetchResponse(response) {
  const headers = new Headers();
  for (const { name, value } of response.headers) headers.append(name, value);
  return new Response(response.body ?? null, { status: response.status, headers });
}

/** What a mutation returned, as a WIT `mutation-response` (strings go over as text, the cheap way). */
export async function toMutationResponse(result) {
  if (typeof Response !== "undefined" && result instanceof Response) {
    const bytes = new Uint8Array(await result.arrayBuffer());
    return { status: result.status, headers: headerList(result.headers), body: { tag: "bytes", val: bytes } };
  }
  if (!result || typeof result !== "object") throw new TypeError("runMutation must return { status, body, headers } or a Response");
  // A status Fetch cannot send (outside 200-599) goes to the core as 0, which
  // stores and answers the SPEC's 500 for an unsendable response.
  const status = Number.isInteger(result.status) && result.status >= 200 && result.status <= 599 ? result.status : 0;
  const body = result.body;
  let witBody;
  if (body === null || body === undefined) witBody = { tag: "text", val: "" };
  else if (typeof body === "string") witBody = { tag: "text", val: body };
  else witBody = { tag: "bytes", val: asBytes(body) };
  return { status, headers: headerList(result.headers), body: witBody };
}

function clockOf(options) {
  return typeof options.now === "function" ? options.now : Date.now;
}

function nowOf(clock) {
  const now = clock();
  if (!Number.isSafeInteger(now)) throw new TypeError(`the clock returned ${now}, not integer milliseconds`);
  return BigInt(now);
}

/**
 * The ledger for one database: the whole SPEC flow and its lower-level steps.
 * `options` carry the SPEC settings (`protectedMethods`, `fingerprintHeaders`,
 * `replayHeaders`, `pendingTtlMs`, `retentionMs`, `bodyCapBytes`,
 * `sweepBatch`) plus `now()` (ms clock), `logger` (default console) and
 * `sweep` (false to never schedule the opportunistic sweep).
 */
export class IdempotencyLedger {
  constructor(core, db, options = {}) {
    this.core = core;
    this.db = db;
    this.options = options;
    this.config = core.config(options);
    this.clock = clockOf(options);
    this.logger = options.logger ?? console;
  }

  /** How the protocol classifies a request head: pass-through, reject (400) or protected. */
  admit(head) {
    return this.core.call((c) => c.protocol.admit(this.config, head));
  }

  /** The fingerprint prefix (`UPPER(method)\npath\nheaders\n`) of a request head. */
  fingerprintPrefix(head) {
    return this.core.call((c) => c.protocol.fingerprintPrefix(this.config, head));
  }

  /** The fingerprint of a head and raw body bytes, with Web Crypto over the component's prefix. */
  async fingerprint(head, body) {
    return sha256Hex(this.fingerprintPrefix(head), body);
  }

  /** The fingerprint computed entirely inside the component (same digest; slower). */
  fingerprintInComponent(head, body) {
    return this.core.call((c) => c.protocol.fingerprint(this.config, head, asBytes(body ?? new Uint8Array(0))));
  }

  async #batch(statements) {
    try {
      return await this.db.batch(statements);
    } catch (error) {
      throw new IdempotencyError({ tag: "ledger", val: toLedgerError(error) }, { cause: error });
    }
  }

  /** Decision round trip: claim, fenced takeover and lookup in ONE batch. Returns the WIT `decision`. */
  async decide(principal, key, fingerprint, now = this.clock()) {
    const at = BigInt(now);
    const statements = this.core.call((c) => c.steps.planDecision(this.config, principal, key, fingerprint, at));
    const results = await this.#batch(statements);
    return this.core.call((c) => c.steps.decide(this.config, principal, key, fingerprint, at, results));
  }

  /**
   * Completion round trip: shapes the response and writes the fenced
   * completion in ONE batch. Returns { response, stored } (stored false =
   * fenced out, already logged). A failed batch throws an IdempotencyError
   * whose `response` is what the caller should still get.
   */
  async complete(ticket, mutationResponse, now = this.clock()) {
    const plan = this.core.call((c) => c.steps.planCompletion(this.config, ticket, mutationResponse, BigInt(now)));
    let results;
    try {
      results = await this.#batch(plan.statements);
    } catch (error) {
      error.response = plan.response;
      throw error;
    }
    const stored = this.core.call((c) => c.steps.finishCompletion(results));
    if (!stored) this.logger.error(this.core.fencedOutMessage(ticket));
    return { response: plan.response, stored };
  }

  /** Deletes this ticket's pending row; only when the mutation surely did not run. True when released. */
  async release(ticket) {
    const statements = this.core.call((c) => c.steps.planRelease(this.config, ticket));
    const results = await this.#batch(statements);
    return this.core.call((c) => c.steps.finishRelease(results));
  }

  /** One bounded sweep batch (rows last updated before now - retention). Returns how many rows went. */
  async sweep(now = this.clock()) {
    const statements = this.core.call((c) => c.steps.planSweep(this.config, BigInt(now)));
    const results = await this.#batch(statements);
    return Number(this.core.call((c) => c.steps.finishSweep(results)));
  }

  /** The 5xx to send when a protocol call failed before anything ran. */
  errorResponse(error) {
    const protocolError =
      error instanceof IdempotencyError ? error.protocolError : { tag: "ledger", val: { tag: "other", val: String(error?.message ?? error) } };
    return toFetchResponse(this.core.errorResponse(protocolError));
  }

  /**
   * The whole SPEC for one request. Returns { response, outcome, ... } where
   * outcome is "pass-through" | "rejected" | "replayed" | "executed" |
   * "unavailable"; for "executed", `stored` is "completed" | "fenced-out" |
   * "failed". The body is read once as bytes and handed to runMutation.
   * A throwing mutation leaves the row pending and the error is rethrown.
   */
  async handle(request, principal, runMutation, { waitUntil } = {}) {
    const clock = this.clock;
    let head;
    let admission;
    try {
      head = requestHead(request);
      admission = this.admit(head);
    } catch (error) {
      return this.#unavailable(error, "admission");
    }
    if (admission.tag === "reject") {
      return { response: toFetchResponse(admission.val.response), outcome: "rejected", reason: admission.val.reason };
    }
    // The body is read ONCE, as raw bytes: hashed for the fingerprint and
    // handed to the mutation; it never crosses into the component.
    const body = await request.arrayBuffer();
    if (admission.tag === "pass-through") {
      const result = await runMutation(body, request);
      if (typeof Response !== "undefined" && result instanceof Response) return { response: result, outcome: "pass-through" };
      const shaped = await toMutationResponse(result);
      const headers = new Headers();
      for (const { name, value } of shaped.headers) headers.append(name, value);
      const noBody = [204, 205, 304].includes(result.status);
      return { response: new Response(noBody ? null : shaped.body.val, { status: result.status, headers }), outcome: "pass-through" };
    }
    const { key, fingerprintPrefix } = admission.val;
    let decision;
    try {
      const fingerprint = await sha256Hex(fingerprintPrefix, body);
      decision = await this.decide(principal, key, fingerprint, Number(nowOf(clock)));
    } catch (error) {
      return this.#unavailable(error, "decision", { principal, key });
    }
    if (decision.tag === "replay") return { response: toFetchResponse(decision.val), outcome: "replayed" };
    if (decision.tag === "reject") {
      return { response: toFetchResponse(decision.val.response), outcome: "rejected", reason: decision.val.reason };
    }
    const ticket = decision.val;
    let produced;
    try {
      produced = await toMutationResponse(await runMutation(body, request));
    } catch (error) {
      if (error instanceof NothingRanError) {
        try {
          await this.release(ticket);
        } catch (releaseError) {
          this.logger.error(`[idempotency] release failed for principal=${principal}, key=${key}: ${releaseError.message}; the row stays pending`);
        }
      }
      throw error;
    }
    let completion;
    let stored;
    try {
      completion = await this.complete(ticket, produced, Number(nowOf(clock)));
      stored = completion.stored ? "completed" : "fenced-out";
    } catch (error) {
      this.logger.error(
        `[idempotency] completion not stored for principal=${ticket.principal}, key=${ticket.key}, generation=${ticket.generation}: ${error.message}; the row stays pending`,
      );
      if (!error.response) return { ...this.#unavailable(error, null), outcome: "executed", stored: "failed", ticket, error };
      completion = { response: error.response };
      stored = "failed";
      if (this.options.onCompletionError) {
        try {
          this.options.onCompletionError(error, ticket);
        } catch (hookError) {
          this.logger.error(`[idempotency] onCompletionError threw: ${hookError?.message ?? hookError}`);
        }
      }
    }
    if (this.options.sweep !== false && typeof waitUntil === "function") {
      const at = Number(nowOf(clock));
      // Started on a later turn, so even a synchronous database (better-sqlite3)
      // sweeps after this response has been handed back.
      const sweep = new Promise((resolve) => setTimeout(resolve, 0))
        .then(() => this.sweep(at))
        .catch((error) => {
          this.logger.error(`[idempotency] sweep failed: ${error.message}`);
        });
      waitUntil(sweep);
    }
    return { response: toFetchResponse(completion.response), outcome: "executed", stored, ticket };
  }

  #unavailable(error, stage, who) {
    if (stage) {
      const whom = who ? ` for principal=${who.principal}, key=${who.key}` : "";
      this.logger.error(`[idempotency] ${stage} failed${whom}: ${error?.message ?? error}; the mutation did not run`);
    }
    return { response: this.errorResponse(error), outcome: "unavailable", error };
  }
}
