// PostgreSQL on Node: the adapter (./pg.js) plus a pool made from a URL.
// Kept apart from ./pg.js so that Workers code never sees `import("pg")`.
export * from "./pg.js";

/**
 * A pg.Pool for `url` (`postgresql://...`), whose idle-connection errors
 * (pg-pool drops the connection) go to `logger.warn` instead of crashing the
 * process. Imports `pg` (a peer dependency).
 */
export async function createPgPool(url, { max = 10, connectTimeoutMs = 5000, logger = console, ...rest } = {}) {
  const { default: pg } = await import("pg");
  const pool = new pg.Pool({ connectionString: url, max, connectionTimeoutMillis: connectTimeoutMs, ...rest });
  pool.on("error", (error) => logger.warn?.(error));
  return pool;
}

