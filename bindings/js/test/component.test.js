// The package's component binding (src/component.js over src/abi.js, with the
// type table generated from the WIT into generated/wit.js) checked three ways:
// - the generated table is what scripts/wit-table.js makes of wit/*.wit now;
// - against the core module jco extracted: every export and import has the
//   core signature the binding derives from the table, and every function
//   the core module exports is bound;
// - against jco's generated glue on the same component (generated/core.js,
//   not shipped): the same calls (sessions, exchanges stepped and driven,
//   sweeps, migrations, every conformance vector once the vectors are in
//   format 3) give the same values and the same errors through both.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { test } from "node:test";
import { coreSignatures, instantiate as bind } from "../src/component.js";
import { generate, render } from "../scripts/wit-table.js";
import { FORMAT_3, doc } from "./helpers/vectors.js";
import { dialectOf, eventOf, headOf, optionsOf, resultsOf, runExchange, runExchangeDriven, runRenewal, runRenewalDriven, runSweep, ticketOf } from "./helpers/vector-json.js";
import { vectorDb } from "./helpers/sqlite.js";

const generated = (name) => new URL(`../generated/${name}`, import.meta.url);
const coreBytes = readFileSync(generated("core.core.wasm"));

test("generated/wit.js is the type table of wit/*.wit as it is now", () => {
  const dir = fileURLToPath(new URL("../../../wit", import.meta.url));
  assert.equal(readFileSync(generated("wit.js"), "utf8"), render(generate(dir), "wit/*.wit"), "run make -C bindings/js build");
});

/** The core module's imports and exports with their function types. */
function coreFunctions(bytes) {
  let i = 8;
  const leb = () => {
    let result = 0;
    let shift = 0;
    let b;
    do {
      b = bytes[i++];
      result += (b & 0x7f) * 2 ** shift;
      shift += 7;
    } while (b & 0x80);
    return result;
  };
  const name = () => {
    const n = leb();
    const s = bytes.subarray(i, i + n).toString("utf8");
    i += n;
    return s;
  };
  const VAL = { 0x7f: "i32", 0x7e: "i64", 0x7d: "f32", 0x7c: "f64" };
  const types = [];
  const funcTypes = []; // function index space: imports first
  const imports = {};
  const exports = {};
  while (i < bytes.length) {
    const id = bytes[i++];
    const size = leb();
    const end = i + size;
    if (id === 1) {
      for (let n = leb(); n > 0; n--) {
        assert.equal(bytes[i++], 0x60);
        const params = [];
        for (let p = leb(); p > 0; p--) params.push(VAL[bytes[i++]]);
        const results = [];
        for (let r = leb(); r > 0; r--) results.push(VAL[bytes[i++]]);
        types.push({ params, results });
      }
    } else if (id === 2) {
      for (let n = leb(); n > 0; n--) {
        const module = name();
        const field = name();
        const kind = bytes[i++];
        if (kind === 0) {
          const t = types[leb()];
          funcTypes.push(t);
          imports[`${module}::${field}`] = t;
        } else if (kind === 1) {
          i++;
          const flags = leb();
          leb();
          if (flags & 1) leb();
        } else if (kind === 2) {
          const flags = leb();
          leb();
          if (flags & 1) leb();
        } else if (kind === 3) i += 2;
      }
    } else if (id === 3) {
      for (let n = leb(); n > 0; n--) funcTypes.push(types[leb()]);
    } else if (id === 7) {
      for (let n = leb(); n > 0; n--) {
        const field = name();
        const kind = bytes[i++];
        const index = leb();
        if (kind === 0) exports[field] = funcTypes[index];
      }
    }
    i = end;
  }
  return { imports, exports };
}

test("the binding's core signatures are the core module's, and it binds every function the module exports", () => {
  const core = coreFunctions(coreBytes);
  const want = coreSignatures();
  assert.deepEqual(core.imports, want.imports, "imports");
  for (const [name, sig] of Object.entries(want.exports)) assert.deepEqual(core.exports[name], sig, name);
  const bound = new Set(Object.keys(want.exports));
  const unbound = Object.keys(core.exports).filter((name) => !name.startsWith("cabi_") && !bound.has(name));
  assert.deepEqual(unbound, [], "exports of the core module that the binding does not bind (wit/ changed?)");
  for (const [name, sig] of Object.entries(core.exports)) {
    if (name.startsWith("cabi_post_")) assert.deepEqual(sig, { params: ["i32"], results: [] }, name);
  }
});

