// Only the request headers the core reads (its `request-headers`) cross into
// the component: Session.start copies no other, and the answers are the ones
// all the headers would have given.
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, test } from "node:test";
import { getCore, ledgerFor, openLedgerDatabase } from "../src/node.js";
import { interceptSession } from "./helpers/intercept.js";

const dir = mkdtempSync(join(tmpdir(), "idem-request-headers-"));
after(() => rmSync(dir, { recursive: true, force: true }));

// What a typical API client sends besides the headers the core reads.
const OTHERS = {
  host: "api.example.com",
  "user-agent": "example-client/1.4.2",
  accept: "application/json",
  authorization: "Bearer abc.def.ghi",
  "x-request-id": "5f0c6f4e-8f0b-4bde-9a3e-1c2d3e4f5a6b",
  cookie: `session=${"x".repeat(4000)}`,
};

const head = (headers) => ({ method: "POST", pathAndQuery: "/orders", headers: Object.entries(headers).map(([name, value]) => ({ name, value })) });

test("the session names the key, the length and the fingerprinted headers, lower-cased, each once", () => {
  const core = getCore();
  assert.deepEqual([...core.open(core.defaultConfig()).requestHeaders], ["idempotency-key", "content-length", "content-type", "x-api-version"]);
  const custom = core.open({ ...core.defaultConfig(), fingerprintHeaders: ["Content-Type", "X-Tenant", "idempotency-key"] });
  assert.deepEqual([...custom.requestHeaders], ["idempotency-key", "content-length", "content-type", "x-tenant"]);
});

test("an exchange copies only those headers into the component and answers as with all of them", async () => {
  const db = await openLedgerDatabase(join(dir, "ledger.sqlite"));
  const l = ledgerFor(db, { sweep: false, fingerprintHeaders: ["content-type", "x-tenant"] });
  const given = [];
  // Every request the component's session.start receives, as it receives it.
  interceptSession(l.session, { start: (session, request) => (given.push(request.head.headers.map((h) => h.name.toLowerCase()).sort()), session.start(request)) });
  const body = Buffer.from('{"sku":"A-1"}');
  const read = { "Idempotency-Key": "k-1", "content-type": "application/json", "X-Tenant": "t-1", "content-length": String(body.length) };
  let ran = 0;
  const io = { readBody: () => body, runHandler: () => (ran++, { tag: "answered", val: { status: 201, headers: [], body: { tag: "bytes", val: body } } }) };
  const first = await l.exchange(head({ ...OTHERS, ...read }), "acct", io);
  const replay = await l.exchange(head({ ...read, host: "other.example.com" }), "acct", io);
  const otherTenant = await l.exchange(head({ ...OTHERS, ...read, "X-Tenant": "t-2" }), "acct", io);
  assert.deepEqual([first.outcome, replay.outcome, otherTenant.outcome, ran], ["executed", "replayed", "key-reused", 1]);
  assert.deepEqual(given, Array(3).fill(["content-length", "content-type", "idempotency-key", "x-tenant"]));
  db.close();
});
