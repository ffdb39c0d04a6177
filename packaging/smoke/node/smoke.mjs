// dist-check: the JS README's node:http example, run from the npm tarball
// installed into a project outside the repository (better-sqlite3 file).
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { fileURLToPath } from "node:url";
import { idempotentHandler, openLedgerDatabase } from "@idempotency/ledger/node";
import * as root from "@idempotency/ledger";

const entry = fileURLToPath(import.meta.resolve("@idempotency/ledger/node"));
assert.ok(entry.startsWith(process.cwd()), `the package must come from this project's node_modules, not ${entry}`);
assert.equal(typeof root.idempotentHandler, "function", "the root entry under the node condition is the Node entry");

const db = await openLedgerDatabase(process.argv[2]); // creates and migrates (WAL, busy timeout)
let runs = 0;
const server = createServer(idempotentHandler({ db, principal: (req) => req.headers.authorization?.replace(/^Bearer /, "") }, async (req, res) => {
  runs += 1;
  res.writeHead(201, { "content-type": "application/json", location: "/orders/o_1" }).end(JSON.stringify({ ok: true, bytes: req.rawBody.length }));
}));
await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
const url = `http://127.0.0.1:${server.address().port}/orders`;
const post = async (headers) => {
  const res = await fetch(url, { method: "POST", headers: { "idempotency-key": "order-7f3a", "content-type": "application/json", ...headers }, body: '{"sku":"A-1"}' });
  return { status: res.status, location: res.headers.get("location"), body: await res.text() };
};
const first = await post({ authorization: "Bearer account-42" });
const retry = await post({ authorization: "Bearer account-42" });
const anonymous = await post({});
server.close();
db.close();
console.log(`node: first ${first.status} ${first.body}, retry ${retry.status} ${retry.body}, handler ran ${runs} time(s), no principal -> ${anonymous.status} (package from ${entry})`);
assert.deepEqual(first, { status: 201, location: "/orders/o_1", body: '{"ok":true,"bytes":13}' });
assert.deepEqual(retry, first);
assert.equal(anonymous.status, 401);
assert.equal(runs, 1);