// ---------------------------------------------------------------------------
// The same calls through both bindings.

const { instantiate: jco } = await import(generated("core.js").href);
const jcoModules = Object.fromEntries(
  [...new Set(readFileSync(generated("core.js"), "utf8").match(/core\.core\d*\.wasm/g))].map((n) => [n, new WebAssembly.Module(readFileSync(generated(n)))]),
);
const DISPOSE = Symbol.dispose ?? Symbol.for("dispose");

/** A root of either binding, with an executor slot for the driven calls. */
function root(instantiate) {
  const state = { executor: null };
  const ledger = {
    executeBatch(statements) {
      if (state.executor === null) throw { tag: "host", val: "no executor" };
      return state.executor(statements);
    },
  };
  const r = instantiate((n) => jcoModules[n], { "idempotency:ledger/ledger": ledger });
  return { ...r.session, Exchange: r.exchange.Exchange, state };
}
const ours = root(bind);
const theirs = root(jco);

/**
 * A session of either binding with the surface the vector runners use
 * (what src/runtime.js's Session offers, without the runtime).
 */
function sessionOn(r, config) {
  const s = r.Session.open(config);
  const sql = Object.fromEntries(r.queries(config.dialect).map((q) => [q.query, q.sql]));
  return {
    sql,
    raw: s,
    start(head, principal, now, mode, transactional = false, body = undefined) {
      const started = s.start({ head, principal: principal ?? undefined, now: BigInt(now), mode, transactional, body });
      const x = started.exchange;
      return { action: started.action, exchange: x && { step: (n, e) => x.step(BigInt(n), e), drop: () => x[DISPOSE]() } };
    },
    sweep: (now) => s.sweep(BigInt(now)),
    swept: (result) => s.swept(result),
    renewal: (ticket, now) => s.renewal(ticket, BigInt(now)),
    renewed: (ticket, result) => s.renewed(ticket, result),
    renew(executor, ticket, now) {
      return this.drive(executor, () => s.renew(ticket, BigInt(now)));
    },
    drive(executor, fn) {
      r.state.executor = (statements) => {
        try {
          return executor(statements);
        } catch (error) {
          throw error?.batchError ?? error;
        }
      };
      try {
        return fn();
      } finally {
        r.state.executor = null;
      }
    },
  };
}

/** The value or the error a call gives, comparable across the bindings. */
async function outcome(fn) {
  try {
    return { value: await fn() };
  } catch (error) {
    if (error && Object.prototype.hasOwnProperty.call(error, "payload")) return { payload: error.payload };
    return { threw: error?.constructor?.name };
  }
}

/** Runs `fn(rootOfOneBinding)` on both bindings; asserts the same outcome; returns it. */
async function same(what, fn) {
  const a = await outcome(() => fn(ours));
  const b = await outcome(() => fn(theirs));
  assert.deepEqual(a, b, what);
  return a;
}

function configOf(r, options = {}, dialect = "sqlite") {
  const c = r.defaultConfig(options.profile ?? "recipe");
  const SETTINGS = {
    protectedMethods: "list", fingerprintHeaders: "list", replayHeaders: "list", pendingTtlMs: "big", retentionMs: "big", bodyCapBytes: "num",
    requestBodyCapBytes: "big", sweepBatch: "num", sweepEvery: "num", keyRequired: "bool", replayHeader: "opt", inProgressRetryMs: "optbig", waitMs: "big", onServerError: "enum",
    leaseRenewal: "bool",
  };
  for (const [name, kind] of Object.entries(SETTINGS)) {
    const value = options[name];
    if (value === undefined) continue;
    c[name] = kind === "big" ? BigInt(value) : kind === "optbig" ? (value === null ? undefined : BigInt(value)) : kind === "opt" ? (value ?? undefined) : value;
  }
  c.dialect = dialect;
  return c;
}

/** A database per binding and scenario: the runners' `db` over a fresh better-sqlite3 file (closed by `closeAll`). */
const open = [];
function fileDb(rows = []) {
  const db = vectorDb(rows);
  open.push(db);
  return db;
}
function closeAll() {
  for (const db of open.splice(0)) db.close();
}

