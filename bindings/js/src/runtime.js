// The idempotency core component (bound by ./component.js) and the calls into it.
// Platform-neutral: the caller supplies the compiled core module, so this file
// never compiles WebAssembly from bytes (Workers forbid that at run time).
//
// Everything the protocol decides is asked of the core: one `session`
// resource per settings object, one `exchange` per protected request. The
// host only converts values, runs SQL and performs the exchange's actions.
import { CORE_MODULE, PACKAGE, instantiate } from "./component.js";

/** The core modules the component is instantiated from, by file name (generated/). */
export const CORE_MODULE_NAMES = [CORE_MODULE];
export { PACKAGE };

/** A protocol call failed: `protocolError` is the WIT `protocol-error`. Nothing ran on its account. */
export class IdempotencyError extends Error {
  constructor(protocolError, options) {
    super(describeProtocolError(protocolError), options);
    this.name = "IdempotencyError";
    this.protocolError = protocolError;
  }
}

/**
 * The component trapped (or was entered again after a trap): the instance is
 * discarded and a fresh one serves the next call. The request in flight is
 * answered with its session's `fault` reply (asked when the session opened).
 */
export class ComponentFault extends Error {
  constructor(message, options) {
    super(message, options);
    this.name = "ComponentFault";
  }
}

/**
 * Thrown by a database adapter: `batchError` is the WIT `batch-error` (what
 * the driver saw). The core classifies it.
 */
export class BatchFailure extends Error {
  constructor(batchError, options) {
    const detail = batchError?.tag === "database" ? batchError.val?.message : batchError?.val;
    super(`ledger batch failed (${batchError?.tag}): ${detail}`, options);
    this.name = "BatchFailure";
    this.batchError = batchError;
  }
}

/** A database error as the driver gave it: a WIT `batch-error` `database`. */
export const databaseError = (code, message) => ({
  tag: "database",
  val: code === undefined || code === null || code === "" ? { message: String(message) } : { code: String(code), message: String(message) },
});

export function describeProtocolError(error) {
  if (!error || typeof error !== "object") return `idempotency protocol error: ${String(error)}`;
  if (error.tag === "ledger") {
    const l = error.val ?? {};
    return `idempotency ledger error (${l.tag})${l.val !== undefined ? `: ${l.val}` : ""}`;
  }
  return `idempotency ${error.tag}: ${error.val}`;
}

/** What an adapter threw, as a WIT `batch-error`: its own BatchFailure (or any error carrying a `batchError`), or a failure of the host. */
export function toBatchError(error) {
  if (error instanceof BatchFailure || (error && typeof error === "object" && error.batchError?.tag !== undefined)) return error.batchError;
  return { tag: "host", val: String(error?.message ?? error) };
}

/**
 * One instance of the component. Every export is synchronous; a stepped
 * exchange never re-enters the host, so one instance serves any number of
 * concurrent requests in an isolate or process. The driven calls (`migrate`,
 * `run-sweep`, a driven exchange) call the ledger import, which runs the
 * executor given to `Core.drive` for the duration of that one call.
 */
export class Core {
  #getCoreModule;
  #imports;
  #root = null;
  #epoch = 0;
  #executor = null;
  #queries = new Map();

  /** @param getCoreModule (name) => WebAssembly.Module, for each of CORE_MODULE_NAMES */
  constructor(getCoreModule) {
    this.#getCoreModule = getCoreModule;
    const ledger = {
      // Never traps: an error is returned as the WIT `batch-error` (a thrown
      // non-Error object is the `err` payload).
      executeBatch: (statements) => {
        const run = this.#executor;
        if (run === null) throw { tag: "host", val: "no database is attached to this driven call" };
        try {
          return run(statements);
        } catch (error) {
          throw toBatchError(error);
        }
      },
    };
    this.#imports = { "idempotency:ledger/ledger": ledger };
  }

  /** Instantiates now (otherwise the first call does). */
  ready() {
    this.#exports();
    return this;
  }

