// Every vector of conformance/vectors.json through this package: the
// component's protocol functions, the step API over the package's
// better-sqlite3 adapter (one real database file per vector), and the driven
// API with better-sqlite3 as its ledger import. Fails on an unknown kind or
// field, and unless the number run equals the file's counts.
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { after, describe, test } from "node:test";
import { getCore, ledgerFor, newCore, sha256Hex, sqliteLedger, toMutationResponse } from "../src/node.js";
import { freshDb, insertRows, rows } from "./helpers/sqlite.js";
import { doc, options } from "./helpers/vectors.js";

const KINDS = ["fingerprint", "admission", "decision", "completion", "sweep"];
const TOP_LEVEL = ["format", "description", "defaults", "counts", ...KINDS];
const ran = Object.fromEntries(KINDS.map((k) => [k, 0]));

function fields(v, allowed) {
  for (const key of Object.keys(v)) assert.ok(allowed.includes(key), `${v.id}: unknown field ${JSON.stringify(key)}`);
}


const head = (v) => ({
  method: v.method,
  pathAndQuery: v.path_and_query,
  headers: v.headers.map(([name, value]) => ({ name, value })),
});
const hex = (s) => Uint8Array.from(Buffer.from(s, "hex"));
const responseJson = (r) => ({ status: r.status, headers: r.headers.map((h) => [h.name, h.value]), body: r.body ?? null });

function decisionJson(d) {
  switch (d.tag) {
    case "execute":
      return { kind: "execute", generation: Number(d.val.generation), created_at: Number(d.val.createdAt) };
    case "replay":
      return { kind: "replay", response: responseJson(d.val) };
    case "reject":
      return { kind: "reject", reason: d.val.reason, response: responseJson(d.val.response) };
    default:
      throw new Error(`unknown decision ${d.tag}`);
  }
}

function mutation(v) {
  for (const key of Object.keys(v)) assert.ok(["status", "headers", "body_text", "body_hex"].includes(key), `unknown response field ${key}`);
  assert.ok(("body_text" in v) !== ("body_hex" in v), "a response needs exactly one of body_text, body_hex");
  return {
    status: v.status,
    headers: v.headers.map(([name, value]) => ({ name, value })),
    body: "body_text" in v ? { tag: "text", val: v.body_text } : { tag: "bytes", val: hex(v.body_hex) },
  };
}

/** rows_after null = which rows remain is not specified (only how many). */
function checkRows(db, v, way) {
  if (v.rows_after !== null) assert.deepEqual(rows(db), v.rows_after, `${v.id} (${way}): rows after`);
}

const ticketOf = (t) => {
  fields(t, ["principal", "key", "fingerprint", "generation", "created_at"]);
  return { principal: t.principal, key: t.key, fingerprint: t.fingerprint, generation: BigInt(t.generation), createdAt: BigInt(t.created_at) };
};

/** A component instance whose driven API runs on `db` (its ledger import). */
function drivenCore(db) {
  const ledger = sqliteLedger(db);
  return newCore((statements) => {
    try {
      return ledger.batchSync(statements);
    } catch (error) {
      throw { tag: "other", val: String(error.message) };
    }
  });
}

