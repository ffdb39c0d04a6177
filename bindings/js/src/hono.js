// Hono middleware (Workers and Node): `app.use(idempotency({...}))` or per
// route. Platform-neutral; ./hono-worker.js and ./hono-node.js bind it to
// their core loader.
import { IdempotencyLedger, readBodyCapped, requestHead, toFetchResponse } from "./ledger.js";
import { adapterOptions, nodeHead, principalValue } from "./middleware.js";

function waitUntilOf(c) {
  try {
    const ctx = c.executionCtx; // throws on Node (no ExecutionContext)
    if (ctx && typeof ctx.waitUntil === "function") return (p) => ctx.waitUntil(p);
  } catch {
    // Node: the sweep runs as a detached promise
  }
  return undefined;
}

/**
 * The request body, never more than `cap` bytes held. A body with a declared
 * Content-Length (the core already refused one over the cap, and the runtime
 * delivers no more than it declares) is read in one go with the Fetch API's
 * `arrayBuffer()`, which @hono/node-server serves straight from the socket
 * without building a web Request and stream; a chunked one is streamed and
 * dropped as soon as it passes the cap.
 */
async function readRequestBody(incoming, request, cap) {
  const declared = incoming // on Node: no Fetch Headers built to look
    ? incoming.headers["content-length"] !== undefined && incoming.headers["transfer-encoding"] === undefined
    : request.headers.has("content-length") && !request.headers.has("transfer-encoding");
  if (declared) {
    const bytes = new Uint8Array(await request.arrayBuffer());
    return BigInt(bytes.byteLength) > BigInt(cap) ? null : bytes;
  }
  return readBodyCapped(request.body, cap);
}

/**
 * The head the protocol reads. On Node the IncomingMessage @hono/node-server
 * binds (`c.env.incoming`, its documented HttpBindings) gives it as received,
 * as the Express and node:http adapters read it: raw path, headers in arrival
 * order with duplicates kept apart, and no Fetch Headers built for a replay.
 * A request the app rebuilt with another URL is read as a Fetch Request.
 */
function headOf(incoming, request) {
  return incoming ? nodeHead(incoming) : requestHead(request);
}

/** The IncomingMessage behind `request` on Node, unless the app rebuilt the request with another URL. */
function incomingOf(c, request) {
  const incoming = c.env?.incoming;
  const usable = incoming && typeof incoming.url === "string" && Array.isArray(incoming.rawHeaders) && incoming.headers && request.url.endsWith(incoming.url);
  return usable ? incoming : undefined;
}

/**
 * What `c.req.json()` / `.text()` / `.arrayBuffer()` read: the bytes the
 * middleware holds (Hono's public `bodyCache`); the text is decoded only when
 * asked for (UTF-8 with replacement, as Response.text()).
 */
function bodyCacheOf(buffer) {
  const cache = { arrayBuffer: Promise.resolve(buffer) };
  let text;
  Object.defineProperty(cache, "text", {
    configurable: true,
    enumerable: false,
    get: () => (text ??= Promise.resolve(new TextDecoder().decode(buffer))),
    set: (value) => Object.defineProperty(cache, "text", { value, writable: true, configurable: true, enumerable: true }),
  });
  return cache;
}

/**
 * The request again, around the bytes already read (the handler reads it:
 * Hono's own body readers look at c.req.raw too). On Node it is built from
 * the head read off the IncomingMessage: built from the original, it would first
 * turn @hono/node-server's lazy headers into a Fetch Headers (that alone cost
 * more than the rest of the middleware's own work). Elsewhere (Workers:
 * `cf`, ...) the original's own properties carry over.
 */
function requestWithBody(incoming, head, request, buffer) {
  if (incoming) {
    const headers = head.headers.map(({ name, value }) => [name, value]);
    return new Request(request.url, { method: request.method, headers, body: buffer, signal: request.signal });
  }
  return new Request(request, { body: buffer });
}

function bufferOf(bytes) {
  if (bytes.byteOffset === 0 && bytes.byteLength === bytes.buffer.byteLength) return bytes.buffer;
  return bytes.slice().buffer;
}

/** Builds `idempotency(options)` over `api` (the entry's makeApi result). */
export function makeHonoIdempotency(api) {
  return function idempotency(options) {
    const { principalOf, dbOf, select } = adapterOptions(options, "idempotency");
    return async function idempotencyMiddleware(c, next) {
      const request = c.req.raw;
      const method = request.method;
      if (!select(method, c.req.path)) return next();
      const ledger = api.ledgerFor(await dbOf(c), options);
      if (!ledger.session.protects(method)) return next();
      const principal = principalValue(await principalOf(c));
      const incoming = incomingOf(c, request);
      const head = headOf(incoming, request);
      const begun = await ledger.begin(head, principal, (cap) => readRequestBody(incoming, request, cap));
      if (begun.kind === "pass-through") return next();
      if (begun.kind === "answer") {
        const response = toFetchResponse(begun.answer);
        if (begun.reason === "body-too-large") response.headers.set("connection", "close");
        return response;
      }
      const { ticket, body } = begun;
      // The handler reads the same bytes (c.req.json(), c.req.raw.body, ...):
      // the request is rebuilt around them.
      const buffer = bufferOf(body);
      if (method !== "GET" && method !== "HEAD") c.req.raw = requestWithBody(incoming, head, request, buffer);
      c.req.bodyCache = bodyCacheOf(buffer);
      let thrown;
      try {
        await next();
      } catch (error) {
        thrown = error;
      }
      const raised = thrown ?? c.error;
      if (raised !== undefined) {
        // The mutation raised: the core says whether its reservation is released.
        await ledger.abandon(ticket, IdempotencyLedger.reasonOf(raised), raised?.message ?? String(raised));
        if (thrown !== undefined) throw thrown;
        return;
      }
      const done = await ledger.finish(ticket, c.res);
      if (done.sweepDue && options.sweep !== false) ledger.scheduleSweep(waitUntilOf(c));
      c.res = undefined; // no header merge: the caller gets exactly the core's response
      c.res = toFetchResponse(done.answer);
    };
  };
}
