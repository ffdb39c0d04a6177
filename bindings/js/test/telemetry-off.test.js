// Telemetry costs nothing when it cannot record: without @opentelemetry/api
// installed (a child process in which it cannot be resolved), and with the
// API but no meter or tracer provider registered (this process, until the
// last test registers one). Real servers on loopback: Hono, Express, node:http.
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { createServer } from "node:http";
import { join } from "node:path";
import { test } from "node:test";
import { promisify } from "node:util";
import * as api from "@opentelemetry/api";
import express from "express";
import { Hono } from "hono";
import { idempotency as honoIdempotency } from "../src/hono-node.js";
import { idempotency as expressIdempotency } from "../src/express.js";
import { idempotentHandler } from "../src/node.js";
import { currentInstruments } from "../src/telemetry.js";
import { installOtel, pointWith } from "./helpers/otel.js";
import { honoServer, listen } from "./helpers/servers.js";
import { freshDb } from "./helpers/sqlite.js";
import { PACKAGE_ROOT } from "./helpers/workerd.js";

const run = promisify(execFile);
const quiet = { error() {}, warn() {}, info() {} };

async function post(base, key, body = '{"sku":"A"}') {
  const r = await fetch(`${base}/orders`, { method: "POST", headers: { "content-type": "application/json", "idempotency-key": key }, body });
  return `${r.status} ${await r.text()}`;
}

test("without @opentelemetry/api installed: every adapter serves, and the package looked for the API once", async () => {
  const { stdout, stderr } = await run(process.execPath, ["--require", join(PACKAGE_ROOT, "test/fixtures/hide-otel.cjs"), join(PACKAGE_ROOT, "test/fixtures/adapters-app.js")], {
    cwd: PACKAGE_ROOT,
    timeout: 60_000,
  });
  const report = JSON.parse(stdout.trim());
  assert.equal(report.api, "absent", "the API could not be resolved in that process");
  for (const via of ["hono", "express", "node:http"]) {
    assert.deepEqual(report.results[via], [`201 {"via":"${via}"}`, `201 {"via":"${via}"}`, '409 {"error":"idempotency_key_reused"}'], via);
  }
  assert.deepEqual(report.outcomes, ["executed", "replayed", "key-reused", "executed", "replayed", "key-reused", "executed", "replayed", "key-reused"]);
  const refused = stderr.split("\n").filter((l) => l === "hidden: @opentelemetry/api");
  assert.equal(refused.length, 2, `the package asked once for 9 exchanges (the other is the fixture's own check): ${stderr}`);
});

test("with the API but no provider registered: nothing recorded, no span context asked for, and nothing broken", async () => {
  const outcomes = [];
  const settings = () => ({ db: freshDb(), principal: () => "acct-1", logger: quiet, onOutcome: (o) => outcomes.push(o) });
  const hono = new Hono();
  hono.post("/orders", honoIdempotency(settings()), (c) => c.json({ via: "hono" }, 201));
  const app = express();
  app.post("/orders", expressIdempotency(settings()), express.json(), (req, res) => res.status(201).json({ via: "express" }));
  const bases = {
    hono: await honoServer(hono),
    express: await listen(createServer(app)),
    "node:http": await listen(createServer(idempotentHandler(settings(), (req, res) => res.writeHead(201).end('{"via":"node:http"}')))),
  };
  // The package asks the API for the active context only when it starts a span.
  let asked = 0;
  const active = api.context.active;
  api.context.active = function countedActive() {
    asked += 1;
    return active.call(this);
  };
  let otel;
  try {
    for (const [via, base] of Object.entries(bases)) {
      assert.equal(await post(base, "k1"), `201 {"via":"${via}"}`);
      assert.equal(await post(base, "k1"), `201 {"via":"${via}"}`);
      assert.equal(await post(base, "k1", '{"sku":"B"}'), '409 {"error":"idempotency_key_reused"}');
    }
    assert.equal(outcomes.length, 9);
    assert.equal(asked, 0, "no span was started");
    assert.equal(currentInstruments(), null, "nothing to record with");

    // Registered now: the counter starts from what happens after, nothing was kept before.
    otel = installOtel();
    assert.equal(await post(bases.hono, "k2"), '201 {"via":"hono"}');
    assert.ok(asked > 0, "with a tracer provider the span's parent is asked for (the spy sees the package's calls)");
  } finally {
    api.context.active = active;
  }
  try {
    const m = await otel.metrics();
    assert.deepEqual(
      m["idempotency.requests"].map((p) => [p.attributes, p.value]),
      [[{ "idempotency.outcome": "executed", "http.request.method": "POST", "http.route": "/orders" }, 1]],
    );
    assert.equal(pointWith(m["idempotency.ledger.duration"], { "idempotency.outcome": "executed" })?.value.count, 1);
    assert.deepEqual(
      otel.spans().map((s) => s.attributes["idempotency.outcome"]),
      ["executed"],
    );
  } finally {
    await otel.shutdown();
  }
  // Unregistered again: back to recording nothing.
  assert.equal(currentInstruments(), null);
  assert.equal(await post(bases.express, "k3"), '201 {"via":"express"}');
});