const T = 1_767_225_600_000;
const keyed = (key, extra = []) => ({ method: "POST", path_and_query: "/orders", headers: [["Idempotency-Key", key], ["Content-Type", "application/json"], ...extra], principal: "acct", now: T });

/**
 * A scripted exchange in the vectors' shape (only what the runners read):
 * `feeds` are events in the vectors' spelling, or "db" for "run this batch
 * on the database".
 */
const scripted = (id, options, request, feeds) => ({
  id,
  options,
  database: true,
  rows: [],
  request,
  steps: [...feeds.map((feed, i) => (feed === "db" ? { expect: {}, now: T + i } : { expect: {}, now: T + i, feed })), { expect: {} }],
});

const answered = (status, body, headers = [["Content-Type", "application/json"], ["X-Frame-Options", "DENY"], ["Set-Cookie", "s=1"]]) => ({ "handler-done": { answered: { status, headers, body_text: body } } });
const body = (text) => ({ body: Buffer.from(text).toString("hex") });
const SCENARIOS = [
  scripted("fresh", {}, keyed("k1"), [body("{}"), "db", answered(201, '{"id":1}'), "db"]),
  scripted("fresh-bytes", {}, keyed("k2"), [body("{}"), "db", { "handler-done": { answered: { status: 200, headers: [], body_hex: "6f6bff" } } }, "db"]),
  scripted("too-big-response", { bodyCapBytes: 4 }, keyed("k3"), [body("{}"), "db", answered(201, "0123456789"), "db"]),
  scripted("ietf-too-big", { profile: "ietf", bodyCapBytes: 4 }, keyed('"k4"'), [body("{}"), "db", answered(201, "0123456789"), "db"]),
  scripted("raised", {}, keyed("k5"), [body("{}"), "db", { "handler-done": { raised: "boom" } }]),
  scripted("raised-release", { onServerError: "release" }, keyed("k6"), [body("{}"), "db", { "handler-done": { raised: "boom" } }, "db"]),
  scripted("nothing-changed", {}, keyed("k7"), [body("{}"), "db", { "handler-done": { "nothing-changed": null } }, "db"]),
  scripted("declined", {}, keyed("k8"), [body("{}"), "db", { "handler-done": { declined: null } }, "db"]),
  scripted("too-large", {}, keyed("k9"), [{ "body-too-large": null }]),
  ...["length-unknown", "incomplete", "consumed"].map((p) => scripted(`unreadable-${p}`, {}, keyed("k10"), [{ "body-unreadable": p }])),
  scripted("hashed-not-hex", {}, keyed("k11"), [{ "body-hashed": "nope" }]),
  scripted("out-of-order", {}, keyed("k12"), [{ slept: null }]),
  scripted("declared-too-large", { requestBodyCapBytes: 4 }, keyed("k13", [["Content-Length", "5"]]), []),
  scripted("no-principal", {}, { ...keyed("k14"), principal: null }, []),
  scripted("long-principal", {}, { ...keyed("k15"), principal: "p".repeat(5000) }, []),
  scripted("no-key", {}, { ...keyed("x"), headers: [] }, []),
  scripted("unprotected", {}, { ...keyed("k16"), method: "GET" }, []),
  scripted("unicode", {}, keyed("k17", [["X-Api-Version", "é".repeat(3000) + "😀\ud800"]]), [body("é".repeat(40_000)), "db", answered(201, "日本".repeat(100)), "db"]),
  ...[
    { kind: "database", code: "SQLITE_BUSY", message: "database is locked" },
    { kind: "database", code: null, message: "D1_ERROR: Network connection lost." },
    { kind: "pool-exhausted", message: "p" },
    { kind: "unreachable", message: "u" },
    { kind: "outcome-unknown", message: "o" },
    { kind: "host", message: "h" },
  ].flatMap((e, i) => [
    scripted(`decision-failed-${i}`, {}, keyed(`kf${i}`), [body("{}"), { "batch-failed": e }]),
    scripted(`completion-failed-${i}`, {}, keyed(`kc${i}`), [body("{}"), "db", answered(201, "{}"), { "batch-failed": e }]),
  ]),
  scripted("malformed-results", {}, keyed("k18"), [body("{}"), { "batch-done": [{ rows: [[null, -9007199254740991, { real: -0.5 }, "ü", { blob: "00ff" }]], changes: 3 }] }]),
  // Transactional: the completion in the handler's transaction, then commit or rollback (on the file).
  scripted("tx-fresh", {}, { ...keyed("t1"), transactional: true }, [body("{}"), "db", answered(201, '{"id":1}'), "db", "db"]),
  scripted("tx-renewal-off", { leaseRenewal: false }, { ...keyed("t2"), transactional: true }, [body("{}"), "db", answered(201, "{}"), "db", "db"]),
  scripted("tx-raised", {}, { ...keyed("t3"), transactional: true }, [body("{}"), "db", { "handler-done": { raised: "boom" } }, "db", "db"]),
  scripted("tx-commit-unknown", {}, { ...keyed("t4"), transactional: true }, [body("{}"), "db", answered(201, "{}"), "db", { "commit-failed": { kind: "outcome-unknown", message: "o" } }]),
  scripted("tx-commit-busy", {}, { ...keyed("t5"), transactional: true }, [body("{}"), "db", answered(201, "{}"), "db", { "commit-failed": { kind: "database", code: "SQLITE_BUSY", message: "database is locked" } }, "db", "db"]),
  scripted("tx-completion-failed", {}, { ...keyed("t6"), transactional: true }, [body("{}"), "db", answered(201, "{}"), { "batch-failed": { kind: "database", code: "SQLITE_CONSTRAINT_NOTNULL", message: "NOT NULL constraint failed: idempotency_keys.status" } }, "db", "db"]),
  scripted("tx-events-out-of-order", {}, { ...keyed("t7"), transactional: true }, [body("{}"), "db", { committed: null }]),
];

