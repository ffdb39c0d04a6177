// The idempotency core component (WIT idempotency:ledger@0.2.0, wit/*.wit)
// bound to its core module with the Component Model's canonical ABI, in this
// file instead of jco's generated glue: the types below are wit/*.wit
// written out (same names, same order), and the lifting and lowering are
// derived from them. jco still extracts the core module (`jco transpile`
// -> generated/core.core.wasm); its glue (generated/core.js) is only used by
// test/component.test.js, which checks this binding against it and against
// the core module's own function signatures.
//
// Why: jco 1.35's glue is ~200 KB of JS (per-call async-task bookkeeping, a
// function per export specialised for every type) that a Worker parses at
// start and compiles on first use, plus two shim modules; this binding is one
// core module and a few KB, and does the same conversions per call.
//
// Values are jco's: records as objects with camelCase fields, variants as
// { tag, val } (no `val` for a case without payload), enums as their WIT
// names, option as the value or undefined, s64/u64 as BigInt, list<u8> as
// Uint8Array, `result` returned as the ok value or thrown as an error whose
// `payload` is the err value. Instantiation is synchronous; nothing is
// compiled here (the caller hands over a compiled WebAssembly.Module).

const MAX_FLAT_PARAMS = 16;
const MAX_FLAT_RESULTS = 1;
export const CORE_MODULE = "core.core.wasm";
const LEDGER = "idempotency:ledger/ledger@0.2.0";
const SESSION = "idempotency:ledger/session@0.2.0";

const camel = (name) => name.replace(/-([a-z0-9])/g, (_, c) => c.toUpperCase());
const alignTo = (n, align) => Math.ceil(n / align) * align;
const encoder = new TextEncoder();
const decoder = new TextDecoder();
const hasOwn = Object.prototype.hasOwnProperty;

/** A `result` err value thrown by a call (jco's ComponentError: the err value is `payload`). */
export class ComponentError extends Error {
  constructor(payload) {
    super(`${typeof payload === "object" && payload !== null && "tag" in payload ? payload.tag : String(payload)} (see error.payload)`);
    this.name = "ComponentError";
    Object.defineProperty(this, "payload", { value: payload, enumerable: true });
  }
}

// ---------------------------------------------------------------------------
// Memory access for one instance: views refreshed whenever memory grew.

class Memory {
  constructor(memory, realloc) {
    this.memory = memory;
    this.realloc = realloc;
    this.buffer = null;
    this.dv = null;
    this.u8 = null;
    this.len = 0; // the length of the last string or list lowered
    this.refresh();
  }

  refresh() {
    const buffer = this.memory.buffer;
    if (buffer !== this.buffer) {
      this.buffer = buffer;
      this.dv = new DataView(buffer);
      this.u8 = new Uint8Array(buffer);
    }
  }

  alloc(align, size) {
    const ptr = this.realloc(0, 0, align, size);
    this.refresh();
    return ptr;
  }
}

function utf8Length(s, from, n) {
  let len = from;
  for (let i = from; i < n; i++) {
    const c = s.charCodeAt(i);
    if (c < 0x80) len += 1;
    else if (c < 0x800) len += 2;
    else if (c >= 0xd800 && c <= 0xdbff && i + 1 < n && (s.charCodeAt(i + 1) & 0xfc00) === 0xdc00) {
      len += 4;
      i++;
    } else len += 3; // other code units, lone surrogates included (encoded as U+FFFD)
  }
  return len;
}

/** Copies `s` into guest memory as UTF-8 (exact size); returns the pointer, `cx.len` the length. */
function lowerString(cx, s) {
  if (typeof s !== "string") throw new TypeError(`expected a string, got ${typeof s}`);
  const n = s.length;
  if (n === 0) {
    cx.len = 0;
    return 1;
  }
  let ascii = true;
  let i = 0;
  for (; i < n; i++) {
    if (s.charCodeAt(i) >= 0x80) {
      ascii = false;
      break;
    }
  }
  const len = ascii ? n : utf8Length(s, i, n);
  const ptr = cx.alloc(1, len);
  if (ascii && n <= 64) {
    const u8 = cx.u8;
    for (let j = 0; j < n; j++) u8[ptr + j] = s.charCodeAt(j);
  } else {
    const { read, written } = encoder.encodeInto(s, cx.u8.subarray(ptr, ptr + len));
    if (read !== n || written !== len) throw new Error("failed to encode the whole string");
  }
  cx.len = len;
  return ptr;
}

