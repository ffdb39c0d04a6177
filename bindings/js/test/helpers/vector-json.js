// Conformance vectors (format 3, conformance/README.md) <-> WIT values, and
// the runner of one exchange or sweep vector over any database. Pure JS (no
// Node built-ins): used by the Node suites (better-sqlite3, PostgreSQL) and
// inside workerd (D1).

export const COLUMNS = [
  "principal", "key", "fingerprint", "status", "generation",
  "response_status", "response_body", "response_headers", "created_at", "updated_at",
];

/** The fields each kind's vectors carry (required, then optional); a runner fails on any other. */
export const FIELDS = {
  exchange: [["id", "spec", "config", "database", "rows", "request", "steps", "rows_after"], ["stepped_only"]],
  sweep: [["id", "spec", "config", "rows", "now", "expect", "rows_after"], ["feed"]],
  config: [["id", "spec", "profile", "overrides", "expect"], []],
};
export const KINDS = Object.keys(FIELDS);
const REQUEST_FIELDS = ["method", "path_and_query", "headers", "principal", "now"];
const STEP_FIELDS = ["expect", "now", "feed", "rows"];

function exactly(what, object, required, optional = []) {
  if (object === null || typeof object !== "object" || Array.isArray(object)) throw new Error(`${what}: not an object`);
  const got = Object.keys(object);
  const unknown = got.filter((f) => !required.includes(f) && !optional.includes(f));
  const missing = required.filter((f) => !got.includes(f));
  if (unknown.length || missing.length) throw new Error(`${what}: unknown fields [${unknown}] missing fields [${missing}]`);
}

/** Throws unless `v` has exactly the fields of its kind (and its request and steps theirs). */
export function checkFields(kind, v) {
  const fields = FIELDS[kind];
  if (!fields) throw new Error(`unknown vector kind ${kind}`);
  exactly(v.id, v, ...fields);
  if (kind === "exchange") {
    exactly(`${v.id} request`, v.request, REQUEST_FIELDS);
    v.steps.forEach((s, i) => {
      exactly(`${v.id} step ${i}`, s, ["expect"], STEP_FIELDS);
      exactly(`${v.id} step ${i} expect`, s.expect, [Object.keys(s.expect)[0]]);
      if (!ACTIONS.includes(Object.keys(s.expect)[0])) throw new Error(`${v.id} step ${i}: unknown action ${Object.keys(s.expect)[0]}`);
      if (s.feed !== undefined && (Object.keys(s.feed).length !== 1 || !EVENTS.includes(Object.keys(s.feed)[0]))) throw new Error(`${v.id} step ${i}: unknown event ${JSON.stringify(s.feed)}`);
      if (i < v.steps.length - 1 && s.now === undefined) throw new Error(`${v.id} step ${i}: no now`);
    });
  }
}

const ACTIONS = ["read-body", "run-batch", "sleep", "run-handler", "pass-through", "respond", "propagate"];
const EVENTS = ["body", "body-hashed", "body-too-large", "body-unreadable", "batch-done", "batch-failed", "slept", "handler-done"];

const CONFIG_FIELDS = {
  profile: "profile",
  "protected-methods": "protectedMethods",
  "fingerprint-headers": "fingerprintHeaders",
  "replay-headers": "replayHeaders",
  "pending-ttl-ms": "pendingTtlMs",
  "retention-ms": "retentionMs",
  "body-cap-bytes": "bodyCapBytes",
  "request-body-cap-bytes": "requestBodyCapBytes",
  "sweep-batch": "sweepBatch",
  "sweep-every": "sweepEvery",
  "key-required": "keyRequired",
  "replay-header": "replayHeader",
  "in-progress-retry-ms": "inProgressRetryMs",
  "wait-ms": "waitMs",
  "on-server-error": "onServerError",
};

/**
 * The dialect a vector's session opens in: its config's `dialect` (only
 * vectors without a database carry one), else the runner's database's.
 */
export function dialectOf(v, runners) {
  const dialect = v.config?.dialect;
  if (dialect === undefined) return runners;
  if (v.database) throw new Error(`${v.id}: a database vector names a dialect`);
  if (dialect !== "sqlite" && dialect !== "postgres") throw new Error(`${v.id}: unknown dialect ${dialect}`);
  return dialect;
}

/** A vector's WIT-spelled config overrides as package options (`dialect` apart: dialectOf); throws on an unknown field. */
export function optionsOf(id, config) {
  const out = {};
  for (const [name, value] of Object.entries(config)) {
    if (name === "dialect") continue;
    if (!(name in CONFIG_FIELDS)) throw new Error(`${id}: unknown config field ${name}`);
    out[CONFIG_FIELDS[name]] = value;
  }
  return out;
}

