// Wait instead of 409 (waitMs), with real concurrent requests over HTTP: the
// duplicates of a slow first request poll as the core directs and get its
// stored answer; with a wait shorter than the first request, they get the 409.
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { describe, test } from "node:test";
import express from "express";
import { Hono } from "hono";
import { idempotency as honoIdempotency } from "../src/hono-node.js";
import { idempotency as expressIdempotency } from "../src/express.js";
import { idempotentHandler } from "../src/node.js";
import { honoServer, listen } from "./helpers/servers.js";
import { freshDb } from "./helpers/sqlite.js";

const logger = { error() {}, warn() {}, info() {} };
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

const post = async (base, key) => {
  const r = await fetch(`${base}/orders`, {
    method: "POST",
    headers: { "content-type": "application/json", "idempotency-key": key, "x-user": "acct-1" },
    body: '{"sku":"A"}',
  });
  return { status: r.status, text: await r.text() };
};

/** 10 concurrent duplicates of a 300 ms mutation. */
async function duplicates(base, key) {
  return Promise.all(Array.from({ length: 10 }, () => post(base, key)));
}

async function checkWaiting(makeBase) {
  let runs = 0;
  const mutation = async () => {
    runs += 1;
    await sleep(300);
    return runs;
  };
  const patient = await makeBase({ waitMs: 3000 }, mutation);
  const answers = await duplicates(patient, "patient");
  assert.equal(runs, 1, "one execution for 10 concurrent duplicates");
  assert.ok(
    answers.every((a) => a.status === 201 && a.text === answers[0].text),
    `every duplicate got the first answer: ${JSON.stringify(answers)}`,
  );
  const impatient = await makeBase({ waitMs: 20 }, mutation);
  const rejected = await duplicates(impatient, "impatient");
  assert.equal(runs, 2);
  // The duplicates that came while the first ran waited 20 ms and got the 409; on a
  // loaded machine some arrive after it answered and get its stored answer (a replay).
  const created = rejected.filter((a) => a.status === 201);
  assert.ok(created.length >= 1 && created.every((a) => a.text === created[0].text), `one answer, replayed: ${JSON.stringify(rejected)}`);
  const refused = rejected.filter((a) => a.status !== 201);
  assert.ok(refused.length >= 1, `some duplicates came while the first ran: ${JSON.stringify(rejected)}`);
  assert.ok(
    refused.every((a) => a.status === 409 && JSON.parse(a.text).error === "idempotency_key_in_progress"),
    JSON.stringify(rejected),
  );
}

describe("wait instead of 409 (waitMs), real concurrent requests", () => {
  test("Hono on Node", async () => {
    await checkWaiting(async (settings, mutation) => {
      const app = new Hono();
      app.use(honoIdempotency({ db: freshDb(), principal: (c) => c.req.header("x-user"), logger, ...settings }));
      app.post("/orders", async (c) => c.json({ order: await mutation() }, 201));
      return honoServer(app);
    });
  });

  test("Express", async () => {
    await checkWaiting(async (settings, mutation) => {
      const app = express();
      app.use(expressIdempotency({ db: freshDb(), principal: (req) => req.get("x-user"), logger, ...settings }));
      app.post("/orders", async (req, res) => res.status(201).json({ order: await mutation() }));
      return listen(createServer(app));
    });
  });

  test("node:http", async () => {
    await checkWaiting(async (settings, mutation) => {
      const handler = idempotentHandler({ db: freshDb(), principal: (req) => req.headers["x-user"], logger, ...settings }, async (req, res) => {
        const order = await mutation();
        res.writeHead(201, { "content-type": "application/json" });
        res.end(JSON.stringify({ order }));
      });
      return listen(createServer(handler));
    });
  });
});