function liftString(cx, ptr, len) {
  if (len === 0) return "";
  const u8 = cx.u8;
  const end = ptr + len;
  if (end > u8.length) throw new RangeError(`string [${ptr}, ${end}) out of bounds`);
  if (len <= 32) {
    let s = "";
    for (let i = ptr; i < end; i++) {
      const c = u8[i];
      if (c >= 0x80) return decoder.decode(u8.subarray(ptr, end));
      s += String.fromCharCode(c);
    }
    return s;
  }
  return decoder.decode(u8.subarray(ptr, end));
}

// ---------------------------------------------------------------------------
// Types are plain descriptors ({ k: kind, ... }); their layout (size,
// alignment, field offsets, flat core types) is computed on first use, and
// three functions walk them:
//   store(cx, t, ptr, v) / load(cx, t, ptr)   a value in linear memory
//   lower(cx, t, v, out)                      a value as flat core values pushed on `out`
// (Descriptors instead of a closure per type: a Worker builds the schema at
// start, where every line of JS runs cold.)

const U8 = 0;
const U16 = 1;
const U32 = 2;
const S64 = 3;
const U64 = 4;
const F64 = 5;
const BOOL = 6;
const STRING = 7;
const BYTES = 8;
const OWN = 9;
const LIST = 10;
const RECORD = 11;
const VARIANT = 12;
const ENUM = 13;
const OPTION = 14;

const prim = (k, size, flat) => ({ k, L: { size, align: size > 4 ? 8 : size, flat } });
const u8 = prim(U8, 1, ["i32"]);
const u16 = prim(U16, 2, ["i32"]);
const u32 = prim(U32, 4, ["i32"]);
const s64 = prim(S64, 8, ["i64"]);
const u64 = prim(U64, 8, ["i64"]);
const f64 = prim(F64, 8, ["f64"]);
const bool = prim(BOOL, 1, ["i32"]);
const string = { k: STRING, L: { size: 8, align: 4, flat: ["i32", "i32"] } };
/** own<session>: the i32 handle the guest created with [resource-new]. */
const ownSession = prim(OWN, 4, ["i32"]);
/** list<T> (list<u8>: a Uint8Array in, a copy out; list<u16>: a Uint16Array out, as jco gives them). */
const list = (elem) => (elem === u8 ? { k: BYTES, L: string.L } : { k: LIST, elem, L: string.L });
/** record { field: type, ... } in WIT order: JS objects with camelCase fields. */
const record = (fields) => ({ k: RECORD, fields, L: null });
/** variant { case: type | null, ... }: { tag, val } (no `val` for a case without payload). */
const variant = (cases) => ({ k: VARIANT, cases, L: null });
/** enum { name, ... }: the names as strings. */
const enumeration = (...names) => ({ k: ENUM, cases: Object.fromEntries(names.map((n) => [n, null])), L: null });
/** option<T>: the value, or undefined (null accepted) for none. */
const option = (t) => ({ k: OPTION, cases: { none: null, some: t }, L: null });
/** result<ok, err> as { tag: "ok" | "err", val }; a function returning one throws the err (see `func`). */
const result = (ok, err) => ({ k: VARIANT, cases: { ok, err }, L: null, isResult: true });

function join(a, b) {
  if (a === b) return a;
  if ((a === "i32" && b === "f32") || (a === "f32" && b === "i32")) return "i32";
  return "i64";
}

