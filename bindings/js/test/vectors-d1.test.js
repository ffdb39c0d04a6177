// The decision, completion and sweep vectors once more, on real D1 in workerd
// through the package's D1 adapter (value conversion, Object.values rows,
// meta.changes). Counts are asserted like the better-sqlite3 run.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { PACKAGE_ROOT, startWorker } from "./helpers/workerd.js";

const doc = JSON.parse(readFileSync(new URL("../../../conformance/vectors.json", import.meta.url), "utf8"));
const CONFIG_FIELDS = {
  "protected-methods": "protectedMethods",
  "fingerprint-headers": "fingerprintHeaders",
  "replay-headers": "replayHeaders",
  "pending-ttl-ms": "pendingTtlMs",
  "retention-ms": "retentionMs",
  "body-cap-bytes": "bodyCapBytes",
  "sweep-batch": "sweepBatch",
};
const options = (v) =>
  Object.fromEntries(
    Object.entries(v.config).map(([name, value]) => {
      assert.ok(name in CONFIG_FIELDS, `${v.id}: unknown config field ${name}`);
      return [CONFIG_FIELDS[name], value];
    }),
  );

let mf;
before(async () => {
  ({ mf } = await startWorker({ scriptPath: join(PACKAGE_ROOT, "test/fixtures/vector-worker.js") }));
});
after(async () => {
  await mf?.dispose();
});

for (const kind of ["decision", "completion", "sweep"]) {
  test(`${kind} vectors on D1 in workerd`, async () => {
    let ran = 0;
    for (const v of doc[kind]) {
      const r = await mf.dispatchFetch("http://vectors.test/vector", { method: "POST", body: JSON.stringify({ kind, vector: v, options: options(v) }) });
      assert.equal(r.status, 200, `${v.id}: ${await r.clone().text()}`);
      const { got, rows, logged } = await r.json();
      if (kind === "sweep") {
        assert.deepEqual({ deleted: got.deleted, remaining: rows.length }, { deleted: v.expect.deleted, remaining: v.expect.remaining ?? rows.length }, `${v.id} (D1): ${v.spec}`);
      } else {
        assert.deepEqual(got, v.expect, `${v.id} (D1): ${v.spec}`);
      }
      if (kind === "completion") assert.equal(logged.length, got.stored ? 0 : 1, `${v.id}: fenced out is logged`);
      if (v.rows_after !== null) assert.deepEqual(rows, v.rows_after, `${v.id} (D1): rows after`);
      ran++;
    }
    assert.equal(ran, doc.counts[kind], `${kind}: vectors run != counts`);
  });
}
