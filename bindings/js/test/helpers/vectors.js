// The shared conformance vectors and the mapping of their WIT-spelled config
// fields onto this package's option names, for every JS vector runner.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";

export const doc = JSON.parse(readFileSync(new URL("../../../../conformance/vectors.json", import.meta.url), "utf8"));

const CONFIG_FIELDS = {
  "protected-methods": "protectedMethods",
  "fingerprint-headers": "fingerprintHeaders",
  "replay-headers": "replayHeaders",
  "pending-ttl-ms": "pendingTtlMs",
  "retention-ms": "retentionMs",
  "body-cap-bytes": "bodyCapBytes",
  "sweep-batch": "sweepBatch",
};

/** A vector's `config` as package options; fails on an unknown field. */
export function options(v) {
  const out = {};
  for (const [name, value] of Object.entries(v.config)) {
    assert.ok(name in CONFIG_FIELDS, `${v.id}: unknown config field ${name}`);
    out[CONFIG_FIELDS[name]] = value;
  }
  return out;
}
