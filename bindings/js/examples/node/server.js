// An idempotent `POST /orders` on Node: Hono (@hono/node-server) with the
// package's Hono middleware, over SQLite (better-sqlite3) or PostgreSQL (pg).
//
//   make serve-node                      (top level; PORT, DATABASE_URL, IDEMPOTENCY_* from the environment)
//
// Contract: listens on 127.0.0.1:$PORT (default 8080); DATABASE_URL is a file
// path (SQLite; default a file under the system temp dir) or a postgresql://
// URL (the ledger's table is migrated at start). `Authorization: Bearer
// <token>`: the token is the principal; without it the app's own auth
// answers 401 before the idempotency layer. POST /orders (protected):
// ?delay_ms=N sleeps first, counts one execution, answers 201
// {"id","request"} with Location /orders/<id>. GET /orders/count: 200
// {"count"}. Logs go to stderr. SIGTERM / SIGINT: close and exit 0.
//
// Orders in the ledger's database (the exactly-once mode):
//   ORDERS_IN_DATABASE=1          each execution inserts a row into `orders` (created at
//                                 start) in DATABASE_URL's database; the count is its rows
//   IDEMPOTENCY_TRANSACTIONAL=1   the insert runs in the handler's transaction and commits
//                                 with the stored answer (the route is `transactional: true`)
//   X-Exit-After-Write: 1         the process exits with status 3 right after the insert,
//                                 before anything commits
//   IDEMPOTENCY_LEASE_RENEWAL=on|off  whether a running handler's owner renews its lease
//   IDEMPOTENCY_PREPARED_STATEMENTS=1 PostgreSQL on a direct connection only: the ledger's
//                                 statements prepared by name (pgLedger's preparedStatements)
import { randomUUID } from "node:crypto";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { serve } from "@hono/node-server";
import { Hono } from "hono";
import { idempotency, migrate, NothingChangedError, sweepsDone } from "@idempotency/ledger/hono";
import { createPgPool, pgLedger } from "@idempotency/ledger/pg";

const env = process.env;
const log = (message) => process.stderr.write(`${message}\n`);

function intFrom(name) {
  const raw = env[name];
  if (raw === undefined || raw === "") return undefined;
  if (!/^\d+$/.test(raw)) throw new Error(`${name} must be a non-negative integer, got ${JSON.stringify(raw)}`);
  return Number(raw);
}

function boolFrom(name) {
  const raw = env[name];
  if (raw === undefined || raw === "") return undefined;
  if (/^(1|true|yes|on)$/i.test(raw)) return true;
  if (/^(0|false|no|off)$/i.test(raw)) return false;
  throw new Error(`${name} must be true or false (1/0, on/off), got ${JSON.stringify(raw)}`);
}

/** The ledger settings the environment asks for; unset ones keep the core's defaults. */
function settingsFromEnv() {
  const settings = {};
  const ttl = intFrom("IDEMPOTENCY_PENDING_TTL_MS");
  if (ttl !== undefined) settings.pendingTtlMs = ttl;
  const cap = intFrom("IDEMPOTENCY_MAX_BODY_BYTES");
  if (cap !== undefined) settings.requestBodyCapBytes = cap;
  if (env.IDEMPOTENCY_PROFILE) settings.profile = env.IDEMPOTENCY_PROFILE;
  const required = boolFrom("IDEMPOTENCY_KEY_REQUIRED");
  if (required !== undefined) settings.keyRequired = required;
  if (env.IDEMPOTENCY_REPLAY_HEADER !== undefined) settings.replayHeader = env.IDEMPOTENCY_REPLAY_HEADER === "" ? null : env.IDEMPOTENCY_REPLAY_HEADER;
  const wait = intFrom("IDEMPOTENCY_WAIT_MS");
  if (wait !== undefined) settings.waitMs = wait;
  if (env.IDEMPOTENCY_ON_SERVER_ERROR) settings.onServerError = env.IDEMPOTENCY_ON_SERVER_ERROR;
  const renewal = boolFrom("IDEMPOTENCY_LEASE_RENEWAL");
  if (renewal !== undefined) settings.leaseRenewal = renewal;
  return settings;
}

const CREATE_ORDERS = "CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, principal TEXT NOT NULL, request TEXT NOT NULL, created_at BIGINT NOT NULL)";

