// The ledger on better-sqlite3 (Node): each step's statements run in ONE
// `BEGIN IMMEDIATE` transaction on the calling thread. Failures are reported
// as the driver gave them (SQLite's code and message); the core classifies.
import { BatchFailure, databaseError } from "./runtime.js";

function toSqliteValue(value) {
  switch (value.tag) {
    case "null":
      return null;
    case "integer":
      return value.val; // BigInt: better-sqlite3 binds it as INTEGER
    case "real":
      return value.val;
    case "text":
      return value.val;
    case "blob":
      return Buffer.from(value.val.buffer, value.val.byteOffset, value.val.byteLength);
    default:
      throw new BatchFailure({ tag: "host", val: `unknown value tag ${value.tag}` });
  }
}

function fromSqliteValue(value) {
  if (value === null || value === undefined) return { tag: "null" };
  if (typeof value === "bigint") return { tag: "integer", val: value };
  if (typeof value === "number") return Number.isInteger(value) ? { tag: "integer", val: BigInt(value) } : { tag: "real", val: value };
  if (typeof value === "string") return { tag: "text", val: value };
  if (value instanceof Uint8Array) return { tag: "blob", val: new Uint8Array(value) };
  throw new BatchFailure({ tag: "host", val: `SQLite returned a value of unexpected type ${typeof value}` });
}

/** A better-sqlite3 error as the driver gave it; anything else is the host's own failure. */
export function sqliteBatchError(error) {
  if (error instanceof BatchFailure) return error;
  const code = typeof error?.code === "string" && error.code.startsWith("SQLITE_") ? error.code : undefined;
  if (code || error?.name === "SqliteError") return new BatchFailure(databaseError(code, error.message), { cause: error });
  return new BatchFailure({ tag: "host", val: String(error?.message ?? error) }, { cause: error });
}

/** True for a better-sqlite3 Database (duck-typed). */
export function isBetterSqlite(db) {
  return !!db && typeof db.prepare === "function" && typeof db.transaction === "function" && typeof db.pragma === "function";
}

/** The ledger over a better-sqlite3 Database. */
export function sqliteLedger(db) {
  if (!isBetterSqlite(db)) throw new TypeError("sqliteLedger needs a better-sqlite3 Database");
  const cache = new Map();
  const prepare = (sql) => {
    let statement = cache.get(sql);
    if (!statement) {
      statement = db.prepare(sql);
      statement.safeIntegers(true);
      if (statement.reader) statement.raw(true);
      cache.set(sql, statement);
    }
    return statement;
  };
  const run = db.transaction((statements) =>
    statements.map((s) => {
      const statement = prepare(s.sql);
      const params = s.params.map(toSqliteValue);
      if (statement.reader) {
        const rows = statement.all(...params).map((row) => row.map(fromSqliteValue));
        // A RETURNING statement changed exactly the rows it returned.
        const changes = /^\s*select\b/i.test(s.sql) ? 0n : BigInt(rows.length);
        return { rows, changes };
      }
      const info = statement.run(...params);
      return { rows: [], changes: BigInt(info.changes) };
    }),
  );
  const batchSync = (statements) => {
    try {
      return run.immediate(statements);
    } catch (error) {
      throw sqliteBatchError(error);
    }
  };
  return {
    db,
    dialect: "sqlite",
    async batch(statements) {
      return batchSync(statements);
    },
    /** The same, synchronously (the driven API's ledger import). */
    batchSync,
  };
}