test("the same values and errors as jco's glue: defaults, schema, queries, settings", async () => {
  for (const profile of ["recipe", "ietf", "other"]) await same(`default-config ${profile}`, (r) => r.defaultConfig(profile));
  for (const dialect of ["sqlite", "postgres", "other"]) {
    await same(`schema ${dialect}`, (r) => r.schema(dialect));
    await same(`queries ${dialect}`, (r) => r.queries(dialect));
  }
  for (const options of [{}, { profile: "ietf" }, { pendingTtlMs: 0 }, { replayHeaders: ["set-cookie"] }, { waitMs: 99_999 }, { protectedMethods: ["P O S T"] }]) {
    await same(`open ${JSON.stringify(options)}`, (r) => {
      const s = r.Session.open(configOf(r, options));
      return [s.config(), s.protectedMethods(), s.fault(), s.migration(), s.sweep(T)];
    });
  }
  // One deliberate difference: jco stores an integer out of its WIT type's
  // range modulo 2^bits (a sweep batch of -1 became 4294967295, a TTL of 2^64
  // ms became 0, a `now` of 2^63 became -2^63); this binding refuses it
  // (TypeError), as it refuses any value of the wrong type.
  assert.equal((await outcome(() => ours.Session.open({ ...ours.defaultConfig("recipe"), sweepBatch: -1 }))).threw, "TypeError");
  assert.equal((await outcome(() => ours.Session.open({ ...ours.defaultConfig("recipe"), pendingTtlMs: 2n ** 64n }))).threw, "TypeError");
  assert.equal((await outcome(() => ours.Session.open(ours.defaultConfig("recipe")).sweep(2n ** 63n))).threw, "TypeError");
  await same("not a string", (r) => r.Session.open({ ...r.defaultConfig("recipe"), protectedMethods: [1] }));
  await same("unknown enum", (r) => r.Session.open({ ...r.defaultConfig("recipe"), dialect: "mysql" }));
  await same("an event of no known kind", (r) => {
    const s = r.Session.open(r.defaultConfig("recipe"));
    const { exchange } = s.start({ head: headOf(keyed("k")), principal: "p", now: 1n, mode: "stepped" });
    return exchange.step(1n, { tag: "nope" });
  });
});