/**
 * The ledger's database; with `orders`, also the `orders` table in it:
 * `insert(order, transaction)` (in the handler's transaction when given,
 * else committed on its own) and `count()` (committed rows only).
 */
async function openDatabase(url, orders, preparedStatements) {
  const postgres = /^postgres(ql)?:\/\//.test(url);
  if (preparedStatements && !postgres) throw new Error("IDEMPOTENCY_PREPARED_STATEMENTS=1 needs a postgresql:// DATABASE_URL");
  if (postgres) {
    const pool = await createPgPool(url, { max: 10, logger: { warn: log } });
    await migrate(pool);
    if (orders) await pool.query(CREATE_ORDERS);
    const sql = "INSERT INTO orders (id, principal, request, created_at) VALUES ($1, $2, $3, $4)";
    return {
      // A pg.Pool is recognised as it is; pgLedger for its options.
      db: preparedStatements ? pgLedger(pool, { preparedStatements }) : pool,
      describe: `PostgreSQL ${url.replace(/\/\/[^@/]*@/, "//***@")}`,
      // The handler's transaction: the client checked out for the request.
      insert: (o, tx) => (tx ? tx.client : pool).query(sql, [o.id, o.principal, o.request, o.createdAt]),
      count: async () => Number((await pool.query("SELECT COUNT(*) AS n FROM orders")).rows[0].n),
      close: () => pool.end(),
    };
  }
  const { default: Database } = await import("better-sqlite3");
  const db = new Database(url, { timeout: 5000 });
  db.pragma("journal_mode = WAL");
  db.pragma("synchronous = NORMAL");
  await migrate(db);
  let reader = null;
  if (orders) {
    db.exec(CREATE_ORDERS);
    // Another connection: it sees committed rows only, never the open transaction of a running handler.
    reader = new Database(url, { readonly: true, timeout: 5000 });
  }
  const sql = "INSERT INTO orders (id, principal, request, created_at) VALUES (?, ?, ?, ?)";
  return {
    db,
    describe: `SQLite ${url}`,
    // The handler's transaction is open on the ledger's Database itself (tx.db is `db`).
    insert: async (o, tx) => (tx ? tx.db : db).prepare(sql).run(o.id, o.principal, o.request, o.createdAt),
    count: async () => reader.prepare("SELECT COUNT(*) AS n FROM orders").get().n,
    close: () => {
      reader?.close();
      db.close();
    },
  };
}

// JSON nested deeper than this is refused (400 invalid_json) by the three
// example servers alike, whatever their parsers' own limits.
const MAX_JSON_DEPTH = 100;

function nestedTooDeep(text) {
  let depth = 0;
  let inString = false;
  let escaped = false;
  for (let i = 0; i < text.length; i++) {
    const ch = text.charCodeAt(i);
    if (inString) {
      if (escaped) escaped = false;
      else if (ch === 0x5c) escaped = true;
      else if (ch === 0x22) inString = false;
      continue;
    }
    if (ch === 0x22) inString = true;
    else if (ch === 0x5b || ch === 0x7b) {
      if (++depth > MAX_JSON_DEPTH) return true;
    } else if (ch === 0x5d || ch === 0x7d) depth = Math.max(depth - 1, 0);
  }
  return false;
}

