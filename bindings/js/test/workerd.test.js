// Every SPEC row through HTTP requests to the example Worker, in real workerd
// (miniflare, cf: false, offline) with a real local D1. The harness wraps the
// real D1 binding to count round trips; nothing here fakes the database.
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { createHash } from "node:crypto";
import { schemaStatements } from "../src/node.js";
import { startWorker } from "./helpers/workerd.js";
import { HARNESS_SCRIPT, startHarness } from "./helpers/harness.js";
import { T0, ledgerRow, order, orderCount, send, stats, uniqueKey, waitFor } from "./helpers/http.js";
import { chunkedUpload } from "./helpers/upload.js";

const { mf, db } = await startHarness();

const sku = () => uniqueKey("sku");
const KEY_INVALID_MESSAGE = "Idempotency-Key must be 1-255 printable ASCII characters.";

describe("SPEC 1: header contract", () => {
  test("a protected method without Idempotency-Key gets 400 idempotency_key_required and touches no ledger", async () => {
    for (const method of ["POST", "PATCH", "DELETE"]) {
      const r = await send(mf, { method, body: order(sku()) });
      assert.equal(r.status, 400, method);
      assert.deepEqual(r.json, { error: "idempotency_key_required" });
      assert.equal(r.headers.get("content-type"), "application/json");
      const s = await stats(mf, r.id);
      assert.deepEqual(s.batches, [], `${method}: no batch`);
      assert.equal(s.mutationsStarted, 0);
    }
  });

  test("an empty key is required, not invalid", async () => {
    const r = await send(mf, { key: "", body: order(sku()) });
    assert.equal(r.status, 400);
    assert.deepEqual(r.json, { error: "idempotency_key_required" });
  });

  test("keys outside 1-255 printable ASCII get 400 idempotency_key_invalid", async () => {
    for (const key of ["k".repeat(256), "caf\u00e9", "tab\there"]) {
      const s0 = sku();
      const r = await send(mf, { key, body: order(s0) });
      assert.equal(r.status, 400, JSON.stringify(key));
      assert.deepEqual(r.json, { error: "idempotency_key_invalid", message: KEY_INVALID_MESSAGE });
      assert.equal(await orderCount(db, s0), 0);
      assert.deepEqual((await stats(mf, r.id)).batches, []);
    }
    const r = await send(mf, { key: "k".repeat(255), body: order(sku()) });
    assert.equal(r.status, 201, "255 printable characters are a valid key");
  });

  test("GET, HEAD and OPTIONS pass straight through with no ledger access at all", async () => {
    for (const method of ["GET", "HEAD", "OPTIONS"]) {
      const r = await send(mf, { method, key: uniqueKey() });
      assert.notEqual(r.status, 400, method);
      const s = await stats(mf, r.id);
      assert.deepEqual(s.batches, [], `${method}: no ledger batch`);
    }
    const r = await send(mf, { method: "GET" });
    assert.equal(r.status, 200);
    assert.ok(Array.isArray(r.json.orders));
  });

  test("the same key under two principals is two independent rows", async () => {
    const key = uniqueKey();
    const s0 = sku();
    const a = await send(mf, { key, token: "tok-a", body: order(s0) });
    const b = await send(mf, { key, token: "tok-b", body: order(s0) });
    assert.equal(a.status, 201);
    assert.equal(b.status, 201);
    assert.notEqual(a.json.id, b.json.id, "no replay across principals");
    assert.equal(await orderCount(db, s0), 2);
    assert.equal((await ledgerRow(db, "acct-a", key)).status, "completed");
    assert.equal((await ledgerRow(db, "acct-b", key)).status, "completed");
  });

  test("protected methods are configurable", async () => {
    const r = await send(mf, { method: "PUT", headers: { "x-test-protected-methods": "POST,PUT" }, body: order(sku()) });
    assert.equal(r.status, 400);
    assert.deepEqual(r.json, { error: "idempotency_key_required" });
    const open = await send(mf, { method: "DELETE", headers: { "x-test-protected-methods": "POST" } });
    assert.equal(open.status, 405, "DELETE is unprotected under this setting: the app answers it directly");
    assert.deepEqual((await stats(mf, open.id)).batches, []);
  });
});

