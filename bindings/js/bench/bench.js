// Measurements for the JS host (run with `make bench`). Prints a report and
// writes it to .tmp/bench.json. All traffic stays inside this process and the
// local workerd it starts (miniflare, cf: false).
import { mkdirSync, readFileSync, readdirSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { gzipSync } from "node:zlib";
import { PACKAGE_ROOT, startWorker } from "../test/helpers/workerd.js";
import { T0, order, send, stats, uniqueKey } from "../test/helpers/http.js";

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
};
const pct = (xs, p) => [...xs].sort((a, b) => a - b)[Math.min(xs.length - 1, Math.floor((p / 100) * xs.length))];
const ms = (x) => `${x.toFixed(2)} ms`;
const report = {};

// 1. Round trips per path on D1, counted by the harness's wrapper around the real binding.
async function roundTrips() {
  const { mf } = await startWorker({ scriptPath: join(PACKAGE_ROOT, "test/fixtures/harness.js") });
  const paths = {};
  const record = async (name, r) => {
    const s = await stats(mf, r.id);
    const critical = s.batches.filter((b) => b !== "sweep").length;
    paths[name] = { status: r.status, batchesOnRequestPath: critical, batchesInWaitUntil: s.batches.length - critical, batches: s.batches };
  };
  try {
    const key = uniqueKey();
    const sku = uniqueKey("sku");
    await record("pass-through (GET)", await send(mf, { method: "GET" }));
    await record("400 missing/invalid key", await send(mf, { body: order(sku) }));
    await record("execute (claim won) + completion", await send(mf, { key, body: order(sku), now: T0 }));
    await record("replay of a completed key", await send(mf, { key, body: order(sku), now: T0 + 1 }));
    await record("409 key reused", await send(mf, { key, body: order(sku, 9), now: T0 + 2 }));
    const pending = uniqueKey();
    await send(mf, { key: pending, body: order(sku), now: T0, headers: { "x-test-throw": "1" } });
    await record("409 in progress", await send(mf, { key: pending, body: order(sku), now: T0 + 1 }));
    await record("takeover of a stale pending row + completion", await send(mf, { key: pending, body: order(sku), now: T0 + 30_001 }));
    await record("decision batch failed (fail closed)", await send(mf, { key: uniqueKey(), body: order(sku), headers: { "x-test-fail-batch": "1" } }));
  } finally {
    await mf.dispose();
  }
  report.roundTrips = paths;
  console.log("\nRound trips to D1 per path (one env.DB.batch() each):");
  for (const [name, p] of Object.entries(paths)) {
    console.log(`  ${name.padEnd(48)} ${String(p.batchesOnRequestPath)} on the request path + ${p.batchesInWaitUntil} in waitUntil   [${p.batches.join(", ")}] -> ${p.status}`);
  }
}

// 2. Package size: what a Worker bundle carries (component core modules + jco glue + this package's JS).
function size() {
  const files = [];
  for (const dir of ["generated", "src"]) {
    for (const name of readdirSync(join(PACKAGE_ROOT, dir))) {
      const path = join(PACKAGE_ROOT, dir, name);
      if (statSync(path).isFile() && !name.endsWith(".d.ts") && (name.endsWith(".js") || name.endsWith(".wasm")) && name !== "node.js" && name !== "sqlite.js") {
        const bytes = readFileSync(path);
        files.push({ file: `${dir}/${name}`, bytes: bytes.length, gzip: gzipSync(bytes, { level: 9 }).length });
      }
    }
  }
  const sum = (f, k) => f.reduce((a, x) => a + x[k], 0);
  const wasm = files.filter((f) => f.file.endsWith(".wasm"));
  const glue = files.filter((f) => f.file === "generated/core.js");
  const own = files.filter((f) => f.file.startsWith("src/"));
  const component = statSync(join(PACKAGE_ROOT, "../../target/component/idempotency_ledger.wasm")).size;
  report.size = {
    componentWasm: component,
    coreModules: { bytes: sum(wasm, "bytes"), gzip: sum(wasm, "gzip") },
    jcoGlue: { bytes: sum(glue, "bytes"), gzip: sum(glue, "gzip") },
    packageJs: { bytes: sum(own, "bytes"), gzip: sum(own, "gzip") },
    total: { bytes: sum(files, "bytes"), gzip: sum(files, "gzip") },
    files,
  };
  const kib = (n) => `${(n / 1024).toFixed(1)} KiB`;
  console.log("\nPackage size in a Worker bundle (raw / gzip -9):");
  console.log(`  component (input)          ${kib(component)}`);
  console.log(`  core modules (3 .wasm)     ${kib(report.size.coreModules.bytes)} / ${kib(report.size.coreModules.gzip)}`);
  console.log(`  jco glue (core.js)         ${kib(report.size.jcoGlue.bytes)} / ${kib(report.size.jcoGlue.gzip)}`);
  console.log(`  package JS (worker entry)  ${kib(report.size.packageJs.bytes)} / ${kib(report.size.packageJs.gzip)}`);
  console.log(`  total                      ${kib(report.size.total.bytes)} / ${kib(report.size.total.gzip)}`);
}

