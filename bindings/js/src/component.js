// The idempotency core component (WIT package in generated/wit.js, made from
// wit/*.wit by scripts/wit-table.js) instantiated from its core module with
// the canonical ABI of ./abi.js, in this file instead of jco's generated
// glue. jco still extracts the core module (`jco transpile` ->
// generated/core.core.wasm); its glue (generated/core.js) is only used by
// test/component.test.js, which checks this binding against it and the
// type table against the core module's own function signatures.
//
// Why: jco's glue is ~300 KB of JS (per-call async-task bookkeeping, a
// function per export specialised for every type) that a Worker parses at
// start and compiles on first use, plus shim modules; this binding is this
// file, src/abi.js and generated/wit.js (about 70 KB together), and does the
// same conversions per call.
//
// The instance has jco's shape: { session: { Session, defaultConfig, schema,
// queries }, exchange: { Exchange } }; resources are objects whose methods
// call the guest and whose [Symbol.dispose]() drops them; a function
// returning a `result` returns the ok value or throws a ComponentError whose
// `payload` is the err value. Instantiation is synchronous; nothing is
// compiled here (the caller hands over a compiled WebAssembly.Module).
import { INTERFACES, PACKAGE, TYPES, WORLD, codec } from "../generated/wit.js";
import { CODEC_HELPERS, MAX_FLAT_PARAMS, MAX_FLAT_RESULTS, Memory, camel, coreSignature, flatOf, lay, liftFlat, load, lower, record, store, typeTable } from "./abi.js";

export const CORE_MODULE = "core.core.wasm";
export { PACKAGE };

const [NAMESPACE, VERSION] = PACKAGE.split("@");
/** The component-level name of one of the package's interfaces: "idempotency:ledger/session@0.3.0". */
export const interfaceName = (iface) => `${NAMESPACE}/${iface}${VERSION ? `@${VERSION}` : ""}`;
const pascal = (name) => camel(name).replace(/^./, (c) => c.toUpperCase());
const hasOwn = Object.prototype.hasOwnProperty;
const DISPOSE = Symbol.dispose ?? Symbol.for("dispose");
const types = typeTable(TYPES);
// The types every request carries are lifted and lowered by their generated
// functions (scripts/wit-codec.js) wherever the descriptor walk meets them;
// `session.start`'s and `exchange.step`'s parameters are lowered flat by
// theirs (exportCall).
for (const [name, [lift, lower, flat]] of Object.entries(codec(CODEC_HELPERS))) {
  const t = types(name);
  if (lift !== undefined) Object.assign(t, { lift, lower });
  if (flat !== undefined) t.flat = flat;
}

/** A `result` err value thrown by a call (jco's ComponentError: the err value is `payload`). */
export class ComponentError extends Error {
  constructor(payload) {
    super(`${typeof payload === "object" && payload !== null && "tag" in payload ? payload.tag : String(payload)} (see error.payload)`);
    this.name = "ComponentError";
    Object.defineProperty(this, "payload", { value: payload, enumerable: true });
  }
}

/** Every function of the world as { iface, resource?, kind, name, exportName, params, result }. */
function worldFunctions() {
  const out = [];
  for (const iface of WORLD.exports) {
    const { functions, resources } = INTERFACES[iface];
    const base = interfaceName(iface);
    for (const [name, [params, result]] of Object.entries(functions)) out.push({ iface, kind: "function", name, exportName: `${base}#${name}`, params, result });
    for (const [resource, { methods, statics }] of Object.entries(resources)) {
      for (const [name, [params, result]] of Object.entries(methods)) out.push({ iface, resource, kind: "method", name, exportName: `${base}#[method]${resource}.${name}`, params, result });
      for (const [name, [params, result]] of Object.entries(statics)) out.push({ iface, resource, kind: "static", name, exportName: `${base}#[static]${resource}.${name}`, params, result });
    }
  }
  return out;
}
const FUNCTIONS = worldFunctions();
const RESOURCES = WORLD.exports.flatMap((iface) => Object.keys(INTERFACES[iface].resources).map((resource) => ({ iface, resource, type: `${iface}.${resource}` })));
const IMPORTS = WORLD.imports.flatMap((iface) => Object.entries(INTERFACES[iface].functions).map(([name, [params, result]]) => ({ iface, name, params, result })));

const paramTypes = (f) => f.params.map(([, t]) => types(t));
const resultType = (f) => (f.result === null ? null : types(f.result));

