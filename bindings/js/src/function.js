// Idempotent functions: at most once per (principal, key) for work that is
// not HTTP (queue consumers, webhooks, jobs), on the same ledger and the same
// core rules as the HTTP adapters, as the Python host's @idempotent_function.
// Platform-neutral; the entries bind it to their database wrappers.
//
// A call is one exchange of a synthetic request:
//   method   POST (or, when the settings do not protect POST, the first
//            protected method in sorted order)
//   path     /functions/<name>
//   headers  Idempotency-Key: <key>, Content-Type: application/json
//   body     the payload as canonical JSON (./canonical-json.js), UTF-8
// The function's return value is stored as canonical JSON (a 200 with
// Content-Type: application/json) and a call with the same key gets it back
// (JSON.parse of the stored text) instead of running the function again.
import { canonicalJson } from "./canonical-json.js";
import { NothingChangedError } from "./ledger.js";
import { principalValue } from "./middleware.js";

const encoder = new TextEncoder();
const JSON_HEADERS = [{ name: "content-type", value: "application/json" }];
const REPLAYS = new Set(["replayed", "replayed-after-wait"]);

/**
 * The core answered a call instead of running it, or ran it and could not
 * store its result: the key was reused with another payload (`key-reused`),
 * a call with it is in progress (`in-progress`), no principal
 * (`principal-required`), an invalid key, the ledger failed, ... `outcome`
 * is the core's outcome name, `status`, `headers` and `body` its answer.
 */
export class RejectedError extends Error {
  constructor(outcome, response) {
    super(`${outcome}: ${response.status} ${response.body ?? ""}`);
    this.name = "RejectedError";
    this.outcome = outcome;
    this.status = response.status;
    this.headers = response.headers;
    this.body = response.body ?? null;
  }

  /** The outcome name (`key-reused`, `in-progress`, ...), as Python's Rejected.reason. */
  get reason() {
    return this.outcome;
  }

  /** The core's Retry-After, in seconds, when its answer has one (in progress, busy, outcome unknown). */
  get retryAfterSeconds() {
    const header = this.headers?.find((h) => h.name.toLowerCase() === "retry-after");
    const seconds = header === undefined ? NaN : Number(header.value);
    return Number.isFinite(seconds) ? seconds : undefined;
  }
}

/** The method a synthetic call uses under `session`: POST when protected, else the first protected method (sorted). */
function methodOf(session) {
  if (session.protects("POST")) return "POST";
  const methods = [...session.protectedMethods].sort();
  return methods[0] ?? "POST";
}

/**
 * Runs one idempotent call: `{ outcome, value }` (ran, or replayed), `{
 * outcome, error }` (the function threw: rethrow it; a NothingChangedError
 * released the key), or `{ outcome, rejected }` (a RejectedError). `run(context)`
 * runs the function; `context` is { transaction, signal, ticket }.
 */
export async function callOnce(ledger, { name, key, principal, payload, run, transactional = false }) {
  const body = encoder.encode(canonicalJson(payload));
  const path = `/functions/${name}`;
  const head = {
    method: methodOf(ledger.session),
    pathAndQuery: path,
    headers: [{ name: "Idempotency-Key", value: String(key) }, ...JSON_HEADERS],
  };
  let ran = false;
  let value;
  const { action, outcome, error } = await ledger.exchange(
    head,
    principalValue(principal),
    {
      readBody: (cap) => (BigInt(body.byteLength) > BigInt(cap) ? "too-large" : body),
      runHandler: async (ticket, bytes, context) => {
        const result = await run(context);
        const stored = canonicalJson(result);
        value = result;
        ran = true;
        return { tag: "answered", val: { status: 200, headers: JSON_HEADERS, body: { tag: "text", val: stored } } };
      },
    },
    { route: path, transactional },
  );
  if (action.tag === "pass-through") {
    const own = await ledger.ownTransaction(transactional);
    let result;
    try {
      result = await run(own.context);
    } catch (thrown) {
      await own.end(false);
      throw thrown;
    }
    if (!(await own.end(true))) return { outcome, rejected: new RejectedError(ledger.session.faultReply.outcome, ledger.faultResponse()) };
    return { outcome, value: result };
  }
  if (error !== undefined) return { outcome, error };
  if (action.tag === "propagate") return { outcome, rejected: new RejectedError(outcome, action.val.response) };
  const { send } = action.val;
  if (send.tag === "handler") return { outcome, value };
  const response = send.val;
  // A transactional call taken over meanwhile: its writes were rolled back, and the answer is the current owner's stored result.
  if (outcome === "fenced-out" && response.status === 200) return { outcome, value: response.body ? JSON.parse(response.body) : null };
  if (ran && response.status === 200) return { outcome, value };
  if (REPLAYS.has(outcome) && response.status === 200) return { outcome, value: response.body ? JSON.parse(response.body) : null };
  return { outcome, rejected: new RejectedError(outcome, response) };
}

/** The function's name for the synthetic path: `options.name`, else `fn.name`. */
function nameOf(fn, options, what) {
  const name = options.name ?? fn.name;
  if (typeof name !== "string" || name === "") throw new TypeError(`${what}: give options.name (the function has no name)`);
  return name;
}

/** `db` as a function of the call's arguments (a database object as it is). */
function dbSource(options, what) {
  if (options.ledger !== undefined) return null;
  const db = options.db;
  if (db === undefined || db === null) throw new TypeError(`${what}: options.db (or options.ledger) is required`);
  return typeof db === "function" && typeof db.batch !== "function" && typeof db.prepare !== "function" ? db : () => db;
}

