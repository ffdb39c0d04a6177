// PostgreSQL on Node: the adapter (./pg.js) plus a pool made from a URL.
// Kept apart from ./pg.js so that Workers code never sees `import("pg")`.
export * from "./pg.js";

/**
 * A pg.Pool for `url` (`postgresql://...`), with idle-connection errors
 * logged instead of crashing the process. Imports `pg` (a peer dependency).
 */
export async function createPgPool(url, { max = 10, connectTimeoutMs = 5000, logger = console, ...rest } = {}) {
  const { default: pg } = await import("pg");
  const pool = new pg.Pool({ connectionString: url, max, connectionTimeoutMillis: connectTimeoutMs, ...rest });
  pool.on("error", (error) => logger.warn?.(`[idempotency] idle PostgreSQL connection failed: ${error.message}`));
  return pool;
}

