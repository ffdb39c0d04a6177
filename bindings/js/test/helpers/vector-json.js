// Conformance-vector JSON <-> WIT values, and the runner of the database
// kinds (decision, completion, abandon, sweep) over any LedgerDb. Pure JS:
// used by the Node suites (better-sqlite3, PostgreSQL) and inside workerd (D1).

export const COLUMNS = [
  "principal", "key", "fingerprint", "status", "generation",
  "response_status", "response_body", "response_headers", "created_at", "updated_at",
];

/** The fields each kind's vectors carry (a runner fails on any other). */
export const FIELDS = {
  fingerprint: ["id", "spec", "config", "method", "path_and_query", "headers", "body_hex", "prefix", "fingerprint"],
  admission: ["id", "spec", "config", "method", "path_and_query", "headers", "principal", "expect"],
  decision: ["id", "spec", "config", "rows", "principal", "key", "fingerprint", "now", "waiting_since", "expect", "rows_after"],
  completion: ["id", "spec", "config", "rows", "ticket", "response", "now", "expect", "rows_after"],
  abandon: ["id", "spec", "config", "rows", "ticket", "reason", "expect", "rows_after"],
  sweep: ["id", "spec", "config", "rows", "now", "expect", "rows_after"],
  classify: ["id", "spec", "dialect", "error", "expect"],
  error: ["id", "spec", "config", "error", "expect"],
  log: ["id", "spec", "config", "event", "expect"],
  config: ["id", "spec", "profile", "overrides", "expect"],
};
export const KINDS = Object.keys(FIELDS);
export const DATABASE_KINDS = ["decision", "completion", "abandon", "sweep"];

/** Throws unless `v` has exactly the fields of its kind. */
export function checkFields(kind, v) {
  const want = FIELDS[kind];
  if (!want) throw new Error(`unknown vector kind ${kind}`);
  const got = Object.keys(v);
  const unknown = got.filter((f) => !want.includes(f));
  const missing = want.filter((f) => !got.includes(f));
  if (unknown.length || missing.length) throw new Error(`${v.id}: unknown fields [${unknown}] missing fields [${missing}]`);
}

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