describe("SPEC 2: schema", () => {
  test("the migration file creates exactly the SPEC table", async () => {
    const columns = await db.prepare("SELECT name, type, \"notnull\", dflt_value, pk FROM pragma_table_info('idempotency_keys')").all();
    assert.deepEqual(
      columns.results.map((c) => [c.name, c.type, c.notnull, c.dflt_value, c.pk]),
      [
        ["principal", "TEXT", 1, null, 1],
        ["key", "TEXT", 1, null, 2],
        ["fingerprint", "TEXT", 1, null, 0],
        ["status", "TEXT", 1, "'pending'", 0],
        ["generation", "INTEGER", 1, "1", 0],
        ["response_status", "INTEGER", 0, null, 0],
        ["response_body", "TEXT", 0, null, 0],
        ["response_headers", "TEXT", 0, null, 0],
        ["created_at", "INTEGER", 1, null, 0],
        ["updated_at", "INTEGER", 1, null, 0],
      ],
    );
    const index = await db.prepare("SELECT name FROM pragma_index_list('idempotency_keys') WHERE name = 'idx_idempotency_keys_updated_at'").all();
    assert.equal(index.results.length, 1);
    assert.ok(schemaStatements().length === 2);
  });
});

describe("SPEC 3 + 5: claim before mutate, decisions", () => {
  test("the first request claims generation 1, runs once, and costs one decision + one completion batch", async () => {
    const key = uniqueKey();
    const s0 = sku();
    const r = await send(mf, { key, body: order(s0), now: T0 });
    assert.equal(r.status, 201);
    assert.equal(r.headers.get("location"), `/orders/${r.json.id}`);
    const s = await stats(mf, r.id);
    assert.deepEqual(s.batches, ["decision", "completion", "sweep"], "one batch to decide, one to complete, the sweep in waitUntil");
    assert.equal(s.direct, 1, "the only statement outside the ledger batches is the mutation's own INSERT");
    assert.equal(s.waitUntil, 1);
    const row = await ledgerRow(db, "acct-a", key);
    assert.equal(row.generation, 1);
    assert.equal(row.status, "completed");
    assert.equal(row.created_at, T0);
    assert.equal(await orderCount(db, s0), 1);
  });

  test("a completed key replays the stored response with one batch and never executes", async () => {
    const key = uniqueKey();
    const s0 = sku();
    const first = await send(mf, { key, body: order(s0), now: T0 });
    for (let i = 0; i < 3; i++) {
      const again = await send(mf, { key, body: order(s0), now: T0 + 1000 * (i + 1) });
      assert.equal(again.status, 201);
      assert.equal(again.text, first.text);
      assert.equal(again.headers.get("location"), first.headers.get("location"));
      assert.equal(again.headers.get("content-type"), "application/json");
      const s = await stats(mf, again.id);
      assert.deepEqual(s.batches, ["decision"]);
      assert.equal(s.mutationsStarted, 0);
    }
    assert.equal(await orderCount(db, s0), 1);
  });

  test("a different fingerprint under a used key gets 409 idempotency_key_reused, never executed nor replayed", async () => {
    const key = uniqueKey();
    const s0 = sku();
    await send(mf, { key, body: order(s0) });
    const variants = [
      { body: order(s0, 2) },
      { body: ` ${order(s0)}` },
      { body: order(s0), headers: { "content-type": "application/json; charset=utf-8" } },
      { body: order(s0), headers: { "x-api-version": "2" } },
      { body: order(s0), path: "/orders?dry_run=1" },
      { body: order(s0), method: "PATCH" },
    ];
    for (const v of variants) {
      const r = await send(mf, { key, ...v });
      assert.equal(r.status, 409, JSON.stringify(v));
      assert.deepEqual(r.json, { error: "idempotency_key_reused" });
      assert.equal((await stats(mf, r.id)).mutationsStarted, 0);
    }
    assert.equal(await orderCount(db, s0), 1);
  });

  test("non-allowlisted headers never affect the fingerprint", async () => {
    const key = uniqueKey();
    const s0 = sku();
    const first = await send(mf, { key, body: order(s0), headers: { "user-agent": "a/1", "x-trace-id": "t-1" } });
    const again = await send(mf, { key, body: order(s0), headers: { "user-agent": "b/2", "x-trace-id": "t-2", "x-request-id": "r" } });
    assert.equal(again.status, 201);
    assert.equal(again.text, first.text);
    assert.equal(await orderCount(db, s0), 1);
  });

  test("path and query are taken verbatim: reordered parameters are another request", async () => {
    const key = uniqueKey();
    const s0 = sku();
    const first = await send(mf, { key, body: order(s0), path: "/orders?a=1&b=2" });
    assert.equal(first.status, 201);
    const reordered = await send(mf, { key, body: order(s0), path: "/orders?b=2&a=1" });
    assert.equal(reordered.status, 409);
    assert.deepEqual(reordered.json, { error: "idempotency_key_reused" });
  });

  test("the Worker's fingerprint is SPEC 4's SHA-256 over the raw bytes", async () => {
    const key = uniqueKey();
    const body = Uint8Array.from([0x7b, 0xff, 0xfe, 0x00, 0x80, 0x7d]);
    const r = await send(mf, { key, body, headers: { "content-type": "application/octet-stream", "x-api-version": "7" } });
    assert.equal(r.status, 422, "the app rejects non-JSON, and that answer is what gets stored");
    const row = await ledgerRow(db, "acct-a", key);
    // SPEC 4: UPPER(method) \n path_and_query \n lower(name):value per fingerprint header \n, then the raw bytes.
    const expected = createHash("sha256").update("POST\n/orders\ncontent-type:application/octet-stream\nx-api-version:7\n").update(body).digest("hex");
    assert.equal(row.fingerprint, expected);
    // Two different invalid UTF-8 bodies must not collide (no text decoding).
    const other = await send(mf, { key, body: Uint8Array.from([0x7b, 0xff, 0xff, 0x00, 0x80, 0x7d]), headers: { "content-type": "application/octet-stream", "x-api-version": "7" } });
    assert.equal(other.status, 409);
    assert.deepEqual(other.json, { error: "idempotency_key_reused" });
  });

  test("a fresh pending row gets 409 in_progress with Retry-After, never executed nor replayed", async () => {
    const key = uniqueKey();
    const s0 = sku();
    const failed = await send(mf, { key, body: order(s0), now: T0, headers: { "x-test-throw": "1" } });
    assert.equal(failed.status, 500, "a throwing mutation is rethrown (workerd answers 500)");
    assert.equal((await ledgerRow(db, "acct-a", key)).status, "pending", "the row stays pending");
    // SPEC 5.3: by default the 409 suggests 1 s (in-progress-retry-ms), never more than the time left until a takeover.
    const r = await send(mf, { key, body: order(s0), now: T0 + 1 });
    assert.equal(r.status, 409);
    assert.deepEqual(r.json, { error: "idempotency_key_in_progress", retry_after_ms: 1000 });
    assert.equal(r.headers.get("retry-after"), "1");
    assert.equal(r.headers.get("content-type"), "application/json");
    assert.equal((await stats(mf, r.id)).mutationsStarted, 0);
    assert.deepEqual((await stats(mf, r.id)).batches, ["decision"]);
    // Without the hint, the truth: the time left until a retry can take the row over.
    const untilTakeover = await send(mf, { key, body: order(s0), now: T0 + 1, headers: { "x-test-retry-hint": "none" } });
    assert.deepEqual(untilTakeover.json, { error: "idempotency_key_in_progress", retry_after_ms: 29_999 });
    assert.equal(untilTakeover.headers.get("retry-after"), "30");
    const custom = await send(mf, { key, body: order(s0), now: T0 + 1000, headers: { "x-test-ttl": "5000", "x-test-retry-hint": "none" } });
    assert.deepEqual(custom.json, { error: "idempotency_key_in_progress", retry_after_ms: 4000 });
    assert.equal(custom.headers.get("retry-after"), "4");
    const rounded = await send(mf, { key, body: order(s0), now: T0 + 1000, headers: { "x-test-ttl": "1500", "x-test-retry-hint": "none" } });
    assert.equal(rounded.headers.get("retry-after"), "1", "ceil(500 / 1000)");
  });

  test("a stored row that cannot be replayed exactly answers 500 record-corrupt, never executes", async () => {
    const key = uniqueKey();
    const s0 = sku();
    const r0 = await send(mf, { key, body: order(s0), now: T0 });
    assert.equal(r0.status, 201);
    await db.prepare("UPDATE idempotency_keys SET response_headers = 'not json' WHERE principal = 'acct-a' AND key = ?").bind(key).run();
    const r = await send(mf, { key, body: order(s0), now: T0 + 1 });
    assert.equal(r.status, 500);
    assert.equal(r.headers.get("content-type"), "application/json");
    assert.equal(typeof r.json.error, "string");
    assert.equal(await orderCount(db, s0), 1);
  });
});

