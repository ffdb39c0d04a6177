// The exchange vectors that touch a database, and the sweep vectors, on real
// D1 in workerd through the package's D1 adapter (value conversion,
// Object.values rows, meta.changes), stepped as a Worker runs them, with the
// body hashed by Web Crypto. Counts are asserted.
import assert from "node:assert/strict";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { PACKAGE_ROOT, startWorker } from "./helpers/workerd.js";
import { SKIP_VECTORS, doc } from "./helpers/vectors.js";
import { checkFields } from "./helpers/vector-json.js";

describe("vectors on D1 in workerd", { skip: SKIP_VECTORS }, () => {
  let mf;
  before(async () => {
    ({ mf } = await startWorker({ scriptPath: join(PACKAGE_ROOT, "test/fixtures/vector-worker.js") }));
  });
  after(async () => {
    await mf?.dispose();
  });

  const run = async (kind, v) => {
    const r = await mf.dispatchFetch("http://vectors.test/vector", { method: "POST", body: JSON.stringify({ kind, vector: v }) });
    assert.equal(r.status, 200, `${v.id}: ${await r.clone().text()}`);
    return r.json();
  };

  test(`exchange vectors with a database, on D1 (${doc.exchange?.filter((v) => v.database).length})`, async () => {
    let ran = 0;
    for (const v of doc.exchange) {
      checkFields("exchange", v);
      if (!v.database) continue;
      const { got, rows } = await run("exchange", v);
      assert.deepEqual(got, v.steps.map((s) => s.expect), `${v.id} (D1): ${v.spec}`);
      if (v.rows_after !== null) assert.deepEqual(rows, v.rows_after, `${v.id} (D1): rows after`);
      ran++;
    }
    assert.equal(ran, doc.exchange.filter((v) => v.database).length);
    assert.ok(ran > 0, "the vectors hold database exchanges");
  });

  test(`sweep vectors on D1 (${doc.counts?.sweep})`, async () => {
    let ran = 0;
    for (const v of doc.sweep) {
      checkFields("sweep", v);
      const { got, rows } = await run("sweep", v);
      assert.deepEqual(got, v.expect, `${v.id} (D1): ${v.spec}`);
      if (v.rows_after !== null) assert.deepEqual(rows, v.rows_after, `${v.id} (D1): rows after`);
      ran++;
    }
    assert.equal(ran, doc.counts.sweep, "sweep: vectors run != counts");
  });
});
