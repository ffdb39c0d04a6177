// Every conformance vector through the component from Node: the kinds that
// need no database (fingerprint, admission, classify, error, log, config),
// and the database kinds (decision, completion, abandon, sweep) on a fresh
// better-sqlite3 file each, both through the step API (plan, one batch,
// decide/finish: what the package runs) and the driven API (the core's run-*
// calling the ledger import synchronously). D1: vectors-d1.test.js;
// PostgreSQL: vectors-pg.test.js. Fails on an unknown kind or field and
// unless the number run equals `counts`.
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { test, after } from "node:test";
import { getCore } from "../src/node.js";
import { sqliteLedger } from "../src/sqlite.js";
import { toWitConfig, IdempotencyError } from "../src/runtime.js";
import { doc, sessionOf } from "./helpers/vectors.js";
import {
  KINDS, DATABASE_KINDS, checkFields, optionsOf, configJson, headersOf, hexBytes, responseJson, admissionJson,
  protocolErrorOf, protocolErrorJson, batchErrorOf, ledgerErrorJson, logEventOf, runDatabaseVector,
} from "./helpers/vector-json.js";
import { freshDb, insertRows, rows } from "./helpers/sqlite.js";

const core = getCore();
const ran = Object.fromEntries(KINDS.map((k) => [k, 0]));

const head = (v) => ({ method: v.method, pathAndQuery: v.path_and_query, headers: headersOf(v.headers) });

const RUNNERS = {
  fingerprint(v) {
    const s = sessionOf(core, v);
    const body = hexBytes(v.body_hex);
    assert.equal(s.fingerprintPrefix(head(v)), v.prefix, `${v.id}: prefix`);
    assert.equal(s.fingerprint(head(v), body), v.fingerprint, `${v.id}: in the component`);
    const native = createHash("sha256").update(Buffer.from(v.prefix, "utf8")).update(body).digest("hex");
    assert.equal(native, v.fingerprint, `${v.id}: native SHA-256 over the prefix`);
  },
  admission(v) {
    const s = sessionOf(core, v);
    let got;
    try {
      got = admissionJson(s.admit(head(v), v.principal ?? undefined));
    } catch (error) {
      if (!(error instanceof IdempotencyError)) throw error;
      // The vectors name the error's kind only (its wording is the log kind's business).
      const e = protocolErrorJson(error.protocolError);
      got = { kind: "error", error: "ledger" in e ? e : { kind: e.kind } };
    }
    assert.deepEqual(got, v.expect, `${v.id}: ${v.spec}`);
  },
  classify(v) {
    const s = core.open(toWitConfig(core, {}, v.dialect));
    assert.deepEqual(ledgerErrorJson(s.classify(batchErrorOf(v.error))), v.expect, `${v.id}: ${v.spec}`);
  },
  error(v) {
    const s = sessionOf(core, v);
    assert.deepEqual(responseJson(s.errorResponse(protocolErrorOf(v.error))), v.expect, `${v.id}: ${v.spec}`);
  },
  log(v) {
    const s = sessionOf(core, v);
    assert.deepEqual(s.logLine(logEventOf(v.event)), v.expect, `${v.id}: ${v.spec}`);
  },
  config(v) {
    let got;
    try {
      const s = core.open(toWitConfig(core, { profile: v.profile, ...optionsOf(v.id, v.overrides) }, "sqlite"));
      got = { kind: "ok", config: configJson(s.config) };
    } catch (error) {
      if (!(error instanceof IdempotencyError)) throw error;
      assert.equal(error.protocolError.tag, "invalid-config", `${v.id}: ${error.message}`);
      assert.equal(v.expect.kind, "invalid", `${v.id}: refused: ${error.protocolError.val}`);
      assert.ok(error.protocolError.val.startsWith(v.expect.field), `${v.id}: message "${error.protocolError.val}" names ${v.expect.field}`);
      return;
    }
    assert.deepEqual(got, v.expect, `${v.id}: ${v.spec}`);
  },
};

for (const kind of KINDS) {
  if (DATABASE_KINDS.includes(kind)) continue;
  test(`vectors: ${kind} (${doc.counts[kind]})`, () => {
    for (const v of doc[kind]) {
      checkFields(kind, v);
      RUNNERS[kind](v);
      ran[kind]++;
    }
  });
}

for (const kind of DATABASE_KINDS) {
  for (const way of ["steps", "driven"]) {
    test(`vectors: ${kind} on better-sqlite3 files, ${way} (${doc.counts[kind]})`, async () => {
      let n = 0;
      for (const v of doc[kind]) {
        checkFields(kind, v);
        const db = freshDb();
        insertRows(db, v.rows);
        const session = sessionOf(core, v, "sqlite");
        const { got, expect } = await runDatabaseVector(kind, v, session, sqliteLedger(db), way);
        assert.deepEqual(got, expect, `${v.id} (${way}): ${v.spec}`);
        if (v.rows_after !== null) assert.deepEqual(rows(db), v.rows_after, `${v.id} (${way}): rows after`);
        if (kind === "sweep") assert.equal(rows(db).length, v.expect.remaining, `${v.id}: remaining`);
        db.close();
        n++;
      }
      if (way === "steps") ran[kind] += n;
      else assert.equal(n, doc.counts[kind]);
    });
  }
}

after(() => {
  for (const kind of KINDS) assert.equal(ran[kind], doc.counts[kind], `${kind}: ran ${ran[kind]} of ${doc.counts[kind]}`);
});
