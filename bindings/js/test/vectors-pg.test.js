// The database kinds of the vectors (decision, completion, abandon, sweep) on
// PostgreSQL through the package's pg adapter (`postgres` dialect, one
// transaction per batch in one round trip). One schema, emptied before each
// vector. Rows only SQLite's dynamic typing admits (a text in a BIGINT
// column) cannot be arranged: exactly POSTGRES_UNREPRESENTABLE, counted.
import assert from "node:assert/strict";
import { after, before, test } from "node:test";
import { getCore, migrate } from "../src/node.js";
import { pgLedger } from "../src/pg.js";
import { doc, sessionOf } from "./helpers/vectors.js";
import { DATABASE_KINDS, checkFields, runDatabaseVector } from "./helpers/vector-json.js";
import { SKIP_PG, freshSchema, insertPgRows, pgRows } from "./helpers/pg.js";

const POSTGRES_UNREPRESENTABLE = ["decision-035"];
const core = getCore();
let pg;
let ledgerDb;

before(async () => {
  if (SKIP_PG) return;
  pg = await freshSchema({ max: 2 });
  ledgerDb = pgLedger(pg.pool);
  await migrate(pg.pool);
});
after(async () => {
  await pg?.dispose();
});

for (const kind of DATABASE_KINDS) {
  test(`${kind} vectors on PostgreSQL (${doc.counts[kind]})`, { skip: SKIP_PG }, async () => {
    let ran = 0;
    const unrepresentable = [];
    for (const v of doc[kind]) {
      checkFields(kind, v);
      await pg.admin.query(`DELETE FROM "${pg.schema}".idempotency_keys`);
      const client = await pg.pool.connect();
      try {
        await insertPgRows(client, v.rows);
      } catch (error) {
        unrepresentable.push(v.id);
        assert.ok(POSTGRES_UNREPRESENTABLE.includes(v.id), `${v.id}: rows not representable in PostgreSQL: ${error.message}`);
        continue;
      } finally {
        client.release();
      }
      const session = sessionOf(core, v, "postgres");
      const { got, expect } = await runDatabaseVector(kind, v, session, ledgerDb, "steps");
      assert.deepEqual(got, expect, `${v.id} (PostgreSQL): ${v.spec}`);
      const c = await pg.pool.connect();
      try {
        const rows = await pgRows(c);
        if (kind === "sweep") assert.equal(rows.length, v.expect.remaining, `${v.id}: remaining`);
        if (v.rows_after !== null) assert.deepEqual(rows, v.rows_after, `${v.id} (PostgreSQL): rows after`);
      } finally {
        c.release();
      }
      ran++;
    }
    assert.deepEqual(unrepresentable, POSTGRES_UNREPRESENTABLE.filter((id) => id.startsWith(kind)));
    assert.equal(ran + unrepresentable.length, doc.counts[kind], `${kind}: vectors run + unrepresentable != counts`);
  });
}