/** A WIT config as the vectors spell it (every field). */
export function configJson(c) {
  const out = {};
  for (const [wit, js] of Object.entries(CONFIG_FIELDS)) {
    const v = c[js];
    out[wit] = typeof v === "bigint" ? Number(v) : v === undefined ? null : v;
  }
  out.dialect = c.dialect;
  const ordered = {};
  for (const k of ["protected-methods", "fingerprint-headers", "replay-headers", "pending-ttl-ms", "retention-ms", "body-cap-bytes", "request-body-cap-bytes", "sweep-batch", "sweep-every", "dialect", "profile", "key-required", "replay-header", "in-progress-retry-ms", "wait-ms", "on-server-error"]) ordered[k] = out[k];
  return ordered;
}

export const headersOf = (pairs) => pairs.map(([name, value]) => ({ name, value }));
export const hexBytes = (hex) => Uint8Array.from(hex.match(/../g) ?? [], (b) => parseInt(b, 16));
const hexOf = (bytes) => [...bytes].map((b) => b.toString(16).padStart(2, "0")).join("");

/** A SQL value as the vectors spell it -> WIT `value`. */
export function valueOf(v) {
  if (v === null) return { tag: "null" };
  if (typeof v === "number") {
    if (!Number.isSafeInteger(v)) throw new Error(`a SQL integer must be a safe integer, got ${v}`);
    return { tag: "integer", val: BigInt(v) };
  }
  if (typeof v === "string") return { tag: "text", val: v };
  if (v && typeof v === "object" && Object.keys(v).length === 1) {
    if ("real" in v) return { tag: "real", val: v.real };
    if ("blob" in v) return { tag: "blob", val: hexBytes(v.blob) };
  }
  throw new Error(`unknown SQL value ${JSON.stringify(v)}`);
}

/** A WIT `value` -> the vectors' spelling. */
export function valueJson(v) {
  switch (v.tag) {
    case "null":
      return null;
    case "integer":
      return Number(v.val);
    case "text":
      return v.val;
    case "real":
      return { real: v.val };
    case "blob":
      return { blob: hexOf(v.val) };
    default:
      throw new Error(`unknown value tag ${v.tag}`);
  }
}

export const responseJson = (r) => ({ status: r.status, headers: r.headers.map((h) => [h.name, h.value]), body: r.body ?? null });
const ticketJson = (t) => ({ principal: t.principal, key: t.key, fingerprint: t.fingerprint, generation: Number(t.generation), created_at: Number(t.createdAt) });
const logJson = (l) => ({ level: l.level, message: l.message });
const statementJson = (s) => ({ query: s.query, params: s.params.map(valueJson) });

/** A WIT `action` -> the vectors' spelling. */
export function actionJson(a) {
  switch (a.tag) {
    case "read-body":
      return { "read-body": { cap: Number(a.val.cap), prefix: a.val.prefix } };
    case "run-batch":
      return { "run-batch": a.val.map(statementJson) };
    case "sleep":
      return { sleep: a.val };
    case "run-handler":
      return { "run-handler": ticketJson(a.val) };
    case "pass-through":
      return { "pass-through": null };
    case "respond": {
      const r = a.val;
      return { respond: { send: r.send.tag === "core" ? responseJson(r.send.val) : "handler", close: r.close, log: r.log.map(logJson), sweep: r.sweep, outcome: r.outcome } };
    }
    case "propagate":
      return { propagate: { log: a.val.log.map(logJson), outcome: a.val.outcome, response: responseJson(a.val.response) } };
    default:
      throw new Error(`unknown action ${a.tag}`);
  }
}

export function batchErrorOf(e) {
  if (e.kind === "database") return { tag: "database", val: e.code === null ? { message: e.message } : { code: e.code, message: e.message } };
  return { tag: e.kind, val: e.message };
}

export function resultsOf(results) {
  return results.map((r) => ({ rows: r.rows.map((row) => row.map(valueOf)), changes: BigInt(r.changes) }));
}

function handlerResultOf(h) {
  const [kind] = Object.keys(h);
  if (kind === "answered") {
    const r = h.answered;
    const body = "body_text" in r ? { tag: "text", val: r.body_text } : { tag: "bytes", val: hexBytes(r.body_hex) };
    return { tag: "answered", val: { status: r.status, headers: headersOf(r.headers), body } };
  }
  if (kind === "raised") return { tag: "raised", val: h.raised };
  if (kind === "nothing-changed" || kind === "declined") return { tag: kind };
  throw new Error(`unknown handler result ${kind}`);
}

/** An event as the vectors spell it -> WIT `event`. */
export function eventOf(e) {
  const [kind] = Object.keys(e);
  const v = e[kind];
  switch (kind) {
    case "body":
      return { tag: "body", val: hexBytes(v) };
    case "body-hashed":
    case "body-unreadable":
      return { tag: kind, val: v };
    case "body-too-large":
    case "slept":
      return { tag: kind };
    case "batch-done":
      return { tag: kind, val: resultsOf(v) };
    case "batch-failed":
      return { tag: kind, val: batchErrorOf(v) };
    case "handler-done":
      return { tag: kind, val: handlerResultOf(v) };
    default:
      throw new Error(`unknown event ${kind}`);
  }
}

