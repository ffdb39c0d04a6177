// Hono middleware (Workers and Node): `app.post("/orders", idempotency({...}),
// handler)` per route, or `app.use(idempotency({...}))` with include/exclude.
// Platform-neutral; ./hono-worker.js and ./hono-node.js bind it to their
// core loader.
import { createMiddleware } from "hono/factory";
import { matchedRoutes } from "hono/route";
import { drainRequestBody, mutationOf, readFetchBody, requestHead, toFetchResponse } from "./fetch.js";
import { handlerContext, neverAborted, raisedResult } from "./ledger.js";
import { adapterOptions, nodeHead, principalValue } from "./middleware.js";
import { closeAfterAnswer, holdResponse, readNodeRawBody, sendCore } from "./node-http.js";

function waitUntilOf(c) {
  // Under @hono/node-server (its HttpBindings: c.env.incoming) there is no
  // ExecutionContext, and asking for it throws: an Error built per request.
  if (c.env?.incoming) return undefined;
  try {
    const ctx = c.executionCtx; // throws on Node (no ExecutionContext)
    if (ctx && typeof ctx.waitUntil === "function") return (p) => ctx.waitUntil(p);
  } catch {
    // Node: the sweep runs as a detached promise
  }
  return undefined;
}

/**
 * The IncomingMessage behind the request on Node (@hono/node-server binds it
 * as `c.env.incoming`, its documented HttpBindings), unless the app rebuilt
 * the request with another URL.
 */
function incomingOf(c, request) {
  const incoming = c.env?.incoming;
  // rawHeaders, not headers: the parsed headers object is built on first access.
  const usable = incoming && typeof incoming.url === "string" && Array.isArray(incoming.rawHeaders) && request.url.endsWith(incoming.url);
  return usable ? incoming : undefined;
}

/**
 * What `c.req.json()` / `.text()` / `.arrayBuffer()` read: the bytes the
 * middleware holds (Hono's public `bodyCache`), so they leave c.req.raw
 * unread; the text is decoded only when asked for (UTF-8 with replacement,
 * as Response.text()).
 */
function bodyCacheOf(bytes) {
  const buffer = bytes.byteOffset === 0 && bytes.byteLength === bytes.buffer.byteLength ? bytes.buffer : bytes.slice().buffer;
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
 * The ServerResponse @hono/node-server writes the app's answer to (its
 * HttpBindings: `c.env.outgoing`), when the body was read from its request
 * and nothing was written to it yet.
 */
function outgoingOf(c, incoming) {
  const outgoing = c.env?.outgoing;
  const usable = incoming && outgoing && typeof outgoing.writeHead === "function" && typeof outgoing.getHeaders === "function" && !outgoing.headersSent;
  return usable ? outgoing : undefined;
}

/** The WIT handler-result of a response held on a ServerResponse. */
const heldResult = (captured) => ({ tag: "answered", val: { status: captured.status, headers: captured.headers, body: { tag: "bytes", val: captured.body } } });

/** What the middleware's race sees once the handler's answer was left to @hono/node-server. */
const HANDED_OFF = Symbol("handed off");

/**
 * The body, never more than `cap` bytes held, and how the handler reads it
 * again: c.req's readers from Hono's body cache (set when the handler
 * runs); c.req.raw on Node from
 * `incoming.rawBody` (the body is read from the IncomingMessage, as the
 * Express and node:http adapters read it, and @hono/node-server serves every
 * reader of its Request from rawBody: the request is not rebuilt); elsewhere
 * (Workers) c.req.raw is rebuilt around the bytes read.
 */
function readBody(c, incoming, request, cap) {
  if (incoming) return readNodeRawBody(incoming, cap, { putBack: false });
  return readFetchBodyFor(c, request, cap);
}

async function readFetchBodyFor(c, request, cap) {
  const body = await readFetchBody(request, cap);
  if (typeof body !== "string" && request.method !== "GET" && request.method !== "HEAD") c.req.raw = new Request(request, { body });
  return body;
}

