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
  return {
    dialect: "sqlite",
    async batch(statements) {
      let prepared;
      try {
        prepared = statements.map((s) => db.prepare(s.sql).bind(...s.params.map(toD1Value)));
      } catch (error) {
        if (error instanceof BatchFailure) throw error;
        throw new BatchFailure(databaseError(undefined, error?.message ?? error), { cause: error });
      }
      let results;
      try {
        results = await db.batch(prepared);
      } catch (error) {
        // D1 gives a message only ("D1_ERROR: ... SQLITE_BUSY", "Network connection lost").
        throw new BatchFailure(databaseError(undefined, error?.message ?? error), { cause: error });
      }
      return fromD1Results(results, statements.length);
    },
  };
}