/** The layout of `t`, computed once. */
function lay(t) {
  if (t.L !== null) return t.L;
  if (t.k === RECORD) {
    const names = [];
    const types = [];
    const offsets = [];
    const flat = [];
    let offset = 0;
    let align = 1;
    for (const name in t.fields) {
      const ft = t.fields[name];
      const fl = lay(ft);
      offset = alignTo(offset, fl.align);
      names.push(camel(name));
      types.push(ft);
      offsets.push(offset);
      offset += fl.size;
      align = Math.max(align, fl.align);
      for (const f of fl.flat) flat.push(f);
    }
    t.L = { size: alignTo(offset, align), align, flat, names, types, offsets };
    return t.L;
  }
  // VARIANT, ENUM, OPTION
  const tags = [];
  const types = [];
  const index = new Map();
  let caseAlign = 1;
  let caseSize = 0;
  const joined = [];
  for (const tag in t.cases) {
    const ct = t.cases[tag];
    index.set(tag, tags.length);
    tags.push(tag);
    types.push(ct);
    if (ct === null) continue;
    const cl = lay(ct);
    caseAlign = Math.max(caseAlign, cl.align);
    caseSize = Math.max(caseSize, cl.size);
    for (let i = 0; i < cl.flat.length; i++) joined[i] = i < joined.length ? join(joined[i], cl.flat[i]) : cl.flat[i];
  }
  const n = tags.length;
  const disc = n <= 0x100 ? 1 : n <= 0x10000 ? 2 : 4;
  const align = Math.max(disc, caseAlign);
  const payload = alignTo(disc, caseAlign);
  t.L = { size: alignTo(payload + caseSize, align), align, flat: ["i32", ...joined], joined, tags, types, index, disc, payload };
  return t.L;
}

function invalid(what, v) {
  return new TypeError(`invalid ${what} value [${typeof v === "bigint" ? `${v}n` : String(v)}]`);
}
function uint(v, max, what) {
  if (typeof v !== "number" || !Number.isInteger(v) || v < 0 || v > max) throw invalid(what, v);
  return v;
}
const S64_MIN = -(2n ** 63n);
const S64_MAX = 2n ** 63n - 1n;
const U64_MAX = 2n ** 64n - 1n;
function int64(v, signed) {
  const b = typeof v === "number" && Number.isSafeInteger(v) ? BigInt(v) : v;
  if (typeof b !== "bigint" || (signed ? b < S64_MIN || b > S64_MAX : b < 0n || b > U64_MAX)) throw invalid(signed ? "s64" : "u64", v);
  return b;
}
function checkRecord(L, v) {
  if (v === null || typeof v !== "object") throw new TypeError(`expected a record { ${L.names.join(", ")} }, got ${v === null ? "null" : typeof v}`);
}
function caseOf(t, L, v) {
  let i;
  if (t.k === ENUM) i = L.index.get(v);
  else if (t.k === OPTION) i = v === undefined || v === null ? 0 : 1;
  else i = v !== null && typeof v === "object" ? L.index.get(v.tag) : undefined;
  if (i === undefined) {
    const got = t.k === ENUM || v === null || typeof v !== "object" ? JSON.stringify(v) ?? String(v) : `{ tag: ${JSON.stringify(v.tag)} }`;
    throw new TypeError(`invalid ${t.k === ENUM ? "enum" : "variant"} value ${got}: expected ${t.k === ENUM ? "" : "a tag of "}${L.tags.map((x) => JSON.stringify(x)).join(" | ")}`);
  }
  return i;
}
/** The payload of case `i` of a variant-like value `v`. */
const payloadOf = (t, v) => (t.k === OPTION ? v : t.k === ENUM ? undefined : v.val);

function asBytes(v) {
  if (v instanceof Uint8Array) return v;
  if (v instanceof ArrayBuffer) return new Uint8Array(v);
  if (ArrayBuffer.isView(v)) return new Uint8Array(v.buffer, v.byteOffset, v.byteLength);
  if (Array.isArray(v)) {
    for (const x of v) uint(x, 0xff, "u8");
    return Uint8Array.from(v);
  }
  throw new TypeError(`expected bytes (Uint8Array), got ${typeof v}`);
}