describe("SPEC 6: fenced takeover", () => {
  test("a stale pending row is taken over (generation 2) and completed by the new owner", async () => {
    const key = uniqueKey();
    const s0 = sku();
    await send(mf, { key, body: order(s0), now: T0, headers: { "x-test-throw": "1" } });
    const r = await send(mf, { key, body: order(s0), now: T0 + 30_001 });
    assert.equal(r.status, 201);
    const s = await stats(mf, r.id);
    assert.deepEqual(s.batches, ["decision", "completion", "sweep"]);
    const row = await ledgerRow(db, "acct-a", key);
    assert.equal(row.generation, 2);
    assert.equal(row.status, "completed");
    assert.equal(row.created_at, T0);
    const replay = await send(mf, { key, body: order(s0), now: T0 + 30_002 });
    assert.equal(replay.text, r.text);
  });

  test("a stale pending row is never taken over by a different fingerprint", async () => {
    const key = uniqueKey();
    const s0 = sku();
    await send(mf, { key, body: order(s0), now: T0, headers: { "x-test-throw": "1" } });
    const r = await send(mf, { key, body: order(s0, 5), now: T0 + 60_000 });
    assert.equal(r.status, 409);
    assert.deepEqual(r.json, { error: "idempotency_key_reused" });
    assert.equal((await ledgerRow(db, "acct-a", key)).generation, 1);
  });

  test("a superseded owner's completion is fenced out: it still answers, logs loudly, and the new owner's response stays stored", async () => {
    const key = uniqueKey();
    const s0 = sku();
    const slowId = uniqueKey("slow");
    const slow = send(mf, { key, body: order(s0), now: T0, id: slowId, headers: { "x-test-delay-ms": "1500" } });
    await waitFor(mf, slowId, (s) => s.mutationsStarted === 1, "the first owner to start its mutation");
    const taker = await send(mf, { key, body: order(s0), now: T0 + 30_001 });
    assert.equal(taker.status, 201);
    const first = await slow;
    assert.equal(first.status, 201, "the fenced-out caller still gets the response it computed");
    assert.notEqual(first.json.id, taker.json.id);
    const s = await stats(mf, slowId);
    assert.equal(s.errors.length, 1);
    assert.match(s.errors[0], /fenced out|superseded/i);
    assert.match(s.errors[0], /acct-a/);
    assert.ok(s.errors[0].includes(key));
    assert.match(s.errors[0], /generation=1|generation 1/);
    const row = await ledgerRow(db, "acct-a", key);
    assert.equal(row.generation, 2);
    assert.equal(JSON.parse(row.response_body).id, taker.json.id, "at most one completion write succeeded: the current owner's");
    const replay = await send(mf, { key, body: order(s0), now: T0 + 30_002 });
    assert.equal(replay.text, taker.text);
  });
});

