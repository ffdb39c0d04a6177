// node:http pieces shared by the Express middleware and the plain node:http
// adapter: the request head as received, the body read up to the core's cap
// (and handed back to the stream for the application), the response the
// handler writes held until the core has completed it, then sent as the
// application made it (or the core's response instead).
import { handlerContext, neverAborted, NothingChangedError, raisedResult } from "./ledger.js";
import { adapterOptions, nodeHead, principalValue } from "./middleware.js";

/** The path without the query (for route selection). */
export function nodePath(req) {
  const url = req.originalUrl ?? req.url ?? "/";
  const q = url.indexOf("?");
  return q === -1 ? url : url.slice(0, q);
}

/**
 * Reads the request body, never holding more than `cap` bytes: resolves with
 * a Buffer, "too-large" as soon as the body passes the cap (the rest is left
 * unread: the answer closes the connection), "consumed" when something read
 * the stream before (a body parser mounted first) or "incomplete" when the
 * client's stream broke. Unless `putBack` is false, the bytes read are put
 * back into the stream (`unshift`), so the application's body parser
 * (express.json(), ...) reads the same body afterwards.
 */
export function readNodeBody(req, cap, options) {
  return Promise.resolve(readNodeBodyNow(req, cap, options));
}

/**
 * Whether every byte of the body is buffered on `req`: the request is
 * complete, or its Content-Length (no Transfer-Encoding) says as many bytes
 * as are buffered (Node's parser pushes a body that came with the head
 * before a middleware's first await resumes, and marks the request complete
 * only on a later callback).
 */
function bodyBuffered(req) {
  if (req.readableFlowing === true) return false;
  if (req.complete) return true;
  const length = req.headers["content-length"];
  return typeof length === "string" && req.headers["transfer-encoding"] === undefined && /^\d+$/.test(length) && req.readableLength === Number(length);
}

/**
 * readNodeBody, answered at once when the whole body is already buffered
 * (the usual case for a small body): the value itself then (no listener,
 * no turn of the event loop); else the promise.
 */
export function readNodeBodyNow(req, cap, { putBack = true } = {}) {
  if (req.readableDidRead || req.readableEnded) return "consumed";
  const limit = Number(cap);
  if (bodyBuffered(req)) {
    if (req.readableLength > limit) {
      req.pause();
      return "too-large";
    }
    const chunks = [];
    let total = 0;
    let chunk;
    while ((chunk = req.read()) !== null) {
      if (typeof chunk === "string") chunk = Buffer.from(chunk);
      total += chunk.length;
      chunks.push(chunk);
    }
    const body = chunks.length === 1 ? chunks[0] : Buffer.concat(chunks, total);
    // A stream decoded to text (setEncoding) counts characters, not bytes.
    if (total > limit) return "too-large";
    if (putBack && body.length > 0) req.unshift(body);
    return body;
  }
  return new Promise((resolve) => {
    const chunks = [];
    let total = 0;
    let finished = false;
    const cleanup = () => {
      finished = true;
      req.removeListener("readable", onReadable);
      req.removeListener("error", onBroken);
      req.removeListener("end", onEnd);
      req.removeListener("aborted", onBroken);
      req.removeListener("close", onClose);
    };
    const done = () => {
      cleanup();
      const body = chunks.length === 1 ? chunks[0] : Buffer.concat(chunks, total);
      if (putBack && body.length > 0) req.unshift(body);
      resolve(body);
    };
    function onReadable() {
      if (finished) return;
      let chunk;
      while ((chunk = req.read()) !== null) {
        if (typeof chunk === "string") chunk = Buffer.from(chunk);
        total += chunk.length;
        if (total > limit) {
          cleanup();
          chunks.length = 0;
          req.pause();
          resolve("too-large");
          return;
        }
        chunks.push(chunk);
      }
      if (req.complete) done();
    }
    function onEnd() {
      if (!finished) done();
    }
    function onBroken() {
      if (finished) return;
      cleanup();
      resolve("incomplete");
    }
    function onClose() {
      if (!finished && !req.complete) onBroken();
    }
    req.on("readable", onReadable);
    req.on("end", onEnd);
    req.on("error", onBroken);
    req.on("aborted", onBroken);
    req.on("close", onClose);
  });
}

/** readNodeBodyNow, the bytes also kept on `req.rawBody` (where handlers find them). */
export function readNodeRawBody(req, cap, options) {
  const keep = (body) => {
    if (typeof body !== "string") req.rawBody = body;
    return body;
  };
  const body = readNodeBodyNow(req, cap, options);
  return body instanceof Promise ? body.then(keep) : keep(body);
}