/** Lowers a string, list or bytes into memory it allocates; returns the pointer, `cx.len` the length. */
function lowerList(cx, t, v) {
  if (t.k === STRING) return lowerString(cx, v);
  if (t.k === BYTES) {
    const b = asBytes(v);
    const ptr = cx.alloc(1, b.length);
    cx.u8.set(b, ptr);
    cx.len = b.length;
    return ptr;
  }
  if (!Array.isArray(v) && !(t.elem === u16 && v instanceof Uint16Array)) throw new TypeError(`expected an array, got ${typeof v}`);
  const { size, align } = lay(t.elem);
  const n = v.length;
  const base = cx.alloc(align, n * size);
  for (let i = 0; i < n; i++) store(cx, t.elem, base + i * size, v[i]);
  cx.len = n;
  return base;
}

function liftList(cx, t, base, n) {
  if (t.k === STRING) return liftString(cx, base, n);
  const size = t.k === BYTES ? 1 : lay(t.elem).size;
  if (base + n * size > cx.u8.length) throw new RangeError(`list [${base}, ${base + n * size}) out of bounds`);
  if (t.k === BYTES) return cx.u8.slice(base, base + n);
  if (t.elem === u16) {
    const out = new Uint16Array(n);
    for (let i = 0; i < n; i++) out[i] = cx.dv.getUint16(base + i * 2, true);
    return out;
  }
  const out = [];
  for (let i = 0; i < n; i++) out.push(load(cx, t.elem, base + i * size));
  return out;
}

function setDisc(dv, L, p, i) {
  if (L.disc === 1) dv.setUint8(p, i);
  else if (L.disc === 2) dv.setUint16(p, i, true);
  else dv.setUint32(p, i, true);
}

function store(cx, t, p, v) {
  switch (t.k) {
    case U8:
      return cx.dv.setUint8(p, uint(v, 0xff, "u8"));
    case U16:
      return cx.dv.setUint16(p, uint(v, 0xffff, "u16"), true);
    case U32:
      return cx.dv.setUint32(p, uint(v, 0xffffffff, "u32"), true);
    case S64:
      return cx.dv.setBigInt64(p, int64(v, true), true);
    case U64:
      return cx.dv.setBigUint64(p, int64(v, false), true);
    case F64:
      if (typeof v !== "number") throw invalid("f64", v);
      return cx.dv.setFloat64(p, v, true);
    case BOOL:
      return cx.dv.setUint8(p, v ? 1 : 0);
    case OWN:
      return cx.dv.setUint32(p, v, true);
    case STRING:
    case BYTES:
    case LIST: {
      const ptr = lowerList(cx, t, v);
      cx.dv.setUint32(p, ptr, true);
      cx.dv.setUint32(p + 4, cx.len, true);
      return undefined;
    }
    case RECORD: {
      const L = lay(t);
      checkRecord(L, v);
      for (let i = 0; i < L.names.length; i++) store(cx, L.types[i], p + L.offsets[i], v[L.names[i]]);
      return undefined;
    }
    default: {
      const L = lay(t);
      const i = caseOf(t, L, v);
      setDisc(cx.dv, L, p, i);
      if (L.types[i] !== null) store(cx, L.types[i], p + L.payload, payloadOf(t, v));
      return undefined;
    }
  }
}

function load(cx, t, p) {
  const dv = cx.dv;
  switch (t.k) {
    case U8:
      return dv.getUint8(p);
    case U16:
      return dv.getUint16(p, true);
    case U32:
      return dv.getUint32(p, true);
    case S64:
      return dv.getBigInt64(p, true);
    case U64:
      return dv.getBigUint64(p, true);
    case F64:
      return dv.getFloat64(p, true);
    case BOOL: {
      const b = dv.getUint8(p);
      if (b > 1) throw new TypeError(`invalid bool discriminant ${b}`);
      return b === 1;
    }
    case OWN:
      return dv.getUint32(p, true);
    case STRING:
    case BYTES:
    case LIST:
      return liftList(cx, t, dv.getUint32(p, true), dv.getUint32(p + 4, true));
    case RECORD: {
      const L = lay(t);
      const o = {};
      for (let i = 0; i < L.names.length; i++) o[L.names[i]] = load(cx, L.types[i], p + L.offsets[i]);
      return o;
    }
    default: {
      const L = lay(t);
      const i = L.disc === 1 ? dv.getUint8(p) : L.disc === 2 ? dv.getUint16(p, true) : dv.getUint32(p, true);
      if (i >= L.tags.length) throw new TypeError(`invalid variant discriminant ${i}`);
      const ct = L.types[i];
      if (t.k === ENUM) return L.tags[i];
      if (t.k === OPTION) return ct === null ? undefined : load(cx, ct, p + L.payload);
      return ct === null ? { tag: L.tags[i] } : { tag: L.tags[i], val: load(cx, ct, p + L.payload) };
    }
  }
}

