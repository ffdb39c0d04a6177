// The shared conformance vectors (format 3) and a session per vector config.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { toWitConfig } from "../../src/runtime.js";
import { KINDS, dialectOf, optionsOf } from "./vector-json.js";

export const doc = JSON.parse(readFileSync(new URL("../../../../conformance/vectors.json", import.meta.url), "utf8"));

/** True once conformance/vectors.json is in the format these runners read. */
export const FORMAT_3 = doc.format === 3;
/** Why the vector suites skip (the file is still in an older format), or false. */
export const SKIP_VECTORS = FORMAT_3 ? false : `conformance/vectors.json is format ${doc.format}; these runners read format 3`;

if (FORMAT_3) {
  for (const key of Object.keys(doc)) {
    assert.ok(["format", "description", "counts", "families", ...KINDS].includes(key), `unknown top-level key (vector kind) ${key}`);
  }
  for (const kind of Object.keys(doc.counts)) assert.ok(KINDS.includes(kind), `unknown vector kind ${kind} in counts`);
}

/** A session on the vector's config, in the vector's dialect or else `dialect` (the runner's database's). */
export function sessionOf(core, v, dialect = "sqlite") {
  return core.open(toWitConfig(core, optionsOf(v.id, v.config), dialectOf(v, dialect)));
}
