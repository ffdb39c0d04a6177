// One request = one exchange of the core (WIT idempotency:ledger exchange),
// run here in `stepped` mode: the core answers every event with the next
// action and this loop performs it (read the body, run a batch, sleep, run
// the handler) until a final action (pass-through, respond, propagate), which
// the framework adapter sends. Every status, header, text, wait and log line
// comes out of the core; this file hashes the body, runs SQL, sleeps, writes
// the core's log lines and schedules the sweeps the core asks for.
//
// Platform-neutral: a `LedgerDb` is anything with
//   dialect: "sqlite" | "postgres"
//   batch(statements) -> Promise<StatementResult[]>   (one atomic unit; throws BatchFailure)
//   begin() -> Promise<LedgerTransaction>             (optional: transactional handlers)
//   renewalBatch(statements)                          (optional: a lease renewal's batch, on
//                                                      another connection than batch's)
// where a statement is { query, sql, params } and a LedgerTransaction is
//   handle                        what the handler gets (the driver's own object)
//   execute(statements)           the completion inside the transaction (throws BatchFailure)
//   commit()                      throws BatchFailure
//   rollback()                    never throws
// (see ./d1.js for D1, ./sqlite.js for better-sqlite3, ./pg.js for
// node-postgres).
import { drainRequestBody, mutationOf, readFetchBody, requestHead, toFetchResponse } from "./fetch.js";
import { BatchFailure, ComponentFault, IdempotencyError, toBatchError, toWitConfig } from "./runtime.js";
import { ExchangeRecording, currentInstruments } from "./telemetry.js";

const encoder = new TextEncoder();
const EMPTY = new Uint8Array(0);

/**
 * The largest body an exchange gives the core with the request head
 * (`request-start.body`: the core hashes it, one call and one host hash
 * fewer); a larger one is hashed here at `read-body`, faster than the
 * component's SHA-256.
 */
export const BODY_AT_START_MAX_BYTES = 4096;

/**
 * Whether an exchange reads the body before it starts: the request carries a
 * key (so the core never passes it through with its body consumed) and no
 * Content-Length over the cap (which the core answers 413 unread).
 */
function readsFirst(headers, cap) {
  let keyed = false;
  for (const { name, value } of headers) {
    const lowered = name.toLowerCase();
    if (lowered === "idempotency-key") keyed ||= value !== "";
    else if (lowered === "content-length" && !(/^\s*\d+\s*$/.test(value) && BigInt(value.trim()) <= cap)) return false;
  }
  return keyed;
}

/**
 * Throw this from a handler that KNOWS it changed nothing: the core releases
 * the reservation (`nothing-changed`) so a retry runs at once, and the
 * response the framework makes for the error (or `options.response`, a
 * `{ status, headers, body }` the adapter sends) goes out unstored.
 */
export class NothingChangedError extends Error {
  constructor(message = "the handler changed nothing", options) {
    super(message, options);
    this.name = "NothingChangedError";
    if (options?.response !== undefined) this.response = options.response;
    if (options?.value !== undefined) this.value = options.value;
  }
}

/**
 * The reason of the `signal` a handler gets once a lease renewal found its
 * reservation taken over (docs/SPEC.md 10.1): its completion will be fenced
 * out (a transactional handler's writes rolled back); stop before any effect
 * outside the database. The message is the core's log line for it.
 */
export class LeaseLostError extends Error {
  constructor(message = "lease lost", options) {
    super(message, options);
    this.name = "LeaseLostError";
  }
}

/**
 * What a handler gets besides its request: its transaction (transactional
 * routes), the lease's signal, the ticket. A class: an object literal with a
 * getter costs a closure and an accessor pair per request, ten times this.
 */
class HandlerContext {
  #signal;
  constructor(transaction, signal, ticket) {
    this.transaction = transaction;
    this.ticket = ticket;
    this.#signal = signal;
    Object.freeze(this);
  }

  /** The AbortSignal a lost lease aborts, made when first asked for (an AbortController costs microseconds on Node 20). */
  get signal() {
    return this.#signal();
  }
}

/** `signal` is a function returning the AbortSignal (see neverAborted). */
export const handlerContext = (transaction, signal, ticket) => new HandlerContext(transaction, signal, ticket);

/**
 * The signal of a lease that is never lost (renewal off, or no reservation),
 * as handlerContext takes it: one per request, made when first asked for
 * (Workers bind such objects to the request that made them).
 */
