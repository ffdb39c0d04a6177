#!/usr/bin/env node
// Generates the type table the package's canonical ABI binding loads
// (src/component.js, src/abi.js), and the lift and lower functions of the
// types each request carries (scripts/wit-codec.js), from the WIT package
// itself:
//
//   node scripts/wit-table.js ../../wit generated/wit.js
//
// so a WIT change regenerates the binding's types instead of leaving a
// transcription behind (`make build` runs it whenever wit/*.wit changed;
// test/component.test.js checks the table against the core module's function
// signatures and against jco's glue for the same component). Pure Node, no
// dependency: it parses the subset of WIT the package uses (interfaces,
// `use`, type aliases, records, variants, enums, resources with methods and
// static functions, freestanding functions, one world) and refuses anything
// else, loudly.
//
// The table (an ES module of plain data, then `codec(h)`: see wit-codec.js):
//   PACKAGE   "namespace:name@version"
//   TYPES     { "interface.name": definition }, definitions being
//             ["record", [[field, type], ...]] | ["variant", [[case, type | null], ...]]
//             | ["enum", [name, ...]] | ["resource"] | ["alias", type]
//   INTERFACES { name: { functions: { name: [params, result] },
//                        resources: { name: { methods: {...}, statics: {...} } } } }
//   WORLD     { name, imports: [interface], exports: [interface] }
// where a type is a primitive's name ("u16", "string", ...), "interface.name",
// or ["list" | "option" | "own" | "borrow", type] | ["result", ok | null, err | null]
// | ["tuple", [type, ...]]; params are [[name, type], ...], a result is a type or null.
import { readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { codecSource } from "./wit-codec.js";

const PRIMITIVES = new Set(["bool", "s8", "u8", "s16", "u16", "s32", "u32", "s64", "u64", "f32", "f64", "char", "string"]);

/** WIT source -> tokens ({ t: kind, v: text, line }); doc comments are dropped like any comment. */
function tokenize(source, file) {
  const tokens = [];
  let i = 0;
  let line = 1;
  while (i < source.length) {
    const c = source[i];
    if (c === "\n") {
      line++;
      i++;
    } else if (/\s/.test(c)) i++;
    else if (source.startsWith("//", i)) {
      while (i < source.length && source[i] !== "\n") i++;
    } else if (source.startsWith("/*", i)) {
      const end = source.indexOf("*/", i + 2);
      if (end < 0) throw new Error(`${file}:${line}: unterminated comment`);
      line += source.slice(i, end).split("\n").length - 1;
      i = end + 2;
    } else if (source.startsWith("->", i)) {
      tokens.push({ t: "->", v: "->", line });
      i += 2;
    } else if ("{}()<>,:;=.@/*".includes(c)) {
      tokens.push({ t: c, v: c, line });
      i++;
    } else if (c === "_") {
      tokens.push({ t: "id", v: "_", line });
      i++;
    } else if (/[%a-zA-Z0-9]/.test(c)) {
      const m = /^%?[a-zA-Z0-9]+(?:[-.+][a-zA-Z0-9]+)*/.exec(source.slice(i));
      // a version (after @) may hold dots; identifiers never do
      const text = tokens.at(-1)?.t === "@" ? m[0] : m[0].split(".")[0];
      tokens.push({ t: "id", v: text, line });
      i += text.length;
    } else throw new Error(`${file}:${line}: unexpected character ${JSON.stringify(c)}`);
  }
  return tokens;
}

class Parser {
  constructor(tokens, file) {
    this.tokens = tokens;
    this.file = file;
    this.at = 0;
  }
  peek(offset = 0) {
    return this.tokens[this.at + offset];
  }
  fail(message) {
    const t = this.peek();
    throw new Error(`${this.file}:${t?.line ?? "end"}: ${message} (at ${t ? JSON.stringify(t.v) : "the end"})`);
  }
  take(kind, value) {
    const t = this.peek();
    if (!t || t.t !== kind || (value !== undefined && t.v !== value)) this.fail(`expected ${value ?? kind}`);
    this.at++;
    return t.v;
  }
  eat(kind, value) {
    const t = this.peek();
    if (t && t.t === kind && (value === undefined || t.v === value)) {
      this.at++;
      return true;
    }
    return false;
  }
  name() {
    const v = this.take("id");
    return v.startsWith("%") ? v.slice(1) : v;
  }
  done() {
    return this.at >= this.tokens.length;
  }

  /** A type expression, as written (names resolved later). */
  type() {
    const name = this.name();
    if (["list", "option", "own", "borrow"].includes(name) && this.eat("<")) {
      const inner = this.type();
      this.take(">");
      return [name, inner];
    }
    if (name === "result") {
      if (!this.eat("<")) return ["result", null, null];
      let ok = null;
      let err = null;
      if (this.eat("id", "_")) {
        this.take(",");
        err = this.type();
      } else {
        ok = this.type();
        if (this.eat(",")) err = this.type();
      }
      this.take(">");
      return ["result", ok, err];
    }
    if (name === "tuple") {
      this.take("<");
      const items = [this.type()];
      while (this.eat(",")) items.push(this.type());
      this.take(">");
      return ["tuple", items];
    }
    if (name === "flags" || name === "future" || name === "stream") this.fail(`${name} is not supported by this binding`);
    return PRIMITIVES.has(name) ? name : { ref: name };
  }

  /** `(name: type, ...)` */
  params() {
    this.take("(");
    const params = [];
    while (!this.eat(")")) {
      const name = this.name();
      this.take(":");
      params.push([name, this.type()]);
      if (!this.eat(",")) {
        this.take(")");
        break;
      }
    }
    return params;
  }

  /** `func(params) [-> type]` */
  func() {
    this.take("id", "func");
    const params = this.params();
    const result = this.eat("->") ? this.type() : null;
    this.take(";");
    return [params, result];
  }

  /** `{ a, b(type), ... }` items of a record / variant / enum. */
  members(withType, colon) {
    this.take("{");
    const members = [];
    while (!this.eat("}")) {
      const name = this.name();
      let type = null;
      if (colon) {
        this.take(":");
        type = this.type();
      } else if (withType && this.eat("(")) {
        type = this.type();
        this.take(")");
      }
      members.push(withType || colon ? [name, type] : name);
      if (!this.eat(",")) {
        this.take("}");
        break;
      }
    }
    return members;
  }

  interfaceBody() {
    const body = { uses: [], types: {}, functions: {}, resources: {} };
    this.take("{");
    while (!this.eat("}")) {
      const word = this.peek().v;
      if (word === "use") {
        this.at++;
        const from = this.name();
        this.take(".");
        this.take("{");
        while (!this.eat("}")) {
          const name = this.name();
          const alias = this.eat("id", "as") ? this.name() : name;
          body.uses.push({ from, name, alias });
          if (!this.eat(",")) {
            this.take("}");
            break;
          }
        }
        this.take(";");
      } else if (word === "record") {
        this.at++;
        body.types[this.name()] = ["record", this.members(false, true)];
      } else if (word === "variant") {
        this.at++;
        body.types[this.name()] = ["variant", this.members(true, false)];
      } else if (word === "enum") {
        this.at++;
        body.types[this.name()] = ["enum", this.members(false, false)];
      } else if (word === "type") {
        this.at++;
        const name = this.name();
        this.take("=");
        body.types[name] = ["alias", this.type()];
        this.take(";");
      } else if (word === "resource") {
        this.at++;
        const name = this.name();
        body.types[name] = ["resource"];
        const resource = { methods: {}, statics: {} };
        body.resources[name] = resource;
        if (!this.eat(";")) {
          this.take("{");
          while (!this.eat("}")) {
            if (this.peek().v === "constructor") this.fail("resource constructors are not supported by this binding");
            const fname = this.name();
            this.take(":");
            if (this.eat("id", "static")) resource.statics[fname] = this.func();
            else resource.methods[fname] = this.func();
          }
        }
      } else if (this.peek(1)?.t === ":") {
        const name = this.name();
        this.take(":");
        body.functions[name] = this.func();
      } else this.fail(`unsupported interface item ${word}`);
    }
    return body;
  }
}

/** The package line of a .wit file: `package ns:name@version;` (parsed apart: it is the one place versions occur). */
function packageOf(dir) {
  const names = new Set();
  for (const file of readdirSync(dir).filter((f) => f.endsWith(".wit"))) {
    const m = /^\s*package\s+([a-z0-9-]+:[a-z0-9-]+(?:@[0-9A-Za-z.+-]+)?)\s*;/m.exec(readFileSync(join(dir, file), "utf8"));
    if (!m) throw new Error(`${file}: no package line`);
    names.add(m[1]);
  }
  if (names.size !== 1) throw new Error(`one package expected, found ${[...names].join(", ")}`);
  return [...names][0];
}

/** Strips the `package` line (handled by packageOf) before parsing. */
function withoutPackage(source) {
  return source.replace(/^\s*package\s+[^;]*;/m, "");
}

/** The whole table for `dir`: names resolved to "interface.name". */
export function generate(dir) {
  const PACKAGE = packageOf(dir);
  const interfaces = {};
  let world = null;
  for (const file of readdirSync(dir).filter((f) => f.endsWith(".wit")).sort()) {
    const p = new Parser(tokenize(withoutPackage(readFileSync(join(dir, file), "utf8")), file), file);
    while (!p.done()) {
      const word = p.name();
      if (word === "interface") {
        const name = p.name();
        if (interfaces[name]) p.fail(`interface ${name} defined twice`);
        interfaces[name] = p.interfaceBody();
      } else if (word === "world") {
        if (world) p.fail("more than one world");
        world = { name: p.name(), imports: [], exports: [] };
        p.take("{");
        while (!p.eat("}")) {
          const kind = p.name();
          if (kind !== "import" && kind !== "export") p.fail("a world holds imports and exports of interfaces only");
          const iface = p.name();
          if (p.peek().t !== ";") p.fail("only interfaces of this package may be imported or exported");
          p.take(";");
          world[`${kind}s`].push(iface);
        }
      } else p.fail(`unsupported top-level item ${word}`);
    }
  }
  if (!world) throw new Error("no world");

  const TYPES = {};
  const resolve = (iface, t) => {
    if (typeof t === "string") return t;
    if (Array.isArray(t)) {
      if (t[0] === "result") return ["result", t[1] && resolve(iface, t[1]), t[2] && resolve(iface, t[2])];
      if (t[0] === "tuple") return ["tuple", t[1].map((x) => resolve(iface, x))];
      return [t[0], resolve(iface, t[1])];
    }
    const body = interfaces[iface];
    if (t.ref in body.types) return `${iface}.${t.ref}`;
    const use = body.uses.find((u) => u.alias === t.ref);
    if (!use) throw new Error(`interface ${iface}: unknown type ${t.ref}`);
    if (!interfaces[use.from]?.types[use.name]) throw new Error(`interface ${iface}: ${use.from}.${use.name} does not exist`);
    return `${use.from}.${use.name}`;
  };
  const INTERFACES = {};
  for (const [iface, body] of Object.entries(interfaces)) {
    for (const [name, def] of Object.entries(body.types)) {
      let out;
      if (def[0] === "record") out = ["record", def[1].map(([f, t]) => [f, resolve(iface, t)])];
      else if (def[0] === "variant") out = ["variant", def[1].map(([c, t]) => [c, t === null ? null : resolve(iface, t)])];
      else if (def[0] === "alias") out = ["alias", resolve(iface, def[1])];
      else out = def;
      TYPES[`${iface}.${name}`] = out;
    }
    const fn = ([params, result]) => [params.map(([n, t]) => [n, resolve(iface, t)]), result === null ? null : resolve(iface, result)];
    const functions = Object.fromEntries(Object.entries(body.functions).map(([n, f]) => [n, fn(f)]));
    const resources = {};
    for (const [name, r] of Object.entries(body.resources)) {
      resources[name] = {
        methods: Object.fromEntries(Object.entries(r.methods).map(([n, f]) => [n, fn(f)])),
        statics: Object.fromEntries(Object.entries(r.statics).map(([n, f]) => [n, fn(f)])),
      };
    }
    INTERFACES[iface] = { functions, resources };
  }
  for (const iface of [...world.imports, ...world.exports]) if (!INTERFACES[iface]) throw new Error(`world ${world.name}: no interface ${iface}`);
  return { PACKAGE, TYPES, INTERFACES, WORLD: world };
}

/** The table as an ES module. */
export function render(table, from) {
  const lines = [
    `// Generated by scripts/wit-table.js from ${from} (WIT package ${table.PACKAGE}): do not edit.`,
    "// The type table of the canonical ABI binding (src/component.js), and its lift and lower functions per type.",
    `export const PACKAGE = ${JSON.stringify(table.PACKAGE)};`,
    `export const WORLD = ${JSON.stringify(table.WORLD)};`,
    "export const TYPES = {",
    ...Object.entries(table.TYPES).map(([k, v]) => `  ${JSON.stringify(k)}: ${JSON.stringify(v)},`),
    "};",
    "export const INTERFACES = {",
  ];
  const fns = (indent, fs) => Object.entries(fs).map(([n, f]) => `${indent}${JSON.stringify(n)}: ${JSON.stringify(f)},`);
  for (const [name, { functions, resources }] of Object.entries(table.INTERFACES)) {
    lines.push(`  ${JSON.stringify(name)}: {`, "    functions: {", ...fns("      ", functions), "    },", "    resources: {");
    for (const [r, { methods, statics }] of Object.entries(resources)) {
      lines.push(`      ${JSON.stringify(r)}: {`, "        methods: {", ...fns("          ", methods), "        },", "        statics: {", ...fns("          ", statics), "        },", "      },");
    }
    lines.push("    },", "  },");
  }
  lines.push("};", "", codecSource(table.TYPES));
  return lines.join("\n");
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  const [dir, out] = process.argv.slice(2);
  if (!dir || !out) {
    process.stderr.write("usage: node scripts/wit-table.js <wit dir> <output .js>\n");
    process.exit(2);
  }
  writeFileSync(out, render(generate(dir), "wit/*.wit"));
}