/** A vector's WIT-spelled config overrides as package options; throws on an unknown field. */
export function optionsOf(id, config) {
  const out = {};
  for (const [name, value] of Object.entries(config)) {
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
export const responseJson = (r) => ({ status: r.status, headers: r.headers.map((h) => [h.name, h.value]), body: r.body ?? null });
export const ticketOf = (t) => ({ principal: t.principal, key: t.key, fingerprint: t.fingerprint, generation: BigInt(t.generation), createdAt: BigInt(t.created_at) });
export const ticketJson = (t) => ({ principal: t.principal, key: t.key, fingerprint: t.fingerprint, generation: Number(t.generation), created_at: Number(t.createdAt) });

export function ledgerErrorOf(e) {
  return "message" in e ? { tag: e.kind, val: e.message } : { tag: e.kind };
}
export function ledgerErrorJson(e) {
  return e.val === undefined ? { kind: e.tag } : { kind: e.tag, message: e.val };
}
export function protocolErrorOf(e) {
  if (e.kind === "ledger") return { tag: "ledger", val: ledgerErrorOf(e.ledger) };
  return { tag: e.kind, val: e.message };
}
export function protocolErrorJson(e) {
  if (e.tag === "ledger") return { kind: "ledger", ledger: ledgerErrorJson(e.val) };
  return { kind: e.tag, message: e.val };
}
export function batchErrorOf(e) {
  if (e.kind === "database") return { tag: "database", val: e.code === null ? { message: e.message } : { code: e.code, message: e.message } };
  return { tag: e.kind, val: e.message };
}
export function logEventOf(e) {
  switch (e.kind) {
    case "decision-failed":
      return { tag: e.kind, val: { principal: e.principal, key: e.key, error: protocolErrorOf(e.error) } };
    case "completion-failed":
    case "release-failed":
      return { tag: e.kind, val: { ticket: ticketOf(e.ticket), error: protocolErrorOf(e.error) } };
    case "fenced-out":
      return { tag: e.kind, val: ticketOf(e.ticket) };
    case "abandoned":
      return { tag: e.kind, val: { ticket: ticketOf(e.ticket), reason: e.reason, released: e.released, detail: e.detail } };
    case "sweep-failed":
      return { tag: e.kind, val: protocolErrorOf(e.error) };
    default:
      throw new Error(`unknown log event kind ${e.kind}`);
  }
}

export function admissionJson(a) {
  if (a.tag === "pass-through") return { kind: "pass-through" };
  if (a.tag === "protected") return { kind: "protected", key: a.val.key };
  return { kind: "reject", reason: a.val.reason, response: responseJson(a.val.response) };
}

export function decisionJson(d) {
  if (d.tag === "execute") return { kind: "execute", generation: Number(d.val.generation), created_at: Number(d.val.createdAt) };
  if (d.tag === "replay") return { kind: "replay", response: responseJson(d.val) };
  if (d.tag === "wait") return { kind: "wait", ms: d.val };
  return { kind: "reject", reason: d.val.reason, response: responseJson(d.val.response) };
}

export function mutationOf(r) {
  const body = "body_text" in r ? { tag: "text", val: r.body_text } : { tag: "bytes", val: hexBytes(r.body_hex) };
  return { status: r.status, headers: headersOf(r.headers), body };
}

/**
 * Runs one database-kind vector through `session` (a Session of this
 * package) on `db` (a LedgerDb, or { batch } whose errors fail the test):
 * returns `{ got, expect }` in the vector's JSON shape, plus `rowsCount`
 * handled by the caller. `way` "steps" (plan + one batch + decide/finish)
 * or "driven" (the core's run-* through the ledger import; needs db.batchSync).
 */
export async function runDatabaseVector(kind, v, session, db, way = "steps") {
  const driven = way === "driven";
  const drive = (fn) => session.drive((statements) => db.batchSync(statements), fn);
  if (kind === "decision") {
    const args = [v.principal, v.key, v.fingerprint];
    let d;
    if (driven) d = drive((s) => s.runDecision(...args, BigInt(v.now), BigInt(v.waiting_since)));
    else d = session.decide(...args, v.now, v.waiting_since, await db.batch(session.planDecision(...args, v.now)));
    return { got: decisionJson(d), expect: v.expect };
  }
  if (kind === "completion") {
    const ticket = ticketOf(v.ticket);
    const response = mutationOf(v.response);
    if (driven) {
      const c = drive((s) => s.runCompletion(ticket, response, BigInt(v.now)));
      const e = v.expect;
      const got = { outcome: c.outcome, response: responseJson(c.response), send_mutation_body: c.sendMutationBody, sweep_due: c.sweepDue };
      const expect = { outcome: e.outcome, response: e.response, send_mutation_body: e.send_mutation_body, sweep_due: e.sweep_due };
      // The plan's own line comes first; a fenced-out write adds the core's line after it.
      got.first_log = c.log[0] ?? null;
      expect.first_log = e.log ?? (e.outcome === "fenced-out" ? got.first_log : null);
      return { got, expect };
    }
    const plan = session.planCompletion(ticket, response, v.now);
    const outcome = session.finishCompletion(plan.action, await db.batch(plan.statements));
    const got = {
      action: plan.action,
      outcome,
      response: responseJson(plan.response),
      send_mutation_body: plan.sendMutationBody,
      sweep_due: plan.sweepDue,
      log: plan.log ?? null,
    };
    return { got, expect: v.expect };
  }
  if (kind === "abandon") {
    const ticket = ticketOf(v.ticket);
    if (driven) {
      const released = drive((s) => s.runAbandon(ticket, v.reason));
      return { got: { released }, expect: { released: v.expect.released } };
    }
    const statements = session.planAbandon(ticket, v.reason);
    const released = statements ? session.finishRelease(await db.batch(statements)) : false;
    return { got: { planned: !!statements, released }, expect: v.expect };
  }
  if (kind === "sweep") {
    let r;
    if (driven) r = drive((s) => s.runSweep(BigInt(v.now)));
    else r = session.finishSweep(await db.batch(session.planSweep(v.now)));
    return { got: { deleted: Number(r.deleted), more: r.more }, expect: { deleted: v.expect.deleted, more: v.expect.more } };
  }
  throw new Error(`not a database kind: ${kind}`);
}