/** Builds `idempotentFunction(fn, options)` over `api` (the entry's makeApi result). */
export function makeIdempotentFunction(api) {
  /**
   * `fn` at most once per (principal, key): returns an async function with
   * the same arguments. Options: `db` (a database, or a function of the
   * arguments returning it) or `ledger` (an IdempotencyLedger); `principal`
   * (a string, or a function of the arguments); `key(...args)` (the
   * Idempotency-Key); `payload(...args)` (what is fingerprinted; default the
   * arguments array); `name` (the synthetic path's last part; default
   * fn.name); `transactional` (the function's writes to the ledger's
   * database commit with its stored result); and every setting
   * (`pendingTtlMs`, `waitMs`, ...). `fn` gets one argument after the
   * caller's: { transaction, signal, ticket } (its transaction's handle when
   * transactional; the AbortSignal a lost lease aborts).
   */
  return function idempotentFunction(fn, options) {
    const what = "idempotentFunction";
    if (typeof fn !== "function") throw new TypeError(`${what}(fn, options): fn must be a function`);
    if (!options || typeof options !== "object") throw new TypeError(`${what}(fn, options): options are required`);
    if (typeof options.key !== "function") throw new TypeError(`${what}: options.key must be a function of the arguments returning the key`);
    if (options.payload !== undefined && typeof options.payload !== "function") throw new TypeError(`${what}: options.payload must be a function of the arguments`);
    const name = nameOf(fn, options, what);
    const dbOf = dbSource(options, what);
    const principalOf = typeof options.principal === "function" ? options.principal : () => options.principal;
    const wrapped = async function idempotent(...args) {
      const ledger = dbOf === null ? options.ledger : api.ledgerFor(await dbOf(...args), options);
      const call = await callOnce(ledger, {
        name,
        key: await options.key(...args),
        principal: await principalOf(...args),
        payload: options.payload === undefined ? args : await options.payload(...args),
        run: (context) => fn.apply(this, [...args, context]),
        transactional: options.transactional === true,
      });
      if (call.error !== undefined) {
        if (call.error instanceof NothingChangedError) return call.error.value;
        throw call.error;
      }
      if (call.rejected !== undefined) throw call.rejected;
      return call.value;
    };
    Object.defineProperty(wrapped, "name", { value: name });
    return wrapped;
  };
}

// Cloudflare Queues: the outcome of a message -> what happens to it.
const ACKED = new Set(["executed", "taken-over", "replayed", "replayed-after-wait", "fenced-out", "completion-failed", "passed-through"]);
const MAX_DELAY_SECONDS = 43_200; // Queues' longest retry delay (12 hours)
const clampDelay = (s) => Math.min(MAX_DELAY_SECONDS, Math.max(0, Math.ceil(s)));

/** Builds `idempotentQueueConsumer(handler, options)` over `api`. */
export function makeIdempotentQueueConsumer(api) {
  /**
   * A Cloudflare Queues `queue(batch, env, ctx)` handler that runs
   * `handler(message, env, ctx, context)` at most once per message key
   * (`context`: { transaction, signal, ticket }, as idempotentFunction's), one message
   * after the other. Options: `db` (a function of env; default
   * env[options.binding ?? "DB"]), `key(message)` (default message.id),
   * `payload(message)` (default message.body), `principal` (a string, or a
   * function of (message, env); default `queue:<the queue's name>`), `name`
   * (default the queue's name), `onMessage({ message, outcome, ack,
   * delaySeconds, error })` and every setting. The in-progress hint
   * defaults to the time left until a takeover (`inProgressRetryMs: null`).
   * What happens to each message is README's table: acked once the handler
   * ran or its stored result was found; else retried (with the core's
   * Retry-After as the delay when it gives one, the pending TTL after a
   * handler that threw).
   */
  return function idempotentQueueConsumer(handler, options = {}) {
    const what = "idempotentQueueConsumer";
    if (typeof handler !== "function") throw new TypeError(`${what}(handler, options): handler must be a function (message, env, ctx)`);
    const settings = { inProgressRetryMs: null, ...options };
    const keyOf = options.key ?? ((message) => message.id);
    const payloadOf = options.payload ?? ((message) => message.body);
    const dbOf = typeof options.db === "function" ? options.db : options.db !== undefined ? () => options.db : (env) => env?.[options.binding ?? "DB"];
    return async function queue(batch, env, ctx) {
      const name = options.name ?? batch.queue;
      let ledger = null;
      for (const message of batch.messages) {
        if (ledger === null) {
          const db = await dbOf(env);
          if (!db) throw new TypeError(`${what}: no database (bind D1 as ${options.binding ?? "DB"} or pass options.db)`);
          ledger = api.ledgerFor(db, settings);
        }
        const principal = options.principal === undefined ? `queue:${batch.queue}` : typeof options.principal === "function" ? await options.principal(message, env) : options.principal;
        const call = await callOnce(ledger, {
          name,
          key: await keyOf(message),
          principal,
          payload: await payloadOf(message),
          run: (context) => handler(message, env, ctx, context),
          transactional: options.transactional === true,
        });
        let delaySeconds;
        const ack = call.error === undefined && call.rejected === undefined && ACKED.has(call.outcome);
        if (ack) message.ack();
        else {
          if (call.rejected?.retryAfterSeconds !== undefined) delaySeconds = clampDelay(call.rejected.retryAfterSeconds);
          else if (call.outcome === "abandoned") delaySeconds = clampDelay(Number(ledger.session.config.pendingTtlMs) / 1000);
          if (delaySeconds === undefined) message.retry();
          else message.retry({ delaySeconds });
        }
        if (typeof options.onMessage === "function") {
          try {
            options.onMessage({ message, outcome: call.outcome, ack, delaySeconds, error: call.error ?? call.rejected });
          } catch {
            // a broken callback must not break the batch
          }
        }
      }
    };
  };
}
