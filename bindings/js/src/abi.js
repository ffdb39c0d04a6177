// The Component Model's canonical ABI for the value types the idempotency
// core's WIT uses, over one core module's linear memory: type descriptors
// built from the generated type table (generated/wit.js, made from wit/*.wit
// by scripts/wit-table.js), their layout, and lifting and lowering. No
// WebAssembly is compiled or instantiated here (./component.js does that).
//
// Values are jco's: records as objects with camelCase fields, variants as
// { tag, val } (no `val` for a case without payload), enums as their WIT
// names, option as the value or undefined (null accepted going in), s64/u64
// as BigInt, list<u8> as Uint8Array, own<resource> as the object the
// instance made for the handle.

export const MAX_FLAT_PARAMS = 16;
export const MAX_FLAT_RESULTS = 1;

const alignTo = (n, align) => Math.ceil(n / align) * align;
export const camel = (name) => name.replace(/-([a-z0-9])/g, (_, c) => c.toUpperCase());
const encoder = new TextEncoder();
const decoder = new TextDecoder();

// ---------------------------------------------------------------------------
// Memory access for one instance: views refreshed whenever memory grew.

export class Memory {
  constructor(memory, realloc) {
    this.memory = memory;
    this.realloc = realloc;
    this.dv = null;
    this.u8 = null;
    this.len = 0; // the length of the last string or list lowered
    /** (resource, handle) -> the JS object of an own<resource> lifted from the guest (set by the instance). */
    this.liftOwn = null;
    /** (resource, object) -> the handle of an own<resource> or borrow<resource> lowered into the guest. */
    this.lowerHandle = null;
    this.refresh();
  }

