// Generates, for the records, variants and enums every request carries (an
// exchange's actions and events, the ledger's statements and results, and
// the types inside them: HOT below), a function that lifts each from guest
// memory and one that lowers it there, as straight-line JS (src/abi.js's
// `load` and `store` call them instead of walking the type's descriptor). The same layout, the
// same values and the same errors as the descriptor walk, which still lowers
// flat parameters and handles everything else; test/component.test.js runs
// every conformance vector through both this binding and jco's glue.
//
// Emitted into generated/wit.js by scripts/wit-table.js as one function,
// `codec(h)`, taking abi.js's helpers (so the table module imports nothing)
// and returning { "interface.name": [lift, lower, flat?] } (`flat`: for the
// parameters passed flat, FLAT_ROOTS; lift and lower undefined for a type
// only passed flat).
import { camel, lay, typeTable } from "../src/abi.js";

/** The address `base` + `off` as JS source (`base`: "p" or an expression; `off`: a number). */
const at = (base, off) => (off === 0 ? base : `${base} + ${off}`);

const PRIMITIVE_LOAD = {
  u8: (b, o) => `cx.dv.getUint8(${at(b, o)})`,
  u16: (b, o) => `cx.dv.getUint16(${at(b, o)}, true)`,
  u32: (b, o) => `cx.dv.getUint32(${at(b, o)}, true)`,
  s64: (b, o) => `cx.dv.getBigInt64(${at(b, o)}, true)`,
  u64: (b, o) => `cx.dv.getBigUint64(${at(b, o)}, true)`,
  f64: (b, o) => `cx.dv.getFloat64(${at(b, o)}, true)`,
  bool: (b, o) => `h.liftBool(cx, ${at(b, o)})`,
  string: (b, o) => `h.liftString(cx, cx.dv.getUint32(${at(b, o)}, true), cx.dv.getUint32(${at(b, o + 4)}, true))`,
};
const PRIMITIVE_STORE = {
  u8: (b, o, v) => `cx.dv.setUint8(${at(b, o)}, h.uint(${v}, 0xff, "u8"));`,
  u16: (b, o, v) => `cx.dv.setUint16(${at(b, o)}, h.uint(${v}, 0xffff, "u16"), true);`,
  u32: (b, o, v) => `cx.dv.setUint32(${at(b, o)}, h.uint(${v}, 0xffffffff, "u32"), true);`,
  s64: (b, o, v) => `cx.dv.setBigInt64(${at(b, o)}, h.int64(${v}, true), true);`,
  u64: (b, o, v) => `cx.dv.setBigUint64(${at(b, o)}, h.int64(${v}, false), true);`,
  f64: (b, o, v) => `cx.dv.setFloat64(${at(b, o)}, h.f64(${v}), true);`,
  bool: (b, o, v) => `cx.dv.setUint8(${at(b, o)}, ${v} ? 1 : 0);`,
  string: (b, o, v) => `{ const ptr = h.lowerString(cx, ${v}); cx.dv.setUint32(${at(b, o)}, ptr, true); cx.dv.setUint32(${at(b, o + 4)}, cx.len, true); }`,
};

/** The roots of the covered types: what `session.start`, `exchange.step` and `ledger.execute-batch` carry in memory. */
const HOT = ["session.started", "exchange.event", "ledger.statement", "ledger.statement-result", "ledger.batch-error"];

/** The parameters every request passes flat (`session.start`'s, `exchange.step`'s): each gets a flat lowering function too. */
const FLAT_ROOTS = ["exchange.request-start", "exchange.event"];

const PRIMITIVE_FLAT = {
  u8: (v) => `out.push(h.uint(${v}, 0xff, "u8"));`,
  u16: (v) => `out.push(h.uint(${v}, 0xffff, "u16"));`,
  u32: (v) => `out.push(h.uint(${v}, 0xffffffff, "u32"));`,
  s64: (v) => `out.push(h.int64(${v}, true));`,
  u64: (v) => `out.push(BigInt.asIntN(64, h.int64(${v}, false)));`,
  f64: (v) => `out.push(h.f64(${v}));`,
  bool: (v) => `out.push(${v} ? 1 : 0);`,
  string: (v) => `{ const ptr = h.lowerString(cx, ${v}); out.push(ptr, cx.len); }`,
};

