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
  exchange: [["id", "spec", "config", "database", "rows", "request", "steps", "rows_after"], ["stepped_only", "interactive_only", "writes_after"]],
  sweep: [["id", "spec", "config", "rows", "now", "expect", "rows_after"], ["feed"]],
  renewal: [["id", "spec", "config", "rows", "ticket", "now", "expect", "rows_after"], ["feed"]],
  config: [["id", "spec", "profile", "overrides", "expect"], []],
};
export const KINDS = Object.keys(FIELDS);
const REQUEST_FIELDS = ["method", "path_and_query", "headers", "principal", "now", "transactional"];
const STEP_FIELDS = ["expect", "now", "feed", "rows", "handler_writes"];

/** The side table a transactional handler writes to (conformance/README.md), the same statement in both dialects. */
export const HANDLER_WRITES = "CREATE TABLE handler_writes (principal TEXT NOT NULL, key TEXT NOT NULL, generation BIGINT NOT NULL)";
/** A handler's write, inside its transaction. */
export const HANDLER_WRITE = { sqlite: "INSERT INTO handler_writes (principal, key, generation) VALUES (?, ?, ?)", postgres: "INSERT INTO handler_writes (principal, key, generation) VALUES ($1, $2, $3)" };
/** The side table as the vectors compare it. */
export const HANDLER_WRITES_SELECT = "SELECT principal, key, generation FROM handler_writes ORDER BY principal, key, generation";

/** The number of handler transactions a database vector opens (its run-handler steps with `transaction` true). */
export const transactionsOf = (v) => (v.database ? v.steps.filter((s) => s.expect["run-handler"]?.transaction === true).length : 0);

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
  for (const flag of ["stepped_only", "interactive_only"]) {
    if (v[flag] !== undefined && v[flag] !== true) throw new Error(`${v.id}: ${flag} is true when present`);
  }
  if (kind === "exchange") {
    exactly(`${v.id} request`, v.request, REQUEST_FIELDS, ["body"]);
    if (typeof v.request.transactional !== "boolean") throw new Error(`${v.id}: request.transactional is a bool`);
    if ((v.writes_after !== undefined) !== (v.database && v.request.transactional)) throw new Error(`${v.id}: writes_after exactly in the transactional database vectors`);
    v.steps.forEach((s, i) => {
      exactly(`${v.id} step ${i}`, s, ["expect"], STEP_FIELDS);
      exactly(`${v.id} step ${i} expect`, s.expect, [Object.keys(s.expect)[0]]);
      if (!ACTIONS.includes(Object.keys(s.expect)[0])) throw new Error(`${v.id} step ${i}: unknown action ${Object.keys(s.expect)[0]}`);
      if (s.feed !== undefined && (Object.keys(s.feed).length !== 1 || !EVENTS.includes(Object.keys(s.feed)[0]))) throw new Error(`${v.id} step ${i}: unknown event ${JSON.stringify(s.feed)}`);
      if (i < v.steps.length - 1 && s.now === undefined) throw new Error(`${v.id} step ${i}: no now`);
    });
  }
}

const ACTIONS = ["read-body", "run-batch", "sleep", "run-handler", "complete-in-transaction", "commit", "rollback", "pass-through", "respond", "propagate"];
const EVENTS = ["body", "body-hashed", "body-too-large", "body-unreadable", "batch-done", "batch-failed", "slept", "committed", "commit-failed", "rolled-back", "handler-done"];

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
  "lease-renewal": "leaseRenewal",
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
  for (const k of ["protected-methods", "fingerprint-headers", "replay-headers", "pending-ttl-ms", "retention-ms", "body-cap-bytes", "request-body-cap-bytes", "sweep-batch", "sweep-every", "dialect", "profile", "key-required", "replay-header", "in-progress-retry-ms", "wait-ms", "on-server-error", "lease-renewal"]) ordered[k] = out[k];
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
export const ticketJson = (t) => ({ principal: t.principal, key: t.key, fingerprint: t.fingerprint, generation: Number(t.generation), created_at: Number(t.createdAt) });
export const logJson = (l) => ({ level: l.level, message: l.message });
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
      return { "run-handler": { ticket: ticketJson(a.val.ticket), "renew-every-ms": a.val.renewEveryMs ?? null, transaction: a.val.transaction } };
    case "complete-in-transaction":
      return { "complete-in-transaction": a.val.map(statementJson) };
    case "commit":
    case "rollback":
      return { [a.tag]: null };
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
    case "committed":
    case "rolled-back":
      if (v !== null) throw new Error(`${kind} takes null`);
      return { tag: kind };
    case "commit-failed":
      return { tag: kind, val: batchErrorOf(v) };
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