function toBuffer(chunk, encoding) {
  if (chunk === undefined || chunk === null) return null;
  if (Buffer.isBuffer(chunk)) return chunk;
  if (chunk instanceof Uint8Array) return Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
  return Buffer.from(String(chunk), typeof encoding === "string" ? encoding : "utf8");
}

/** The headers set on `res` that `names` lists (lower-cased), as WIT headers. */
function headersOf(res, names) {
  const list = [];
  for (const name of names) {
    const value = res.getHeader(name);
    if (Array.isArray(value)) for (const v of value) list.push({ name, value: String(v) });
    else if (value !== undefined) list.push({ name, value: String(value) });
  }
  return list;
}

/** The methods holdResponse replaces, in the order it sets them. */
const HELD_METHODS = ["writeHead", "flushHeaders", "write", "end"];

/**
 * Holds what the handler writes to `res` (status and headers stay on `res`;
 * the body chunks are kept) instead of sending it. `onEnd({ status, headers,
 * body })` runs once at `res.end()`, with the headers `names` lists (the
 * exchange's `Session.responseHeaders`: the core reads no other). Returns {
 * send(), restore() }: send() writes the held response as the application
 * made it, every header included. `releaseByDelete`: see restore below.
 */
export function holdResponse(res, names, onEnd, { releaseByDelete = false } = {}) {
  const original = { writeHead: res.writeHead, write: res.write, end: res.end, flushHeaders: res.flushHeaders };
  const chunks = [];
  let ended = false;
  let endCallback;
  // Released by putting the replaced methods back, or (releaseByDelete) by
  // deleting the patches of the methods the response inherits. Express gives
  // every request's response a shape of its own (V8 makes a new map for each
  // property added to it, by Express and by Node as it sends): there a
  // response left in dictionary mode by the deletes costs less CPU to finish
  // than one given four more fields. A node:http or Hono response keeps the
  // shape every response shares, which the deletes would give up (measured
  // both ways). A method set on this response itself (another middleware's
  // wrapper) is always put back.
  const inherited = releaseByDelete ? HELD_METHODS.map((name) => !Object.hasOwn(res, name)) : null;
  let restored = false;
  const restore = () => {
    if (restored) return;
    restored = true;
    for (let i = HELD_METHODS.length - 1; i >= 0; i--) {
      if (inherited?.[i]) delete res[HELD_METHODS[i]];
      else res[HELD_METHODS[i]] = original[HELD_METHODS[i]];
    }
  };
  res.writeHead = function writeHead(status, reason, headers) {
    if (typeof reason !== "string") headers = reason;
    else res.statusMessage = reason;
    res.statusCode = status;
    if (Array.isArray(headers)) {
      for (let i = 0; i + 1 < headers.length; i += 2) res.appendHeader(headers[i], headers[i + 1]);
    } else if (headers) {
      for (const [name, value] of Object.entries(headers)) if (value !== undefined) res.setHeader(name, value);
    }
    return res;
  };
  res.flushHeaders = function flushHeaders() {};
  res.write = function write(chunk, encoding, callback) {
    const b = toBuffer(chunk, encoding);
    if (b) chunks.push(b);
    const cb = typeof encoding === "function" ? encoding : callback;
    if (typeof cb === "function") process.nextTick(cb);
    return true;
  };
  res.end = function end(chunk, encoding, callback) {
    if (typeof chunk === "function") {
      callback = chunk;
      chunk = undefined;
    } else if (typeof encoding === "function") {
      callback = encoding;
      encoding = undefined;
    }
    if (ended) return res;
    ended = true;
    endCallback = callback;
    const b = toBuffer(chunk, encoding);
    if (b) chunks.push(b);
    restore();
    onEnd({ status: res.statusCode, headers: headersOf(res, names), body: Buffer.concat(chunks) });
    return res;
  };
  return {
    restore,
    get ended() {
      return ended;
    },
    send() {
      res.end(Buffer.concat(chunks), endCallback);
    },
  };
}

// How long a connection closed after an answer keeps discarding what the
// client still sends, at most (see closeAfterAnswer).
const LINGER_MS = 5000;

