// The decision, completion and sweep vectors once more, on real D1 in workerd
// through the package's D1 adapter (value conversion, Object.values rows,
// meta.changes). Counts are asserted like the better-sqlite3 run.
import assert from "node:assert/strict";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { PACKAGE_ROOT, startWorker } from "./helpers/workerd.js";
import { doc, options } from "./helpers/vectors.js";

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
