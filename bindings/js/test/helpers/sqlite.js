// Real better-sqlite3 database files for the tests.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import Database from "better-sqlite3";
import { migrate } from "../../src/node.js";

import { COLUMNS } from "./vector-json.js";

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