describe("SPEC 7: response lifecycle", () => {
  test("only status, body and allowlisted headers are stored and replayed; the first caller gets the mutation's own response", async () => {
    const key = uniqueKey();
    const s0 = sku();
    const first = await send(mf, { key, body: order(s0), headers: { "x-test-header": "x-internal:secret" } });
    assert.equal(first.headers.get("x-internal"), "secret", "the first caller gets every header the mutation set");
    const row = await ledgerRow(db, "acct-a", key);
    assert.deepEqual(Object.keys(JSON.parse(row.response_headers)), ["content-type", "location"]);
    const replay = await send(mf, { key, body: order(s0) });
    assert.equal(replay.headers.get("x-internal"), null);
    assert.equal(replay.headers.get("location"), first.headers.get("location"));
  });

  test("custom replay headers", async () => {
    const key = uniqueKey();
    const s0 = sku();
    const headers = { "x-test-replay-headers": "x-order-version", "x-test-header": "X-Order-Version:3" };
    const r = await send(mf, { key, body: order(s0), headers });
    assert.equal(r.headers.get("x-order-version"), "3");
    const replay = await send(mf, { key, body: order(s0), headers });
    assert.equal(replay.headers.get("x-order-version"), "3");
    assert.equal(replay.headers.get("location"), null, "only the configured replay headers are replayed");
  });

  test("a body at the cap is stored; one byte over becomes a stored 500 that names the cap", async () => {
    const key = uniqueKey();
    const atCap = await send(mf, { key, body: order(sku()), headers: { "x-test-body": "size:16384" } });
    assert.equal(atCap.status, 201);
    assert.equal(atCap.text.length, 16384);
    const over = uniqueKey();
    const s0 = sku();
    const r = await send(mf, { key: over, body: order(s0), headers: { "x-test-body": "size:16385" } });
    assert.equal(r.status, 500);
    assert.equal(r.json.error, "idempotency_response_unstorable");
    assert.match(r.json.message, /executed.*16385 bytes.*16384 bytes/, "the first caller learns the request ran and why its answer is a 500");
    const row = await ledgerRow(db, "acct-a", over);
    assert.equal(row.response_status, 500);
    assert.equal(row.response_body, r.text);
    const replay = await send(mf, { key: over, body: order(s0) });
    assert.equal(replay.status, 500);
    assert.equal(replay.text, r.text, "every replay gets the same 500");
    const small = uniqueKey();
    const capped = await send(mf, { key: small, body: order(sku()), headers: { "x-test-body": "size:11", "x-test-body-cap": "10" } });
    assert.equal(capped.status, 500, "configurable cap");
  });

  test("204, 205 and 304 never carry a body, fresh or replayed", async () => {
    for (const status of [204, 205, 304]) {
      const key = uniqueKey();
      const s0 = sku();
      const r = await send(mf, { key, body: order(s0), headers: { "x-test-status": String(status), "x-test-body": "text:ignored" } });
      assert.equal(r.status, status);
      assert.equal(r.text, "");
      const replay = await send(mf, { key, body: order(s0) });
      assert.equal(replay.status, status);
      assert.equal(replay.text, "");
      assert.equal((await ledgerRow(db, "acct-a", key)).response_body, null, "stored without a body");
    }
  });

  test("bytes that are not UTF-8 cannot be stored: a loud 500, never mangled", async () => {
    const key = uniqueKey();
    const s0 = sku();
    const r = await send(mf, { key, body: order(s0), headers: { "x-test-body": "hex:6f6bff" } });
    assert.equal(r.status, 500);
    assert.match(r.json.message, /not UTF-8/);
    const row = await ledgerRow(db, "acct-a", key);
    assert.equal(row.response_status, 500);
    assert.equal(row.response_body, r.text, "the 500 is stored, not the bytes");
    const ok = uniqueKey();
    const utf8 = await send(mf, { key: ok, body: order(sku()), headers: { "x-test-body": "hex:e697a5e69cac" } });
    assert.equal(utf8.status, 201);
    assert.equal(utf8.text, "\u65e5\u672c");
  });
});

