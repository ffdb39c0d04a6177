// The package's component binding (src/component.js, the canonical ABI
// written out from wit/*.wit) checked two ways:
// - against the core module jco extracted: every export and import has the
//   core signature the binding derives from its WIT types, and every function
//   the core module exports is bound;
// - against jco's generated glue on the same core module (generated/core.js,
//   not shipped): every conformance vector's calls, through the step API and
//   the driven API, give the same values and the same errors through both.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";
import { coreSignatures, instantiate as bind } from "../src/component.js";
import { sqliteLedger } from "../src/sqlite.js";
import { doc } from "./helpers/vectors.js";
import { batchErrorOf, headersOf, hexBytes, logEventOf, mutationOf, optionsOf, protocolErrorOf, ticketOf } from "./helpers/vector-json.js";
import { freshDb, insertRows } from "./helpers/sqlite.js";

const generated = (name) => new URL(`../generated/${name}`, import.meta.url);
const coreBytes = readFileSync(generated("core.core.wasm"));

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

/** A root of either binding, with an executor slot for the driven API. */
function root(instantiate) {
  const state = { executor: null };
  const ledger = {
    executeBatch(statements) {
      try {
        return state.executor(statements);
      } catch (error) {
        throw error.batchError ?? { tag: "host", val: String(error.message) };
      }
    },
  };
  const r = instantiate((n) => jcoModules[n], { "idempotency:ledger/ledger": ledger, "idempotency:ledger/ledger@0.2.0": ledger });
  return { ...r.session, state };
}
const ours = root(bind);
const theirs = root(jco);

/** The value or the error a call gives, comparable across the bindings. */
function outcome(fn) {
  try {
    return { value: fn() };
  } catch (error) {
    if (error && Object.prototype.hasOwnProperty.call(error, "payload")) return { payload: error.payload };
    return { threw: error?.constructor?.name };
  }
}

/** Runs `fn(rootOfOneBinding)` on both bindings; asserts the same outcome; returns it. */
function same(what, fn) {
  const a = outcome(() => fn(ours));
  const b = outcome(() => fn(theirs));
  assert.deepEqual(a, b, what);
  return a;
}

function configOf(r, v, dialect = "sqlite") {
  const options = optionsOf(v.id, v.config ?? {});
  const c = r.defaultConfig(options.profile ?? "recipe");
  const SETTINGS = {
    protectedMethods: "list", fingerprintHeaders: "list", replayHeaders: "list", pendingTtlMs: "big", retentionMs: "big", bodyCapBytes: "num",
    requestBodyCapBytes: "big", sweepBatch: "num", sweepEvery: "num", keyRequired: "bool", replayHeader: "opt", inProgressRetryMs: "optbig", waitMs: "big", onServerError: "enum",
  };
  for (const [name, kind] of Object.entries(SETTINGS)) {
    const value = options[name];
    if (value === undefined) continue;
    c[name] = kind === "big" ? BigInt(value) : kind === "optbig" ? (value === null ? undefined : BigInt(value)) : kind === "opt" ? (value ?? undefined) : value;
  }
  c.dialect = dialect;
  return c;
}

const sessionOf = (r, v, dialect) => r.Session.open(configOf(r, v, dialect));
const headOf = (v) => ({ method: v.method, pathAndQuery: v.path_and_query, headers: headersOf(v.headers) });

test("the same values and errors as jco's glue: defaults, schema, settings", () => {
  for (const profile of ["recipe", "ietf", "other"]) same(`default-config ${profile}`, (r) => r.defaultConfig(profile));
  for (const dialect of ["sqlite", "postgres"]) same(`schema ${dialect}`, (r) => r.schema(dialect));
  for (const v of doc.config) {
    same(v.id, (r) => {
      const s = r.Session.open(configOf(r, { id: v.id, config: { profile: v.profile, ...v.overrides } }));
      return [s.config(), s.policy(), s.bodyTooLarge()];
    });
  }
  // values the core or the binding refuses
  // One deliberate difference: jco stores an integer out of its WIT type's
  // range modulo 2^bits (a sweep batch of -1 became 4294967295, a TTL of 2^64
  // ms became 0, a `now` of 2^63 became -2^63); this binding refuses it
  // (TypeError), as it refuses any value of the wrong type.
  assert.equal(outcome(() => ours.Session.open({ ...ours.defaultConfig("recipe"), sweepBatch: -1 })).threw, "TypeError");
  assert.equal(outcome(() => ours.Session.open({ ...ours.defaultConfig("recipe"), pendingTtlMs: 2n ** 64n })).threw, "TypeError");
  assert.equal(outcome(() => ours.Session.open(ours.defaultConfig("recipe")).planSweep(2n ** 63n)).threw, "TypeError");
  same("not a string", (r) => r.Session.open({ ...r.defaultConfig("recipe"), protectedMethods: [1] }));
  same("unknown enum", (r) => r.Session.open({ ...r.defaultConfig("recipe"), dialect: "mysql" }));
});

