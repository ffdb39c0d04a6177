// The ledger on Cloudflare D1: each step's statements go out as ONE
// `db.batch()` (D1 runs a batch as a single transaction). Failures are
// reported as D1 gave them (a message, no code); the core classifies them.
import { BatchFailure, databaseError } from "./runtime.js";

const MAX_SAFE = BigInt(Number.MAX_SAFE_INTEGER);

/** A WIT `value` as a D1 bind parameter. */
export function toD1Value(value) {
  switch (value.tag) {
    case "null":
      return null;
    case "integer":
      if (value.val > MAX_SAFE || value.val < -MAX_SAFE) {
        throw new BatchFailure({ tag: "host", val: `integer ${value.val} does not fit a D1 number exactly` });
      }
      return Number(value.val);
    case "real":
      return value.val;
    case "text":
      return value.val;
    case "blob":
      return value.val;
    default:
      throw new BatchFailure({ tag: "host", val: `unknown value tag ${value.tag}` });
  }
}

/** A value D1 returned as a WIT `value` (integral numbers become integers). */
export function fromD1Value(value) {
  if (value === null || value === undefined) return { tag: "null" };
  if (typeof value === "number") {
    return Number.isSafeInteger(value) ? { tag: "integer", val: BigInt(value) } : { tag: "real", val: value };
  }
  if (typeof value === "bigint") return { tag: "integer", val: value };
  if (typeof value === "string") return { tag: "text", val: value };
  if (typeof value === "boolean") return { tag: "integer", val: value ? 1n : 0n };
  if (value instanceof ArrayBuffer) return { tag: "blob", val: new Uint8Array(value) };
  if (ArrayBuffer.isView(value)) return { tag: "blob", val: new Uint8Array(value.buffer, value.byteOffset, value.byteLength) };
  if (Array.isArray(value)) return { tag: "blob", val: Uint8Array.from(value) };
  throw new BatchFailure({ tag: "host", val: `D1 returned a value of unexpected type ${typeof value}` });
}

/** Converts D1 batch results to WIT `statement-result`s: rows as positional arrays (SQL column order), changes from meta. */
export function fromD1Results(results, expected) {
  if (!Array.isArray(results) || results.length !== expected) {
    throw new BatchFailure({
      tag: "host",
      val: `D1 batch returned ${Array.isArray(results) ? results.length : typeof results} results for ${expected} statements`,
    });
  }
  return results.map((result) => ({
    rows: (result?.results ?? []).map((row) => (Array.isArray(row) ? row : Object.values(row)).map(fromD1Value)),
    changes: BigInt(Math.max(0, Math.trunc(Number(result?.meta?.changes ?? 0)))),
  }));
}

/** The ledger over a D1 binding (`env.DB`). */
export function d1Ledger(db) {
  if (!db || typeof db.prepare !== "function" || typeof db.batch !== "function") {
    throw new TypeError("d1Ledger needs a D1Database binding (env.DB)");
  }
  const prepareAll = (statements) => {
    try {
      return statements.map((s) => db.prepare(s.sql).bind(...s.params.map(toD1Value)));
    } catch (error) {
      if (error instanceof BatchFailure) throw error;
      throw new BatchFailure(databaseError(undefined, error?.message ?? error), { cause: error });
    }
  };
  const run = async (prepared) => {
    try {
      return await db.batch(prepared);
    } catch (error) {
      // D1 gives a message only ("D1_ERROR: ... SQLITE_BUSY", "Network connection lost").
      throw new BatchFailure(databaseError(undefined, error?.message ?? error), { cause: error });
    }
  };
  return {
    dialect: "sqlite",
    async batch(statements) {
      const prepared = prepareAll(statements);
      return fromD1Results(await run(prepared), statements.length);
    },
    /**
     * A transactional handler's "transaction" on D1, which has no
     * interactive transactions (docs/SPEC.md 10.2): nothing opens; the
     * handler gets `handle`, `{ dialect, prepare(sql), add(...statements) }`,
     * and registers its writes (D1 prepared statements, bound) with `add`;
     * they run after the core's fenced completion in ONE `db.batch()`
     * `[complete, fence, ...the handler's statements]`, so a completion that
     * matched no row aborts the batch before any of them commits. Their
     * results are not returned (generate ids in the handler).
     */
    async begin() {
      const kept = [];
      let open = true;
      const handle = Object.freeze({
        dialect: "sqlite",
        /** `db.prepare(sql)` on the ledger's D1 database (bind it, then `add` it). */
        prepare: (sql) => db.prepare(sql),
        /** Registers statements to commit with the completion, in order. */
        add(...statements) {
          if (!open) throw new Error("the handler's D1 batch has already run (or was dropped): add statements before the handler answers");
          for (const s of statements) {
            if (!s || typeof s !== "object" || typeof s.bind !== "function") throw new TypeError("add(...statements): D1 prepared statements (db.prepare(sql).bind(...))");
          }
          kept.push(...statements);
        },
      });
      return {
        handle,
        /** The completion followed by the handler's statements, as one batch: the completion's results only. */
        async execute(statements) {
          if (!open) throw new BatchFailure({ tag: "host", val: "the handler's D1 batch has already run" });
          open = false;
          const prepared = prepareAll(statements);
          const results = await run([...prepared, ...kept]);
          if (!Array.isArray(results) || results.length !== prepared.length + kept.length) {
            throw new BatchFailure({ tag: "outcome-unknown", val: `D1 batch returned ${Array.isArray(results) ? results.length : typeof results} results for ${prepared.length + kept.length} statements` });
          }
          return fromD1Results(results.slice(0, statements.length), statements.length);
        },
        /**
         * The completion's batch already committed; a transaction that ran no
         * completion (a request the ledger passed through) commits the
         * handler's statements now, as one batch.
         */
        async commit() {
          if (!open) return;
          open = false;
          if (kept.length > 0) fromD1Results(await run(kept), kept.length);
        },
        /** The batch aborted, or never ran: nothing to undo. */
        async rollback() {
          open = false;
          kept.length = 0;
        },
      };
    },
  };
}
