// The shared conformance vectors (format 2) and a session per vector config.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { toWitConfig } from "../../src/runtime.js";
import { KINDS, optionsOf } from "./vector-json.js";

export const doc = JSON.parse(readFileSync(new URL("../../../../conformance/vectors.json", import.meta.url), "utf8"));

assert.equal(doc.format, 2, "conformance/vectors.json format");
for (const key of Object.keys(doc)) {
  assert.ok(["format", "description", "counts", ...KINDS].includes(key), `unknown top-level key (vector kind) ${key}`);
}
for (const kind of Object.keys(doc.counts)) assert.ok(KINDS.includes(kind), `unknown vector kind ${kind} in counts`);

/** A session on the vector's config in `dialect`. */
export function sessionOf(core, v, dialect = "sqlite") {
  return core.open(toWitConfig(core, optionsOf(v.id, v.config), dialect));
}