async function main() {
  const port = intFrom("PORT") ?? 8080;
  const databaseUrl = env.DATABASE_URL || join(tmpdir(), "idempotency-ledger-serve-node.sqlite");
  const settings = settingsFromEnv();
  const ordersInDatabase = boolFrom("ORDERS_IN_DATABASE") === true;
  const transactional = boolFrom("IDEMPOTENCY_TRANSACTIONAL") === true;
  if (transactional && !ordersInDatabase) throw new Error("IDEMPOTENCY_TRANSACTIONAL=1 needs ORDERS_IN_DATABASE=1 (the orders must live in the ledger's database)");
  const { defaultOptions } = await import("@idempotency/ledger/node");
  // The 201 echoes the request JSON, so the stored response must hold a
  // request at the request cap (the environment's, else the core's default
  // 1 MiB): the response cap (body-cap-bytes) is max(16384, request cap +
  // 1024), never above the core's 16 MiB maximum. (Left at its 16 KiB
  // default, a valid 20 KB order ran and was answered, and replayed, as 500.)
  const requestCap = defaultOptions(settings).requestBodyCapBytes;
  settings.bodyCapBytes = Math.min(Math.max(16_384, requestCap + 1024), 16 * 1024 * 1024);
  const preparedStatements = boolFrom("IDEMPOTENCY_PREPARED_STATEMENTS") === true;
  const database = await openDatabase(databaseUrl, ordersInDatabase, preparedStatements);
  const logger = { error: log, warn: log, info: log };
  const options = { db: database.db, principal: (c) => c.get("principal"), logger, transactional, ...settings };
  const middleware = idempotency(options); // validates the settings once (the core refuses bad ones)

  let executions = 0;
  const app = new Hono();
  // The app's own authentication of POST /orders, before the idempotency
  // layer: the bearer token is the principal (the scheme is case-insensitive;
  // GET /orders/count is open).
  const authenticate = async (c, next) => {
    if (c.req.method !== "POST") return next();
    // The scheme in any case, blanks, one token without blanks (as the Rust and Python servers read it).
    const match = /^[ \t]*bearer[ \t]+([^ \t]+)[ \t]*$/i.exec(c.req.header("authorization") ?? "");
    if (!match) return c.json({ error: "unauthorized", message: "Send Authorization: Bearer <token>." }, 401, { "www-authenticate": "Bearer" });
    c.set("principal", match[1]);
    return next();
  };
  // A request the handler refuses before creating anything throws
  // NothingChangedError: the middleware releases the key (a corrected retry with
  // the same key runs) and app.onError answers the 400.
  const refused = (error, message) => new NothingChangedError(message, { cause: { error, message } });
  // One protected route: the app's auth first, then the idempotency layer, then the handler.
  app.post("/orders", authenticate, middleware, async (c) => {
    const delay = c.req.query("delay_ms") ?? "0";
    if (!/^[0-9]+$/.test(delay)) throw refused("invalid_delay_ms", "delay_ms must be a non-negative integer.");
    if (Number(delay) > 0) await new Promise((resolve) => setTimeout(resolve, Number(delay)));
    let request;
    try {
      const text = await c.req.text();
      if (nestedTooDeep(text)) throw new Error("nested too deep");
      request = JSON.parse(text);
    } catch {
      throw refused("invalid_json", "The body must be JSON.");
    }
    executions += 1;
    const id = `ord_${randomUUID()}`;
    if (ordersInDatabase) {
      const order = { id, principal: c.get("principal"), request: JSON.stringify(request), createdAt: Date.now() };
      // Transactional: the handler's transaction (`transaction.db` on SQLite, `transaction.client` on PostgreSQL).
      try {
        await database.insert(order, c.get("idempotency").transaction);
      } catch (error) {
        // The database refused or lost it: answered as the other servers do.
        return c.json({ error: "order_not_written", message: String(error?.message ?? error) }, 500);
      }
      if (c.req.header("x-exit-after-write") === "1") process.exit(3);
    }
    return c.json({ id, request }, 201, { location: `/orders/${id}` });
  });
  app.get("/orders/count", async (c) => c.json({ count: ordersInDatabase ? await database.count() : executions }));
  app.onError((error, c) => (error instanceof NothingChangedError ? c.json(error.cause, 400) : c.text("Internal Server Error", 500)));

  // Resolve what is in force (the core's defaults for what the environment left unset).
  const inForce = defaultOptions(settings);
  const server = serve({ fetch: app.fetch, hostname: "127.0.0.1", port }, (info) => {
    log(`serve-node: listening on http://127.0.0.1:${info.port}; database ${database.describe}; settings ${JSON.stringify({ ...inForce, ordersInDatabase, transactional, preparedStatements })}`);
  });

  let stopping = false;
  const stop = (signal) => {
    if (stopping) return;
    stopping = true;
    log(`serve-node: ${signal}: closing`);
    server.close(async () => {
      await sweepsDone(); // a background sweep still queued would meet a closed database
      await Promise.resolve(database.close()).catch(() => {});
      log("serve-node: stopped");
      process.exit(0);
    });
    server.closeAllConnections?.();
    setTimeout(() => process.exit(0), 5000).unref();
  };
  process.on("SIGTERM", () => stop("SIGTERM"));
  process.on("SIGINT", () => stop("SIGINT"));
}

main().catch((error) => {
  log(`serve-node: ${error?.stack ?? error}`);
  process.exit(1);
});
