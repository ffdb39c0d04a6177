// The conformance vectors on real D1 in workerd through the package's D1
// adapter (value conversion, Object.values rows, meta.changes), stepped as a
// Worker runs them, with the body hashed by Web Crypto: every exchange
// vector but the `interactive_only` ones (D1 has no interactive
// transactions: a transactional vector's completion runs with the handler's
// writes as ONE batch, so there is no open transaction left to script a
// commit on), every sweep and renewal vector. Counts are asserted.
import assert from "node:assert/strict";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { PACKAGE_ROOT, startWorker } from "./helpers/workerd.js";
import { SKIP_VECTORS, doc } from "./helpers/vectors.js";
import { checkFields, transactionsOf } from "./helpers/vector-json.js";

const CHUNK = 40; // vectors per request to the Worker

describe("vectors on D1 in workerd", { skip: SKIP_VECTORS }, () => {
  let mf;
  before(async () => {
    ({ mf } = await startWorker({ scriptPath: join(PACKAGE_ROOT, "test/fixtures/vector-worker.js") }));
  });
  after(async () => {
    await mf?.dispose();
  });

  /** Runs `vectors` of `kind` in the Worker; their results in order. */
  const run = async (kind, vectors) => {
    const out = [];
    for (let i = 0; i < vectors.length; i += CHUNK) {
      const chunk = vectors.slice(i, i + CHUNK);
      const r = await mf.dispatchFetch("http://vectors.test/vectors", { method: "POST", body: JSON.stringify({ kind, vectors: chunk }) });
      assert.equal(r.status, 200, await r.clone().text());
      out.push(...(await r.json()));
    }
    assert.equal(out.length, vectors.length);
    return out;
  };

  test(`exchange vectors on D1, but the interactive_only ones (${doc.exchange?.filter((v) => !v.interactive_only).length})`, async () => {
    const vectors = doc.exchange.filter((v) => {
      checkFields("exchange", v);
      return !v.interactive_only;
    });
    const results = await run("exchange", vectors);
    let ran = 0;
    let transactions = 0;
    const failed = [];
    vectors.forEach((v, i) => {
      const result = results[i];
      try {
        assert.equal(result.id, v.id);
        assert.equal(result.error, undefined, `${v.id} (D1): ${result.error}`);
        assert.deepEqual(result.got, v.steps.map((s) => s.expect), `${v.id} (D1): ${v.spec}`);
        if (v.database) {
          if (v.rows_after !== null) assert.deepEqual(result.rows, v.rows_after, `${v.id} (D1): rows after`);
          assert.deepEqual(result.writes, v.writes_after ?? [], `${v.id} (D1): handler_writes after`);
        }
        assert.equal(result.transactions, transactionsOf(v), `${v.id} (D1): handler transactions`);
      } catch (error) {
        failed.push(error);
      }
      transactions += result.transactions ?? 0;
      ran++;
    });
    if (failed.length > 0) {
      failed[0].message = `${failed.length} exchange vectors failed on D1: ${failed.map((e) => e.message.split(" ")[0]).join(", ")}\n${failed[0].message}`;
      throw failed[0];
    }
    const skipped = doc.exchange.filter((v) => v.interactive_only).length;
    assert.ok(skipped > 0, "the vectors mark interactive_only ones");
    assert.equal(ran, doc.counts.exchange - skipped, "exchange: vectors run != counts - interactive_only");
    assert.ok(transactions > 0, "the D1 runs kept handler writes for the completion's batch");
  });

  for (const kind of ["sweep", "renewal"]) {
    test(`${kind} vectors on D1 (${doc.counts?.[kind]})`, async () => {
      const results = await run(kind, doc[kind].map((v) => (checkFields(kind, v), v)));
      let ran = 0;
      doc[kind].forEach((v, i) => {
        const result = results[i];
        assert.equal(result.error, undefined, `${v.id} (D1): ${result.error}`);
        assert.deepEqual(result.got, v.expect, `${v.id} (D1): ${v.spec}`);
        if (v.rows_after !== null) assert.deepEqual(result.rows, v.rows_after, `${v.id} (D1): rows after`);
        ran++;
      });
      assert.equal(ran, doc.counts[kind], `${kind}: vectors run != counts`);
    });
  }
});