/**
 * Makes the connection of `req` close after its answer without losing the
 * answer: the rest of the request body is read and discarded, and when Node
 * closes the connection (after a `Connection: close` response) it sends its
 * FIN but keeps reading until the client closes its side (or LINGER_MS
 * passed) before letting go of the socket. Closing a socket at once while
 * the client is still sending makes the kernel answer the client's data with
 * a reset, which can wipe the answer from the client's receive buffer: a
 * client still uploading a chunked body over the cap then sees no 413.
 */
export function closeAfterAnswer(req) {
  const socket = req.socket;
  if (!socket || socket.destroyed || typeof socket.destroySoon !== "function") return;
  req.resume();
  const destroySoon = socket.destroySoon;
  socket.destroySoon = function lingeringDestroySoon() {
    socket.destroySoon = destroySoon;
    const timer = setTimeout(() => socket.destroy(), LINGER_MS);
    timer.unref?.();
    socket.once("close", () => clearTimeout(timer));
    socket.once("end", () => socket.destroy());
    socket.end();
    socket.resume();
  };
}

/** Sends the core's response (a WIT `response`) as the whole response: every header the handler set is dropped. */
export function sendCore(res, response, close) {
  for (const name of res.getHeaderNames()) res.removeHeader(name);
  res.statusCode = response.status;
  for (const { name, value } of response.headers) res.appendHeader(name, value);
  // Node closes the connection after a response that says so.
  if (close) {
    res.setHeader("connection", "close");
    if (res.req) closeAfterAnswer(res.req);
  }
  if (response.body === undefined || response.body === null) res.end();
  else res.end(response.body);
}

/** Sends a `{ status, headers, body }` (a NothingChangedError's own response). */
function sendObject(res, response) {
  for (const name of res.getHeaderNames()) res.removeHeader(name);
  res.statusCode = response.status;
  for (const [name, value] of Object.entries(response.headers ?? {})) res.setHeader(name, value);
  res.end(response.body ?? undefined);
}

const STATE = Symbol.for("idempotency-ledger.request");

// body-parser's error types: the request was refused while it was read or
// parsed, before any route handler ran (Express's express.json() & co.).
const BODY_PARSER_ERRORS = new Set([
  "entity.parse.failed",
  "entity.too.large",
  "entity.verify.failed",
  "encoding.unsupported",
  "charset.unsupported",
  "request.aborted",
  "request.size.invalid",
  "stream.encoding.set",
  "stream.not.readable",
  "parameters.too.many",
]);

/**
 * Whether the framework refused the request before the route handler ran:
 * an error from a body parser (its `type`), or, with the middleware mounted
 * app-wide (no route matched yet when it ran), a response or error made
 * before any route matched (a middleware after it answered, or no route
 * matched at all).
 */
function declinedBy(req, state, error) {
  if (error !== undefined && BODY_PARSER_ERRORS.has(error?.type)) return true;
  return state.routeAtStart === undefined && state.framework && req.route === undefined;
}

/**
 * The route template for the metrics (`http.route`): `option` (a string, or
 * a function of the request), else under Express the route it matched
 * (`req.baseUrl` + `req.route.path`, read once the exchange ended, when the
 * path is a string); node:http knows none.
 */
function routeOf(req, option, framework) {
  if (option !== undefined) return typeof option === "function" ? () => option(req) : option;
  if (!framework) return undefined;
  return () => {
    const path = req.route?.path;
    return typeof path === "string" ? `${req.baseUrl ?? ""}${path}` : undefined;
  };
}

/** The context of a request the ledger passed through (no transaction, no ticket, a signal never aborted). */
const passedThroughContext = () => handlerContext(undefined, neverAborted(), undefined);

/**
 * The exchange for one node:http request. `run({ bypass })` runs the
 * application (Express's next(), or the node:http handler); its response is
 * held, completed through the core, and then the answer the core says is
 * sent. The handler finds its context on `req.idempotency` ({ transaction,
 * signal, ticket }). Resolves once the request was answered.
 */
