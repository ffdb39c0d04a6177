// A throwaway PostgreSQL (scripts/postgres.sh run -- ... sets IDEMPOTENCY_PG_URL):
// pools on fresh schemas, row helpers for the vectors.
import pg from "pg";
import { sweepsDone } from "../../src/ledger.js";
import { COLUMNS } from "./vector-json.js";

export const PG_URL = process.env.IDEMPOTENCY_PG_URL ?? "";
export const SKIP_PG = PG_URL ? false : "IDEMPOTENCY_PG_URL is not set (make -C bindings/js test-postgres runs these)";

let schemas = 0;
const created = [];

/** `url` with `-c search_path=schema` for every connection. */
export function urlWithSchema(url, schema) {
  const sep = url.includes("?") ? "&" : "?";
  return `${url}${sep}options=${encodeURIComponent(`-c search_path=${schema}`)}`;
}

/** A fresh schema; returns { schema, url, pool (max connections), admin } and drops it at `dispose()`. */
export async function freshSchema({ max = 4, ...rest } = {}) {
  const schema = `js_${process.pid}_${++schemas}_${Math.random().toString(36).slice(2, 8)}`;
  const admin = new pg.Client({ connectionString: PG_URL });
  await admin.connect();
  await admin.query(`CREATE SCHEMA "${schema}"`);
  const url = urlWithSchema(PG_URL, schema);
  const pool = new pg.Pool({ connectionString: url, max, connectionTimeoutMillis: 10_000, ...rest });
  pool.on("error", () => {});
  const handle = {
    schema,
    url,
    pool,
    admin,
    async dispose() {
      await sweepsDone(); // the shutdown order users are told to follow
      await pool.end().catch(() => {});
      await admin.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`).catch(() => {});
      await admin.end().catch(() => {});
    },
  };
  created.push(handle);
  return handle;
}

/** Inserts vector rows verbatim (strings as text, integers as integers); throws when PostgreSQL's types refuse them. */
export async function insertPgRows(client, rows) {
  for (const row of rows) {
    for (const key of Object.keys(row)) if (!COLUMNS.includes(key)) throw new Error(`unknown row column ${key}`);
    const values = COLUMNS.map((c) => (row[c] === null ? null : typeof row[c] === "number" ? String(row[c]) : row[c]));
    await client.query(`INSERT INTO idempotency_keys (${COLUMNS.join(", ")}) VALUES (${COLUMNS.map((_, i) => `$${i + 1}`).join(", ")})`, values);
  }
}

/** The whole table as JSON objects ordered by principal, key (BIGINT as numbers). */
export async function pgRows(client) {
  const { rows } = await client.query({ text: `SELECT ${COLUMNS.join(", ")} FROM idempotency_keys ORDER BY principal COLLATE "C", key COLLATE "C"`, rowMode: "array" });
  return rows.map((r) => {
    const out = {};
    COLUMNS.forEach((c, i) => {
      const v = r[i];
      out[c] = typeof v === "string" && ["generation", "response_status", "created_at", "updated_at"].includes(c) ? Number(v) : v;
    });
    return out;
  });
}