const f64Bits = new Float64Array(1);
const i64Bits = new BigInt64Array(f64Bits.buffer);
const f32Bits = new Float32Array(1);
const i32Bits = new Int32Array(f32Bits.buffer);

/** A flat value of core type `have` passed in a variant slot of joined type `want`. */
function coerce(value, have, want) {
  if (have === want) return value;
  if (have === "i32" && want === "i64") return BigInt(value >>> 0);
  if (have === "f32") {
    f32Bits[0] = value;
    return want === "i32" ? i32Bits[0] : BigInt(i32Bits[0] >>> 0);
  }
  if (have === "f64" && want === "i64") {
    f64Bits[0] = value;
    return i64Bits[0];
  }
  throw new Error(`cannot pass ${have} as ${want}`);
}

function lower(cx, t, v, out) {
  switch (t.k) {
    case U8:
      return out.push(uint(v, 0xff, "u8"));
    case U16:
      return out.push(uint(v, 0xffff, "u16"));
    case U32:
      return out.push(uint(v, 0xffffffff, "u32"));
    case S64:
      return out.push(int64(v, true));
    case U64:
      return out.push(BigInt.asIntN(64, int64(v, false))); // a flat i64 is the two's complement bit pattern
    case F64:
      if (typeof v !== "number") throw invalid("f64", v);
      return out.push(v);
    case BOOL:
      return out.push(v ? 1 : 0);
    case OWN:
      return out.push(v);
    case STRING:
    case BYTES:
    case LIST: {
      const ptr = lowerList(cx, t, v);
      return out.push(ptr, cx.len);
    }
    case RECORD: {
      const L = lay(t);
      checkRecord(L, v);
      for (let i = 0; i < L.names.length; i++) lower(cx, L.types[i], v[L.names[i]], out);
      return out.length;
    }
    default: {
      const L = lay(t);
      const i = caseOf(t, L, v);
      out.push(i);
      const ct = L.types[i];
      const joined = L.joined;
      let k = 0;
      if (ct !== null) {
        const start = out.length;
        lower(cx, ct, payloadOf(t, v), out);
        const have = lay(ct).flat;
        for (; k < have.length; k++) out[start + k] = coerce(out[start + k], have[k], joined[k]);
      }
      for (; k < joined.length; k++) out.push(joined[k] === "i64" ? 0n : 0);
      return out.length;
    }
  }
}

// ---------------------------------------------------------------------------
// wit/ledger.wit and wit/types.wit, in their order.

const value = variant({ null: null, integer: s64, real: f64, text: string, blob: list(u8) });
const statement = record({ sql: string, params: list(value) });
const statementResult = record({ rows: list(list(value)), changes: u64 });
const databaseError = record({ code: option(string), message: string });
const batchError = variant({ database: databaseError, "pool-exhausted": string, unreachable: string, "outcome-unknown": string, host: string });

