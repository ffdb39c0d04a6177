// The exchange vectors that touch a database, and the sweep vectors, on
// PostgreSQL through the package's pg adapter (`postgres` dialect, one
// transaction per batch in one round trip), stepped. One schema, emptied
// before each vector (every row of the vectors fits PostgreSQL's columns).
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { getCore, migrate } from "../src/node.js";
import { pgLedger } from "../src/pg.js";
import { SKIP_VECTORS, doc, sessionOf } from "./helpers/vectors.js";
import { checkFields, runExchange, runSweep } from "./helpers/vector-json.js";
import { SKIP_PG, freshSchema, insertPgRows, pgRows } from "./helpers/pg.js";

const core = getCore();

describe("vectors on PostgreSQL", { skip: SKIP_PG || SKIP_VECTORS }, () => {
  let pg;
  let ledgerDb;
  before(async () => {
    pg = await freshSchema({ max: 2 });
    ledgerDb = pgLedger(pg.pool);
    await migrate(pg.pool);
  });
  after(async () => {
    await pg?.dispose();
  });

  /** Replaces the table's rows. */
  async function replaceRows(rows) {
    await pg.admin.query(`DELETE FROM "${pg.schema}".idempotency_keys`);
    const client = await pg.pool.connect();
    try {
      await insertPgRows(client, rows);
    } finally {
      client.release();
    }
  }
  async function table() {
    const c = await pg.pool.connect();
    try {
      return await pgRows(c);
    } finally {
      c.release();
    }
  }
  const db = { batch: (statements) => ledgerDb.batch(statements), replaceRows };

  test(`exchange vectors with a database, on PostgreSQL (${doc.exchange?.filter((v) => v.database).length})`, async () => {
    let ran = 0;
    for (const v of doc.exchange) {
      checkFields("exchange", v);
      if (!v.database) continue;
      await replaceRows(v.rows);
      const got = await runExchange(v, sessionOf(core, v, "postgres"), { db });
      assert.deepEqual(got, v.steps.map((s) => s.expect), `${v.id} (PostgreSQL): ${v.spec}`);
      if (v.rows_after !== null) assert.deepEqual(await table(), v.rows_after, `${v.id} (PostgreSQL): rows after`);
      ran++;
    }
    assert.equal(ran, doc.exchange.filter((v) => v.database).length);
    assert.ok(ran > 0, "the vectors hold database exchanges");
  });

  test(`sweep vectors on PostgreSQL (${doc.counts?.sweep})`, async () => {
    let ran = 0;
    for (const v of doc.sweep) {
      checkFields("sweep", v);
      await replaceRows(v.rows);
      assert.deepEqual(await runSweep(v, sessionOf(core, v, "postgres"), ledgerDb), v.expect, `${v.id} (PostgreSQL): ${v.spec}`);
      if (v.rows_after !== null) assert.deepEqual(await table(), v.rows_after, `${v.id} (PostgreSQL): rows after`);
      ran++;
    }
    assert.equal(ran, doc.counts.sweep, "sweep: vectors run != counts");
  });
});