/** `request.body` (hex), the body given with the request -> WIT `request-start.body`. */
export const startBodyOf = (request) => (request.body === undefined ? undefined : hexBytes(request.body));

export const headOf = (request) => ({ method: request.method, pathAndQuery: request.path_and_query, headers: headersOf(request.headers) });

const withSql = (session, statements) => statements.map((s) => ({ query: s.query, sql: session.sql[s.query], params: s.params }));
const FINAL = ["respond", "pass-through", "propagate"];

/**
 * The host's side of the transactional actions of a database vector
 * (conformance/README.md, "The handler's transaction"), on the package's own
 * transactions (`db.begin()`: better-sqlite3, pg, D1). Returns the event to
 * feed for `action`, or undefined when the action is not one it performs.
 */
function transactions(v, session, db, counters) {
  let tx = null;
  return {
    async event(step, action) {
      if (db === null) return undefined;
      if (action.tag === "run-handler" && action.val.transaction) {
        // SPEC 10.2: the transaction opens (deferred on SQLite: no lock yet),
        // another request may change the table, then the handler writes inside it.
        tx = await db.begin();
        counters.transactions++;
        if (step.rows !== undefined) await db.replaceRows(step.rows);
        for (const w of step.handler_writes ?? []) await db.write(tx.handle, w);
        return undefined; // the step's feed follows
      }
      if (step.feed !== undefined) return undefined; // scripted: the transaction is left as it is
      switch (action.tag) {
        case "complete-in-transaction":
          if (tx === null) throw new Error(`${v.id}: complete-in-transaction without a transaction`);
          try {
            return { tag: "batch-done", val: await tx.execute(withSql(session, action.val)) };
          } catch (error) {
            if (!error?.batchError) throw error;
            return { tag: "batch-failed", val: error.batchError };
          }
        case "commit":
          if (tx === null) throw new Error(`${v.id}: commit without a transaction`);
          try {
            await tx.commit();
          } catch (error) {
            if (!error?.batchError) throw error;
            return { tag: "commit-failed", val: error.batchError }; // still open, for the rollback
          }
          tx = null;
          return { tag: "committed" };
        case "rollback":
          if (tx === null) throw new Error(`${v.id}: rollback without a transaction`);
          await tx.rollback();
          tx = null;
          return { tag: "rolled-back" };
        default:
          return undefined;
      }
    },
    /** The exchange ended: a transaction still open is rolled back (the host drops it with its connection). */
    async end() {
      if (tx !== null) await tx.rollback();
      tx = null;
    },
  };
}

/**
 * Runs one exchange vector, stepped, through `session` (a Session of this
 * package). `db` (database vectors): { batch(statements with sql) ->
 * Promise<results> (throws a BatchFailure), replaceRows(rows) -> Promise
 * (on another connection), begin() -> the package's transaction on the
 * runner's connection, write(handle, write) -> Promise (one handler_writes
 * insert through the transaction's handle) }. `hash(prefix, bytes)`
 * (optional, may be async): feed `body-hashed` with it where the vector
 * feeds `body` (`body-too-large` for a body over the cap). `counters.transactions`
 * counts the handler transactions opened. Returns the actions got, one per
 * step, in the vectors' spelling (the caller compares them with the steps'
 * `expect`).
 */
export async function runExchange(v, session, { db = null, hash = null, counters = { transactions: 0 } } = {}) {
  const got = [];
  const host = transactions(v, session, db, counters);
  let { action, exchange } = session.start(headOf(v.request), v.request.principal ?? undefined, v.request.now, "stepped", v.request.transactional, startBodyOf(v.request));
  try {
    for (let i = 0; i < v.steps.length; i++) {
      const step = v.steps[i];
      got.push(actionJson(action));
      if (i === v.steps.length - 1) {
        if (!FINAL.includes(action.tag)) got.push({ "left-open": action.tag });
        break;
      }
      // A final action may still be fed (an event after the end): the same exchange answers it.
      if (exchange === undefined) {
        got.push({ "no-exchange-to-feed": step.feed ?? null });
        break;
      }
      let event = await host.event(step, action);
      if (event !== undefined) {
        // performed on the database
      } else if (step.feed !== undefined) {
        event = eventOf(step.feed);
        // What a host that hashes natively feeds: the hash, or body-too-large
        // for a body over the cap (it stops reading there, so never hashes one).
        if (hash !== null && event.tag === "body" && action.tag === "read-body") {
          event = BigInt(event.val.length) > action.val.cap ? { tag: "body-too-large" } : { tag: "body-hashed", val: await hash(action.val.prefix, event.val) };
        }
      } else if (action.tag === "run-batch" && db !== null) {
        if (step.rows !== undefined) await db.replaceRows(step.rows);
        try {
          event = { tag: "batch-done", val: await db.batch(withSql(session, action.val)) };
        } catch (error) {
          if (!error?.batchError) throw error;
          event = { tag: "batch-failed", val: error.batchError };
        }
      } else throw new Error(`${v.id} step ${i}: nothing to feed after ${action.tag}`);
      action = exchange.step(step.now, event);
    }
  } finally {
    exchange?.drop();
    await host.end();
  }
  return got;
}

