// Every conformance vector (format 3, conformance/README.md) through the
// component from Node. Exchange vectors run three times: stepped feeding the
// vector's events (database vectors on a fresh better-sqlite3 file each),
// stepped again with `body-hashed` (node:crypto's SHA-256 over the read-body
// prefix and the body) wherever a vector feeds `body`, and driven (the core
// runs each batch through the ledger import, which checks the statements
// and runs them on the file synchronously). Sweep and config vectors once.
// D1: vectors-d1.test.js; PostgreSQL: vectors-pg.test.js. Fails on an
// unknown kind or field and unless the number run equals `counts`.
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { after, describe, test } from "node:test";
import { getCore } from "../src/node.js";
import { sqliteLedger } from "../src/sqlite.js";
import { toWitConfig, IdempotencyError } from "../src/runtime.js";
import { SKIP_VECTORS, doc, sessionOf } from "./helpers/vectors.js";
import { KINDS, checkFields, configJson, optionsOf, runExchange, runExchangeDriven, runSweep } from "./helpers/vector-json.js";
import { freshDb, insertRows, rows } from "./helpers/sqlite.js";

const core = getCore();
const ran = Object.fromEntries(KINDS.map((k) => [k, 0]));
const nodeHash = (prefix, body) => createHash("sha256").update(prefix, "utf8").update(body).digest("hex");

/** A fresh file with the vector's rows, as the runner's database. */
function databaseOf(v) {
  if (!v.database) return { db: null, close() {}, rows: () => null };
  const file = freshDb();
  insertRows(file, v.rows);
  const ledger = sqliteLedger(file);
  const replaceRowsSync = (r) => {
    file.prepare("DELETE FROM idempotency_keys").run();
    insertRows(file, r);
  };
  return {
    db: { batch: ledger.batch, batchSync: ledger.batchSync, replaceRowsSync, replaceRows: async (r) => replaceRowsSync(r) },
    rows: () => rows(file),
    close: () => file.close(),
  };
}

describe("vectors", { skip: SKIP_VECTORS }, () => {
  for (const [way, run] of [
    ["stepped", (v, s, db) => runExchange(v, s, { db })],
    ["stepped, body-hashed", (v, s, db) => runExchange(v, s, { db, hash: nodeHash })],
    ["driven", async (v, s, db) => runExchangeDriven(v, s, db)],
  ]) {
    test(`exchange vectors on better-sqlite3 files, ${way} (${doc.counts?.exchange})`, async () => {
      let n = 0;
      const failed = [];
      for (const v of doc.exchange) {
        checkFields("exchange", v);
        if (way === "driven" && v.stepped_only) continue;
        const database = databaseOf(v);
        try {
          const got = await run(v, sessionOf(core, v, "sqlite"), database.db);
          assert.deepEqual(got, v.steps.map((s) => s.expect), `${v.id} (${way}): ${v.spec}`);
          if (v.database && v.rows_after !== null) assert.deepEqual(database.rows(), v.rows_after, `${v.id} (${way}): rows after`);
        } catch (error) {
          failed.push(error);
        } finally {
          database.close();
        }
        n++;
      }
      // Every vector runs; the failures are reported together (the first one in full).
      if (failed.length > 0) {
        failed[0].message = `${failed.length} exchange vectors failed (${way}): ${failed.map((e) => e.message.split(" ")[0]).join(", ")}\n${failed[0].message}`;
        throw failed[0];
      }
      const want = way === "driven" ? doc.exchange.filter((v) => !v.stepped_only).length : doc.counts.exchange;
      assert.equal(n, want, `exchange (${way}): ran ${n} of ${want}`);
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