/** The core signature each export and import must have (checked against the core module by test/component.test.js). */
export function coreSignatures() {
  const exports = {};
  for (const f of FUNCTIONS) exports[f.exportName] = coreSignature(paramTypes(f), resultType(f), { self: f.kind === "method" });
  const imports = {};
  for (const { iface, resource } of RESOURCES) {
    exports[`${interfaceName(iface)}#[dtor]${resource}`] = { params: ["i32"], results: [] };
    imports[`[export]${interfaceName(iface)}::[resource-new]${resource}`] = { params: ["i32"], results: ["i32"] };
    imports[`[export]${interfaceName(iface)}::[resource-drop]${resource}`] = { params: ["i32"], results: [] };
  }
  for (const f of IMPORTS) imports[`${interfaceName(f.iface)}::${f.name}`] = coreSignature(paramTypes(f), resultType(f), { imported: true });
  return { exports, imports };
}

/**
 * The JS call of one export: lowers the arguments (a method's first core
 * argument is its resource's rep), calls the core function, lifts the result
 * from its return area and runs the post-return.
 */
function exportCall(cx, exports, f) {
  const fn = exports[f.exportName];
  if (typeof fn !== "function") throw new TypeError(`the core module does not export ${f.exportName}`);
  const post = exports[`cabi_post_${f.exportName}`];
  const params = paramTypes(f);
  const res = resultType(f);
  const method = f.kind === "method";
  if (res === null || lay(res).flat.length <= MAX_FLAT_RESULTS) throw new TypeError(`${f.exportName}: results passed flat are not supported by this binding`);
  const flatCount = flatOf(params).length + (method ? 1 : 0);
  const spilled = flatCount > MAX_FLAT_PARAMS ? record(Object.fromEntries(params.map((t, i) => [`p${i}`, t]))) : null;
  if (spilled && method) throw new TypeError(`${f.exportName}: spilled method parameters are not supported by this binding`);
  const unwrap = res.isResult === true;
  const n = params.length;
  const flat = params.map((t) => t.flat ?? null);
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
      for (let i = 0; i < n; i++) {
        if (flat[i] !== null) flat[i](cx, args[i], out);
        else lower(cx, params[i], args[i], out);
      }
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
 * (each import of the world, by its unversioned or versioned interface name,
 * functions in camelCase) returns the statement results or throws the WIT
 * `batch-error` (a plain object, or an error whose `payload` it is; any other
 * Error thrown there is a trap). Returns jco's shape (see above).
 */
export function instantiate(getCoreModule, imports) {
  const module = getCoreModule(CORE_MODULE);
  let cx = null;
  let exports = null;
  let trapped = false;

  // One handle table per exported resource: handle -> rep.
  const tables = new Map(RESOURCES.map((r) => [r.type, { reps: new Map(), next: 1, ...r }]));
  const dtorOf = (table) => (rep) => exports[`${interfaceName(table.iface)}#[dtor]${table.resource}`](rep);
  const coreImports = {};
  for (const table of tables.values()) {
    const dtor = dtorOf(table);
    coreImports[`[export]${interfaceName(table.iface)}`] = {
      ...coreImports[`[export]${interfaceName(table.iface)}`],
      [`[resource-new]${table.resource}`]: (rep) => {
        const h = table.next++;
        table.reps.set(h, rep);
        return h;
      },
      [`[resource-drop]${table.resource}`]: (h) => {
        const rep = table.reps.get(h);
        if (rep === undefined) throw new WebAssembly.RuntimeError(`unknown ${table.resource} handle ${h}`);
        table.reps.delete(h);
        dtor(rep);
      },
    };
  }
  for (const f of IMPORTS) {
    const host = imports?.[`${NAMESPACE}/${f.iface}`] ?? imports?.[interfaceName(f.iface)];
    const hostFn = host?.[camel(f.name)];
    if (typeof hostFn !== "function") throw new TypeError(`instantiate: imports['${NAMESPACE}/${f.iface}'].${camel(f.name)} is required`);
    const params = paramTypes(f);
    const res = resultType(f);
    const viaPointer = res !== null && lay(res).flat.length > MAX_FLAT_RESULTS;
    if (res !== null && !viaPointer) throw new TypeError(`${f.name}: flat import results are not supported by this binding`);
    coreImports[interfaceName(f.iface)] = {
      ...coreImports[interfaceName(f.iface)],
      [f.name]: (...flat) => {
        // Anything thrown from here unwinds the guest's frames: the instance
        // is not entered again (a trap), whatever the error was.
        try {
          cx.refresh();
          const retptr = viaPointer ? flat.pop() : undefined;
          const args = [];
          for (let i = 0, at = 0; i < params.length; i++) {
            const n = lay(params[i]).flat.length;
            args.push(liftFlat(cx, params[i], flat.slice(at, at + n)));
            at += n;
          }
          let value;
          if (res?.isResult) {
            try {
              value = { tag: "ok", val: hostFn(...args) };
            } catch (error) {
              if (error && hasOwn.call(error, "payload")) value = { tag: "err", val: error.payload };
              else if (error instanceof Error) throw error;
              else value = { tag: "err", val: error };
            }
          } else value = hostFn(...args);
          if (viaPointer) store(cx, res, retptr, value);
        } catch (error) {
          trapped = true;
          throw error instanceof WebAssembly.RuntimeError ? error : new WebAssembly.RuntimeError(`the ${f.name} import failed: ${error?.message ?? error}`, { cause: error });
        }
      },
    };
  }

  const instance = new WebAssembly.Instance(module, coreImports);
  exports = instance.exports;
  cx = new Memory(exports.memory, exports.cabi_realloc);

  /** The call of `f`, made on first use; refuses to enter a trapped instance. */
  const bind = (f) => {
    let call = null;
    return (rep, args) => {
      if (trapped) throw new WebAssembly.RuntimeError("the component instance trapped earlier; it cannot be entered again");
      if (call === null) call = exportCall(cx, exports, f);
      try {
        return call(rep, args);
      } catch (error) {
        if (error instanceof WebAssembly.RuntimeError) trapped = true;
        throw error;
      }
    };
  };

  // Resource objects: an own<resource> lifted from the guest keeps its
  // handle; [Symbol.dispose]() (or the garbage collector) drops it.
  const HANDLE = Symbol("handle");
  const classes = new Map();
  const registry =
    typeof FinalizationRegistry === "undefined"
      ? { register() {}, unregister() {} }
      : new FinalizationRegistry(({ table, h }) => drop(table, h));
  function drop(table, h) {
    const rep = table.reps.get(h);
    if (rep === undefined) return;
    table.reps.delete(h);
    if (trapped) return;
    try {
      dtorOf(table)(rep);
    } catch {
      trapped = true;
    }
  }
  for (const table of tables.values()) {
    const name = pascal(table.resource);
    const Class = {
      [name]: class {
        constructor() {
          throw new TypeError(`"${name}" resource does not define a constructor`);
        }
      },
    }[name];
    const repOf = (object) => {
      const rep = table.reps.get(object?.[HANDLE]);
      if (rep === undefined) throw new TypeError(`Resource error: Not a valid "${name}" resource.`);
      return rep;
    };
    Object.defineProperty(Class.prototype, DISPOSE, {
      value: function dispose() {
        const h = this[HANDLE];
        if (h === undefined) return;
        this[HANDLE] = undefined;
        registry.unregister(this);
        drop(table, h);
      },
      writable: true,
      configurable: true,
    });
    classes.set(table.type, { Class, table });
    for (const f of FUNCTIONS.filter((x) => x.resource === table.resource && x.kind === "method")) {
      const call = bind(f);
      Object.defineProperty(Class.prototype, camel(f.name), {
        value: function (...args) {
          return call(repOf(this), args);
        },
        writable: true,
        configurable: true,
      });
    }
    for (const f of FUNCTIONS.filter((x) => x.resource === table.resource && x.kind === "static")) {
      const call = bind(f);
      Class[camel(f.name)] = (...args) => call(0, args);
    }
  }
  cx.liftOwn = (type, h) => {
    const { Class, table } = classes.get(type);
    if (!table.reps.has(h)) throw new WebAssembly.RuntimeError(`unknown ${table.resource} handle ${h}`);
    const object = Object.create(Class.prototype);
    object[HANDLE] = h; // a plain store (a symbol key is listed by nothing), not defineProperty: one per exchange started
    registry.register(object, { table, h }, object);
    return object;
  };

  const root = {};
  for (const iface of WORLD.exports) {
    const { functions, resources } = INTERFACES[iface];
    if (Object.keys(functions).length === 0 && Object.keys(resources).length === 0) continue;
    const api = {};
    for (const f of FUNCTIONS.filter((x) => x.iface === iface && x.kind === "function")) {
      const call = bind(f);
      api[camel(f.name)] = (...args) => call(0, args);
    }
    for (const resource of Object.keys(resources)) api[pascal(resource)] = classes.get(`${iface}.${resource}`).Class;
    root[camel(iface)] = api;
    root[interfaceName(iface)] = api;
  }
  return root;
}