export async function handleNode(api, options, parts, req, res, run, { framework = false } = {}) {
  const { principalOf, dbOf, select } = parts;
  if (!select(req.method, nodePath(req))) return run({ bypass: true });
  const ledger = api.ledgerFor(await dbOf(req), options);
  const transactional = options.transactional === true;
  const state = { error: undefined, held: null, check: null, routeAtStart: req.route, framework };
  const handlerResult = (captured) => {
    const error = state.error;
    if (error instanceof NothingChangedError) return { tag: "nothing-changed" };
    if (declinedBy(req, state, error)) return { tag: "declined" };
    if (error !== undefined) return raisedResult(error);
    return { tag: "answered", val: { status: captured.status, headers: captured.headers, body: { tag: "bytes", val: captured.body } } };
  };
  /** Runs the application with its response held; resolves with its WIT handler-result once it is over. */
  const runHeld = (context) =>
    new Promise((resolve) => {
      req[STATE] = state;
      req.idempotency = context;
      // The handler is over once its response ended and (node:http) its
      // function returned, or once it failed: a framework reports that
      // through its error middleware and then answers it (held too).
      let captured = null;
      let returned = framework;
      state.check = () => {
        if (state.check === null) return;
        const failed = state.error !== undefined && !framework;
        if (!failed && (captured === null || !returned)) return;
        state.check = null;
        resolve(handlerResult(captured));
      };
      state.held = holdResponse(
        res,
        ledger.session.responseHeaders,
        (c) => {
          captured = c;
          state.check?.();
        },
        { releaseByDelete: framework },
      );
      Promise.resolve()
        .then(() => run({ bypass: false, state }))
        .then(
          () => {
            returned = true;
            state.check?.();
          },
          (thrown) => fail(req, thrown),
        );
    });
  /** Sends what the handler made (held), or, when it made nothing, its error's response or a dropped connection. */
  const sendHandlers = () => {
    const held = state.held;
    if (held?.ended) held.send();
    else {
      held?.restore();
      if (state.error?.response !== undefined) sendObject(res, state.error.response);
      else res.destroy(state.error);
    }
  };
  // Not protected (or no key where keys are optional): the handler runs as
  // it is; on a transactional route, in a transaction of its own, committed
  // once it answered.
  const passThrough = async () => {
    if (!transactional) {
      req.idempotency = passedThroughContext();
      return run({ bypass: true });
    }
    const own = await ledger.ownTransaction(true);
    const result = await runHeld(own.context);
    if (!(await own.end(result.tag === "answered"))) {
      state.held?.restore();
      sendCore(res, ledger.faultResponse(), false);
      return undefined;
    }
    sendHandlers();
    return undefined;
  };
  if (!ledger.session.protects(req.method)) return passThrough();
  const principal = principalValue(await principalOf(req));
  const route = routeOf(req, options.route, framework);
  const { action } = await ledger.exchange(
    nodeHead(req),
    principal,
    {
      readBody: (cap) => readNodeRawBody(req, cap),
      runHandler: (ticket, body, context) => runHeld(context),
    },
    { route, transactional },
  );
  if (action.tag === "pass-through") return passThrough();
  const held = state.held;
  if (action.tag === "propagate") {
    // Express: the framework's own error response (held) goes out unstored;
    // node:http (nothing to re-raise to): the core's answer for it.
    if (held?.ended) held.send();
    else {
      held?.restore();
      sendCore(res, action.val.response, false);
    }
    return undefined;
  }
  const { send, close } = action.val;
  if (send.tag === "core") {
    held?.restore();
    sendCore(res, send.val, close);
  } else sendHandlers();
  return undefined;
}

/**
 * Reports what the handler threw (Express error middleware, a throwing
 * node:http handler). A handler whose response was not written yet is over:
 * its exchange continues at once.
 */
export function fail(req, error) {
  const state = req?.[STATE];
  if (!state || state.error !== undefined) return state;
  state.error = error ?? new Error("the handler failed");
  state.check?.();
  return state;
}

/**
 * The plain node:http adapter: `http.createServer(idempotentHandler(options,
 * async (req, res) => { ... }))`. The handler reads the body from
 * `req.rawBody` (a Buffer; the stream is readable too) and writes `res` as
 * usual; what it writes is completed through the core, then sent. A handler
 * that throws is abandoned and answered with the core's 500; a
 * NothingChangedError releases the key (send your response before throwing
 * it, or give it one: `new NothingChangedError(msg, { response })`).
 */
export function makeIdempotentHandler(api) {
  return function idempotentHandler(options, handler) {
    if (typeof handler !== "function") throw new TypeError("idempotentHandler(options, handler): handler must be a function (req, res)");
    const parts = adapterOptions(options, "idempotentHandler");
    return function listener(req, res) {
      handleNode(api, options, parts, req, res, ({ bypass }) => (bypass ? Promise.resolve(handler(req, res)) : handler(req, res))).catch((error) => {
        // A failure of the host itself (the database adapter or a bug):
        // nothing the core answered; the connection is dropped.
        res.destroy(error);
      });
    };
  };
}