test("the same values and errors as jco's glue: exchanges stepped and driven, sweeps, migrations", async () => {
  const cases = [...SCENARIOS, ...(FORMAT_3 ? doc.exchange : [])];
  for (const v of cases) {
    const opts = v.options ?? optionsOf(v.id, v.config);
    const dialect = v.options ? "sqlite" : dialectOf(v, "sqlite");
    const stepped = (r) => runExchange(v, sessionOn(r, configOf(r, opts, dialect)), { db: v.database ? fileDb(v.rows) : null });
    const driven = (r) => runExchangeDriven(v, sessionOn(r, configOf(r, opts, dialect)), v.database ? fileDb(v.rows) : null);
    const a = await same(`${v.id} (stepped)`, stepped);
    assert.ok(a.value?.length > 0, `${v.id}: ran`);
    if (!v.stepped_only) await same(`${v.id} (driven)`, driven);
    closeAll();
  }
  for (const v of FORMAT_3 ? doc.renewal : []) {
    await same(`${v.id} (stepped)`, (r) => runRenewal(v, sessionOn(r, configOf(r, optionsOf(v.id, v.config), dialectOf(v, "sqlite"))), fileDb(v.rows)));
    await same(`${v.id} (driven)`, (r) => runRenewalDriven(v, sessionOn(r, configOf(r, optionsOf(v.id, v.config), dialectOf(v, "sqlite"))), fileDb(v.rows)));
    closeAll();
  }
  for (const v of FORMAT_3 ? doc.sweep : []) {
    await same(`${v.id}`, (r) => runSweep(v, sessionOn(r, configOf(r, optionsOf(v.id, v.config))), fileDb(v.rows)));
  }
  await same("renewal of a ticket whose row is gone", (r) => {
    const s = sessionOn(r, configOf(r));
    const ticket = ticketOf({ principal: "p", key: "k", fingerprint: "f".repeat(64), generation: 2, created_at: T });
    return [s.renewal(ticket, T), s.renewed(ticket, { tag: "ok", val: resultsOf([{ rows: [], changes: 0 }]) }), s.renewed(ticket, { tag: "err", val: eventOf({ "batch-failed": { kind: "unreachable", message: "u" } }).val })];
  });
  const expired = Array.from({ length: 3 }, (_, i) => ({
    principal: "p", key: `k${i}`, fingerprint: "f".repeat(64), status: "completed", generation: 1, response_status: 201, response_body: "{}", response_headers: "{}", created_at: 0, updated_at: 0,
  }));
  await same("sweep and swept", (r) => runSweep({ now: T, feed: undefined }, sessionOn(r, configOf(r, { sweepBatch: 2 })), fileDb(expired)));
  await same("swept, every value kind", (r) => sessionOn(r, configOf(r)).swept({ tag: "ok", val: resultsOf([{ rows: [[null, 1, { real: 1.5 }, "t", { blob: "00" }]], changes: 2 ** 53 - 1 }]) }));
  for (const e of [{ kind: "database", code: "40001", message: "serialization" }, { kind: "pool-exhausted", message: "p" }, { kind: "host", message: "h" }]) {
    await same(`swept, failed: ${e.kind}`, (r) => sessionOn(r, configOf(r, {}, "postgres")).swept({ tag: "err", val: eventOf({ "batch-failed": e }).val }));
    await same(`run-sweep and migrate driven, failing: ${e.kind}`, (r) => {
      const s = sessionOn(r, configOf(r, {}, "postgres"));
      return s.drive(() => {
        throw eventOf({ "batch-failed": e }).val;
      }, () => [s.raw.runSweep(1n), (() => {
        try {
          return s.raw.migrate();
        } catch (error) {
          return { payload: error.payload };
        }
      })()]);
    });
  }
  await same("migrate driven on a file", (r) => {
    const s = sessionOn(r, configOf(r));
    const db = fileDb();
    return s.drive((statements) => db.batchSync(statements.map((x) => ({ sql: s.sql[x.query], params: x.params }))), () => s.raw.migrate());
  });
  closeAll();
});

test("a trap or a failing ledger import leaves the instance unusable (the runtime then discards it)", () => {
  const r = root(bind);
  const s = r.Session.open(r.defaultConfig("recipe"));
  r.state.executor = () => [{ rows: [[{ tag: "nope" }]], changes: 0n }]; // not a WIT value: the import cannot lower it
  assert.throws(() => s.runSweep(1n), WebAssembly.RuntimeError);
  assert.throws(() => s.sweep(1n), WebAssembly.RuntimeError, "not entered again");
  assert.throws(() => r.Session.open(r.defaultConfig("recipe")), WebAssembly.RuntimeError);
});