const header = record({ name: string, value: string });
const requestHead = record({ method: string, "path-and-query": string, headers: list(header) });
const response = record({ status: u16, headers: list(header), body: option(string) });
const responseBody = variant({ text: string, bytes: list(u8) });
const mutationResponse = record({ status: u16, headers: list(header), body: responseBody });
const dialect = enumeration("sqlite", "postgres");
const profile = enumeration("recipe", "ietf");
const onServerError = enumeration("store", "release");
const config = record({
  "protected-methods": list(string),
  "fingerprint-headers": list(string),
  "replay-headers": list(string),
  "pending-ttl-ms": u64,
  "retention-ms": u64,
  "body-cap-bytes": u32,
  "request-body-cap-bytes": u64,
  "sweep-batch": u32,
  "sweep-every": u32,
  dialect,
  profile,
  "key-required": bool,
  "replay-header": option(string),
  "in-progress-retry-ms": option(u64),
  "wait-ms": u64,
  "on-server-error": onServerError,
});
const requestPolicy = record({ "protected-methods": list(string), "request-body-cap-bytes": u64, "null-body-statuses": list(u16) });
const ledgerError = variant({ busy: null, constraint: string, schema: string, io: string, "outcome-unknown": string, other: string });
const protocolError = variant({ ledger: ledgerError, "malformed-result": string, "invalid-config": string, "invalid-argument": string });
const ticket = record({ principal: string, key: string, fingerprint: string, generation: s64, "created-at": s64 });
const rejectionReason = enumeration("principal-required", "key-required", "key-invalid", "body-too-large", "key-reused", "in-progress", "retry", "record-corrupt");
const rejection = record({ reason: rejectionReason, response });
const decision = variant({ execute: ticket, replay: response, reject: rejection, wait: u32 });
const protectedRequest = record({ key: string, "fingerprint-prefix": string });
const admission = variant({ "pass-through": null, reject: rejection, protected: protectedRequest });
const completionAction = enumeration("store", "release");
const completionOutcome = enumeration("stored", "released", "fenced-out");
const logLevel = enumeration("error", "warn", "info");
const logLine = record({ level: logLevel, message: string });
const completionPlan = record({
  statements: list(statement),
  action: completionAction,
  response,
  "send-mutation-body": bool,
  "sweep-due": bool,
  log: option(logLine),
});
const completion = record({ response, "send-mutation-body": bool, outcome: completionOutcome, "sweep-due": bool, log: list(logLine) });
const abandonReason = enumeration("raised", "nothing-changed");
const sweepResult = record({ deleted: u64, more: bool });
const requestFailure = record({ principal: string, key: string, error: protocolError });
const ticketFailure = record({ ticket, error: protocolError });
const abandonment = record({ ticket, reason: abandonReason, released: bool, detail: string });
const logEvent = variant({
  "decision-failed": requestFailure,
  "completion-failed": ticketFailure,
  "fenced-out": ticket,
  abandoned: abandonment,
  "release-failed": ticketFailure,
  "sweep-failed": protocolError,
});

// wit/session.wit: [params, result] per function.
const FUNCTIONS = {
  "default-config": [[profile], config],
  schema: [[dialect], list(string)],
};
const STATICS = {
  open: [[config], result(ownSession, protocolError)],
};
const METHODS = {
  config: [[], config],
  policy: [[], requestPolicy],
  admit: [[requestHead, option(string)], result(admission, protocolError)],
  "body-too-large": [[], rejection],
  "fingerprint-prefix": [[requestHead], string],
  fingerprint: [[requestHead, list(u8)], string],
  "error-response": [[protocolError], response],
  classify: [[batchError], ledgerError],
  "log-line": [[logEvent], logLine],
  "plan-decision": [[string, string, string, s64], result(list(statement), protocolError)],
  decide: [[string, string, string, s64, s64, list(statementResult)], result(decision, protocolError)],
  "plan-completion": [[ticket, mutationResponse, s64], result(completionPlan, protocolError)],
  "finish-completion": [[completionAction, list(statementResult)], result(completionOutcome, protocolError)],
  "plan-abandon": [[ticket, abandonReason], result(option(list(statement)), protocolError)],
  "finish-release": [[list(statementResult)], result(bool, protocolError)],
  "plan-sweep": [[s64], list(statement)],
  "finish-sweep": [[list(statementResult)], result(sweepResult, protocolError)],
  migrate: [[], result(null, protocolError)],
  "run-decision": [[string, string, string, s64, s64], result(decision, protocolError)],
  "run-completion": [[ticket, mutationResponse, s64], result(completion, protocolError)],
  "run-abandon": [[ticket, abandonReason], result(bool, protocolError)],
  "run-sweep": [[s64], result(sweepResult, protocolError)],
};
// wit/ledger.wit: the one import.
const EXECUTE_BATCH = [[list(statement)], result(list(statementResult), batchError)];