describe("SPEC 8: bounded opportunistic sweep", () => {
  test("runs in waitUntil after the mutation path, deletes at most the batch size of expired rows", async () => {
    const stale = uniqueKey("stale");
    const retention = 86_400_000;
    const now = T0 + 10 * retention;
    const insert = db.prepare(
      "INSERT INTO idempotency_keys (principal, key, fingerprint, status, generation, response_status, response_body, response_headers, created_at, updated_at) VALUES (?, ?, ?, ?, 1, ?, ?, ?, ?, ?)",
    );
    const fp = "0".repeat(64);
    const rows = [];
    for (let i = 0; i < 25; i++) {
      const completed = i % 2 === 0;
      rows.push(insert.bind("acct-sweep", `${stale}-${i}`, fp, completed ? "completed" : "pending", completed ? 201 : null, completed ? "{}" : null, completed ? "{}" : null, now - retention - 10_000, now - retention - 1));
    }
    rows.push(insert.bind("acct-sweep", `${stale}-fresh`, fp, "completed", 201, "{}", "{}", now - retention, now - retention));
    await db.batch(rows);
    // Every row in the shared database older than now - retention is eligible (other tests' rows too).
    const eligible = async () => (await db.prepare("SELECT COUNT(*) AS n FROM idempotency_keys WHERE updated_at < ?").bind(now - retention).first()).n;
    const mine = async () => (await db.prepare("SELECT COUNT(*) AS n FROM idempotency_keys WHERE principal = 'acct-sweep'").first()).n;
    // A replay does not sweep.
    const key = uniqueKey();
    const s0 = sku();
    await send(mf, { key, body: order(s0), now: T0 });
    const replay = await send(mf, { key, body: order(s0), now: T0 + 1 });
    assert.deepEqual((await stats(mf, replay.id)).batches, ["decision"]);
    // An executed request sweeps one bounded batch off the critical path.
    assert.equal(await mine(), 26);
    const before = await eligible();
    assert.ok(before >= 25);
    const r = await send(mf, { key: uniqueKey(), body: order(sku()), now, headers: { "x-test-sweep-batch": "20" } });
    assert.equal(r.status, 201);
    const s = await stats(mf, r.id);
    // SPEC 8.1: a full batch says `more`, so the host sweeps again (still in waitUntil) until one is not full.
    assert.deepEqual(s.batches.slice(0, 2), ["decision", "completion"]);
    const sweeps = s.batches.slice(2);
    assert.ok(sweeps.length >= 2 && sweeps.every((b) => b === "sweep"), `sweep batches: ${s.batches}`);
    assert.equal(sweeps.length, Math.floor(before / 20) + 1, "one batch per 20 expired rows, then the one that is not full");
    assert.equal(s.waitUntil, 1, "all of it in one waitUntil");
    assert.equal(await eligible(), 0);
    assert.equal(await mine(), 1, "abandoned pending and expired completed rows alike are gone; the row at the boundary stays");
    assert.ok(await ledgerRow(db, "acct-sweep", `${stale}-fresh`));
  });
});