/**
 * The routes Hono matched for the request: through `hono/route`'s helper,
 * which reads a symbol of the Hono this package imports; for a request of
 * another copy of Hono (a CommonJS application loads Hono's CommonJS build,
 * this ES module its ES build) through the request's own `matchedRoutes`
 * (deprecated, kept by Hono 4); undefined when neither answers.
 */
function routesOf(c) {
  try {
    const routes = matchedRoutes(c);
    if (Array.isArray(routes)) return routes;
  } catch {
    // not a request of this package's Hono
  }
  try {
    const routes = c.req.matchedRoutes;
    if (Array.isArray(routes)) return routes;
  } catch {
    // neither
  }
  return undefined;
}

/**
 * Whether the route handler ran: Hono records the last handler it entered
 * (`c.req.routeIndex`). The route handler is the last of the matched
 * routes registered for a method (app.post/get/...; app.use entries are
 * ALL); a response made before it (a validator's 400, an auth middleware's
 * 401, a middleware that threw, or no route at all) means the framework
 * refused the request: declined. When that cannot be told, it ran.
 */
function handlerRan(c, ours) {
  const routes = routesOf(c);
  if (routes === undefined || typeof c.req.routeIndex !== "number") return true;
  let handler = -1;
  for (let i = routes.length - 1; i > ours; i--) {
    if (routes[i].method !== "ALL") {
      handler = i;
      break;
    }
  }
  if (handler === -1) return routes.length - 1 > ours; // nothing after this middleware: no route matched
  return c.req.routeIndex >= handler;
}

/**
 * The route template for the metrics (`http.route`): the path of the route
 * handler Hono matched (what `c.req.routePath` names once it runs: the last
 * matched route registered for a method after this middleware, or this
 * middleware's own route when it is mounted per route); undefined when no
 * route matched, or `options.route` when given.
 */
function honoRoute(c, ours, option) {
  if (option !== undefined) return typeof option === "function" ? option(c) : option;
  const routes = routesOf(c) ?? [];
  for (let i = routes.length - 1; i >= ours && i >= 0; i--) if (routes[i].method !== "ALL") return routes[i].path;
  return undefined;
}

/**
 * Sends what the exchange ended with once the handler's answer was held on
 * `outgoing`: the held answer, or the core's in its place (its answer to a
 * completion that failed or was fenced out, or to a rolled-back handler).
 */
function sendHeld(outgoing, held, action) {
  if (action.tag === "respond" && action.val.send.tag === "handler") {
    if (held.ended) held.send();
    return;
  }
  held.restore();
  if (outgoing.destroyed) return;
  if (action.tag === "respond") sendCore(outgoing, action.val.send.val, action.val.close);
  else if (action.tag === "propagate") sendCore(outgoing, action.val.response, false);
  else outgoing.destroy(new Error(`the exchange ended with ${action.tag} after its handler answered`));
}

/** The Hono variable a handler reads its context from: `c.get("idempotency")` -> { transaction, signal, ticket }. */
export const CONTEXT_VARIABLE = "idempotency";

/** The context of a request the ledger passed through (no transaction, no ticket, a signal never aborted). */
const passedThroughContext = () => handlerContext(undefined, neverAborted(), undefined);

