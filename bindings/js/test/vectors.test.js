// Every conformance vector (format 3, conformance/README.md) through the
// component from Node. Exchange vectors run three times: stepped feeding the
// vector's events (database vectors on a fresh better-sqlite3 file each),
// stepped again with `body-hashed` (node:crypto's SHA-256 over the read-body
// prefix and the body) wherever a vector feeds `body`, and driven (the core
// runs each batch through the ledger import, which checks the statements
// and runs them on the file synchronously). A transactional database vector
// runs its handler in a real transaction on the file, through the package's
// better-sqlite3 transaction (a deferred BEGIN on the runner's connection;
// `rows` replaced through a second connection), and `handler_writes` must
// end as `writes_after` (empty in every other database vector). Sweep,
// renewal (stepped and driven) and config vectors once. D1:
// vectors-d1.test.js; PostgreSQL: vectors-pg.test.js. Fails on an unknown
// kind or field and unless the number run equals `counts`.
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { after, describe, test } from "node:test";
import { getCore } from "../src/node.js";
import { sqliteLedger } from "../src/sqlite.js";
import { toWitConfig, IdempotencyError } from "../src/runtime.js";
import { SKIP_VECTORS, doc, sessionOf } from "./helpers/vectors.js";
import { KINDS, checkFields, configJson, optionsOf, runExchange, runExchangeDriven, runRenewal, runRenewalDriven, runSweep, transactionsOf } from "./helpers/vector-json.js";
import { freshDb, insertRows, rows, vectorDb } from "./helpers/sqlite.js";

const core = getCore();
const ran = Object.fromEntries(KINDS.map((k) => [k, 0]));
const nodeHash = (prefix, body) => createHash("sha256").update(prefix, "utf8").update(body).digest("hex");

describe("vectors", { skip: SKIP_VECTORS }, () => {
  for (const [way, run] of [
    ["stepped", (v, s, db, counters) => runExchange(v, s, { db, counters })],
    ["stepped, body-hashed", (v, s, db, counters) => runExchange(v, s, { db, hash: nodeHash, counters })],
    ["driven", (v, s, db, counters) => runExchangeDriven(v, s, db, { counters })],
  ]) {
    test(`exchange vectors on better-sqlite3 files, ${way} (${doc.counts?.exchange})`, async () => {
      let n = 0;
      let opened = 0;
      let expectedOpened = 0;
      const failed = [];
      for (const v of doc.exchange) {
        checkFields("exchange", v);
        if (way === "driven" && v.stepped_only) continue;
        const database = v.database ? vectorDb(v.rows) : null;
        const counters = { transactions: 0 };
        try {
          const got = await run(v, sessionOf(core, v, "sqlite"), database, counters);
          assert.deepEqual(got, v.steps.map((s) => s.expect), `${v.id} (${way}): ${v.spec}`);
          if (database !== null) {
            if (v.rows_after !== null) assert.deepEqual(database.rows(), v.rows_after, `${v.id} (${way}): rows after`);
            assert.deepEqual(database.writes(), v.writes_after ?? [], `${v.id} (${way}): handler_writes after`);
          }
          assert.equal(counters.transactions, transactionsOf(v), `${v.id} (${way}): handler transactions opened`);
        } catch (error) {
          failed.push(error);
        } finally {
          database?.close();
        }
        opened += counters.transactions;
        expectedOpened += transactionsOf(v);
        n++;
      }
      // Every vector runs; the failures are reported together (the first one in full).
      if (failed.length > 0) {
        failed[0].message = `${failed.length} exchange vectors failed (${way}): ${failed.map((e) => e.message.split(" ")[0]).join(", ")}\n${failed[0].message}`;
        throw failed[0];
      }
      const want = way === "driven" ? doc.exchange.filter((v) => !v.stepped_only).length : doc.counts.exchange;
      assert.equal(n, want, `exchange (${way}): ran ${n} of ${want}`);
      assert.equal(opened, expectedOpened, `exchange (${way}): handler transactions opened`);
      assert.ok(opened > 0, "the vectors open handler transactions");
      if (way === "stepped") ran.exchange += n;
    });
  }

  test(`sweep vectors on better-sqlite3 files (${doc.counts?.sweep})`, async () => {
    for (const v of doc.sweep) {
      checkFields("sweep", v);
      const file = freshDb();
      insertRows(file, v.rows);
      try {
        assert.deepEqual(await runSweep(v, sessionOf(core, v, "sqlite"), sqliteLedger(file)), v.expect, `${v.id}: ${v.spec}`);
        if (v.rows_after !== null) assert.deepEqual(rows(file), v.rows_after, `${v.id}: rows after`);
      } finally {
        file.close();
      }
      ran.sweep++;
    }
  });

  for (const [way, run] of [
    ["stepped", (v, s, db) => runRenewal(v, s, db)],
    ["driven", async (v, s, db) => runRenewalDriven(v, s, db)],
  ]) {
    test(`renewal vectors on better-sqlite3 files, ${way} (${doc.counts?.renewal})`, async () => {
      let n = 0;
      for (const v of doc.renewal) {
        checkFields("renewal", v);
        const database = vectorDb(v.rows);
        try {
          assert.deepEqual(await run(v, sessionOf(core, v, "sqlite"), database), v.expect, `${v.id} (${way}): ${v.spec}`);
          if (v.rows_after !== null) assert.deepEqual(database.rows(), v.rows_after, `${v.id} (${way}): rows after`);
        } finally {
          database.close();
        }
        n++;
      }
      assert.equal(n, doc.counts.renewal, `renewal (${way}): ran ${n} of ${doc.counts.renewal}`);
      if (way === "stepped") ran.renewal += n;
    });
  }

  test(`config vectors (${doc.counts?.config})`, () => {
    for (const v of doc.config) {
      checkFields("config", v);
      let got;
      try {
        const s = core.open(toWitConfig(core, { profile: v.profile, ...optionsOf(v.id, v.overrides) }, v.overrides.dialect ?? "sqlite"));
        got = { kind: "ok", config: configJson(s.config) };
      } catch (error) {
        if (!(error instanceof IdempotencyError)) throw error;
        assert.equal(error.protocolError.tag, "invalid-config", `${v.id}: ${error.message}`);
        assert.equal(v.expect.kind, "invalid", `${v.id}: refused: ${error.protocolError.val}`);
        assert.ok(error.protocolError.val.startsWith(v.expect.field), `${v.id}: message "${error.protocolError.val}" names ${v.expect.field}`);
        ran.config++;
        continue;
      }
      assert.deepEqual(got, v.expect, `${v.id}: ${v.spec}`);
      ran.config++;
    }
  });

  after(() => {
    for (const kind of KINDS) assert.equal(ran[kind], doc.counts[kind], `${kind}: ran ${ran[kind]} of ${doc.counts[kind]}`);
  });
});
