// The idempotency core component (bound by ./component.js) and the calls into it.
// Platform-neutral: the caller supplies the compiled core modules, so this file
// never compiles WebAssembly from bytes (Workers forbid that at run time).
//
// Everything the protocol decides is asked of the core through one `session`
// resource per settings object (WIT idempotency:ledger@0.2.0): the host only
// converts values, runs SQL and applies the answers.
import { CORE_MODULE, instantiate } from "./component.js";

/** The core modules the component is instantiated from, by file name (generated/). */
export const CORE_MODULE_NAMES = [CORE_MODULE];

/** A protocol call failed: `protocolError` is the WIT `protocol-error`. Nothing ran on its account. */
export class IdempotencyError extends Error {
  constructor(protocolError, options) {
    super(describeProtocolError(protocolError), options);
    this.name = "IdempotencyError";
    this.protocolError = protocolError;
  }
}

/**
 * Thrown by a database adapter: `batchError` is the WIT `batch-error` (what
 * the driver saw). The core's `session.classify` says what it means.
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

/** What an adapter threw, as a WIT `batch-error`: its own BatchFailure, or a failure of the host. */
export function toBatchError(error) {
  if (error instanceof BatchFailure) return error.batchError;
  return { tag: "host", val: String(error?.message ?? error) };
}

/**
 * One instance of the component. Every export is synchronous; the step API
 * never re-enters the host, so one instance serves any number of concurrent
 * requests in an isolate or process. The driven API (`run-*`) calls the
 * ledger import, which runs the executor given to `Core.drive` for the
 * duration of that one call.
 */
export class Core {
  #getCoreModule;
  #imports;
  #root = null;
  #epoch = 0;
  #executor = null;

  /** @param getCoreModule (name) => WebAssembly.Module, for each of CORE_MODULE_NAMES */
  constructor(getCoreModule) {
    this.#getCoreModule = getCoreModule;
    const ledger = {
      // Never traps: an error is returned as the WIT `batch-error` (jco
      // treats a thrown non-Error object as the `err` payload).
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
    this.#imports = { "idempotency:ledger/ledger": ledger, "idempotency:ledger/ledger@0.2.0": ledger };
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
   * Runs `fn(exports)`: a WIT error becomes an IdempotencyError; a trap
   * discards the instance (a fresh one serves the next call) and becomes an
   * IdempotencyError with a ledger `other` error, so the host answers the
   * core's 500.
   */
  call(fn) {
    const root = this.#exports();
    try {
      return fn(root);
    } catch (error) {
      if (error && Object.prototype.hasOwnProperty.call(error, "payload")) {
        throw new IdempotencyError(error.payload, { cause: error });
      }
      if (error instanceof TypeError || error instanceof RangeError) {
        // jco refused to lower a value (a host bug, never a trap): the instance is intact.
        throw new IdempotencyError({ tag: "invalid-argument", val: String(error.message) }, { cause: error });
      }
      this.#root = null;
      this.#epoch += 1;
      throw new IdempotencyError({ tag: "ledger", val: { tag: "other", val: `idempotency component trapped: ${error}` } }, { cause: error });
    }
  }

  /** Runs `fn(exports)` with `executor(statements) -> results` behind the ledger import (driven API). */
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
  #policy;

  constructor(core, config) {
    this.#core = core;
    this.#epoch = core.epoch;
    this.#opened = config;
    this.#resource = core.call((c) => c.session.Session.open(config));
    this.#config = null; // read on first use (defaultOptions): not on a Worker's first request
    this.#policy = this.call((s) => s.policy());
  }

  get core() {
    return this.#core;
  }

  /** The settings in force (WIT config, validated). */
  get config() {
    if (this.#config === null) this.#config = this.call((s) => s.config());
    return this.#config;
  }

  /** What the host checks itself (read once): protected methods (upper case), the request body cap, null-body statuses. */
  get policy() {
    return this.#policy;
  }

  /** Runs `fn(session)` on the live resource. */
  call(fn) {
    return this.#core.call(() => fn(this.#live()));
  }

  /** The driven API: `fn(session)` with `executor` behind the ledger import. */
  drive(executor, fn) {
    return this.#core.drive(executor, () => fn(this.#live()));
  }

  #live() {
    if (this.#epoch !== this.#core.epoch) {
      this.#resource = this.#core.call((c) => c.session.Session.open(this.#opened));
      this.#epoch = this.#core.epoch;
    }
    return this.#resource;
  }

  /** True when `method` is protected (the policy's list; no component call). */
  protects(method) {
    return this.#policy.protectedMethods.includes(String(method).toUpperCase());
  }

  admit(head, principal) {
    return this.call((s) => s.admit(head, principal === null || principal === undefined ? undefined : String(principal)));
  }
  bodyTooLarge() {
    return this.call((s) => s.bodyTooLarge());
  }
  fingerprintPrefix(head) {
    return this.call((s) => s.fingerprintPrefix(head));
  }
  fingerprint(head, body) {
    return this.call((s) => s.fingerprint(head, body));
  }
  errorResponse(protocolError) {
    return this.call((s) => s.errorResponse(protocolError));
  }
  classify(batchError) {
    return this.call((s) => s.classify(batchError));
  }
  logLine(event) {
    return this.call((s) => s.logLine(event));
  }
  planDecision(principal, key, fingerprint, now) {
    return this.call((s) => s.planDecision(principal, key, fingerprint, BigInt(now)));
  }
  decide(principal, key, fingerprint, now, waitingSince, results) {
    return this.call((s) => s.decide(principal, key, fingerprint, BigInt(now), BigInt(waitingSince), results));
  }
  planCompletion(ticket, response, now) {
    return this.call((s) => s.planCompletion(ticket, response, BigInt(now)));
  }
  finishCompletion(action, results) {
    return this.call((s) => s.finishCompletion(action, results));
  }
  planAbandon(ticket, reason) {
    return this.call((s) => s.planAbandon(ticket, reason));
  }
  finishRelease(results) {
    return this.call((s) => s.finishRelease(results));
  }
  planSweep(now) {
    return this.call((s) => s.planSweep(BigInt(now)));
  }
  finishSweep(results) {
    return this.call((s) => s.finishSweep(results));
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
