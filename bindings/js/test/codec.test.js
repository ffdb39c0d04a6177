// The generated lift and lower functions (generated/wit.js's `codec`, made by
// scripts/wit-codec.js) against the descriptor walk of src/abi.js, on one
// linear memory: every covered type's values lowered both ways read back the
// same, values written by the walk are lifted the same by both, and a value
// that cannot be lowered is refused with the same error. The parameters
// passed flat (`session.start`'s, `exchange.step`'s) give the same core
// values and write the same bytes both ways.
import assert from "node:assert/strict";
import { test } from "node:test";
import { CODEC_HELPERS, Memory, lay, load, lower, store, typeTable } from "../src/abi.js";
import { TYPES, codec } from "../generated/wit.js";

function memory() {
  const mem = new WebAssembly.Memory({ initial: 1 });
  let top = 8;
  const realloc = (old, oldSize, align, size) => {
    top = Math.ceil(top / align) * align;
    const ptr = top;
    top += Math.max(size, 1);
    while (top > mem.buffer.byteLength) mem.grow(1);
    return ptr;
  };
  return new Memory(mem, realloc);
}

const walk = typeTable(TYPES);
const fast = typeTable(TYPES);
const generated = codec(CODEC_HELPERS);
for (const [name, [lift, lowerTo, flat]] of Object.entries(generated)) {
  if (lift !== undefined) Object.assign(fast(name), { lift, lower: lowerTo });
  if (flat !== undefined) fast(name).flat = flat;
}

const T = (val) => ({ tag: "text", val });
const header = (name, value) => ({ name, value });
const response = { status: 201, headers: [header("content-type", "application/json"), header("location", "/o/1")], body: '{"id":1}' };
const ticket = { principal: "acct", key: "k-1", fingerprint: "f".repeat(64), generation: 3n, createdAt: 1767225600000n };
const results = [
  { rows: [], changes: 1n },
  { rows: [[T("fp"), T("completed"), { tag: "integer", val: -2n }, { tag: "real", val: 1.5 }, { tag: "null" }, { tag: "blob", val: new Uint8Array([0, 255, 7]) }, T("é✓𝄞")]], changes: 0n },
];
const VALUES = {
  "ledger.statement-result": results,
  "ledger.statement": [{ query: "claim", params: [T("acct"), T("k"), { tag: "integer", val: 9007199254740993n }] }, { query: "fence", params: [] }],
  "ledger.batch-error": [{ tag: "database", val: { code: "SQLITE_BUSY", message: "busy" } }, { tag: "database", val: { code: undefined, message: "" } }, { tag: "host", val: "boom" }],
  "exchange.event": [
    { tag: "body", val: new Uint8Array([1, 2, 3]) },
    { tag: "body-hashed", val: "ab".repeat(32) },
    { tag: "body-too-large" },
    { tag: "body-unreadable", val: "consumed" },
    { tag: "batch-done", val: results },
    { tag: "commit-failed", val: { tag: "outcome-unknown", val: "reset" } },
    { tag: "handler-done", val: { tag: "answered", val: { status: 200, headers: [header("X-Order", "1")], body: { tag: "bytes", val: new Uint8Array([123, 125]) } } } },
    { tag: "handler-done", val: { tag: "answered", val: { status: 204, headers: [], body: { tag: "text", val: "" } } } },
    { tag: "handler-done", val: { tag: "raised", val: "Error: x" } },
    { tag: "handler-done", val: { tag: "declined" } },
  ],
  "exchange.action": [
    { tag: "read-body", val: { cap: 1048576n, prefix: "POST\n/orders\n" } },
    { tag: "run-batch", val: [{ query: "lookup", params: [T("acct"), T("k")] }] },
    { tag: "sleep", val: 10 },
    { tag: "run-handler", val: { ticket, renewEveryMs: 10000, transaction: true } },
    { tag: "run-handler", val: { ticket, renewEveryMs: undefined, transaction: false } },
    { tag: "respond", val: { send: { tag: "core", val: response }, close: true, log: [{ level: "warn", message: "m" }], sweep: false, outcome: "replayed" } },
    { tag: "respond", val: { send: { tag: "handler" }, close: false, log: [], sweep: true, outcome: "executed" } },
    { tag: "propagate", val: { log: [], outcome: "abandoned", response: { ...response, body: undefined } } },
    { tag: "commit" },
  ],
};

test("every type each request carries has generated functions", () => {
  for (const name of ["session.started", "exchange.action", "exchange.event", "ledger.statement", "ledger.statement-result", "ledger.batch-error", "types.header", "types.outcome"]) {
    assert.ok(generated[name], name);
  }
});

test("values lowered by the generated functions read back as lowered by the walk; lifted the same from the walk's bytes", () => {
  for (const [name, values] of Object.entries(VALUES)) {
    for (const value of values) {
      const cx = memory();
      const { size, align } = lay(walk(name));
      const a = cx.alloc(align, size);
      store(cx, walk(name), a, value);
      const b = cx.alloc(align, size);
      store(cx, fast(name), b, value);
      cx.refresh();
      const expected = load(cx, walk(name), a);
      assert.deepEqual(load(cx, walk(name), b), expected, `${name}: lowered`);
      assert.deepEqual(load(cx, fast(name), a), expected, `${name}: lifted`);
    }
  }
});