const exportName = (kind, name) => `${SESSION}#${kind === "method" ? `[method]session.${name}` : kind === "static" ? `[static]session.${name}` : name}`;
const flatOf = (types) => types.flatMap((t) => lay(t).flat);

/** The core signature each export and import must have (checked against the core module by test/component.test.js). */
export function coreSignatures() {
  const sig = ([params, res], self) => {
    const flat = [...(self ? ["i32"] : []), ...flatOf(params)];
    const results = lay(res).flat;
    return { params: flat.length > MAX_FLAT_PARAMS ? ["i32"] : flat, results: results.length > MAX_FLAT_RESULTS ? ["i32"] : results };
  };
  const exports = {};
  for (const [name, f] of Object.entries(FUNCTIONS)) exports[exportName("function", name)] = sig(f, false);
  for (const [name, f] of Object.entries(STATICS)) exports[exportName("static", name)] = sig(f, false);
  for (const [name, f] of Object.entries(METHODS)) exports[exportName("method", name)] = sig(f, true);
  exports[`${SESSION}#[dtor]session`] = { params: ["i32"], results: [] };
  const [params, res] = EXECUTE_BATCH;
  const flat = flatOf(params);
  return {
    exports,
    imports: {
      [`${LEDGER}::execute-batch`]: { params: lay(res).flat.length > MAX_FLAT_RESULTS ? [...flat, "i32"] : flat, results: [] },
      [`[export]${SESSION}::[resource-new]session`]: { params: ["i32"], results: ["i32"] },
      [`[export]${SESSION}::[resource-drop]session`]: { params: ["i32"], results: [] },
    },
  };
}

// ---------------------------------------------------------------------------
// Instantiation.

/**
 * The JS function of export `name`: lowers the arguments (a method's first
 * core argument is the session's rep), calls the core function, lifts the
 * result from its return area and runs the post-return.
 */
function func(cx, exports, name, [params, res], method) {
  const fn = exports[name];
  if (typeof fn !== "function") throw new TypeError(`the core module does not export ${name}`);
  const post = exports[`cabi_post_${name}`];
  const flatCount = flatOf(params).length + (method ? 1 : 0);
  if (lay(res).flat.length <= MAX_FLAT_RESULTS) throw new TypeError(`${name}: results passed flat are not supported by this binding`);
  const spilled = flatCount > MAX_FLAT_PARAMS ? record(Object.fromEntries(params.map((t, i) => [`p${i}`, t]))) : null;
  if (spilled && method) throw new TypeError(`${name}: spilled method parameters are not supported by this binding`);
  const unwrap = res.isResult === true;
  const n = params.length;
  return (rep, args) => {
    let ret;
    if (spilled !== null) {
      const L = lay(spilled);
      const ptr = cx.alloc(L.align, L.size);
      const tuple = {};
      for (let i = 0; i < n; i++) tuple[`p${i}`] = args[i];
      store(cx, spilled, ptr, tuple);
      ret = fn(ptr);
    } else {
      const out = method ? [rep] : [];
      for (let i = 0; i < n; i++) lower(cx, params[i], args[i], out);
      ret = fn(...out);
    }
    cx.refresh();
    let value;
    try {
      value = load(cx, res, ret);
    } finally {
      if (post !== undefined) post(ret);
    }
    if (!unwrap) return value;
    if (value.tag === "err") throw new ComponentError(value.val);
    return value.val;
  };
}

/**
 * Instantiates the component: `getCoreModule(CORE_MODULE)` is the compiled
 * core module; `imports["idempotency:ledger/ledger"].executeBatch(statements)`
 * returns the statement results or throws the WIT `batch-error` (a plain
 * object; an Error thrown there is a trap). Returns jco's shape:
 * { session: { defaultConfig, schema, Session } }.
 */