/** The source of `codec(h)` for a type table (generated/wit.js's TYPES). */
export function codecSource(TYPES) {
  const of = typeTable(TYPES);
  const names = new Map(); // type expression (JSON) -> function suffix
  const bodies = [];
  const consts = [];
  const pending = [];
  const layout = (t) => lay(of(t));
  const kindOf = (t) => (typeof t === "string" ? (PRIMITIVE_LOAD[t] ? "primitive" : TYPES[t]?.[0]) : t[0]);
  const resolve = (t) => (typeof t === "string" && TYPES[t]?.[0] === "alias" ? resolve(TYPES[t][1]) : t);

  /** A function suffix per type expression, made (and queued for emission) on first use. */
  const namer = (registry, queue, anonymous) => (t) => {
    const key = JSON.stringify(t);
    let name = registry.get(key);
    if (name === undefined) {
      name = typeof t === "string" ? t.replace(/[^a-z0-9]+/gi, "_") : `${anonymous}${registry.size}`;
      // Two WIT names may read alike once mangled ("a.b-c", "a-b.c"): never one function for both.
      if ([...registry.values()].includes(name)) name = `${name}_${registry.size}`;
      registry.set(key, name);
      queue.push([t, name]);
    }
    return name;
  };
  /** The suffix of the pair of functions for `t`. */
  const fn = namer(names, pending, "t");
  // Source lifting / lowering a `t` at `b` + `o` (primitives inline, the rest a call).
  const load = (t, b, o) => {
    t = resolve(t);
    if (typeof t === "string" && PRIMITIVE_LOAD[t]) return PRIMITIVE_LOAD[t](b, o);
    if (JSON.stringify(t) === '["list","u8"]') return `h.liftBytes(cx, cx.dv.getUint32(${at(b, o)}, true), cx.dv.getUint32(${at(b, o + 4)}, true))`;
    return `l_${fn(t)}(cx, ${at(b, o)})`;
  };
  const store = (t, b, o, v) => {
    t = resolve(t);
    if (typeof t === "string" && PRIMITIVE_STORE[t]) return PRIMITIVE_STORE[t](b, o, v);
    if (JSON.stringify(t) === '["list","u8"]') return `{ const ptr = h.lowerBytes(cx, ${v}); cx.dv.setUint32(${at(b, o)}, ptr, true); cx.dv.setUint32(${at(b, o + 4)}, cx.len, true); }`;
    return `s_${fn(t)}(cx, ${at(b, o)}, ${v});`;
  };
  const disc = (L) => (L.disc === 1 ? "cx.dv.getUint8(p)" : L.disc === 2 ? "cx.dv.getUint16(p, true)" : "cx.dv.getUint32(p, true)");
  const setDisc = (L, i) => (L.disc === 1 ? `cx.dv.setUint8(p, ${i});` : L.disc === 2 ? `cx.dv.setUint16(p, ${i}, true);` : `cx.dv.setUint32(p, ${i}, true);`);

  // Flat lowering (a function's parameters): `f_<name>(cx, v, out)` pushes
  // the core values of `v`, as src/abi.js's `lower` does.
  const flatNames = new Map();
  const flatPending = [];
  const flatFn = namer(flatNames, flatPending, "ft");
  const flatLower = (t, v) => {
    t = resolve(t);
    if (typeof t === "string" && PRIMITIVE_FLAT[t]) return PRIMITIVE_FLAT[t](v);
    if (JSON.stringify(t) === '["list","u8"]') return `{ const ptr = h.lowerBytes(cx, ${v}); out.push(ptr, cx.len); }`;
    return `f_${flatFn(t)}(cx, ${v}, out);`;
  };
  const zeros = (joined, from) => joined.slice(from).map((j) => `out.push(${j === "i64" ? "0n" : "0"});`).join(" ");
  /** A case's payload `v` pushed into its slots of the joined types, then the slots it leaves zeroed. */
  const payload = (ct, v, joined) => {
    if (ct === null) return zeros(joined, 0);
    const have = layout(ct).flat;
    const coerced = have.map((k, i) => (k === joined[i] ? "" : ` out[s + ${i}] = h.coerce(out[s + ${i}], "${k}", "${joined[i]}");`)).join("");
    const pushed = coerced === "" ? flatLower(ct, v) : `{ const s = out.length; ${flatLower(ct, v)}${coerced} }`;
    return `${pushed} ${zeros(joined, have.length)}`.trim();
  };
  const emitFlat = (t, name) => {
    const kind = kindOf(t);
    const L = layout(t);
    if (kind === "record") {
      const fields = TYPES[t][1];
      const expected = JSON.stringify(`expected a record { ${L.names.join(", ")} }, got `);
      const parts = fields.map(([, ft], i) => `  ${flatLower(ft, `v.${L.names[i]}`)}`);
      bodies.push(`function f_${name}(cx, v, out) {\n  if (v === null || typeof v !== "object") throw new TypeError(${expected} + (v === null ? "null" : typeof v));\n${parts.join("\n")}\n}`);
      return;
    }
    if (kind === "enum") {
      const n = fn(t);
      bodies.push(`function f_${name}(cx, v, out) {\n  const i = INDEX_${n}.get(v);\n  if (i === undefined) throw h.badCase(true, TAGS_${n}, v);\n  out.push(i);\n}`);
      return;
    }
    if (kind === "variant" || kind === "result") {
      const n = fn(t);
      const cases = kind === "variant" ? TYPES[t][1] : [["ok", t[1]], ["err", t[2]]];
      const arms = cases.map(([c, ct], i) => `    case ${JSON.stringify(c)}:\n      out.push(${i}); ${payload(ct, "v.val", L.joined)}\n      return;`);
      bodies.push(`function f_${name}(cx, v, out) {\n  if (v === null || typeof v !== "object") throw h.badCase(false, TAGS_${n}, v);\n  switch (v.tag) {\n${arms.join("\n")}\n  }\n  throw h.badCase(false, TAGS_${n}, v);\n}`);
      return;
    }
    if (kind === "option") {
      bodies.push(`function f_${name}(cx, v, out) {\n  if (v === undefined || v === null) { out.push(0); ${zeros(L.joined, 0)} }\n  else { out.push(1); ${payload(t[1], "v", L.joined)} }\n}`);
      return;
    }
    if (kind === "list") {
      const E = layout(t[1]);
      bodies.push(
        `function f_${name}(cx, v, out) {\n  if (!Array.isArray(v)) throw new TypeError(\`expected an array, got \${typeof v}\`);\n  const n = v.length;\n  const base = cx.alloc(${E.align}, n * ${E.size});\n  for (let i = 0; i < n; i++) ${store(t[1], `base + i * ${E.size}`, 0, "v[i]")}\n  out.push(base, n);\n}`,
      );
      return;
    }
    if (kind === "own" || kind === "borrow") {
      bodies.push(`function f_${name}(cx, v, out) {\n  out.push(h.lowerHandleOf(cx, ${JSON.stringify(t[1])}, ${kind !== "borrow"}, v));\n}`);
      return;
    }
    throw new TypeError(`wit-codec: flat ${JSON.stringify(t)} (${kind}) is not supported`);
  };

  const emit = (t, name) => {
    const kind = kindOf(t);
    const L = layout(t);
    if (kind === "record") {
      const fields = TYPES[t][1];
      const lifted = fields.map(([f, ft], i) => `${JSON.stringify(camel(f))}: ${load(ft, "p", L.offsets[i])}`);
      bodies.push(`function l_${name}(cx, p) {\n  return { ${lifted.join(", ")} };\n}`);
      const expected = JSON.stringify(`expected a record { ${L.names.join(", ")} }, got `);
      const stores = fields.map(([, ft], i) => `  ${store(ft, "p", L.offsets[i], `v.${L.names[i]}`)}`);
      bodies.push(`function s_${name}(cx, p, v) {\n  if (v === null || typeof v !== "object") throw new TypeError(${expected} + (v === null ? "null" : typeof v));\n${stores.join("\n")}\n}`);
      return;
    }
    if (kind === "enum") {
      const tags = TYPES[t][1];
      consts.push(`const TAGS_${name} = ${JSON.stringify(tags)};`, `const INDEX_${name} = new Map(TAGS_${name}.map((tag, i) => [tag, i]));`);
      bodies.push(`function l_${name}(cx, p) {\n  const i = ${disc(L)};\n  if (i >= ${tags.length}) throw new TypeError(\`invalid variant discriminant \${i}\`);\n  return TAGS_${name}[i];\n}`);
      bodies.push(`function s_${name}(cx, p, v) {\n  const i = INDEX_${name}.get(v);\n  if (i === undefined) throw h.badCase(true, TAGS_${name}, v);\n  ${setDisc(L, "i")}\n}`);
      return;
    }
    if (kind === "variant" || kind === "result") {
      const cases = kind === "variant" ? TYPES[t][1] : [["ok", t[1]], ["err", t[2]]];
      consts.push(`const TAGS_${name} = ${JSON.stringify(cases.map(([c]) => c))};`);
      const lifts = cases.map(([c, ct], i) => `    case ${i}: return ${ct === null ? `{ tag: ${JSON.stringify(c)} }` : `{ tag: ${JSON.stringify(c)}, val: ${load(ct, "p", L.payload)} }`};`);
      bodies.push(`function l_${name}(cx, p) {\n  const i = ${disc(L)};\n  switch (i) {\n${lifts.join("\n")}\n  }\n  throw new TypeError(\`invalid variant discriminant \${i}\`);\n}`);
      const stores = cases.map(([c, ct], i) => `    case ${JSON.stringify(c)}:\n      ${setDisc(L, i)}${ct === null ? "" : `\n      ${store(ct, "p", L.payload, "v.val")}`}\n      return;`);
      bodies.push(`function s_${name}(cx, p, v) {\n  if (v === null || typeof v !== "object") throw h.badCase(false, TAGS_${name}, v);\n  switch (v.tag) {\n${stores.join("\n")}\n  }\n  throw h.badCase(false, TAGS_${name}, v);\n}`);
      return;
    }
    if (kind === "option") {
      bodies.push(`function l_${name}(cx, p) {\n  const i = ${disc(L)};\n  if (i === 0) return undefined;\n  if (i === 1) return ${load(t[1], "p", L.payload)};\n  throw new TypeError(\`invalid variant discriminant \${i}\`);\n}`);
      bodies.push(`function s_${name}(cx, p, v) {\n  if (v === undefined || v === null) ${setDisc(L, 0)}\n  else {\n    ${setDisc(L, 1)}\n    ${store(t[1], "p", L.payload, "v")}\n  }\n}`);
      return;
    }
    if (kind === "list") {
      const E = layout(t[1]);
      bodies.push(
        `function l_${name}(cx, p) {\n  const base = cx.dv.getUint32(p, true);\n  const n = cx.dv.getUint32(p + 4, true);\n  if (base + n * ${E.size} > cx.u8.length) throw new RangeError(\`list [\${base}, \${base + n * ${E.size}}) out of bounds\`);\n  const out = [];\n  for (let i = 0; i < n; i++) out.push(${load(t[1], `base + i * ${E.size}`, 0)});\n  return out;\n}`,
      );
      bodies.push(
        `function s_${name}(cx, p, v) {\n  if (!Array.isArray(v)) throw new TypeError(\`expected an array, got \${typeof v}\`);\n  const n = v.length;\n  const base = cx.alloc(${E.align}, n * ${E.size});\n  for (let i = 0; i < n; i++) ${store(t[1], `base + i * ${E.size}`, 0, "v[i]")}\n  cx.dv.setUint32(p, base, true);\n  cx.dv.setUint32(p + 4, n, true);\n}`,
      );
      return;
    }
    if (kind === "own" || kind === "borrow" || kind === "resource") {
      const resource = kind === "resource" ? t : t[1];
      bodies.push(`function l_${name}(cx, p) {\n  if (${kind === "borrow" ? "true" : "cx.liftOwn === null"}) throw new TypeError(${JSON.stringify(`${resource}: a borrowed handle cannot be returned`)});\n  return cx.liftOwn(${JSON.stringify(resource)}, cx.dv.getUint32(p, true));\n}`);
      bodies.push(`function s_${name}(cx, p, v) {\n  cx.dv.setUint32(p, h.lowerHandleOf(cx, ${JSON.stringify(resource)}, ${kind !== "borrow"}, v), true);\n}`);
      return;
    }
    throw new TypeError(`wit-codec: ${JSON.stringify(t)} (${kind}) is not supported`);
  };

  // The types every request lifts or lowers (an exchange's actions and events,
  // the ledger import's statements and results) and those in them; the rest
  // (config, errors of `open`, sweep and lease reports) cross once per session
  // or rarely and are left to the descriptor walk.
  const covered = [];
  const visit = (t) => {
    t = resolve(t);
    if (typeof t !== "string") return (t[0] === "result" ? [t[1], t[2]] : t[0] === "tuple" ? t[1] : [t[1]]).forEach((x) => x !== null && visit(x));
    const def = TYPES[t];
    if (!def || !["record", "variant", "enum"].includes(def[0]) || covered.includes(t)) return;
    covered.push(t);
    for (const [, ft] of def[0] === "enum" ? [] : def[1]) if (ft !== null) visit(ft);
  };
  for (const root of HOT) if (TYPES[root]) visit(root);
  for (const name of covered) fn(name);
  const flatRoots = FLAT_ROOTS.filter((name) => TYPES[name]);
  for (const name of flatRoots) flatFn(name);
  while (pending.length > 0 || flatPending.length > 0) {
    if (flatPending.length > 0) emitFlat(...flatPending.shift());
    else emit(...pending.shift());
  }
  const tableNames = [...covered, ...flatRoots.filter((name) => !covered.includes(name))];
  const entry = (name) => {
    const pair = covered.includes(name) ? `l_${fn(name)}, s_${fn(name)}` : "undefined, undefined";
    return flatRoots.includes(name) ? `${pair}, f_${flatFn(name)}` : pair;
  };
  const table = tableNames.map((name) => `    ${JSON.stringify(name)}: [${entry(name)}],`);
  const indent = (block) => block.split("\n").map((line) => (line === "" ? line : `  ${line}`)).join("\n");
  return [
    "/** Lift, lower and flat-lowering functions per type (scripts/wit-codec.js); `h`: src/abi.js's helpers. */",
    "export function codec(h) {",
    indent(consts.join("\n")),
    indent(bodies.join("\n")),
    "  return {",
    ...table,
    "  };",
    "}",
    "",
  ].join("\n");
}
