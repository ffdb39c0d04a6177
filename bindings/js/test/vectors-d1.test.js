// The database kinds of the vectors (decision, completion, abandon, sweep)
// once more, on real D1 in workerd through the package's D1 adapter (value
// conversion, Object.values rows, meta.changes). Counts are asserted.
import assert from "node:assert/strict";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { PACKAGE_ROOT, startWorker } from "./helpers/workerd.js";
import { doc } from "./helpers/vectors.js";
import { DATABASE_KINDS, checkFields } from "./helpers/vector-json.js";

let mf;
before(async () => {
  ({ mf } = await startWorker({ scriptPath: join(PACKAGE_ROOT, "test/fixtures/vector-worker.js") }));
});
after(async () => {
  await mf?.dispose();
});

for (const kind of DATABASE_KINDS) {
  test(`${kind} vectors on D1 in workerd (${doc.counts[kind]})`, async () => {
    let ran = 0;
    for (const v of doc[kind]) {
      checkFields(kind, v);
      const r = await mf.dispatchFetch("http://vectors.test/vector", { method: "POST", body: JSON.stringify({ kind, vector: v }) });
      assert.equal(r.status, 200, `${v.id}: ${await r.clone().text()}`);
      const { got, expect, rows } = await r.json();
      assert.deepEqual(got, expect, `${v.id} (D1): ${v.spec}`);
      if (kind === "sweep") assert.equal(rows.length, v.expect.remaining, `${v.id} (D1): remaining`);
      if (v.rows_after !== null) assert.deepEqual(rows, v.rows_after, `${v.id} (D1): rows after`);
      ran++;
    }
    assert.equal(ran, doc.counts[kind], `${kind}: vectors run != counts`);
  });
}
