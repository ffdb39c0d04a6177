// The idempotency core component (transpiled by jco) and the calls into it.
// Platform-neutral: the caller supplies the compiled core modules, so this file
// never compiles WebAssembly from bytes (Workers forbid that at run time).
import { instantiate } from "../generated/core.js";

/** The three core modules jco split the component into, by file name. */
export const CORE_MODULE_NAMES = ["core.core.wasm", "core.core2.wasm", "core.core3.wasm"];

/** A protocol call failed: `protocolError` is the WIT `protocol-error`. Nothing ran on its account. */
export class IdempotencyError extends Error {
  constructor(protocolError, options) {
    super(describeProtocolError(protocolError), options);
    this.name = "IdempotencyError";
    this.protocolError = protocolError;
  }
}

export function describeProtocolError(error) {
  if (!error || typeof error !== "object") return `idempotency protocol error: ${String(error)}`;
  if (error.tag === "ledger") {
    const l = error.val ?? {};
    return `idempotency ledger error (${l.tag})${l.val !== undefined ? `: ${l.val}` : ""}`;
  }
  return `idempotency ${error.tag}: ${error.val}`;
}

/** Maps anything thrown by a database onto the WIT `ledger-error` cases. */
export function toLedgerError(error) {
  if (error && typeof error === "object" && typeof error.tag === "string" && error.tag !== "ledger") {
    const known = ["busy", "constraint", "schema", "io", "other"];
    if (known.includes(error.tag)) return error;
  }
  const code = typeof error?.code === "string" ? error.code : "";
  const message = String(error?.message ?? error);
  if (/^SQLITE_(BUSY|LOCKED)/.test(code) || /SQLITE_BUSY|SQLITE_LOCKED|database is locked|database table is locked/i.test(message)) {
    return { tag: "busy" };
  }
  if (/^SQLITE_CONSTRAINT/.test(code) || /constraint failed|SQLITE_CONSTRAINT/i.test(message)) {
    return { tag: "constraint", val: message };
  }
  if (/no such table|no such column|has no column/i.test(message)) return { tag: "schema", val: message };
  if (
    /^SQLITE_(IOERR|CANTOPEN|READONLY|FULL|NOTADB|CORRUPT|PERM)/.test(code) ||
    /Network connection lost|storage caused object to be reset|SQLITE_IOERR|disk I\/O error|unable to open database/i.test(message)
  ) {
    return { tag: "io", val: message };
  }
  return { tag: "other", val: message };
}

/**
 * One instance of the component. All exports are synchronous and never
 * re-enter the host (the step API imports nothing), so one instance can serve
 * any number of concurrent requests in an isolate or process.
 */
export class Core {
  #getCoreModule;
  #imports;
  #root = null;
  #configs = new WeakMap();

  /**
   * @param getCoreModule (name) => WebAssembly.Module, for each of CORE_MODULE_NAMES
   * @param executeBatch optional synchronous ledger import for the driven API
   */
  constructor(getCoreModule, executeBatch) {
    this.#getCoreModule = getCoreModule;
    const ledger = {
      executeBatch:
        executeBatch ??
        (() => {
          throw { tag: "other", val: "this host runs the step API only; the driven API has no ledger here" };
        }),
    };
    this.#imports = { "idempotency:ledger/ledger": ledger, "idempotency:ledger/ledger@0.1.0": ledger };
  }

  /** Instantiates now (otherwise the first call does). */
  ready() {
    this.#exports();
    return this;
  }

  #exports() {
    if (this.#root === null) this.#root = instantiate(this.#getCoreModule, this.#imports);
    return this.#root;
  }

  /**
   * Runs `fn(exports)`: a WIT error becomes an IdempotencyError; a trap
   * discards the instance (a fresh one serves the next call) and becomes an
   * IdempotencyError with a ledger `other` error, so the host answers 500.
   */
  call(fn) {
    const root = this.#exports();
    try {
      return fn(root);
    } catch (error) {
      if (error && Object.prototype.hasOwnProperty.call(error, "payload")) {
        throw new IdempotencyError(error.payload, { cause: error });
      }
      this.#root = null;
      throw new IdempotencyError({ tag: "ledger", val: { tag: "other", val: `idempotency component trapped: ${error}` } }, { cause: error });
    }
  }

  get protocol() {
    return this.#exports().protocol;
  }

  get steps() {
    return this.#exports().steps;
  }

  get driven() {
    return this.#exports().driven;
  }

  defaultConfig() {
    return this.call((c) => c.protocol.defaultConfig());
  }

  /** The WIT config for user options (numbers in ms), validated; cached per options object. */
  config(options = {}) {
    if (options && typeof options === "object") {
      const cached = this.#configs.get(options);
      if (cached) return cached;
    }
    const config = toWitConfig(this.defaultConfig(), options ?? {});
    this.call((c) => c.protocol.validateConfig(config));
    if (options && typeof options === "object") this.#configs.set(options, config);
    return config;
  }

  schema() {
    return this.call((c) => c.protocol.schema("sqlite")); // D1 and better-sqlite3 speak SQLite
  }

  errorResponse(protocolError) {
    return this.call((c) => c.protocol.errorResponse(protocolError));
  }

  fencedOutMessage(ticket) {
    return this.call((c) => c.protocol.fencedOutMessage(ticket));
  }
}

const OPTION_FIELDS = {
  protectedMethods: "list",
  fingerprintHeaders: "list",
  replayHeaders: "list",
  pendingTtlMs: "u64",
  retentionMs: "u64",
  bodyCapBytes: "u32",
  sweepBatch: "u32",
};

/** Overrides `base` (a WIT config) with the SPEC settings found in `options`. */
export function toWitConfig(base, options) {
  const config = { ...base };
  for (const [name, kind] of Object.entries(OPTION_FIELDS)) {
    const value = options[name];
    if (value === undefined) continue;
    if (kind === "list") {
      if (!Array.isArray(value) || value.some((v) => typeof v !== "string")) {
        throw new IdempotencyError({ tag: "invalid-config", val: `${name} must be an array of strings` });
      }
      config[name] = [...value];
    } else {
      const n = typeof value === "bigint" ? value : Number.isSafeInteger(value) && value >= 0 ? BigInt(value) : null;
      if (n === null || n < 0n || (kind === "u32" && n > 0xffffffffn) || n > 0xffffffffffffffffn) {
        throw new IdempotencyError({ tag: "invalid-config", val: `${name} must be a non-negative integer` });
      }
      config[name] = kind === "u32" ? Number(n) : n;
    }
  }
  return config;
}