/**
 * Runs one exchange vector driven (not the `stepped_only` ones, which feed a
 * batch an event only a stepped host can): the component runs the batches through
 * the ledger import, which checks each `run-batch` step's statements and
 * runs them on `db.batchSync` (or returns the step's scripted result); the
 * transactional actions are the host's, performed as runExchange does.
 * Returns the actions got, one per step, as runExchange does.
 */
export async function runExchangeDriven(v, session, db, { counters = { transactions: 0 } } = {}) {
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
    return db.batchSync(withSql(session, statements));
  };
  const host = transactions(v, session, db, counters);
  // With the body given at start, the decision's batches run inside start.
  let { action, exchange } = session.drive(executor, () =>
    session.start(headOf(v.request), v.request.principal ?? undefined, v.request.now, "driven", v.request.transactional, startBodyOf(v.request)),
  );
  try {
    for (;;) {
      const step = v.steps[i++];
      got.push(actionJson(action));
      if (i >= v.steps.length || exchange === undefined) break;
      let event = await host.event(step, action);
      if (event === undefined) {
        if (step.feed === undefined) throw new Error(`${v.id} step ${i - 1}: nothing to feed after ${action.tag}`);
        event = eventOf(step.feed);
      }
      action = session.drive(executor, () => exchange.step(step.now, event));
    }
  } finally {
    exchange?.drop();
    await host.end();
  }
  return got;
}

/** A ticket as the vectors spell it -> WIT `ticket`. */
export const ticketOf = (t) => ({ principal: t.principal, key: t.key, fingerprint: t.fingerprint, generation: BigInt(t.generation), createdAt: BigInt(t.created_at) });

/** A lease (WIT) in the vectors' spelling. */
const leaseJson = (lease) => ({ state: lease.state, log: lease.log ? logJson(lease.log) : null });

/**
 * What one stepped batch of a vector returned, as a WIT result: the scripted
 * `feed` when the vector has one, else `runBatch()`'s rows (its batch error
 * when it throws one).
 */
async function batchResult(v, runBatch) {
  if (v.feed !== undefined) {
    const event = eventOf(v.feed);
    return event.tag === "batch-failed" ? { tag: "err", val: event.val } : { tag: "ok", val: event.val };
  }
  try {
    return { tag: "ok", val: await runBatch() };
  } catch (error) {
    if (!error?.batchError) throw error;
    return { tag: "err", val: error.batchError };
  }
}

/**
 * Runs one renewal vector stepped: `session.renewal(ticket, now)` as one
 * batch on `db` (its `renewalBatch` when it has one; or the scripted
 * `feed`), then `session.renewed`: the lease in the vectors' spelling.
 */
export async function runRenewal(v, session, db) {
  const ticket = ticketOf(v.ticket);
  const statements = session.renewal(ticket, v.now);
  // On the LedgerDb's renewal connection where it has one (what the package runs renewals on).
  const result = await batchResult(v, () => (db.renewalBatch ?? db.batch)(withSql(session, statements)));
  return leaseJson(session.renewed(ticket, result));
}

/** Runs one renewal vector driven: `session.renew(ticket, now)`, its batch through `db.batchSync` (or the scripted `feed`). */
export function runRenewalDriven(v, session, db) {
  const ticket = ticketOf(v.ticket);
  const executor = (statements) => {
    if (v.feed !== undefined) {
      const event = eventOf(v.feed);
      if (event.tag === "batch-failed") throw { batchError: event.val };
      return event.val;
    }
    return db.batchSync(withSql(session, statements));
  };
  return leaseJson(session.renew(executor, ticket, v.now));
}

/** Runs one sweep vector: { deleted, more, log } in the vectors' spelling. */
export async function runSweep(v, session, db) {
  const statements = session.sweep(v.now);
  const report = session.swept(await batchResult(v, () => db.batch(withSql(session, statements))));
  return { deleted: Number(report.deleted), more: report.more, log: report.log ? logJson(report.log) : null };
}