export function neverAborted() {
  let signal;
  return () => (signal ??= new AbortController().signal);
}

/** Lowercase hex SHA-256 of `prefix` (UTF-8) followed by `body`, with Web Crypto. */
export async function sha256Hex(prefix, body) {
  const head = encoder.encode(prefix);
  const bytes = body ?? EMPTY;
  const combined = new Uint8Array(head.byteLength + bytes.byteLength);
  combined.set(head, 0);
  combined.set(bytes, head.byteLength);
  const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", combined));
  let hex = "";
  for (const b of digest) hex += b.toString(16).padStart(2, "0");
  return hex;
}

/** The WIT `handler-result` of an error a handler threw: nothing-changed or raised. */
export function raisedResult(error) {
  if (error instanceof NothingChangedError) return { tag: "nothing-changed" };
  return { tag: "raised", val: String(error?.stack ?? error?.message ?? error) };
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

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
const PASS_THROUGH = Object.freeze({ tag: "pass-through" });

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
 * The ledger for one database and one options object. `options` carry the
 * settings (see README: `profile`, `protectedMethods`, ... `onServerError`)
 * plus `now()` (ms clock), `logger` (default console; called as
 * logger[level](message) with the core's level and wording), `sweep`
 * (false: never schedule the sweeps the core asks for) and `onOutcome`
 * (called with the outcome of every exchange, the core's name for how it
 * ended: "executed", "replayed", "key-reused", ...).
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
    this.now = clockOf(options);
    this.logger = options.logger ?? console;
    this.onOutcome = typeof options.onOutcome === "function" ? options.onOutcome : null;
    /** false: this ledger records no OpenTelemetry metrics or spans (option `telemetry: false`). */
    this.telemetry = options.telemetry !== false;
    this.recordKeys = options.recordKeys === true;
    const advice = typeof db.setupAdvice === "function" ? db.setupAdvice() : null;
    if (advice) this.log({ level: "warn", message: advice });
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

  /** The statements of a `run-batch` with their SQL, for the LedgerDb. */
  #withSql(statements) {
    const sql = this.session.sql;
    return statements.map((s) => ({ query: s.query, sql: sql[s.query], params: s.params }));
  }

  /** Runs one batch: the `batch-done` or `batch-failed` event (the failure as the driver saw it). */
  async runBatch(statements, { renewal = false } = {}) {
    try {
      const sql = this.#withSql(statements);
      // A renewal runs on a connection of its own where the LedgerDb has one (never a handler's transaction).
      const results = renewal && typeof this.db.renewalBatch === "function" ? await this.db.renewalBatch(sql) : await this.db.batch(sql);
      return { tag: "batch-done", val: results };
    } catch (error) {
      return { tag: "batch-failed", val: toBatchError(error) };
    }
  }

  /** Runs a `complete-in-transaction`, `commit` or `rollback` on `tx`: the event to feed. */
  async #inTransaction(action, tx) {
    switch (action.tag) {
      case "complete-in-transaction":
        if (tx === null) return { tag: "batch-failed", val: { tag: "host", val: "no transaction is open for this exchange" } };
        try {
          return { tag: "batch-done", val: await tx.execute(this.#withSql(action.val)) };
        } catch (error) {
          return { tag: "batch-failed", val: toBatchError(error) };
        }
      case "commit":
        if (tx === null) return { tag: "commit-failed", val: { tag: "host", val: "no transaction is open for this exchange" } };
        try {
          await tx.commit();
          return { tag: "committed" };
        } catch (error) {
          return { tag: "commit-failed", val: toBatchError(error) };
        }
      default:
        await tx?.rollback();
        return { tag: "rolled-back" };
    }
  }

  /**
   * Renews `ticket`'s lease every `everyMs` while its handler runs (docs/SPEC.md
   * 10.1): the core's renewal batch on the ledger's database (never on the
   * handler's transaction), its answer read by the core and its line logged;
   * a lost lease aborts `signal` and ends the renewals; an unknown one goes
   * on. `stop()` ends them when the handler ends; a renewal still in flight
   * then is ignored (handed to `waitUntil` so a Worker lets it finish).
   */
  #renewLease(ticket, everyMs, waitUntil) {
    let controller = null; // made when the handler asks for its signal, or the lease is lost
    const ensured = () => (controller ??= new AbortController());
    let stopped = false;
    let timer = null;
    const renewOnce = async () => {
      const event = await this.runBatch(this.session.renewal(ticket, this.now()), { renewal: true });
      if (stopped) return null;
      return this.session.renewed(ticket, event.tag === "batch-done" ? { tag: "ok", val: event.val } : { tag: "err", val: event.val });
    };
    const tick = async () => {
      timer = null;
      if (stopped) return;
      const renewal = renewOnce();
      if (typeof waitUntil === "function") waitUntil(renewal.catch(() => {}));
      let lease;
      try {
        lease = await renewal;
      } catch (failure) {
        if (stopped) return;
        if (failure instanceof ComponentFault) for (const line of this.session.faultReply.log) this.log(line);
        else this.logger.error?.(failure);
        lease = null;
      }
      if (stopped) return;
      if (lease?.log) this.log(lease.log);
      if (lease?.state === "lost") {
        stopped = true;
        ensured().abort(new LeaseLostError(lease.log?.message));
        return;
      }
      schedule();
    };
    const schedule = () => {
      timer = setTimeout(tick, everyMs);
      timer?.unref?.();
    };
    schedule();
    return {
      signal: () => ensured().signal,
      stop() {
        stopped = true;
        if (timer !== null) clearTimeout(timer);
        timer = null;
      },
    };
  }

  /**
   * One request's exchange, stepped. `io` is what the framework adapter does:
   *   readBody(cap)  -> the body bytes (at most `cap`), or "too-large" (it
   *                     stopped reading past the cap), "consumed" (something
   *                     before the middleware read it) or "incomplete" (the
   *                     client's stream broke); may return a promise
   *   runHandler(ticket, body, context) -> the WIT `handler-result` (a throw
   *                     counts as raised, or nothing-changed for a
   *                     NothingChangedError); `context` is { transaction,
   *                     signal, ticket }: the transaction's handle on a
   *                     transactional exchange (else undefined) and the
   *                     AbortSignal a lost lease aborts
   * Returns { action, outcome, error?, handlerRan }: the final action
   * (pass-through, respond or propagate) for the adapter to send, its
   * outcome, what the handler threw, and whether it ran (a transactional
   * handler whose transaction could not begin never runs: the core releases
   * its key and responds as the ledger failed). The core's log lines are written and
   * the sweep it asks for is scheduled (handed to `waitUntil` when given)
   * before this returns. `route`: the route template for the metrics (a
   * string, or a function asked once the exchange ended), when the adapter
   * knows it. `transactional` (default: the options' `transactional`): the
   * handler writes to the ledger's own database in a transaction that commits
   * with its completion (docs/SPEC.md 10.2; the LedgerDb must have `begin()`).
   */
  async exchange(head, principal, io, { waitUntil, route, transactional = this.options.transactional === true } = {}) {
    const instruments = this.telemetry ? currentInstruments() : null;
    if (!this.session.protects(head.method)) {
      if (instruments !== null) {
        await new ExchangeRecording(instruments, head.method, principal, false, { traced: false }).finish("passed-through", route, this.digest, { measured: false }).catch(() => {});
      }
      return this.#final(PASS_THROUGH, undefined, waitUntil, false);
    }
    // null unless a meter or tracer provider is registered: nothing is timed then
    const rec = instruments === null ? null : new ExchangeRecording(instruments, head.method, principal, this.recordKeys);
    let exchange;
    let error;
    let action;
    let tx = null; // the handler's open transaction (a transactional exchange)
    let handlerRan = false;
    try {
      // A keyed request's body is read first and, when small, given with the head.
      let read;
      const cap = this.session.config.requestBodyCapBytes;
      if (readsFirst(head.headers, cap)) {
        read = io.readBody(cap);
        if (read instanceof Promise) read = await read;
      }
      const small = read instanceof Uint8Array && read.byteLength <= BODY_AT_START_MAX_BYTES;
      rec?.enter();
      ({ action, exchange } = this.session.start(head, principal, this.now(), "stepped", transactional, small ? read : undefined));
      rec?.leave();
      let body = read instanceof Uint8Array ? read : EMPTY;
      while (exchange !== undefined && !isFinal(action)) {
        let event;
        switch (action.tag) {
          case "read-body": {
            const { cap, prefix } = action.val;
            if (read === undefined) read = io.readBody(cap);
            if (read instanceof Promise) read = await read;
            if (read === "too-large") event = { tag: "body-too-large" };
            else if (typeof read === "string") event = { tag: "body-unreadable", val: read };
            else {
              body = read;
              rec?.enter();
              let fingerprint = this.digest(prefix, read);
              if (typeof fingerprint !== "string") fingerprint = await fingerprint;
              rec?.leave();
              event = { tag: "body-hashed", val: fingerprint };
            }
            break;
          }
          case "run-batch":
            rec?.enter();
            event = await this.runBatch(action.val);
            rec?.leave();
            break;
          case "sleep":
            await sleep(action.val);
            event = { tag: "slept" };
            break;
          case "run-handler": {
            const { ticket, renewEveryMs, transaction } = action.val;
            if (rec !== null) rec.ticket = ticket;
            if (transaction) {
              rec?.enter();
              try {
                if (typeof this.db.begin !== "function") throw new BatchFailure({ tag: "host", val: "this database has no transactions for handlers" });
                tx = await this.db.begin();
              } catch (failure) {
                // The handler never ran: the core releases the key and answers as the ledger failed (SPEC 10.2).
                event = { tag: "batch-failed", val: toBatchError(failure) };
              }
              rec?.leave();
              if (event !== undefined) break;
            }
            const lease = renewEveryMs === undefined ? null : this.#renewLease(ticket, renewEveryMs, waitUntil);
            const context = handlerContext(tx?.handle, lease?.signal ?? neverAborted(), ticket);
            let result;
            handlerRan = true;
            try {
              result = await (rec === null ? io.runHandler(ticket, body, context) : rec.inSpan(() => io.runHandler(ticket, body, context)));
            } catch (thrown) {
              error = thrown;
              result = raisedResult(thrown);
            } finally {
              lease?.stop();
            }
            event = { tag: "handler-done", val: result };
            break;
          }
          case "complete-in-transaction":
          case "commit":
          case "rollback":
            rec?.enter();
            event = await this.#inTransaction(action, tx);
            rec?.leave();
            if (event.tag === "committed" || event.tag === "rolled-back") tx = null;
            break;
          default:
            throw new TypeError(`unknown action ${action.tag}`);
        }
        rec?.enter();
        action = exchange.step(this.now(), event);
        rec?.leave();
      }
    } catch (failure) {
      if (!(failure instanceof ComponentFault)) {
        if (tx !== null) await tx.rollback();
        if (rec !== null) await rec.finish(undefined, undefined, this.digest, { error: failure }).catch(() => {});
        throw failure;
      }
      rec?.leave();
      action = { tag: "respond", val: this.session.faultReply };
    } finally {
      exchange?.drop();
    }
    // Still open after the final action (a commit whose outcome is unknown, an internal error): dropped.
    if (tx !== null) await tx.rollback();
    const end = this.#final(action, error, waitUntil, handlerRan);
    if (rec !== null) await rec.finish(end.outcome, route, this.digest).catch(() => {});
    return end;
  }

  #final(action, error, waitUntil, handlerRan) {
    let outcome;
    if (action.tag === "pass-through") outcome = "passed-through";
    else {
      outcome = action.val.outcome;
      for (const line of action.val.log) this.log(line);
      if (action.tag === "respond" && action.val.sweep && this.options.sweep !== false) this.scheduleSweep(waitUntil);
    }
    if (this.onOutcome !== null) {
      try {
        this.onOutcome(outcome);
      } catch {
        // a broken callback must not break a request
      }
    }
    return error === undefined ? { action, outcome, handlerRan } : { action, outcome, error, handlerRan };
  }

  /**
   * For a request the ledger passes through (its method is not protected, or
   * it has no key where keys are optional) on a transactional route: the
   * handler still gets a transaction, of its own, so its writes run as they
   * would under the ledger. Returns { context, end(ok) }: `end(true)` commits
   * (false when the commit failed: answer `faultResponse()`), `end(false)`
   * rolls back. Not transactional, or a transaction that cannot begin: no
   * transaction in the context, and `end` does nothing.
   */
  async ownTransaction(transactional) {
    let tx = null;
    if (transactional && typeof this.db.begin === "function") {
      try {
        tx = await this.db.begin();
      } catch {
        tx = null; // the handler gets no transaction (and fails if it writes through one)
      }
    }
    return {
      context: handlerContext(tx?.handle, neverAborted(), undefined),
      async end(ok) {
        if (tx === null) return true;
        const open = tx;
        tx = null;
        if (!ok) {
          await open.rollback();
          return true;
        }
        try {
          await open.commit();
          return true;
        } catch {
          await open.rollback();
          return false;
        }
      },
    };
  }

  /** The session's fault reply (logged): the core's 500 for a request the host could not finish. */
  faultResponse() {
    const reply = this.session.faultReply;
    for (const line of reply.log) this.log(line);
    return reply.send.val;
  }

  /** One bounded sweep batch at `now`: the core's report ({ deleted, more, log? }), its line logged. */
  async sweep(now = this.now()) {
    const event = await this.runBatch(this.session.sweep(now));
    const report = this.session.swept(event.tag === "batch-done" ? { tag: "ok", val: event.val } : { tag: "err", val: event.val });
    if (report.log) this.log(report.log);
    return report;
  }

  /** Sweep batches until one is not full (`more` false). Returns the rows deleted. */
  async sweepAll(now = this.now()) {
    let deleted = 0n;
    for (;;) {
      const report = await this.sweep(now);
      deleted += report.deleted;
      if (!report.more) return Number(deleted);
    }
  }

  /**
   * Runs sweepAll off the request path (on a later turn, so a synchronous
   * database sweeps after the response was handed back): handed to
   * `waitUntil` on Workers, a detached promise elsewhere. Returns the promise.
   */
  scheduleSweep(waitUntil) {
    const run = sleep(0)
      .then(() => this.sweepAll())
      .catch((failure) => {
        // A failed batch is the core's report (logged above); only a fault
        // of the component gets here, logged as the core words faults.
        if (failure instanceof ComponentFault) for (const line of this.session.faultReply.log) this.log(line);
        else this.logger.error?.(failure);
      });
    sweepsInFlight.add(run);
    run.then(() => sweepsInFlight.delete(run));
    if (typeof waitUntil === "function") waitUntil(run);
    return run;
  }

  /** Creates the ledger's table and index (the core's migration, one batch). */
  async migrate() {
    const event = await this.runBatch(this.session.migration());
    if (event.tag === "batch-failed") throw new BatchFailure(event.val);
  }

  /**
   * The whole exchange for one Fetch Request (Workers): `runMutation(body,
   * request, context)` runs at most once per (principal, key) and returns a
   * Response or `{ status, body, headers }`; `context` is { transaction,
   * signal, ticket } (the transaction's handle when `transactional`, the
   * AbortSignal a lost lease aborts). Returns `{ response, outcome }`: the
   * Response to send (the core's, or the mutation's own). A mutation that
   * throws is rethrown once the core has said what its reservation becomes
   * (a NothingChangedError carrying `response` is answered with it).
   */
  async handle(request, principal, runMutation, { waitUntil, route, transactional = this.options.transactional === true } = {}) {
    const head = requestHead(request);
    let produced = null;
    let returned;
    const { action, outcome, error, handlerRan } = await this.exchange(
      head,
      principal,
      {
        readBody: (cap) => readFetchBody(request, cap),
        runHandler: async (ticket, body, context) => {
          returned = await runMutation(bufferOf(body), request, context);
          produced = await mutationOf(returned);
          return { tag: "answered", val: produced.wit };
        },
      },
      { waitUntil, route, transactional },
    );
    if (action.tag === "pass-through") {
      const own = await this.ownTransaction(transactional);
      let result;
      try {
        result = await mutationOf(await runMutation(await request.arrayBuffer(), request, own.context));
      } catch (thrown) {
        await own.end(false);
        throw thrown;
      }
      if (!(await own.end(true))) return { response: toFetchResponse(this.faultResponse()), outcome };
      return { response: result.response, outcome };
    }
    if (action.tag === "propagate") {
      if (!handlerRan) return { response: toFetchResponse(action.val.response), outcome };
      throw error;
    }
    const { send, close } = action.val;
    if (close) await drainRequestBody(request);
    if (send.tag === "core") {
      if (returned instanceof Response) returned.body?.cancel().catch(() => {}); // not sent
      return { response: toFetchResponse(send.val), outcome };
    }
    if (produced !== null) return { response: produced.response, outcome };
    if (error?.response !== undefined) return { response: (await mutationOf(error.response)).response, outcome };
    throw error;
  }
}

/** True for the actions after which the exchange takes no event. */
export const isFinal = (action) => action.tag === "respond" || action.tag === "pass-through" || action.tag === "propagate";

/** The ArrayBuffer holding exactly `bytes` (copied only when it is a view on a larger buffer). */
export function bufferOf(bytes) {
  if (bytes.byteOffset === 0 && bytes.byteLength === bytes.buffer.byteLength) return bytes.buffer;
  return bytes.slice().buffer;
}

export { BatchFailure, IdempotencyError };
