// The public surface shared by the entry points; each entry supplies how to
// load the component and which databases it can wrap.
import { IdempotencyLedger, NothingChangedError, sessionFor, sha256Hex } from "./ledger.js";
import { d1Ledger } from "./d1.js";
import { makeIdempotentFunction, makeIdempotentQueueConsumer } from "./function.js";
import { isPgPool, pgLedger } from "./pg.js";
import { SETTING_NAMES } from "./runtime.js";

const NO_OPTIONS = Object.freeze({});

/** True for something that is already a LedgerDb ({ dialect, batch }). */
export function isLedgerDb(db) {
  return !!db && typeof db.batch === "function" && (db.dialect === "sqlite" || db.dialect === "postgres");
}

/** True for a D1Database binding (duck-typed: prepare + batch, no better-sqlite3 transaction). */
export function isD1(db) {
  return !!db && typeof db.prepare === "function" && typeof db.batch === "function" && typeof db.transaction !== "function";
}

/**
 * `wrapOther(db)` wraps the databases only one platform has (better-sqlite3
 * on Node); LedgerDbs, D1 bindings and pg pools are recognised everywhere.
 * `digest(prefix, body)` is the platform's SHA-256 (hex; Web Crypto unless given).
 */
export function makeApi(getCore, wrapOther = () => null, describeDb = "a LedgerDb, a D1 binding or a pg.Pool", { digest = sha256Hex } = {}) {
  const wrapped = new WeakMap(); // db -> LedgerDb
  const ledgers = new WeakMap(); // LedgerDb -> WeakMap(options -> IdempotencyLedger)

  function toLedgerDb(db) {
    if (!db || (typeof db !== "object" && typeof db !== "function")) throw new TypeError(`expected ${describeDb}, got ${db}`);
    if (isLedgerDb(db)) return db;
    let w = wrapped.get(db);
    if (!w) {
      w = wrapOther(db) ?? (isPgPool(db) ? pgLedger(db) : isD1(db) ? d1Ledger(db) : null);
      if (!w) throw new TypeError(`expected ${describeDb}`);
      wrapped.set(db, w);
    }
    return w;
  }

  /** The IdempotencyLedger for a database and an options object (cached per pair; one core session per options object). */
  function ledgerFor(db, options = NO_OPTIONS) {
    const ledgerDb = toLedgerDb(db);
    let byOptions = ledgers.get(ledgerDb);
    if (!byOptions) ledgers.set(ledgerDb, (byOptions = new WeakMap()));
    const key = options ?? NO_OPTIONS;
    let ledger = byOptions.get(key);
    if (!ledger) byOptions.set(key, (ledger = new IdempotencyLedger(getCore(), ledgerDb, key, { digest })));
    return ledger;
  }

  function dbFrom(env, options) {
    const name = options?.binding ?? "DB";
    const db = env?.[name];
    if (!db) throw new TypeError(`env.${name} is not set: bind ${describeDb} as ${name}`);
    return db;
  }

  /**
   * The recipe's drop-in handler: runs `runMutation(bodyBytes, request,
   * context)` at most once per (principal, Idempotency-Key) and returns the
   * Response to send (the core's, or the mutation's own). `principal`
   * undefined (or "") is answered by the core (401). `options.onOutcome(outcome)`
   * hears how each request ended. `context`: { transaction, signal, ticket }
   * (with `options.transactional`, the transaction whose writes commit with
   * the stored answer; `signal` aborts when a renewal finds the lease lost).
   */
  async function handleIdempotentMutation(request, env, ctx, principal, runMutation, options = NO_OPTIONS) {
    const ledger = ledgerFor(dbFrom(env, options), options);
    const waitUntil = ctx && typeof ctx.waitUntil === "function" ? (p) => ctx.waitUntil(p) : undefined;
    const { response } = await ledger.handle(request, principal ?? undefined, runMutation, { waitUntil, route: options?.route, transactional: options?.transactional === true });
    return response;
  }

  /** The settings in force for `options` (profile defaults + overrides), as plain options (numbers in ms). */
  function defaultOptions(options = NO_OPTIONS) {
    const c = sessionFor(getCore(), options, "sqlite").config;
    return {
      profile: c.profile,
      protectedMethods: c.protectedMethods,
      fingerprintHeaders: c.fingerprintHeaders,
      replayHeaders: c.replayHeaders,
      pendingTtlMs: Number(c.pendingTtlMs),
      retentionMs: Number(c.retentionMs),
      bodyCapBytes: c.bodyCapBytes,
      requestBodyCapBytes: Number(c.requestBodyCapBytes),
      sweepBatch: c.sweepBatch,
      sweepEvery: c.sweepEvery,
      keyRequired: c.keyRequired,
      replayHeader: c.replayHeader ?? null,
      inProgressRetryMs: c.inProgressRetryMs === undefined ? null : Number(c.inProgressRetryMs),
      waitMs: Number(c.waitMs),
      onServerError: c.onServerError,
      leaseRenewal: c.leaseRenewal,
    };
  }

  /** The migration: one SQL statement per item (CREATE ... IF NOT EXISTS) for a dialect. */
  function schemaStatements(dialect = "sqlite") {
    return getCore().schema(dialect);
  }

  /** Creates the ledger table and index in any supported database (idempotent; one batch). */
  async function migrate(db) {
    await ledgerFor(db).migrate();
  }

  return {
    toLedgerDb,
    ledgerFor,
    handleIdempotentMutation,
    defaultOptions,
    schemaStatements,
    migrate,
    idempotentFunction: makeIdempotentFunction({ ledgerFor }),
    idempotentQueueConsumer: makeIdempotentQueueConsumer({ ledgerFor }),
  };
}

export { NothingChangedError, SETTING_NAMES };
