// The public surface shared by the Workers and Node entry points; each entry
// supplies how to load the component and how to wrap its database.
import { IdempotencyLedger, sha256Hex, toFetchResponse } from "./ledger.js";

export function makeApi(getCore, wrapDb, describeDb) {
  const ledgers = new WeakMap(); // db -> WeakMap(options -> IdempotencyLedger)
  const NO_OPTIONS = {};

  /** The IdempotencyLedger for a database and options (cached per pair of objects). */
  function ledgerFor(db, options = NO_OPTIONS) {
    if (!db || (typeof db !== "object" && typeof db !== "function")) throw new TypeError(`expected ${describeDb}`);
    let byOptions = ledgers.get(db);
    if (!byOptions) ledgers.set(db, (byOptions = new WeakMap()));
    let ledger = byOptions.get(options);
    if (!ledger) byOptions.set(options, (ledger = new IdempotencyLedger(getCore(), wrapDb(db), options)));
    return ledger;
  }

  function dbFrom(env, options) {
    const name = options?.binding ?? "DB";
    const db = env?.[name];
    if (!db) throw new TypeError(`env.${name} is not set: bind ${describeDb} as ${name}`);
    return db;
  }

  /**
   * The recipe's drop-in handler: runs `runMutation(bodyBytes, request)` at
   * most once per (principal, Idempotency-Key) and returns the Response to send.
   */
  async function handleIdempotentMutation(request, env, ctx, principal, runMutation, options = NO_OPTIONS) {
    const ledger = ledgerFor(dbFrom(env, options), options);
    const waitUntil = ctx && typeof ctx.waitUntil === "function" ? (p) => ctx.waitUntil(p) : (p) => p;
    const { response } = await ledger.handle(request, principal, runMutation, { waitUntil });
    return response;
  }

  /** The SPEC defaults as plain options (numbers in ms). */
  function defaultOptions() {
    const c = getCore().defaultConfig();
    return {
      protectedMethods: c.protectedMethods,
      fingerprintHeaders: c.fingerprintHeaders,
      replayHeaders: c.replayHeaders,
      pendingTtlMs: Number(c.pendingTtlMs),
      retentionMs: Number(c.retentionMs),
      bodyCapBytes: c.bodyCapBytes,
      sweepBatch: c.sweepBatch,
    };
  }

  /** The recipe's computeFingerprint: lowercase hex SHA-256 over the canonical prefix and the raw body bytes. */
  async function computeFingerprint(method, pathAndQuery, headers, bodyBytes, options = NO_OPTIONS) {
    const core = getCore();
    const config = core.config(options);
    const list = [];
    if (headers && typeof headers[Symbol.iterator] === "function") {
      for (const entry of headers) list.push(Array.isArray(entry) ? { name: entry[0], value: String(entry[1]) } : entry);
    } else if (headers) {
      for (const [name, value] of Object.entries(headers)) list.push({ name, value: String(value) });
    }
    const prefix = core.call((c) => c.protocol.fingerprintPrefix(config, { method, pathAndQuery, headers: list }));
    return sha256Hex(prefix, bodyBytes ?? new Uint8Array(0));
  }

  /** The fingerprint of a Fetch Request (reads a clone's body). */
  async function requestFingerprint(request, options = NO_OPTIONS) {
    const url = new URL(request.url);
    const body = await request.clone().arrayBuffer();
    return computeFingerprint(request.method, url.pathname + url.search, request.headers, body, options);
  }

  /**
   * Checks an Idempotency-Key value (SPEC 1): { ok: true, key } or
   * { ok: false, reason: "key-required" | "key-invalid", response }.
   */
  function validateIdempotencyKey(key) {
    const core = getCore();
    const config = { ...core.defaultConfig(), protectedMethods: ["POST"] };
    const headers = key === null || key === undefined ? [] : [{ name: "idempotency-key", value: String(key) }];
    const admission = core.call((c) => c.protocol.admit(config, { method: "POST", pathAndQuery: "/", headers }));
    if (admission.tag === "protected") return { ok: true, key: admission.val.key };
    return { ok: false, reason: admission.val.reason, response: toFetchResponse(admission.val.response) };
  }

  /** The migration: one SQL statement per item (CREATE ... IF NOT EXISTS). */
  function schemaStatements() {
    return getCore().schema();
  }

  return {
    ledgerFor,
    handleIdempotentMutation,
    defaultOptions,
    computeFingerprint,
    requestFingerprint,
    validateIdempotencyKey,
    schemaStatements,
  };
}
