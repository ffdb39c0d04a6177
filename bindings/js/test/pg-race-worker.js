// One JS (Node) process of the cross-language PostgreSQL race (host-test/pg_race.py --js-worker):
//
//   node pg-race-worker.js --url URL --schema SCHEMA --prefix PREFIX --keys N --name NAME --start-file PATH
//
// The same protocol as bindings/python/tests/pg_race_worker.py and the Rust
// pg-race-worker: build the ledger (a pg pool of one connection) and a
// mutation connection of its own, create `<start-file>.ready.<name>`, wait
// for the start file (polling every 1 ms), then for k in 0..N in order handle
// `POST /orders` with `Idempotency-Key: {prefix}-{k}` as principal `race`
// (`content-type: application/json`, body `{"sku":"k{k}"}`). The mutation
// inserts (key, name) into race_mutations (autocommit), sleeps 5 ms and
// returns 201 {"order":"{key}","by":"{name}"}. One JSON line per request on
// stdout: {"worker", "lang", "key", "status", "body", "executed"}.
import { existsSync, writeFileSync } from "node:fs";
import pg from "pg";
import { ledgerFor, migrate } from "../src/node.js";
import { pgLedger } from "../src/pg.js";

function parse(argv) {
  const wanted = ["url", "schema", "prefix", "keys", "name", "start-file"];
  const args = {};
  for (let i = 0; i < argv.length; i += 2) {
    const flag = argv[i];
    if (!flag.startsWith("--") || !wanted.includes(flag.slice(2))) throw new Error(`unknown flag ${flag}`);
    if (argv[i + 1] === undefined) throw new Error(`${flag} needs a value`);
    args[flag.slice(2)] = argv[i + 1];
  }
  for (const name of wanted) if (args[name] === undefined) throw new Error(`--${name} is required`);
  args.keys = Number(args.keys);
  if (!Number.isInteger(args.keys) || args.keys < 0) throw new Error("--keys must be an integer");
  return args;
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function main() {
  let args;
  try {
    args = parse(process.argv.slice(2));
  } catch (error) {
    process.stderr.write(`pg-race-worker.js: ${error.message}\n`);
    process.exit(2);
  }
  const sep = args.url.includes("?") ? "&" : "?";
  const url = `${args.url}${sep}options=${encodeURIComponent(`-c search_path=${args.schema}`)}&application_name=${encodeURIComponent(`pg-race-${args.name}`)}`;
  // A loaded 2-core box must not turn the race into 503s: wait long for locks and connections.
  const pool = new pg.Pool({ connectionString: url, max: 1 });
  pool.on("error", (error) => process.stderr.write(`idle connection: ${error.message}\n`));
  const db = pgLedger(pool, { connectTimeoutMs: 30_000, lockTimeoutMs: 30_000 });
  const logger = { error: (m) => process.stderr.write(`${m}\n`), warn: (m) => process.stderr.write(`${m}\n`), info: () => {} };
  const options = { logger };
  const ledger = ledgerFor(db, options);
  await migrate(db); // idempotent: the driver migrated already; this also connects before the start
  const mutations = new pg.Client({ connectionString: url });
  await mutations.connect();

  writeFileSync(`${args["start-file"]}.ready.${args.name}`, "");
  while (!existsSync(args["start-file"])) await sleep(1);

  const lines = [];
  for (let k = 0; k < args.keys; k++) {
    const key = `${args.prefix}-${k}`;
    let ran = false;
    const request = new Request("http://race.test/orders", {
      method: "POST",
      headers: { "Idempotency-Key": key, "content-type": "application/json" },
      body: `{"sku":"k${k}"}`,
    });
    const handled = await ledger.handle(request, "race", async () => {
      ran = true;
      await mutations.query("INSERT INTO race_mutations (key, worker) VALUES ($1, $2)", [key, args.name]);
      await sleep(5);
      return { status: 201, headers: { "content-type": "application/json" }, body: JSON.stringify({ order: key, by: args.name }) };
    });
    const body = await handled.response.text();
    lines.push(JSON.stringify({ worker: args.name, lang: "js", key, status: handled.response.status, body, executed: ran }));
  }
  process.stdout.write(lines.map((l) => `${l}\n`).join(""));
  await mutations.end();
  await pool.end();
}

main().catch((error) => {
  process.stderr.write(`pg-race-worker.js: ${error?.stack ?? error}\n`);
  process.exit(1);
});