  /** Bumped each time a trap discarded the instance (sessions reopen on the fresh one). */
  get epoch() {
    return this.#epoch;
  }

  #exports() {
    if (this.#root === null) this.#root = instantiate(this.#getCoreModule, this.#imports);
    return this.#root;
  }

  /**
   * Runs `fn(exports)`: a WIT error becomes an IdempotencyError, a value the
   * binding refused to lower an IdempotencyError `invalid-argument` (a host
   * bug; the instance is intact); a trap discards the instance (a fresh one
   * serves the next call) and becomes a ComponentFault.
   */
  call(fn, epoch = this.#epoch) {
    if (epoch !== this.#epoch) throw new ComponentFault("the component instance this object belonged to trapped and was discarded");
    const root = this.#exports();
    try {
      return fn(root);
    } catch (error) {
      if (error && Object.prototype.hasOwnProperty.call(error, "payload")) throw new IdempotencyError(error.payload, { cause: error });
      if (error instanceof TypeError || error instanceof RangeError) {
        throw new IdempotencyError({ tag: "invalid-argument", val: String(error.message) }, { cause: error });
      }
      this.#root = null;
      this.#epoch += 1;
      throw new ComponentFault(`the idempotency component trapped: ${error?.message ?? error}`, { cause: error });
    }
  }

  /** Runs `fn(exports)` with `executor(statements) -> results` behind the ledger import (driven calls). */
  drive(executor, fn) {
    const previous = this.#executor;
    this.#executor = executor;
    try {
      return this.call(fn);
    } finally {
      this.#executor = previous;
    }
  }

  /** The defaults of a profile ("recipe" | "ietf"). */
  defaultConfig(profile = "recipe") {
    return this.call((c) => c.session.defaultConfig(profile));
  }

  /** The migration of a dialect ("sqlite" | "postgres"), one statement per item. */
  schema(dialect = "sqlite") {
    return this.call((c) => c.session.schema(dialect));
  }

  /** The SQL of each query in `dialect`: { [query]: sql } (asked once per dialect). */
  queries(dialect = "sqlite") {
    let table = this.#queries.get(dialect);
    if (!table) {
      table = Object.fromEntries(this.call((c) => c.session.queries(dialect)).map(({ query, sql }) => [query, sql]));
      this.#queries.set(dialect, table);
    }
    return table;
  }

  /** A session on `config` (a WIT config), validated once by the core. */
  open(config) {
    return new Session(this, config);
  }
}

/**
 * One `session` resource of the core, opened once on a validated config.
 * If a trap discards the instance, the session reopens on the fresh one with
 * the same (already validated) config.
 */
export class Session {
  #core;
  #resource;
  #epoch;
  #config;
  #opened;

  constructor(core, config) {
    this.#core = core;
    this.#epoch = core.epoch;
    this.#opened = config;
    this.#resource = core.call((c) => c.session.Session.open(config));
    this.#config = null; // read on first use (defaultOptions): not on a Worker's first request
    /** The protected methods, upper-cased (a request with another method passes through without an exchange). */
    this.protectedMethods = new Set(this.call((s) => s.protectedMethods()));
    /** The request headers an exchange reads, lower-cased: `start` copies no other into the component (the same answers). */
    this.requestHeaders = new Set(this.call((s) => s.requestHeaders()));
    /** The handler's response headers an exchange reads (its replay-headers), lower-cased: `Exchange.step` copies no other into the component (the same answers). */
    this.responseHeaders = new Set(this.call((s) => s.responseHeaders()));
    /** The reply for a request whose exchange the component could not finish (it trapped). */
    this.faultReply = this.call((s) => s.fault());
    this.dialect = config.dialect;
    /** The SQL of each query in this session's dialect. */
    this.sql = core.queries(config.dialect);
  }

  get core() {
    return this.#core;
  }

