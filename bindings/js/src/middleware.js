// What the framework adapters (Hono, Express, node:http) share: option
// checks, route selection and the request head of a node:http request.
// Platform-neutral.

/** A path pattern: a RegExp, an exact path, or a prefix ending in "*" ("/orders/*"). */
function matcher(pattern) {
  if (pattern instanceof RegExp) return (path) => pattern.test(path);
  if (typeof pattern !== "string") throw new TypeError("include/exclude patterns are strings or RegExps");
  if (pattern.endsWith("*")) {
    const prefix = pattern.slice(0, -1);
    return (path) => path.startsWith(prefix);
  }
  return (path) => path === pattern;
}

/**
 * Which requests go through the ledger at all: `routes(method, path)`, or
 * `include` (default: every path) minus `exclude`. A request left out runs
 * the handler untouched (no admission, no ledger).
 */
export function routeFilter(options) {
  if (options.routes !== undefined) {
    if (typeof options.routes !== "function") throw new TypeError("routes must be a function (method, path) => boolean");
    if (options.include !== undefined || options.exclude !== undefined) throw new TypeError("pass routes or include/exclude, not both");
    return (method, path) => !!options.routes(method, path);
  }
  const include = options.include === undefined ? null : [].concat(options.include).map(matcher);
  const exclude = options.exclude === undefined ? [] : [].concat(options.exclude).map(matcher);
  return (method, path) => (include === null || include.some((m) => m(path))) && !exclude.some((m) => m(path));
}

/** Checks the adapter options every middleware needs; returns { principalOf, dbOf, select }. */
export function adapterOptions(options, what) {
  if (!options || typeof options !== "object") throw new TypeError(`${what}(options): options are required`);
  if (typeof options.principal !== "function") {
    throw new TypeError(`${what}: options.principal must be a function returning the authenticated principal (or undefined)`);
  }
  if (options.db === undefined || options.db === null) throw new TypeError(`${what}: options.db is required (a database, or a function of the request)`);
  const db = options.db;
  const dbOf = typeof db === "function" && typeof db.batch !== "function" && typeof db.prepare !== "function" ? db : () => db;
  return { principalOf: options.principal, dbOf, select: routeFilter(options) };
}

/** The principal callback's answer as the core takes it: a string, or undefined for none. */
export function principalValue(value) {
  if (value === null || value === undefined) return undefined;
  return String(value);
}

/**
 * The head the protocol reads from a node:http IncomingMessage (Express,
 * node:http, Hono on @hono/node-server): method, the raw path + query, every
 * header in arrival order (latin1, as received; duplicates kept apart;
 * HTTP/2 pseudo-headers such as `:path` left out, as Fetch leaves them out).
 */
export function nodeHead(req) {
  const headers = [];
  const raw = req.rawHeaders ?? [];
  for (let i = 0; i + 1 < raw.length; i += 2) if (!raw[i].startsWith(":")) headers.push({ name: raw[i], value: raw[i + 1] });
  return { method: req.method, pathAndQuery: req.originalUrl ?? req.url ?? "/", headers };
}
