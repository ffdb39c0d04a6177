// Real better-sqlite3 database files for the tests.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import Database from "better-sqlite3";
import { migrate } from "../../src/node.js";
import { sqliteLedger } from "../../src/sqlite.js";
import { COLUMNS, HANDLER_WRITE, HANDLER_WRITES, HANDLER_WRITES_SELECT } from "./vector-json.js";

export { COLUMNS };

const dirs = [];
process.on("exit", () => {
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});

/** A fresh migrated ledger in a new database file. */
export function freshDb() {
  const dir = mkdtempSync(join(tmpdir(), "idem-sqlite-"));
  dirs.push(dir);
  const db = new Database(join(dir, "ledger.sqlite"));
  db.pragma("journal_mode = WAL");
  migrate(db);
  return db;
}

/**
 * A vector runner's database (conformance/README.md): a fresh file with the
 * ledger's table holding `rows` and the empty `handler_writes`; the
 * runner's batches and handler transactions go through the package's
 * better-sqlite3 ledger on one connection, the `rows` replacements through
 * another (committed).
 */
export function vectorDb(rows = []) {
  const file = freshDb();
  file.exec(HANDLER_WRITES);
  insertRows(file, rows);
  const other = new Database(file.name, { timeout: 1000 });
  const ledger = sqliteLedger(file);
  const replaceRowsSync = (r) => {
    other.transaction(() => {
      other.prepare("DELETE FROM idempotency_keys").run();
      insertRows(other, r);
    })();
  };
  const write = file.prepare(HANDLER_WRITE.sqlite);
  return {
    file,
    batch: ledger.batch,
    batchSync: ledger.batchSync,
    begin: ledger.begin,
    renewalBatch: ledger.renewalBatch,
    replaceRowsSync,
    replaceRows: async (r) => replaceRowsSync(r),
    /** One handler write, through the transaction's handle (the Database, inside the transaction). */
    write: async (handle, w) => {
      if (handle.db !== file || !file.inTransaction) throw new Error("a handler write outside the handler's transaction");
      write.run(w.principal, w.key, BigInt(w.generation));
    },
    rows: () => rows_(file),
    writes: () => file.prepare(HANDLER_WRITES_SELECT).all().map((r) => ({ principal: r.principal, key: r.key, generation: Number(r.generation) })),
    close() {
      other.close();
      file.close();
    },
  };
}

function toSql(value) {
  if (value === null) return null;
  if (typeof value === "string") return value;
  if (typeof value === "number" && Number.isInteger(value)) return BigInt(value);
  if (typeof value === "number") return value;
  throw new Error(`a row value must be a string, number or null, got ${JSON.stringify(value)}`);
}

/** Inserts rows given as JSON objects verbatim (string = TEXT, integer = INTEGER, null = NULL), wrong types included. */
export function insertRows(db, rows) {
  const insert = db.prepare(`INSERT INTO idempotency_keys (${COLUMNS.join(", ")}) VALUES (${COLUMNS.map(() => "?").join(", ")})`);
  for (const row of rows) {
    for (const key of Object.keys(row)) if (!COLUMNS.includes(key)) throw new Error(`unknown row column ${key}`);
    insert.run(...COLUMNS.map((c) => toSql(row[c])));
  }
}

const rows_ = (db) => rows(db);

/** The whole table as JSON objects ordered by principal, key. */
export function rows(db) {
  const statement = db.prepare(`SELECT ${COLUMNS.join(", ")} FROM idempotency_keys ORDER BY principal, key`);
  statement.safeIntegers(true);
  return statement.all().map((row) => {
    const out = {};
    for (const c of COLUMNS) {
      const v = row[c];
      out[c] = typeof v === "bigint" ? Number(v) : v instanceof Uint8Array ? { blob: v.length } : v;
    }
    return out;
  });
}