export const headOf = (request) => ({ method: request.method, pathAndQuery: request.path_and_query, headers: headersOf(request.headers) });

/**
 * Runs one exchange vector, stepped, through `session` (a Session of this
 * package). `db` (database vectors): { batch(statements with sql) ->
 * Promise<results> (throws a BatchFailure), replaceRows(rows) -> Promise }.
 * `hash(prefix, bytes)` (optional, may be async): feed `body-hashed` with it
 * where the vector feeds `body` (`body-too-large` for a body over the cap). Returns the actions got, one per step,
 * in the vectors' spelling (the caller compares them with the steps'
 * `expect`).
 */
export async function runExchange(v, session, { db = null, hash = null } = {}) {
  const got = [];
  let { action, exchange } = session.start(headOf(v.request), v.request.principal ?? undefined, v.request.now, "stepped");
  try {
    for (let i = 0; i < v.steps.length; i++) {
      const step = v.steps[i];
      got.push(actionJson(action));
      if (i === v.steps.length - 1) {
        if (!["respond", "pass-through", "propagate"].includes(action.tag)) got.push({ "left-open": action.tag });
        break;
      }
      // A final action may still be fed (an event after the end): the same exchange answers it.
      if (exchange === undefined) {
        got.push({ "no-exchange-to-feed": step.feed ?? null });
        break;
      }
      let event;
      if (step.feed !== undefined) {
        event = eventOf(step.feed);
        // What a host that hashes natively feeds: the hash, or body-too-large
        // for a body over the cap (it stops reading there, so never hashes one).
        if (hash !== null && event.tag === "body" && action.tag === "read-body") {
          event = BigInt(event.val.length) > action.val.cap ? { tag: "body-too-large" } : { tag: "body-hashed", val: await hash(action.val.prefix, event.val) };
        }
      } else if (action.tag === "run-batch" && db !== null) {
        if (step.rows !== undefined) await db.replaceRows(step.rows);
        try {
          event = { tag: "batch-done", val: await db.batch(action.val.map((s) => ({ query: s.query, sql: session.sql[s.query], params: s.params }))) };
        } catch (error) {
          if (!error?.batchError) throw error;
          event = { tag: "batch-failed", val: error.batchError };
        }
      } else throw new Error(`${v.id} step ${i}: nothing to feed after ${action.tag}`);
      action = exchange.step(step.now, event);
    }
  } finally {
    exchange?.drop();
  }
  return got;
}

/**
 * Runs one exchange vector driven (not the `stepped_only` ones, which feed a
 * batch an event only a stepped host can): the component runs the batches through
 * the ledger import, which checks each `run-batch` step's statements and
 * runs them on `db.batchSync` (or returns the step's scripted result).
 * Returns the actions got, one per step, as runExchange does.
 */
export function runExchangeDriven(v, session, db) {
  const got = [];
  let i = 0;
  const executor = (statements) => {
    const step = v.steps[i++];
    got.push(actionJson({ tag: "run-batch", val: statements }));
    if (!step || !("run-batch" in step.expect)) throw { batchError: { tag: "host", val: "an unexpected batch" } };
    if (step.feed !== undefined) {
      const event = eventOf(step.feed);
      if (event.tag === "batch-failed") throw { batchError: event.val };
      return event.val;
    }
    if (db === null) throw { batchError: { tag: "host", val: "no database and nothing scripted" } };
    if (step.rows !== undefined) db.replaceRowsSync(step.rows);
    return db.batchSync(statements.map((s) => ({ query: s.query, sql: session.sql[s.query], params: s.params })));
  };
  let { action, exchange } = session.start(headOf(v.request), v.request.principal ?? undefined, v.request.now, "driven");
  try {
    for (;;) {
      const step = v.steps[i++];
      got.push(actionJson(action));
      if (i >= v.steps.length || exchange === undefined) break;
      if (step.feed === undefined) throw new Error(`${v.id} step ${i - 1}: nothing to feed after ${action.tag}`);
      const event = eventOf(step.feed);
      action = session.drive(executor, () => exchange.step(step.now, event));
    }
  } finally {
    exchange?.drop();
  }
  return got;
}

/** Runs one sweep vector: { deleted, more, log } in the vectors' spelling. */
export async function runSweep(v, session, db) {
  const statements = session.sweep(v.now);
  let result;
  if (v.feed !== undefined) {
    const event = eventOf(v.feed);
    result = event.tag === "batch-failed" ? { tag: "err", val: event.val } : { tag: "ok", val: event.val };
  } else {
    try {
      result = { tag: "ok", val: await db.batch(statements.map((s) => ({ query: s.query, sql: session.sql[s.query], params: s.params }))) };
    } catch (error) {
      if (!error?.batchError) throw error;
      result = { tag: "err", val: error.batchError };
    }
  }
  const report = session.swept(result);
  return { deleted: Number(report.deleted), more: report.more, log: report.log ? logJson(report.log) : null };
}