test("the same values and errors as jco's glue: every non-database vector", () => {
  for (const v of doc.fingerprint) {
    same(v.id, (r) => {
      const s = sessionOf(r, v);
      return [s.fingerprintPrefix(headOf(v)), s.fingerprint(headOf(v), hexBytes(v.body_hex))];
    });
  }
  for (const v of doc.admission) same(v.id, (r) => sessionOf(r, v).admit(headOf(v), v.principal ?? undefined));
  for (const v of doc.classify) same(v.id, (r) => r.Session.open({ ...r.defaultConfig("recipe"), dialect: v.dialect }).classify(batchErrorOf(v.error)));
  for (const v of doc.error) same(v.id, (r) => sessionOf(r, v).errorResponse(protocolErrorOf(v.error)));
  for (const v of doc.log) same(v.id, (r) => sessionOf(r, v).logLine(logEventOf(v.event)));
  same("unicode and long strings", (r) => {
    const s = r.Session.open(r.defaultConfig("recipe"));
    const long = "é".repeat(5000) + "😀" + "\ud800" + "x".repeat(70);
    const head = { method: "post", pathAndQuery: `/o?q=${long}`, headers: [{ name: "content-type", value: long }, { name: "idempotency-key", value: "k" }] };
    return [s.admit(head, "p"), s.fingerprintPrefix(head), s.fingerprint(head, new Uint8Array(70_000).fill(7))];
  });
});

test("the same values and errors as jco's glue: the database vectors, step and driven", () => {
  let ran = 0;
  for (const kind of ["decision", "completion", "abandon", "sweep"]) {
    for (const v of doc[kind]) {
      // one database per binding and way, with the vector's rows
      const dbs = new Map();
      const dbFor = (r, way) => {
        const k = `${r === ours ? "ours" : "theirs"} ${way}`;
        if (!dbs.has(k)) {
          const db = freshDb();
          insertRows(db, v.rows);
          dbs.set(k, sqliteLedger(db));
        }
        return dbs.get(k);
      };
      const steps = (r) => {
        const s = sessionOf(r, v);
        const run = (statements) => dbFor(r, "steps").batchSync(statements);
        if (kind === "decision") {
          const plan = s.planDecision(v.principal, v.key, v.fingerprint, BigInt(v.now));
          return [plan, s.decide(v.principal, v.key, v.fingerprint, BigInt(v.now), BigInt(v.waiting_since), run(plan))];
        }
        if (kind === "completion") {
          const plan = s.planCompletion(ticketOf(v.ticket), mutationOf(v.response), BigInt(v.now));
          return [plan, s.finishCompletion(plan.action, run(plan.statements))];
        }
        if (kind === "abandon") {
          const plan = s.planAbandon(ticketOf(v.ticket), v.reason);
          return [plan, plan ? s.finishRelease(run(plan)) : null];
        }
        const plan = s.planSweep(BigInt(v.now));
        return [plan, s.finishSweep(run(plan))];
      };
      const driven = (r) => {
        const s = sessionOf(r, v);
        r.state.executor = (statements) => dbFor(r, "driven").batchSync(statements);
        try {
          if (kind === "decision") return s.runDecision(v.principal, v.key, v.fingerprint, BigInt(v.now), BigInt(v.waiting_since));
          if (kind === "completion") return s.runCompletion(ticketOf(v.ticket), mutationOf(v.response), BigInt(v.now));
          if (kind === "abandon") return s.runAbandon(ticketOf(v.ticket), v.reason);
          return s.runSweep(BigInt(v.now));
        } finally {
          r.state.executor = null;
        }
      };
      same(`${v.id} (steps)`, steps);
      same(`${v.id} (driven)`, driven);
      ran++;
    }
  }
  assert.equal(ran, doc.counts.decision + doc.counts.completion + doc.counts.abandon + doc.counts.sweep);
});

test("the same values and errors as jco's glue: every SQL value kind, batch errors and bad results", () => {
  const values = [{ tag: "null" }, { tag: "integer", val: -(2n ** 63n) }, { tag: "integer", val: 2n ** 63n - 1n }, { tag: "real", val: -0.5 }, { tag: "text", val: "ü" }, { tag: "blob", val: new Uint8Array([0, 255]) }];
  const results = [{ rows: [values, []], changes: 2n ** 64n - 1n }];
  same("decide on every value kind (malformed for the decision)", (r) => r.Session.open(r.defaultConfig("recipe")).decide("p", "k", "a".repeat(64), 1n, 1n, results));
  same("finish-sweep on every value kind", (r) => r.Session.open(r.defaultConfig("recipe")).finishSweep(results));
  same("a list in place of a record", (r) => r.Session.open(r.defaultConfig("recipe")).finishSweep([[]]));
  for (const error of [
    { tag: "database", val: { code: "40001", message: "serialization" } },
    { tag: "database", val: { message: "D1_ERROR: no code" } },
    { tag: "pool-exhausted", val: "p" },
    { tag: "unreachable", val: "u" },
    { tag: "outcome-unknown", val: "o" },
    { tag: "host", val: "h" },
  ]) {
    same(`driven call with the batch failing: ${error.tag}`, (r) => {
      const s = r.Session.open({ ...r.defaultConfig("recipe"), dialect: "postgres" });
      r.state.executor = () => {
        throw Object.assign(new Error("failed"), { batchError: error });
      };
      try {
        return s.runSweep(1_000_000_000_000n);
      } finally {
        r.state.executor = null;
      }
    });
  }
});

test("a trap or a failing ledger import leaves the instance unusable (the runtime then discards it)", () => {
  const r = root(bind);
  const s = r.Session.open(r.defaultConfig("recipe"));
  r.state.executor = () => [{ rows: [[{ tag: "nope" }]], changes: 0n }]; // not a WIT value: the import cannot lower it
  assert.throws(() => s.runSweep(1n), WebAssembly.RuntimeError);
  assert.throws(() => s.planSweep(1n), WebAssembly.RuntimeError, "not entered again");
  assert.throws(() => r.Session.open(r.defaultConfig("recipe")), WebAssembly.RuntimeError);
});