export function instantiate(getCoreModule, imports) {
  const module = getCoreModule(CORE_MODULE);
  const ledger = imports?.["idempotency:ledger/ledger"] ?? imports?.[LEDGER];
  if (!ledger || typeof ledger.executeBatch !== "function") throw new TypeError("instantiate: imports['idempotency:ledger/ledger'].executeBatch is required");
  const executeBatch = ledger.executeBatch;
  let cx = null;
  let exports = null;
  let trapped = false;
  const reps = new Map(); // handle -> rep of each live session
  let nextHandle = 1;
  const [[statements], batchResult] = EXECUTE_BATCH;
  const dtor = (rep) => exports[`${SESSION}#[dtor]session`](rep);

  const instance = new WebAssembly.Instance(module, {
    [LEDGER]: {
      "execute-batch": (ptr, len, retptr) => {
        // Anything thrown from here unwinds the guest's frames: the instance
        // is not entered again (a trap), whatever the error was.
        try {
          cx.refresh();
          const list = liftList(cx, statements, ptr, len);
          let value;
          try {
            value = { tag: "ok", val: executeBatch(list) };
          } catch (error) {
            if (error && hasOwn.call(error, "payload")) value = { tag: "err", val: error.payload };
            else if (error instanceof Error) throw error;
            else value = { tag: "err", val: error };
          }
          store(cx, batchResult, retptr, value);
        } catch (error) {
          trapped = true;
          throw error instanceof WebAssembly.RuntimeError ? error : new WebAssembly.RuntimeError(`the ledger import failed: ${error?.message ?? error}`, { cause: error });
        }
      },
    },
    [`[export]${SESSION}`]: {
      "[resource-new]session": (rep) => {
        const handle = nextHandle++;
        reps.set(handle, rep);
        return handle;
      },
      "[resource-drop]session": (handle) => {
        const rep = reps.get(handle);
        if (rep === undefined) throw new WebAssembly.RuntimeError(`unknown session handle ${handle}`);
        reps.delete(handle);
        dtor(rep);
      },
    },
  });
  exports = instance.exports;
  cx = new Memory(exports.memory, exports.cabi_realloc);

  /** The call of export `name`, made on first use; refuses to enter a trapped instance. */
  const bind = (kind, name, f) => {
    let call = null;
    return (rep, args) => {
      if (trapped) throw new WebAssembly.RuntimeError("the component instance trapped earlier; it cannot be entered again");
      if (call === null) call = func(cx, exports, exportName(kind, name), f, kind === "method");
      try {
        return call(rep, args);
      } catch (error) {
        if (error instanceof WebAssembly.RuntimeError) trapped = true;
        throw error;
      }
    };
  };

  const HANDLE = Symbol("session handle");
  const registry =
    typeof FinalizationRegistry === "undefined"
      ? { register() {} }
      : new FinalizationRegistry((handle) => {
          const rep = reps.get(handle);
          if (rep === undefined) return;
          reps.delete(handle);
          if (trapped) return;
          try {
            dtor(rep);
          } catch {
            trapped = true;
          }
        });
  class Session {
    constructor() {
      throw new TypeError('"Session" resource does not define a constructor');
    }
  }
  const repOf = (session) => {
    const rep = reps.get(session?.[HANDLE]);
    if (rep === undefined) throw new TypeError('Resource error: Not a valid "Session" resource.');
    return rep;
  };
  for (const name in METHODS) {
    const call = bind("method", name, METHODS[name]);
    Object.defineProperty(Session.prototype, camel(name), {
      value: function (...args) {
        return call(repOf(this), args);
      },
      writable: true,
      configurable: true,
    });
  }
  const open = bind("static", "open", STATICS.open);
  Session.open = (config) => {
    const session = Object.create(Session.prototype);
    Object.defineProperty(session, HANDLE, { value: open(0, [config]) });
    registry.register(session, session[HANDLE]);
    return session;
  };
  const defaultConfig = bind("function", "default-config", FUNCTIONS["default-config"]);
  const schema = bind("function", "schema", FUNCTIONS.schema);
  const session = { Session, defaultConfig: (p) => defaultConfig(0, [p]), schema: (d) => schema(0, [d]) };
  return { session, [SESSION]: session };
}