test("a value that cannot be lowered is refused with the walk's error", () => {
  const BAD = [
    ["ledger.statement-result", { rows: [[{ tag: "bogus" }]], changes: 0n }],
    ["ledger.statement-result", { rows: "no", changes: 0n }],
    ["ledger.statement-result", { rows: [], changes: -1n }],
    ["ledger.statement-result", null],
    ["ledger.statement", { query: "drop-table", params: [] }],
    ["ledger.statement", { query: "claim", params: [{ tag: "integer", val: 2n ** 63n }] }],
    ["ledger.statement", { query: "claim", params: [{ tag: "real", val: "1" }] }],
    ["ledger.batch-error", "busy"],
    ["exchange.event", { tag: "handler-done", val: { tag: "answered", val: { status: 70000, headers: [], body: { tag: "text", val: "" } } } }],
    ["exchange.event", { tag: "handler-done", val: { tag: "answered", val: { status: 200, headers: [{ name: 1, value: "x" }], body: { tag: "text", val: "" } } } }],
    ["exchange.event", { tag: "body", val: "not bytes" }],
    ["exchange.event", { tag: "body-unreadable", val: "lost" }],
  ];
  for (const [name, value] of BAD) {
    const thrown = (types) => {
      const cx = memory();
      const { size, align } = lay(types(name));
      try {
        store(cx, types(name), cx.alloc(align, size), value);
      } catch (error) {
        return `${error.constructor.name}: ${error.message}`;
      }
      return "no error";
    };
    const expected = thrown(walk);
    assert.notEqual(expected, "no error", `${name} ${JSON.stringify(value, (k, v) => (typeof v === "bigint" ? `${v}n` : v))}`);
    assert.equal(thrown(fast), expected, name);
  }
});

test("bytes the walk refuses to lift are refused by the generated functions alike", () => {
  const cx = memory();
  const p = cx.alloc(8, 64);
  cx.refresh();
  cx.dv.setUint8(p, 200); // no such case
  for (const name of ["exchange.action", "exchange.event", "ledger.value", "types.outcome"]) {
    const message = (types) => {
      try {
        load(cx, types(name), p);
        return "no error";
      } catch (error) {
        return error.message;
      }
    };
    assert.equal(message(fast), message(walk), name);
  }
  const { payload } = lay(walk("exchange.action"));
  cx.dv.setUint8(p, 1); // run-batch, its list out of bounds
  cx.dv.setUint32(p + payload, 0xfffffff0, true);
  cx.dv.setUint32(p + payload + 4, 4, true);
  assert.throws(() => load(cx, fast("exchange.action"), p), /out of bounds/);
  assert.throws(() => load(cx, walk("exchange.action"), p), /out of bounds/);
});

const START = {
  head: { method: "POST", pathAndQuery: "/orders?x=1", headers: [header("idempotency-key", "k-1"), header("content-type", "application/json")] },
  principal: "acct",
  now: 1767225600000,
  mode: "stepped",
  transactional: false,
  body: new Uint8Array([123, 125]),
};
const FLAT = {
  "exchange.request-start": [START, { ...START, head: { ...START.head, headers: [] }, principal: undefined, now: 1767225600000n, mode: "driven", transactional: true, body: undefined }],
  "exchange.event": [...VALUES["exchange.event"], { tag: "batch-failed", val: { tag: "database", val: { code: undefined, message: "m" } } }, { tag: "slept" }],
};

/** Lowers `value` flat with `lowerFlat`; the core values and the memory it wrote. */
function lowered(lowerFlat, value) {
  const cx = memory();
  const out = [];
  try {
    lowerFlat(cx, value, out);
  } catch (error) {
    return { error: `${error.constructor.name}: ${error.message}` };
  }
  cx.refresh();
  return { out, bytes: cx.u8.slice(0, 4096) };
}

test("parameters lowered flat by the generated functions: the walk's core values, the walk's bytes", () => {
  for (const name of ["exchange.request-start", "exchange.event"]) assert.equal(typeof fast(name).flat, "function", name);
  for (const [name, values] of Object.entries(FLAT)) {
    for (const value of values) {
      const expected = lowered((cx, v, out) => lower(cx, walk(name), v, out), value);
      assert.ok(expected.out, `${name}: the walk lowers it`);
      assert.deepEqual(lowered(fast(name).flat, value), expected, `${name} ${value.tag ?? ""}`);
    }
  }
  const BAD = [
    ["exchange.request-start", null],
    ["exchange.request-start", { ...START, head: null }],
    ["exchange.request-start", { ...START, mode: "weird" }],
    ["exchange.request-start", { ...START, head: { ...START.head, headers: "x" } }],
    ["exchange.request-start", { ...START, now: "soon" }],
    ["exchange.event", { tag: "nope" }],
    ["exchange.event", { tag: "body", val: "not bytes" }],
    ["exchange.event", { tag: "batch-failed", val: "busy" }],
  ];
  for (const [name, value] of BAD) {
    const expected = lowered((cx, v, out) => lower(cx, walk(name), v, out), value);
    assert.ok(expected.error, `${name}: the walk refuses it`);
    assert.deepEqual(lowered(fast(name).flat, value), expected, name);
  }
});