async function coldStartOnce(script, path) {
  const t0 = performance.now();
  const { mf } = await startWorker({ scriptPath: join(PACKAGE_ROOT, script) });
  const tReady = performance.now();
  const first = await mf.dispatchFetch(`http://bench.test${path}`, {
    method: "POST",
    headers: { "idempotency-key": uniqueKey("cold"), "content-type": "application/json" },
    body: "{}",
  });
  await first.arrayBuffer();
  const tFirst = performance.now();
  const warm = [];
  for (let i = 0; i < 20; i++) {
    const t = performance.now();
    const r = await mf.dispatchFetch(`http://bench.test${path}`, {
      method: "POST",
      headers: { "idempotency-key": uniqueKey("warm"), "content-type": "application/json" },
      body: "{}",
    });
    await r.arrayBuffer();
    warm.push(performance.now() - t);
  }
  await mf.dispose();
  if (first.status !== 201) throw new Error(`cold start request answered ${first.status}`);
  return { startToReady: tReady - t0, firstRequest: tFirst - tReady, startToFirstResponse: tFirst - t0, warmMedian: median(warm) };
}

// 3. Cold start in workerd: new workerd process (miniflare) -> first handled request.
async function coldStart(runs = 5) {
  const result = {};
  for (const [name, script, path] of [
    ["bare D1 Worker (no package)", "bench/bare-worker.js", "/"],
    ["idempotent Worker (package)", "bench/worker.js", "/idem"],
  ]) {
    const samples = [];
    for (let i = 0; i < runs; i++) samples.push(await coldStartOnce(script, path));
    result[name] = {
      runs,
      startToReadyMedian: median(samples.map((s) => s.startToReady)),
      firstRequestMedian: median(samples.map((s) => s.firstRequest)),
      startToFirstResponseMedian: median(samples.map((s) => s.startToFirstResponse)),
      warmRequestMedian: median(samples.map((s) => s.warmMedian)),
    };
  }
  report.coldStart = result;
  console.log(`\nCold start in workerd (median of ${runs} fresh workerd processes each):`);
  for (const [name, r] of Object.entries(result)) {
    console.log(
      `  ${name.padEnd(30)} start->ready ${ms(r.startToReadyMedian)}, first request ${ms(r.firstRequestMedian)}, start->first response ${ms(r.startToFirstResponseMedian)} (warm request ${ms(r.warmRequestMedian)})`,
    );
  }
}

// 4. Median per-request overhead of the handler over a bare D1 insert, same run, interleaved.
async function overhead(n = 300) {
  const { mf } = await startWorker({ scriptPath: join(PACKAGE_ROOT, "bench/worker.js") });
  const bare = [];
  const idem = [];
  const replay = [];
  try {
    const one = async (path, key) => {
      const t = performance.now();
      const r = await mf.dispatchFetch(`http://bench.test${path}`, {
        method: "POST",
        headers: { "idempotency-key": key, "content-type": "application/json" },
        body: '{"sku":"B","qty":1}',
      });
      await r.arrayBuffer();
      if (r.status !== 201) throw new Error(`${path} answered ${r.status}`);
      return performance.now() - t;
    };
    for (let i = 0; i < 30; i++) {
      await one("/bare", uniqueKey("w"));
      await one("/idem", uniqueKey("w"));
    }
    for (let i = 0; i < n; i++) {
      const key = uniqueKey("b");
      if (i % 2) {
        bare.push(await one("/bare", key));
        idem.push(await one("/idem", key));
      } else {
        idem.push(await one("/idem", key));
        bare.push(await one("/bare", key));
      }
      replay.push(await one("/idem", key));
    }
  } finally {
    await mf.dispose();
  }
  report.overhead = {
    requests: n,
    bareMedian: median(bare),
    idempotentMedian: median(idem),
    replayMedian: median(replay),
    overheadMedian: median(idem) - median(bare),
    bareP90: pct(bare, 90),
    idempotentP90: pct(idem, 90),
  };
  const o = report.overhead;
  console.log(`\nPer-request latency through workerd, ${n} sequential requests each, interleaved (client-measured, dispatchFetch):`);
  console.log(`  bare D1 insert                  median ${ms(o.bareMedian)}  p90 ${ms(o.bareP90)}`);
  console.log(`  handler + the same insert       median ${ms(o.idempotentMedian)}  p90 ${ms(o.idempotentP90)}  (decision batch + insert + completion batch)`);
  console.log(`  handler replay (no insert)      median ${ms(o.replayMedian)}`);
  console.log(`  median overhead of the handler  ${ms(o.overheadMedian)}`);
}

await roundTrips();
size();
await coldStart();
await overhead();
mkdirSync(join(PACKAGE_ROOT, ".tmp"), { recursive: true });
writeFileSync(join(PACKAGE_ROOT, ".tmp/bench.json"), `${JSON.stringify(report, null, 2)}\n`);
console.log("\nwritten: .tmp/bench.json");
