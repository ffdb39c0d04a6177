// Hono middleware on Node (@hono/node-server): the component loaded from
// generated/, node:crypto's SHA-256, and the body read from the Node request
// (`c.env.incoming`) and handed to the app as `incoming.rawBody`, which
// @hono/node-server reads before the stream (c.req.json(), c.req.raw.body, ...).
import { makeApi } from "./api.js";
import { getCore, NODE_PLATFORM } from "./core-node.js";
import { makeHonoIdempotency } from "./hono.js";
import { readNodeBody } from "./node-http.js";
import { isBetterSqlite, sqliteLedger } from "./sqlite.js";

const api = makeApi(getCore, (db) => (isBetterSqlite(db) ? sqliteLedger(db) : null), "a better-sqlite3 Database, a pg.Pool, a D1 binding or a LedgerDb", NODE_PLATFORM);

/** @hono/node-server's IncomingMessage, when the body was not read yet (else null: the web stream is used). */
function incomingOf(c) {
  const incoming = c.env?.incoming;
  if (!incoming || typeof incoming.read !== "function" || typeof incoming.on !== "function") return null;
  if (incoming.rawBody !== undefined || incoming.readableDidRead || incoming.readableEnded) return null;
  return incoming;
}

async function read(incoming, cap) {
  const body = await readNodeBody(incoming, cap, { putBack: false });
  if (body !== null) incoming.rawBody = body;
  return body;
}

// @hono/node-server's lightweight Response keeps [status, body, headers] under
// a symbol described "cache" until something needs a real Response; reading
// it there saves building one (and its body stream) for every completion.
let cacheKey = null;
function resultOf(res) {
  if (!res || typeof res !== "object") return null;
  if (cacheKey === null) cacheKey = Object.getOwnPropertySymbols(res).find((s) => s.description === "cache") ?? null;
  const cache = cacheKey === null ? undefined : res[cacheKey];
  if (!Array.isArray(cache) || cache.length !== 3) return null;
  const [status, body, headers] = cache;
  if (!Number.isInteger(status) || !(body === null || typeof body === "string" || body instanceof Uint8Array)) return null;
  if (!headers || typeof headers !== "object") return null; // no headers: a web Response would add its default content-type
  return { status, headers, body };
}

/** `app.use(idempotency({ db, principal: (c) => ..., ...settings }))`. */
export const idempotency = makeHonoIdempotency(api, { incomingOf, read, resultOf });
export const { ledgerFor, migrate } = api;
export { NothingRanError } from "./ledger.js";
