// Fetch API pieces (Workers, Hono, handleIdempotentMutation): the request
// head, the body read up to the core's cap, the handler's response as the
// core stores it, and the core's response as a Fetch Response.

const encoder = new TextEncoder();
const EMPTY = new Uint8Array(0);

export function asBytes(body) {
  if (body instanceof Uint8Array) return body;
  if (body instanceof ArrayBuffer) return new Uint8Array(body);
  if (ArrayBuffer.isView(body)) return new Uint8Array(body.buffer, body.byteOffset, body.byteLength);
  if (typeof body === "string") return encoder.encode(body);
  throw new TypeError("body must be an ArrayBuffer, a typed array or a string");
}

/** The request head the protocol reads from a Fetch Request: method, path + query, every header. */
export function requestHead(request) {
  const url = new URL(request.url);
  const headers = [];
  for (const [name, value] of request.headers) headers.push({ name, value });
  return { method: request.method, pathAndQuery: url.pathname + url.search, headers };
}

/** Any header collection (Fetch Headers, [name, value] pairs, {name, value} records, a plain object) as WIT headers. */
export function headerList(headers) {
  if (!headers) return [];
  const list = [];
  if (typeof headers.get === "function" && typeof headers.forEach === "function" && !Array.isArray(headers)) {
    for (const [name, value] of headers) list.push({ name, value: String(value) });
  } else if (Array.isArray(headers)) {
    for (const pair of headers) {
      if (Array.isArray(pair)) list.push({ name: String(pair[0]), value: String(pair[1]) });
      else list.push({ name: String(pair.name), value: String(pair.value) });
    }
  } else {
    for (const [name, value] of Object.entries(headers)) {
      if (value === undefined) continue;
      if (Array.isArray(value)) for (const v of value) list.push({ name, value: String(v) });
      else list.push({ name, value: String(value) });
    }
  }
  return list;
}

/**
 * Reads a Fetch body, stopping once it passes `cap` bytes (the core's
 * `read-body.cap`): the bytes, "too-large" (the rest is never read; the
 * stream is cancelled once the answer is final), "consumed" (something read
 * it first) or "incomplete" (the stream failed).
 */
export async function readFetchBody(request, cap) {
  if (request.bodyUsed) return "consumed";
  const body = request.body;
  if (!body) return EMPTY;
  const limit = typeof cap === "bigint" ? cap : BigInt(cap);
  let reader;
  try {
    reader = body.getReader();
  } catch {
    return "consumed"; // locked by another reader
  }
  const chunks = [];
  let total = 0;
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      total += value.byteLength;
      if (BigInt(total) > limit) {
        reader.releaseLock();
        return "too-large";
      }
      chunks.push(value);
    }
  } catch {
    return "incomplete";
  }
  if (chunks.length === 1) return chunks[0];
  const out = new Uint8Array(total);
  let at = 0;
  for (const c of chunks) {
    out.set(c, at);
    at += c.byteLength;
  }
  return out;
}

/**
 * Reads what is left of a request body the exchange refused (the answer
 * says close: the body was not read to its end) and discards it, holding no
 * more than one chunk. A Worker cannot close its client's connection, and
 * workerd resets one whose request body was left unread: under `wrangler
 * dev` its proxy then answered the next refused upload "Your worker
 * restarted mid-request" (503); cancelling the stream does not avoid it,
 * reading it to its end does.
 */
export async function drainRequestBody(request) {
  const body = request.body;
  if (!body || body.locked) return;
  const reader = body.getReader();
  try {
    for (;;) if ((await reader.read()).done) return;
  } catch {
    // the client went away: nothing left to read
  }
}

/**
 * WIT headers as a Fetch HeadersInit: a plain record when every name occurs
 * once (no Headers object built: @hono/node-server writes such a response
 * straight to the socket), else a Headers that keeps every value.
 */
function headersInit(list) {
  const record = Object.create(null);
  for (const { name, value } of list) {
    const lower = name.toLowerCase();
    // A name seen twice, or __proto__ (lost by a record's WebIDL conversion).
    if (lower in record || lower === "__proto__") {
      const headers = new Headers();
      for (const h of list) headers.append(h.name, h.value);
      return headers;
    }
    record[lower] = value;
  }
  return record;
}

/** A WIT `response` (the core's) as a Fetch Response; `close` adds the header that makes a Node server close the connection. */
export function toFetchResponse(response, close = false) {
  const headers = close ? [...response.headers, { name: "connection", value: "close" }] : response.headers;
  return new Response(response.body ?? null, { status: response.status, headers: headersInit(headers) });
}

/**
 * A Response with this body, status and headers. Fetch refuses a body for
 * some statuses (its "null body statuses"): the Response then has none, as
 * Fetch itself sends those.
 */
function responseOf(body, init) {
  try {
    return new Response(body, init);
  } catch (error) {
    if (body === null || !(error instanceof TypeError)) throw error;
    return new Response(null, init);
  }
}

/**
 * What a mutation returned (a Response, or `{ status, body, headers }`), as
 * `{ wit, response }`: the WIT `mutation-response` the core stores from, and
 * the Response to send when the exchange says `handler` (the mutation's own
 * Response object, untouched, or one built from the object once).
 * `rebuild`: a Response is read without a clone and the one to send is made
 * anew from its status, headers and bytes (an adapter that sets it in place
 * of the original, as Hono's c.res).
 */
export async function mutationOf(result, { rebuild = false } = {}) {
  if (typeof Response !== "undefined" && result instanceof Response) {
    if (rebuild) {
      // Read once, and sent as a Response made from the bytes read: a clone
      // tees the body, and a teed Response goes out through a stream (on
      // Node @hono/node-server then pipes it instead of writing it at once).
      const bytes = new Uint8Array(await result.arrayBuffer());
      const headers = headerList(result.headers);
      const response = responseOf(bytes.length === 0 ? null : bytes, { status: result.status, statusText: result.statusText, headers: headersInit(headers) });
      return { wit: { status: result.status, headers, body: { tag: "bytes", val: bytes } }, response };
    }
    const bytes = new Uint8Array(await result.clone().arrayBuffer());
    return { wit: { status: result.status, headers: headerList(result.headers), body: { tag: "bytes", val: bytes } }, response: result };
  }
  if (!result || typeof result !== "object") throw new TypeError("the mutation must return { status, body, headers } or a Response");
  // The status goes to the core as it is (it refuses what it cannot store); only a value that is not a u16 at all becomes 0.
  const status = Number.isInteger(result.status) && result.status >= 0 && result.status <= 0xffff ? result.status : 0;
  const body = result.body ?? null;
  const witBody = body === null ? { tag: "text", val: "" } : typeof body === "string" ? { tag: "text", val: body } : { tag: "bytes", val: asBytes(body) };
  const headers = headerList(result.headers);
  let response = null;
  return {
    wit: { status, headers, body: witBody },
    get response() {
      response ??= responseOf(body, { status, headers: headersInit(headers) });
      return response;
    },
  };
}