  /** The settings in force (WIT config, validated). */
  get config() {
    if (this.#config === null) this.#config = this.call((s) => s.config());
    return this.#config;
  }

  /** Runs `fn(session)` on the live resource. */
  call(fn) {
    return this.#core.call(() => fn(this.#live()));
  }

  #live() {
    if (this.#epoch !== this.#core.epoch) {
      this.#resource = this.#core.call((c) => c.session.Session.open(this.#opened));
      this.#epoch = this.#core.epoch;
    }
    return this.#resource;
  }

  /** True when `method` is protected (no component call). */
  protects(method) {
    return this.protectedMethods.has(String(method).toUpperCase());
  }

  /**
   * Starts one request's exchange: { action, exchange } (`exchange`
   * undefined when the action is final). `now` in ms; `mode` "stepped" (the
   * host runs each batch) or "driven" (through `Core.drive`);
   * `transactional`: the handler runs in a transaction on the ledger's
   * database and its writes commit with the completion (docs/SPEC.md 10.2).
   * `body` (a Uint8Array): the whole request body, when the host already
   * holds it: no `read-body` follows (WIT `request-start.body`; in driven
   * mode call this inside `drive`, as the decision batch runs in it).
   */
  start(head, principal, now, mode = "stepped", transactional = false, body = undefined) {
    const read = this.requestHeaders;
    const headers = head.headers.filter((h) => read.has(String(h.name).toLowerCase()));
    if (headers.length !== head.headers.length) head = { method: head.method, pathAndQuery: head.pathAndQuery, headers };
    const request = { head, principal: principal === null || principal === undefined ? undefined : String(principal), now: BigInt(now), mode, transactional: transactional === true, body };
    let epoch;
    const started = this.call((s) => {
      epoch = this.#core.epoch;
      return s.start(request);
    });
    return { action: started.action, exchange: started.exchange === undefined ? undefined : new Exchange(this.#core, started.exchange, epoch, this.responseHeaders) };
  }

  /** The migration as one batch (statements). */
  migration() {
    return this.call((s) => s.migration());
  }

  /** One bounded sweep batch (statements) of rows last updated before `now - retention`. */
  sweep(now) {
    return this.call((s) => s.sweep(BigInt(now)));
  }

  /** The report of a sweep batch: `result` is { tag: "ok", val: results } or { tag: "err", val: batchError }. */
  swept(result) {
    return this.call((s) => s.swept(result));
  }

  /** The lease renewal of `ticket`'s owner at `now` (statements: one batch, on another connection than a handler's transaction). */
  renewal(ticket, now) {
    return this.call((s) => s.renewal(ticket, BigInt(now)));
  }

  /** What a renewal batch found (`result` as for `swept`): the WIT `lease` ({ state: "held" | "lost" | "unknown", log? }). */
  renewed(ticket, result) {
    return this.call((s) => s.renewed(ticket, result));
  }

  /** Driven: one renewal batch through `executor`; the lease. */
  renew(executor, ticket, now) {
    return this.#core.drive(executor, () => this.#live().renew(ticket, BigInt(now)));
  }

  /** Driven: the migration through `executor`. */
  migrate(executor) {
    return this.#core.drive(executor, () => this.#live().migrate());
  }

  /** Driven: one sweep batch through `executor`; the report. */
  runSweep(executor, now) {
    return this.#core.drive(executor, () => this.#live().runSweep(BigInt(now)));
  }

  /** Driven: `fn()` with `executor` behind the ledger import (a driven exchange's steps). */
  drive(executor, fn) {
    return this.#core.drive(executor, fn);
  }
}

/** One request's `exchange` resource. Drop it (`drop()`) once its action is final. */
export class Exchange {
  #core;
  #resource;
  #epoch;
  #responseHeaders;

  constructor(core, resource, epoch, responseHeaders) {
    this.#core = core;
    this.#resource = resource;
    this.#epoch = epoch;
    this.#responseHeaders = responseHeaders;
  }

  /**
   * Feeds `event` (a WIT event) that happened at `now` (ms); the next
   * action. A handler's answer crosses with only the response headers the
   * exchange reads (`Session.responseHeaders`).
   */
  step(now, event) {
    if (event.tag === "handler-done" && event.val.tag === "answered") event = { tag: "handler-done", val: { tag: "answered", val: this.#readable(event.val.val) } };
    return this.#core.call(() => this.#resource.step(BigInt(now), event), this.#epoch);
  }

  /** `response` with only the headers the exchange reads: itself when it has no other (an adapter that already read only those). */
  #readable(response) {
    const reads = (h) => this.#responseHeaders.has(String(h.name).toLowerCase());
    if (response.headers.every(reads)) return response;
    return { status: response.status, headers: response.headers.filter(reads), body: response.body };
  }

  /** Drops the resource (the exchange runs nothing more). */
  drop() {
    const resource = this.#resource;
    if (resource === null) return;
    this.#resource = null;
    if (this.#epoch !== this.#core.epoch) return; // its instance is gone
    try {
      resource[Symbol.dispose ?? Symbol.for("dispose")]();
    } catch {
      // dropping never fails a request
    }
  }
}

// ---------------------------------------------------------------------------
// Options -> WIT config. Type conversion only: every range and rule is the
// core's (`session.open` refuses a bad value with `invalid-config`).

const OPTION_FIELDS = {
  protectedMethods: "list",
  fingerprintHeaders: "list",
  replayHeaders: "list",
  pendingTtlMs: "u64",
  retentionMs: "u64",
  bodyCapBytes: "u32",
  requestBodyCapBytes: "u64",
  sweepBatch: "u32",
  sweepEvery: "u32",
  keyRequired: "bool",
  replayHeader: "option-string",
  inProgressRetryMs: "option-u64",
  waitMs: "u64",
  onServerError: "enum",
  leaseRenewal: "bool",
};

/** Every settings option this package accepts (camelCase, as in WIT). */
export const SETTING_NAMES = ["profile", ...Object.keys(OPTION_FIELDS)];

function invalid(name, what) {
  return new IdempotencyError({ tag: "invalid-config", val: `${name} ${what}` });
}

function toInteger(name, value, max) {
  let n;
  if (typeof value === "bigint") n = value;
  else if (typeof value === "number" && Number.isInteger(value)) n = BigInt(value);
  else throw invalid(name, `must be an integer, got ${typeof value === "number" ? value : typeof value}`);
  if (n < 0n || n > max) throw invalid(name, `${n} does not fit the setting's type`);
  return n;
}

/** The WIT config for user options: `defaultConfig(options.profile)` with the options applied, in `dialect`. */
export function toWitConfig(core, options = {}, dialect = "sqlite") {
  const profile = options.profile ?? "recipe";
  if (profile !== "recipe" && profile !== "ietf") throw invalid("profile", `must be "recipe" or "ietf", got ${JSON.stringify(profile)}`);
  const config = core.defaultConfig(profile);
  for (const [name, kind] of Object.entries(OPTION_FIELDS)) {
    const value = options[name];
    if (value === undefined) continue;
    switch (kind) {
      case "list":
        if (!Array.isArray(value) || value.some((v) => typeof v !== "string")) throw invalid(name, "must be an array of strings");
        config[name] = [...value];
        break;
      case "u64":
        config[name] = toInteger(name, value, 0xffffffffffffffffn);
        break;
      case "u32":
        config[name] = Number(toInteger(name, value, 0xffffffffn));
        break;
      case "bool":
        if (typeof value !== "boolean") throw invalid(name, "must be true or false");
        config[name] = value;
        break;
      case "option-string":
        if (value !== null && typeof value !== "string") throw invalid(name, "must be a string or null");
        config[name] = value === null ? undefined : value;
        break;
      case "option-u64":
        config[name] = value === null ? undefined : toInteger(name, value, 0xffffffffffffffffn);
        break;
      case "enum":
        if (value !== "store" && value !== "release") throw invalid(name, `must be "store" or "release", got ${JSON.stringify(value)}`);
        config[name] = value;
        break;
    }
  }
  config.dialect = dialect;
  return config;
}
