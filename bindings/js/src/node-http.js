// node:http pieces shared by the Express middleware and the plain node:http
// adapter: the request head as received, the body read up to the core's cap
// (and handed back to the stream for the application), the response captured
// while the handler writes it, and the core's answer sent instead.
import { IdempotencyLedger } from "./ledger.js";
import { adapterOptions, nodeHead, principalValue } from "./middleware.js";


/** The path without the query (for route selection). */
export function nodePath(req) {
  const url = req.originalUrl ?? req.url ?? "/";
  const q = url.indexOf("?");
  return q === -1 ? url : url.slice(0, q);
}

/**
 * Reads the request body, never holding more than `cap` bytes: resolves with
 * a Buffer, or null as soon as the body passes the cap (the rest is left
 * unread; send the 413 with `Connection: close`). Unless `putBack` is false,
 * the bytes read are put back into the stream (`unshift`), so the
 * application's body parser (express.json(), ...) reads the same body afterwards.
 */
export function readNodeBody(req, cap, { putBack = true } = {}) {
  const limit = Number(cap);
  return new Promise((resolve, reject) => {
    const chunks = [];
    let total = 0;
    let finished = false;
    const cleanup = () => {
      finished = true;
      req.removeListener("readable", onReadable);
      req.removeListener("error", onError);
      req.removeListener("end", onEnd);
      req.removeListener("aborted", onAborted);
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
          resolve(null);
          return;
        }
        chunks.push(chunk);
      }
      if (req.complete) done();
    }
    function onEnd() {
      if (!finished) done();
    }
    function onError(error) {
      if (finished) return;
      cleanup();
      reject(error);
    }
    function onAborted() {
      onError(new Error("the client aborted the request"));
    }
    req.on("readable", onReadable);
    req.on("end", onEnd);
    req.on("error", onError);
    req.on("aborted", onAborted);
  });
}

function toBuffer(chunk, encoding) {
  if (chunk === undefined || chunk === null) return null;
  if (Buffer.isBuffer(chunk)) return chunk;
  if (chunk instanceof Uint8Array) return Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
  return Buffer.from(String(chunk), typeof encoding === "string" ? encoding : "utf8");
}

/** Every header the handler set, as WIT headers. */
function headersOf(res) {
  const list = [];
  for (const [name, value] of Object.entries(res.getHeaders())) {
    if (Array.isArray(value)) for (const v of value) list.push({ name, value: String(v) });
    else if (value !== undefined) list.push({ name, value: String(value) });
  }
  return list;
}

/**
 * Captures what the handler writes to `res` (status, headers, body) instead
 * of sending it; `onEnd({ status, headers, body })` runs once at `res.end()`
 * with the original methods restored, and sends the real answer.
 */