  refresh() {
    // memory.grow() detaches the old buffer (its views' length becomes 0):
    // checked through a view, as reading `memory.buffer` costs more.
    if (this.u8 !== null && this.u8.byteLength !== 0) return;
    const buffer = this.memory.buffer;
    this.dv = new DataView(buffer);
    this.u8 = new Uint8Array(buffer);
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
export function lowerString(cx, s) {
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

export function liftString(cx, ptr, len) {
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
// Type descriptors ({ k: kind, L: layout | null, ... }); their layout (size,
// alignment, field offsets, flat core types) is computed on first use, and
// three functions walk them (`load` and `store` hand a type that has them to
// its generated `lift` and `lower`: generated/wit.js, scripts/wit-codec.js):
//   store(cx, t, ptr, v) / load(cx, t, ptr)   a value in linear memory
//   lower(cx, t, v, out)                      a value as flat core values pushed on `out`
// (Descriptors rather than code made at run time, which a Worker would build at
// start, where every line of JS runs cold; the types every request carries
// also have straight-line functions, written at build time: V8 gives each its
// own type feedback, where the walk's sites see every type.)

const U8 = 0;
const U16 = 1;
const U32 = 2;
const S64 = 3;
const U64 = 4;
const F64 = 5;
const BOOL = 6;
const STRING = 7;
const BYTES = 8;
const HANDLE = 9;
const LIST = 10;
const RECORD = 11;
const VARIANT = 12;
const ENUM = 13;
const OPTION = 14;

const prim = (k, size, flat) => ({ k, L: { size, align: size > 4 ? 8 : size, flat } });
const PRIMITIVES = {
  u8: prim(U8, 1, ["i32"]),
  u16: prim(U16, 2, ["i32"]),
  u32: prim(U32, 4, ["i32"]),
  s64: prim(S64, 8, ["i64"]),
  u64: prim(U64, 8, ["i64"]),
  f64: prim(F64, 8, ["f64"]),
  bool: prim(BOOL, 1, ["i32"]),
  string: { k: STRING, L: { size: 8, align: 4, flat: ["i32", "i32"] } },
};
const LIST_LAYOUT = PRIMITIVES.string.L;

/** An own<resource> (or the borrowed `self` of a method): an i32 handle. */
export const handle = (resource, own) => ({ k: HANDLE, resource, own, L: { size: 4, align: 4, flat: ["i32"] } });
/** record { field: type, ... } in WIT order: JS objects with camelCase fields. */
export const record = (fields) => ({ k: RECORD, fields, L: null });

/**
 * The descriptor of every type of a generated table (generated/wit.js):
 * `types("interface.name")` or a type expression. Descriptors are made once.
 */
export function typeTable(TYPES) {
  const named = new Map();
  const of = (t) => {
    if (typeof t === "string") {
      if (PRIMITIVES[t]) return PRIMITIVES[t];
      let d = named.get(t);
      if (d) return d;
      const def = TYPES[t];
      if (!def) throw new TypeError(`the type table has no ${t}`);
      if (def[0] === "alias") {
        d = of(def[1]);
        named.set(t, d);
        return d;
      }
      // Registered before its parts are made: a type may refer to itself through a list.
      d = { k: null, L: null, name: t };
      named.set(t, d);
      if (def[0] === "record") Object.assign(d, { k: RECORD, fields: Object.fromEntries(def[1].map(([f, ft]) => [f, of(ft)])) });
      else if (def[0] === "variant") Object.assign(d, { k: VARIANT, cases: Object.fromEntries(def[1].map(([c, ct]) => [c, ct === null ? null : of(ct)])) });
      else if (def[0] === "enum") Object.assign(d, { k: ENUM, cases: Object.fromEntries(def[1].map((c) => [c, null])) });
      // A resource named as a value type is an own<resource>.
      else if (def[0] === "resource") Object.assign(d, handle(t, true));
      else throw new TypeError(`${t}: a ${def[0]} is not supported by this binding`);
      return d;
    }
    if (!Array.isArray(t)) throw new TypeError(`not a type expression: ${JSON.stringify(t)}`);
    switch (t[0]) {
      case "list": {
        const elem = of(t[1]);
        return elem === PRIMITIVES.u8 ? { k: BYTES, L: LIST_LAYOUT } : { k: LIST, elem, L: LIST_LAYOUT };
      }
      case "option":
        return { k: OPTION, cases: { none: null, some: of(t[1]) }, L: null };
      case "result":
        return { k: VARIANT, cases: { ok: t[1] === null ? null : of(t[1]), err: t[2] === null ? null : of(t[2]) }, L: null, isResult: true };
      case "own":
      case "borrow": {
        if (TYPES[t[1]]?.[0] !== "resource") throw new TypeError(`${t[0]}<${t[1]}>: not a resource`);
        return handle(t[1], t[0] === "own");
      }
      default:
        throw new TypeError(`${t[0]} types are not supported by this binding`);
    }
  };
  return of;
}

function join(a, b) {
  if (a === b) return a;
  if ((a === "i32" && b === "f32") || (a === "f32" && b === "i32")) return "i32";
  return "i64";
}

/** The layout of `t`, computed once. */
export function lay(t) {
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

/** The flat core types of a list of types. */
export const flatOf = (types) => types.flatMap((t) => lay(t).flat);

export function invalid(what, v) {
  return new TypeError(`invalid ${what} value [${typeof v === "bigint" ? `${v}n` : String(v)}]`);
}
export function uint(v, max, what) {
  if (typeof v !== "number" || !Number.isInteger(v) || v < 0 || v > max) throw invalid(what, v);
  return v;
}
const S64_MIN = -(2n ** 63n);
const S64_MAX = 2n ** 63n - 1n;
const U64_MAX = 2n ** 64n - 1n;
export function int64(v, signed) {
  const b = typeof v === "number" && Number.isSafeInteger(v) ? BigInt(v) : v;
  if (typeof b !== "bigint" || (signed ? b < S64_MIN || b > S64_MAX : b < 0n || b > U64_MAX)) throw invalid(signed ? "s64" : "u64", v);
  return b;
}
function checkRecord(L, v) {
  if (v === null || typeof v !== "object") throw new TypeError(`expected a record { ${L.names.join(", ")} }, got ${v === null ? "null" : typeof v}`);
}
/** The error for `v`, not one of an enum's or a variant's `tags`. */
export function badCase(isEnum, tags, v) {
  const got = isEnum || v === null || typeof v !== "object" ? JSON.stringify(v) ?? String(v) : `{ tag: ${JSON.stringify(v.tag)} }`;
  return new TypeError(`invalid ${isEnum ? "enum" : "variant"} value ${got}: expected ${isEnum ? "" : "a tag of "}${tags.map((x) => JSON.stringify(x)).join(" | ")}`);
}
function caseOf(t, L, v) {
  let i;
  if (t.k === ENUM) i = L.index.get(v);
  else if (t.k === OPTION) i = v === undefined || v === null ? 0 : 1;
  else i = v !== null && typeof v === "object" ? L.index.get(v.tag) : undefined;
  if (i === undefined) throw badCase(t.k === ENUM, L.tags, v);
  return i;
}
/** The payload of a variant-like value `v`. */
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

function lowerHandle(cx, t, v) {
  if (cx.lowerHandle === null) throw new TypeError(`${t.resource}: resources cannot be passed here`);
  return cx.lowerHandle(t, v);
}

/** An own<resource> or borrow<resource> lowered into memory (see lowerHandle). */
export const lowerHandleOf = (cx, resource, own, v) => lowerHandle(cx, { resource, own }, v);

/** Copies bytes into guest memory; returns the pointer, `cx.len` the length. */
export function lowerBytes(cx, v) {
  const b = asBytes(v);
  const ptr = cx.alloc(1, b.length);
  cx.u8.set(b, ptr);
  cx.len = b.length;
  return ptr;
}

/** Lowers a string, list or bytes into memory it allocates; returns the pointer, `cx.len` the length. */
function lowerList(cx, t, v) {
  if (t.k === STRING) return lowerString(cx, v);
  if (t.k === BYTES) return lowerBytes(cx, v);
  if (!Array.isArray(v)) throw new TypeError(`expected an array, got ${typeof v}`);
  const { size, align } = lay(t.elem);
  const n = v.length;
  const base = cx.alloc(align, n * size);
  for (let i = 0; i < n; i++) store(cx, t.elem, base + i * size, v[i]);
  cx.len = n;
  return base;
}

/** Lifts `n` bytes at `base` (a copy). */
export function liftBytes(cx, base, n) {
  if (base + n > cx.u8.length) throw new RangeError(`list [${base}, ${base + n}) out of bounds`);
  return cx.u8.slice(base, base + n);
}

/** Lifts a bool at `p`. */
export function liftBool(cx, p) {
  const b = cx.dv.getUint8(p);
  if (b > 1) throw new TypeError(`invalid bool discriminant ${b}`);
  return b === 1;
}

/** An f64 to lower. */
export function f64(v) {
  if (typeof v !== "number") throw invalid("f64", v);
  return v;
}

/** Lifts a string, list or bytes at `base` with `n` elements. */
export function liftList(cx, t, base, n) {
  if (t.k === STRING) return liftString(cx, base, n);
  if (t.k === BYTES) return liftBytes(cx, base, n);
  const size = lay(t.elem).size;
  if (base + n * size > cx.u8.length) throw new RangeError(`list [${base}, ${base + n * size}) out of bounds`);
  const out = [];
  for (let i = 0; i < n; i++) out.push(load(cx, t.elem, base + i * size));
  return out;
}

/**
 * A value passed as flat core values (an import's parameters): strings and
 * lists (pointer, length), integers, bools and enums.
 */
export function liftFlat(cx, t, values) {
  switch (t.k) {
    case STRING:
    case BYTES:
    case LIST:
      return liftList(cx, t, values[0], values[1]);
    case U8:
      return uint(values[0] & 0xff, 0xff, "u8");
    case U16:
      return values[0] & 0xffff;
    case U32:
      return values[0] >>> 0;
    case S64:
      return BigInt.asIntN(64, values[0]);
    case U64:
      return BigInt.asUintN(64, values[0]);
    case F64:
      return values[0];
    case BOOL:
      return values[0] !== 0;
    case ENUM: {
      const L = lay(t);
      if (values[0] >>> 0 >= L.tags.length) throw new TypeError(`invalid enum discriminant ${values[0]}`);
      return L.tags[values[0] >>> 0];
    }
    default:
      throw new TypeError("this binding lifts strings, lists and scalars from flat values only");
  }
}

function setDisc(dv, L, p, i) {
  if (L.disc === 1) dv.setUint8(p, i);
  else if (L.disc === 2) dv.setUint16(p, i, true);
  else dv.setUint32(p, i, true);
}

/** Stores `v` of type `t` at `p` in guest memory. */
export function store(cx, t, p, v) {
  if (t.lower !== undefined) return t.lower(cx, p, v);
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
      return cx.dv.setFloat64(p, f64(v), true);
    case BOOL:
      return cx.dv.setUint8(p, v ? 1 : 0);
    case HANDLE:
      return cx.dv.setUint32(p, lowerHandle(cx, t, v), true);
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

/** Loads a value of type `t` from `p` in guest memory. */
export function load(cx, t, p) {
  if (t.lift !== undefined) return t.lift(cx, p);
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
    case BOOL:
      return liftBool(cx, p);
    case HANDLE:
      if (!t.own || cx.liftOwn === null) throw new TypeError(`${t.resource}: a borrowed handle cannot be returned`);
      return cx.liftOwn(t.resource, dv.getUint32(p, true));
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

/** What the generated lift and lower functions of generated/wit.js call (its `codec(h)`). */
export const CODEC_HELPERS = Object.freeze({ badCase, coerce, f64, int64, liftBool, liftBytes, liftString, lowerBytes, lowerHandleOf, lowerString, uint });

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

/** Lowers `v` of type `t` as flat core values pushed on `out`. */
export function lower(cx, t, v, out) {
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
    case HANDLE:
      return out.push(lowerHandle(cx, t, v));
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

/**
 * The core signature of a function of `params` (types) returning `result`
 * (a type or null), for an export (`self`: a method's handle first) or an
 * import (results over MAX_FLAT_RESULTS: a return pointer parameter).
 */
export function coreSignature(params, result, { self = false, imported = false } = {}) {
  const flat = [...(self ? ["i32"] : []), ...flatOf(params)];
  const results = result === null ? [] : lay(result).flat;
  const spilledParams = flat.length > MAX_FLAT_PARAMS ? ["i32"] : flat;
  if (results.length <= MAX_FLAT_RESULTS) return { params: spilledParams, results };
  return imported ? { params: [...spilledParams, "i32"], results: [] } : { params: spilledParams, results: ["i32"] };
}