describe("SPEC 9: failure rules (D1 failure injection)", () => {
  test("a failed decision batch never runs the mutation: 500, no row", async () => {
    const key = uniqueKey();
    const s0 = sku();
    const r = await send(mf, { key, body: order(s0), headers: { "x-test-fail-batch": "1" } });
    assert.equal(r.status, 500);
    assert.equal(r.json.error, "idempotency_ledger_unavailable");
    const s = await stats(mf, r.id);
    assert.equal(s.mutationsStarted, 0, "fail closed");
    assert.deepEqual(s.batches, ["decision"]);
    assert.equal(await orderCount(db, s0), 0);
    assert.equal(await ledgerRow(db, "acct-a", key), null);
    const retry = await send(mf, { key, body: order(s0) });
    assert.equal(retry.status, 201, "nothing was claimed: the retry executes");
  });

  test("a busy D1 on the decision answers 503 with Retry-After: 1, never runs the mutation", async () => {
    const s0 = sku();
    const r = await send(mf, { key: uniqueKey(), body: order(s0), headers: { "x-test-fail-batch": "1", "x-test-fail-mode": "busy" } });
    assert.equal(r.status, 503);
    assert.equal(r.headers.get("retry-after"), "1");
    assert.equal(r.json.error, "idempotency_ledger_unavailable");
    assert.equal(await orderCount(db, s0), 0);
  });

  test("a decision batch that committed but whose answer was lost still runs nothing; the retry sees in-progress", async () => {
    const key = uniqueKey();
    const s0 = sku();
    const r = await send(mf, { key, body: order(s0), now: T0, headers: { "x-test-fail-batch": "1", "x-test-fail-mode": "after" } });
    // The answer says so: the key may stay reserved until the TTL (not "retry now").
    assert.equal(r.status, 503);
    assert.equal(r.headers.get("retry-after"), "30");
    assert.equal(r.json.error, "idempotency_ledger_outcome_unknown");
    assert.equal(await orderCount(db, s0), 0);
    assert.equal((await ledgerRow(db, "acct-a", key)).status, "pending");
    const retry = await send(mf, { key, body: order(s0), now: T0 + 1 });
    assert.equal(retry.status, 409);
    const later = await send(mf, { key, body: order(s0), now: T0 + 30_001 });
    assert.equal(later.status, 201, "after the TTL the reservation is taken over");
    assert.equal(await orderCount(db, s0), 1);
  });

  test("a failed completion leaves the row pending and is reported; the caller still gets its response", async () => {
    const key = uniqueKey();
    const s0 = sku();
    const r = await send(mf, { key, body: order(s0), now: T0, headers: { "x-test-fail-batch": "2" } });
    assert.equal(r.status, 201);
    assert.equal(r.json.sku, s0);
    const s = await stats(mf, r.id);
    assert.deepEqual(s.batches.slice(0, 2), ["decision", "completion"]);
    assert.equal(s.errors.length, 1);
    assert.match(s.errors[0], /completion not stored/);
    assert.match(s.errors[0], /row stays pending/);
    assert.ok(s.errors[0].includes(key));
    assert.equal((await ledgerRow(db, "acct-a", key)).status, "pending");
    assert.equal(await orderCount(db, s0), 1);
    const retry = await send(mf, { key, body: order(s0), now: T0 + 1000 });
    assert.equal(retry.status, 409, "within the TTL the retry is told the first attempt is in progress");
    assert.equal(await orderCount(db, s0), 1);
  });

  test("a throwing mutation leaves the row pending and is rethrown; NothingChangedError releases it", async () => {
    const key = uniqueKey();
    const s0 = sku();
    const r = await send(mf, { key, body: order(s0), now: T0, headers: { "x-test-throw": "1" } });
    assert.equal(r.status, 500);
    assert.equal((await ledgerRow(db, "acct-a", key)).status, "pending");
    const released = uniqueKey();
    const n = await send(mf, { key: released, body: order(s0), now: T0, headers: { "x-test-nothing-ran": "1" } });
    assert.equal(n.status, 500);
    assert.deepEqual((await stats(mf, n.id)).batches, ["decision", "release"]);
    assert.equal(await ledgerRow(db, "acct-a", released), null, "released: the mutation never ran");
    const again = await send(mf, { key: released, body: order(s0), now: T0 + 1 });
    assert.equal(again.status, 201);
  });

  test("a missing table fails closed with 500", async () => {
    await db.exec("ALTER TABLE idempotency_keys RENAME TO idempotency_keys_away");
    try {
      const s0 = sku();
      const r = await send(mf, { key: uniqueKey(), body: order(s0) });
      assert.equal(r.status, 500);
      assert.equal(r.json.error, "idempotency_ledger_unavailable");
      assert.equal(await orderCount(db, s0), 0);
    } finally {
      await db.exec("ALTER TABLE idempotency_keys_away RENAME TO idempotency_keys");
    }
  });
});