/** Builds `idempotency(options)` over `api` (the entry's makeApi result). */
export function makeHonoIdempotency(api) {
  return function idempotency(options) {
    const { principalOf, dbOf, select } = adapterOptions(options, "idempotency");
    const transactional = options.transactional === true;
    return createMiddleware(async (c, next) => {
      const request = c.req.raw;
      if (!select(request.method, c.req.path)) return next();
      const ledger = api.ledgerFor(await dbOf(c), options);
      // Not protected (or no key where keys are optional): the handler runs as
      // it is; on a transactional route, in a transaction of its own.
      const passThrough = async () => {
        if (!transactional) {
          c.set(CONTEXT_VARIABLE, passedThroughContext());
          return next();
        }
        const own = await ledger.ownTransaction(true);
        c.set(CONTEXT_VARIABLE, own.context);
        try {
          await next();
        } catch (e) {
          await own.end(false);
          throw e;
        }
        if (!(await own.end(c.error === undefined))) {
          c.res = undefined;
          c.res = toFetchResponse(ledger.faultResponse());
        }
      };
      if (!ledger.session.protects(request.method)) return passThrough();
      const principal = principalValue(await principalOf(c));
      const incoming = incomingOf(c, request);
      const ours = c.req.routeIndex;
      // On Node the handler's Response is not read here: the middleware
      // returns it, @hono/node-server writes it as it writes any response
      // (a string or bytes straight to the socket) into `outgoing`, held
      // there, and the exchange completes with the bytes written before the
      // held answer (or the core's instead) goes out. Reading a Response's
      // body means building Fetch's own Response and stream around it,
      // which costs more than the rest of the exchange. Elsewhere (Workers,
      // app.request()) the Response is read and rebuilt.
      const outgoing = outgoingOf(c, incoming);
      let held = null;
      let handOff = null;
      const handedOff = outgoing === undefined ? null : new Promise((resolve) => (handOff = resolve));
      const holdAnswer = () =>
        new Promise((resolve) => {
          held = holdResponse(outgoing, ledger.session.responseHeaders, (captured) => resolve(heldResult(captured)));
          // A connection that closed before the answer was written: nothing
          // to store, and nobody to send it to.
          outgoing.once("close", () => {
            if (held.ended) return;
            held.restore();
            resolve(raisedResult(new Error("the connection closed before the response was written")));
          });
          handOff();
        });
      let produced = null;
      let thrown;
      const exchanged = ledger.exchange(
        incoming ? nodeHead(incoming) : requestHead(request),
        principal,
        {
          readBody: (cap) => readBody(c, incoming, request, cap),
          runHandler: async (ticket, body, context) => {
            // Hono's readers served from the bytes read; built here, not in
            // readBody, so a replay or a 409 never pays for it.
            if (body instanceof Uint8Array) c.req.bodyCache = bodyCacheOf(body);
            c.set(CONTEXT_VARIABLE, context);
            try {
              await next();
            } catch (e) {
              thrown = e; // no onError took it (Hono's compose normally does)
              return raisedResult(e);
            }
            if (!handlerRan(c, ours)) return { tag: "declined" };
            if (c.error !== undefined) return raisedResult(c.error);
            if (outgoing !== undefined) return holdAnswer();
            produced = await mutationOf(c.res, { rebuild: true });
            c.res = undefined; // replaced, not merged into
            c.res = produced.response;
            return { tag: "answered", val: produced.wit };
          },
        },
        { waitUntil: waitUntilOf(c), route: () => honoRoute(c, ours, options.route), transactional },
      );
      const settled = handedOff === null ? await exchanged : await Promise.race([exchanged, handedOff.then(() => HANDED_OFF)]);
      if (settled === HANDED_OFF) {
        // c.res (the handler's) is what @hono/node-server writes, into the
        // held `outgoing`; the exchange goes on from there.
        exchanged.then(
          ({ action }) => sendHeld(outgoing, held, action),
          (failure) => {
            held.restore();
            outgoing.destroy(failure);
          },
        );
        return undefined;
      }
      const { action, handlerRan: ran } = settled;
      if (action.tag === "pass-through") return passThrough();
      if (action.tag === "propagate" && ran) {
        // Hono's onError already made the framework's response (c.res); an
        // error it did not take is thrown on.
        if (thrown !== undefined) throw thrown;
        return undefined;
      }
      if (action.tag === "respond" && action.val.send.tag === "handler") {
        // c.res is the response as the handler (or the framework, for a
        // request it refused) made it: it goes out untouched.
        if (produced === null && thrown !== undefined) {
          if (thrown?.response === undefined) throw thrown;
          c.res = (await mutationOf(thrown.response)).response;
        }
        return undefined;
      }
      // The core's answer: a response it made, or its answer to a failure.
      const close = action.tag === "respond" && action.val.close;
      if (close && !incoming) await drainRequestBody(request);
      if (close && incoming) closeAfterAnswer(incoming);
      const response = toFetchResponse(action.tag === "respond" ? action.val.send.val : action.val.response, close && incoming !== undefined);
      if (c.finalized) {
        c.res = undefined;
        c.res = response;
        return undefined;
      }
      return response;
    });
  };
}