describe("conformance vectors", () => {
  test("file shape", () => {
    assert.equal(doc.format, 1, "unknown vector format");
    for (const key of Object.keys(doc)) assert.ok(TOP_LEVEL.includes(key), `unknown top-level key ${key}`);
    for (const kind of Object.keys(doc.counts)) assert.ok(KINDS.includes(kind), `unknown kind ${kind}`);
    for (const kind of KINDS) assert.equal(doc[kind].length, doc.counts[kind], `${kind}: counts`);
  });

  test("fingerprint", async () => {
    const core = getCore();
    for (const v of doc.fingerprint) {
      fields(v, ["id", "spec", "config", "method", "path_and_query", "headers", "body_hex", "prefix", "fingerprint"]);
      const config = core.config(options(v));
      const body = hex(v.body_hex);
      const prefix = core.call((c) => c.protocol.fingerprintPrefix(config, head(v)));
      assert.equal(prefix, v.prefix, `${v.id}: prefix`);
      assert.equal(core.call((c) => c.protocol.fingerprint(config, head(v), body)), v.fingerprint, `${v.id}: component`);
      assert.equal(await sha256Hex(prefix, body), v.fingerprint, `${v.id}: Web Crypto over the prefix`);
      const native = createHash("sha256").update(Buffer.from(prefix, "utf8")).update(body).digest("hex");
      assert.equal(native, v.fingerprint, `${v.id}: node:crypto over the prefix`);
      ran.fingerprint++;
    }
  });

  test("admission", () => {
    const core = getCore();
    for (const v of doc.admission) {
      fields(v, ["id", "spec", "config", "method", "path_and_query", "headers", "expect"]);
      const config = core.config(options(v));
      const a = core.call((c) => c.protocol.admit(config, head(v)));
      const got =
        a.tag === "pass-through"
          ? { kind: "pass-through" }
          : a.tag === "protected"
            ? { kind: "protected", key: a.val.key }
            : { kind: "reject", reason: a.val.reason, response: responseJson(a.val.response) };
      assert.deepEqual(got, v.expect, `${v.id}: ${v.spec}`);
      ran.admission++;
    }
  });

  test("decision (steps on better-sqlite3, and driven)", async () => {
    for (const v of doc.decision) {
      fields(v, ["id", "spec", "config", "rows", "principal", "key", "fingerprint", "now", "expect", "rows_after"]);
      // The package's step flow: plan-decision, one transaction, decide.
      const db = freshDb();
      insertRows(db, v.rows);
      const ledger = ledgerFor(db, options(v));
      const got = decisionJson(await ledger.decide(v.principal, v.key, v.fingerprint, v.now));
      assert.deepEqual(got, v.expect, `${v.id} (steps): ${v.spec}`);
      checkRows(db, v, "steps");
      db.close();
      // The driven API, the core calling the ledger import itself.
      const db2 = freshDb();
      insertRows(db2, v.rows);
      const core = drivenCore(db2);
      const config = core.config(options(v));
      const driven = core.call((c) => c.driven.decide(config, v.principal, v.key, v.fingerprint, BigInt(v.now)));
      assert.deepEqual(decisionJson(driven), v.expect, `${v.id} (driven): ${v.spec}`);
      checkRows(db2, v, "driven");
      db2.close();
      ran.decision++;
    }
  });

  test("completion (steps on better-sqlite3, and driven)", async () => {
    for (const v of doc.completion) {
      fields(v, ["id", "spec", "config", "rows", "ticket", "response", "now", "expect", "rows_after"]);
      fields(v.expect, ["stored", "response"]);
      const db = freshDb();
      insertRows(db, v.rows);
      const logged = [];
      const ledger = ledgerFor(db, { ...options(v), logger: { error: (m) => logged.push(m) } });
      const ticket = ticketOf(v.ticket);
      const { response, stored } = await ledger.complete(ticket, mutation(v.response), v.now);
      assert.deepEqual({ stored, response: responseJson(response) }, v.expect, `${v.id} (steps): ${v.spec}`);
      assert.equal(logged.length, stored ? 0 : 1, `${v.id}: a fenced-out completion is logged once`);
      if (!stored) assert.match(logged[0], new RegExp(`generation=${v.ticket.generation}`));
      checkRows(db, v, "steps");
      db.close();
      const db2 = freshDb();
      insertRows(db2, v.rows);
      const core = drivenCore(db2);
      const config = core.config(options(v));
      const c2 = core.call((c) => c.driven.complete(config, ticket, mutation(v.response), BigInt(v.now)));
      assert.deepEqual({ stored: !c2.fencedOut, response: responseJson(c2.response) }, v.expect, `${v.id} (driven)`);
      checkRows(db2, v, "driven");
      db2.close();
      ran.completion++;
    }
  });

  test("completion bodies go through the handler's own conversion too", async () => {
    // text bodies as JS strings, byte bodies as Uint8Array: what runMutation returns.
    for (const v of doc.completion) {
      const m = mutation(v.response);
      const shaped = await toMutationResponse({
        status: m.status,
        headers: v.response.headers,
        body: m.body.tag === "text" ? m.body.val : m.body.val,
      });
      const db = freshDb();
      insertRows(db, v.rows);
      const ledger = ledgerFor(db, { ...options(v), logger: { error() {} } });
      if (m.status < 200 || m.status > 599) {
        assert.equal(shaped.status, 0, `${v.id}: an unsendable status reaches the core as 0`);
      } else {
        const { response, stored } = await ledger.complete(ticketOf(v.ticket), shaped, v.now);
        assert.deepEqual({ stored, response: responseJson(response) }, v.expect, `${v.id} (handler conversion)`);
      }
      db.close();
    }
  });

  test("sweep (steps on better-sqlite3, and driven)", async () => {
    for (const v of doc.sweep) {
      fields(v, ["id", "spec", "config", "rows", "now", "expect", "rows_after"]);
      fields(v.expect, ["deleted", "remaining"]);
      const db = freshDb();
      insertRows(db, v.rows);
      const deleted = await ledgerFor(db, options(v)).sweep(v.now);
      const got = { deleted, remaining: rows(db).length };
      const want = { deleted: v.expect.deleted, remaining: v.expect.remaining ?? got.remaining };
      assert.deepEqual(got, want, `${v.id} (steps): ${v.spec}`);
      checkRows(db, v, "steps");
      db.close();
      const db2 = freshDb();
      insertRows(db2, v.rows);
      const core = drivenCore(db2);
      const config = core.config(options(v));
      const drivenDeleted = Number(core.call((c) => c.driven.sweep(config, BigInt(v.now))));
      assert.deepEqual({ deleted: drivenDeleted, remaining: rows(db2).length }, want, `${v.id} (driven)`);
      checkRows(db2, v, "driven");
      db2.close();
      ran.sweep++;
    }
  });

  after(() => {
    // Every vector of every kind ran: the counts must match the file's.
    assert.deepEqual(ran, doc.counts, "vectors run != counts in vectors.json");
    console.log(`conformance vectors run: ${JSON.stringify(ran)}`);
  });
});