describe("issue 21.8: a chunked request refused with 413 leaves the Worker serving", () => {
  // workerd resets a connection whose request body the Worker left unread;
  // `wrangler dev`'s proxy answered such an upload "Your worker restarted
  // mid-request" (503), and a client sending straight to workerd (undici,
  // here) got ECONNRESET instead of the 413 in most rounds. Cancelling the
  // body stream did not change that; reading it to its end (discarded) does.
  test("every refused upload gets its 413 (through dispatchFetch and over HTTP), and the next request is answered", async () => {
    const { createServer } = await import("node:net");
    const free = await new Promise((resolve) => {
      const s = createServer();
      s.listen(0, "127.0.0.1", () => {
        const { port } = s.address();
        s.close(() => resolve(port));
      });
    });
    const served = await startWorker({ scriptPath: HARNESS_SCRIPT, port: free });
    try {
      const headers = { authorization: "Bearer tok-a", "x-test-request-cap": "1024", "content-type": "application/json" };
      for (let round = 0; round < 5; round++) {
        let pulled = 0;
        const stream = new ReadableStream({
          pull(controller) {
            pulled += 1;
            if (pulled > 64) controller.close();
            else controller.enqueue(new Uint8Array(64 * 1024).fill(0x20));
          },
        });
        const refused = await served.mf.dispatchFetch("http://orders.test/orders", { method: "POST", headers: { ...headers, "idempotency-key": uniqueKey("stream") }, body: stream, duplex: "half" });
        const text = await refused.text();
        assert.equal(refused.status, 413, text);
        assert.equal(JSON.parse(text).error, "idempotency_request_too_large");
        const next = await send(served.mf, { key: uniqueKey(), body: order(sku()) });
        assert.equal(next.status, 201, `round ${round}: ${next.text}`);
      }
      for (let round = 0; round < 5; round++) {
        const refused = await chunkedUpload({ port: free, path: "/orders", headers: { ...headers, "idempotency-key": uniqueKey("chunked") }, total: 4 * 1024 * 1024 });
        assert.equal(refused.status, 413, `round ${round}: ${JSON.stringify(refused)}`);
        const next = await fetch(`http://127.0.0.1:${free}/orders`, { method: "POST", headers: { ...headers, "idempotency-key": uniqueKey() }, body: order(sku()) });
        assert.equal(next.status, 201, `round ${round}: the next request after the 413: ${await next.text()}`);
      }
    } finally {
      await served.mf.dispose();
    }
  });
});