export function captureResponse(res, onEnd) {
  const original = { writeHead: res.writeHead, write: res.write, end: res.end, flushHeaders: res.flushHeaders };
  const chunks = [];
  let ended = false;
  const restore = () => {
    res.writeHead = original.writeHead;
    res.write = original.write;
    res.end = original.end;
    res.flushHeaders = original.flushHeaders;
  };
  res.writeHead = function writeHead(status, reason, headers) {
    if (typeof reason !== "string") headers = reason;
    else res.statusMessage = reason;
    res.statusCode = status;
    if (Array.isArray(headers)) {
      for (let i = 0; i + 1 < headers.length; i += 2) res.setHeader(headers[i], headers[i + 1]);
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
    const b = toBuffer(chunk, encoding);
    if (b) chunks.push(b);
    restore();
    const captured = { status: res.statusCode, headers: headersOf(res), body: Buffer.concat(chunks) };
    Promise.resolve()
      .then(() => onEnd(captured))
      .then(
        () => typeof callback === "function" && callback(),
        (error) => {
          if (!res.headersSent) {
            res.statusCode = 500;
            res.end();
          }
          process.emitWarning?.(`idempotency: sending the answer failed: ${error?.message ?? error}`);
        },
      );
    return res;
  };
  return { restore, get ended() { return ended; } };
}

/** Sends an answer ({ status, headers, body }) as the whole response: every header the handler set is dropped. */
export function sendAnswer(res, answer, { close = false } = {}) {
  for (const name of res.getHeaderNames()) res.removeHeader(name);
  res.statusCode = answer.status;
  for (const { name, value } of answer.headers) res.appendHeader ? res.appendHeader(name, value) : res.setHeader(name, value);
  if (close) res.setHeader("connection", "close");
  const body = answer.body;
  if (body === null || body === undefined) res.end();
  else res.end(typeof body === "string" ? body : Buffer.from(body.buffer, body.byteOffset, body.byteLength));
}

const STATE = Symbol.for("idempotency-ledger.request");

/**
 * The flow for one node:http request. `run(req, res)` is the application
 * (Express's next(), or the node:http handler): its response is captured,
 * completed through the core, and the core's answer sent. Returns a promise
 * settled when the request was handled.
 */
export async function handleNode(api, options, parts, req, res, run) {
  const { principalOf, dbOf, select } = parts;
  if (!select(req.method, nodePath(req))) return run({ bypass: true });
  const ledger = api.ledgerFor(await dbOf(req), options);
  if (!ledger.session.protects(req.method)) return run({ bypass: true });
  const principal = principalValue(await principalOf(req));
  const begun = await ledger.begin(nodeHead(req), principal, (cap) => readNodeBody(req, cap));
  if (begun.kind === "pass-through") return run({ bypass: true });
  if (begun.kind === "answer") {
    sendAnswer(res, begun.answer, { close: begun.reason === "body-too-large" });
    return undefined;
  }
  const { ticket, body } = begun;
  req.rawBody = Buffer.from(body.buffer, body.byteOffset, body.byteLength);
  const state = { ticket, raised: undefined, settled: false };
  req[STATE] = state;
  const finished = new Promise((resolve) => {
    captureResponse(res, async (captured) => {
      try {
        if (state.raised !== undefined) {
          // The mutation raised (reported by the error middleware): abandon;
          // the application's own error response goes out unstored.
          state.settled = true;
          await ledger.abandon(ticket, IdempotencyLedger.reasonOf(state.raised), state.raised?.message ?? String(state.raised));
          sendAnswer(res, { status: captured.status, headers: captured.headers, body: captured.body });
          return;
        }
        state.settled = true;
        const done = await ledger.finish(ticket, { status: captured.status, headers: captured.headers, body: captured.body });
        if (done.sweepDue && options.sweep !== false) ledger.scheduleSweep();
        sendAnswer(res, done.answer);
      } finally {
        resolve();
      }
    });
  });
  return run({ bypass: false, state, finished, ledger });
}

/** Marks the request's mutation as raised (Express error middleware, thrown handlers). */
export function markRaised(req, error) {
  const state = req?.[STATE];
  if (state && !state.settled && state.raised === undefined) state.raised = error ?? new Error("the handler failed");
  return state;
}

/**
 * The plain node:http adapter: `http.createServer(idempotentHandler(options,
 * async (req, res) => { ... }))`. The handler reads the body from
 * `req.rawBody` (a Buffer; the stream is readable too) and writes `res` as
 * usual; what it writes is completed through the core and the core's answer
 * is sent. A handler that throws (or rejects) is abandoned (throw
 * NothingRanError when nothing changed) and answered 500 with no body.
 */
export function makeIdempotentHandler(api) {
  return function idempotentHandler(options, handler) {
    if (typeof handler !== "function") throw new TypeError("idempotentHandler(options, handler): handler must be a function (req, res)");
    const parts = adapterOptions(options, "idempotentHandler");
    const logger = options.logger ?? console;
    return function listener(req, res) {
      handleNode(api, options, parts, req, res, async ({ bypass, state }) => {
        try {
          await handler(req, res);
        } catch (error) {
          if (bypass || !state) throw error;
          markRaised(req, error);
          logger.error?.(`[idempotency] the handler failed: ${error?.stack ?? error}`);
          if (!res.writableEnded) {
            res.statusCode = 500;
            for (const name of res.getHeaderNames()) res.removeHeader(name);
            res.end();
          }
        }
      }).catch((error) => {
        logger.error?.(`[idempotency] request failed: ${error?.stack ?? error}`);
        if (!res.headersSent) {
          res.statusCode = 500;
          res.end();
        } else res.destroy(error);
      });
    };
  };
}
