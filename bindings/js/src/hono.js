// Hono middleware (Workers and Node): `app.use(idempotency({...}))` or per
// route. Platform-neutral; ./hono-worker.js and ./hono-node.js bind it to
// their core loader.
import { IdempotencyLedger, readBodyCapped, requestHead, toFetchResponse } from "./ledger.js";
import { adapterOptions, principalValue } from "./middleware.js";

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
async function readRequestBody(request, cap) {
  const headers = request.headers;
  if (headers.has("content-length") && !headers.has("transfer-encoding")) {
    const bytes = new Uint8Array(await request.arrayBuffer());
    return BigInt(bytes.byteLength) > BigInt(cap) ? null : bytes;
  }
  return readBodyCapped(request.body, cap);
}

/**
 * The request again, around the bytes already read. On Node (the bindings of
 * @hono/node-server carry the IncomingMessage) it is built from its parts:
 * built from the original, it would first materialize that one with a body
 * stream of its own, twice the cost. Elsewhere (Workers: `cf`, ...) the
 * original's own properties carry over.
 */
function requestWithBody(c, request, buffer) {
  if (typeof c.env?.incoming?.httpVersion === "string") {
    return new Request(request.url, { method: request.method, headers: request.headers, body: buffer, signal: request.signal });
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
      const begun = await ledger.begin(requestHead(request), principal, (cap) => readRequestBody(request, cap));
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
      if (method !== "GET" && method !== "HEAD") c.req.raw = requestWithBody(c, request, buffer);
      c.req.bodyCache = { arrayBuffer: Promise.resolve(buffer) };
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
