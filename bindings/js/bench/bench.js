// Measurements for the JS host (`make -C bindings/js bench`, also run by the
// top-level `make bench`, inside scripts/postgres.sh so IDEMPOTENCY_PG_URL is
// set). Prints ONE Markdown section on stdout (appended to bench/RESULTS.md by
// scripts/bench.sh); progress, miniflare and workerd logs go to stderr. The
// raw figures are written to .tmp/bench.json. Every comparison measures both
// sides in the same run, interleaved:
//   1. start cost in workerd: a Worker with the package vs the same Worker
//      without it (miniflare + D1, and workerd alone), and what the package weighs;
//   2. per request on D1: the package's handler vs the recipe's plain-JS handler;
//   3. per request on Node: the Hono and Express middleware vs the same app
//      without it (better-sqlite3 files, loopback HTTP), where the time goes,
//      and what OpenTelemetry costs (off, the API without a provider, the SDK);
//   4. PostgreSQL (when IDEMPOTENCY_PG_URL is set): the pg ledger vs a bare
//      `INSERT ... ON CONFLICT` of the same row.
import { execFileSync, spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { Agent, request as httpRequest } from "node:http";
import { cpus, loadavg, tmpdir } from "node:os";
import { dirname, join, relative } from "node:path";
import { gzipSync } from "node:zlib";
import Database from "better-sqlite3";
import { PACKAGE_ROOT, startWorker, workerModules } from "../test/helpers/workerd.js";
import { T0, order, send, stats, uniqueKey } from "../test/helpers/http.js";

const started = performance.now();
const loadAtStart = loadavg()[0];
// stdout carries only the Markdown: everything else written there (console.log,
// miniflare, workerd's stdio) is sent to stderr.
const writeMarkdown = process.stdout.write.bind(process.stdout);
process.stdout.write = process.stderr.write.bind(process.stderr);
const log = (...args) => console.error(`[bench ${((performance.now() - started) / 1000).toFixed(1)} s]`, ...args);

const sorted = (xs) => [...xs].sort((a, b) => a - b);
const median = (xs) => {
  const s = sorted(xs);
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
};
const pct = (xs, p) => sorted(xs)[Math.min(xs.length - 1, Math.max(0, Math.ceil((p / 100) * xs.length) - 1))];
/** Median of the per-round differences a[i] - b[i] (both sides sampled in the same round). */
const pairedMedian = (a, b) => median(a.map((x, i) => x - b[i]));
const f1 = (x) => x.toFixed(1);
const f2 = (x) => x.toFixed(2);
const ms = (x) => `${f2(x)} ms`;
const signed = (x, digits = 2) => `${x >= 0 ? "+" : "−"}${Math.abs(x).toFixed(digits)} ms`;
const us = (x) => `${x.toFixed(1)} µs`;
const signedUs = (x) => `${x >= 0 ? "+" : "−"}${us(Math.abs(x))}`;
const kib = (n) => `${(n / 1024).toFixed(1)} KiB`;
const ratio = (x) => `${x.toFixed(2)}×`;
const report = {};
const md = [];
const table = (head, rows) => {
  // numbers right-aligned, text left-aligned
  const numeric = head.map((_, i) => i > 0 && rows.every((r) => /^(\*\*)?[+−-]?[\d.]+( |$|\*|×|%)/.test(String(r[i])) || r[i] === ""));
  md.push(`| ${head.join(" | ")} |`, `|${numeric.map((n) => (n ? " ---: " : " --- ")).join("|")}|`);
  for (const r of rows) md.push(`| ${r.join(" | ")} |`);
  md.push("");
};
const versionOf = (pkg) => JSON.parse(readFileSync(join(PACKAGE_ROOT, "node_modules", pkg, "package.json"), "utf8")).version;
const PG_URL = process.env.IDEMPOTENCY_PG_URL ?? "";
// IDEMPOTENCY_BENCH_QUICK=1: a tenth of every count (a smoke run of the bench itself; figures meaningless).
const QUICK = !!process.env.IDEMPOTENCY_BENCH_QUICK;
const count = (n) => (QUICK ? Math.max(2, Math.ceil(n / 10)) : n);

// The previous run's start cost, from the JS section of bench/RESULTS.md
// (scripts/bench.sh rewrites that file only after every host's bench ran).
function previousStartCost() {
  const path = join(PACKAGE_ROOT, "../../bench/RESULTS.md");
  if (!existsSync(path)) return null;
  const text = readFileSync(path, "utf8");
  const js = text.slice(Math.max(0, text.indexOf("## JavaScript host")));
  const date = /Produced by `make bench` on (\d{4}-\d\d-\d\d)/.exec(text)?.[1] ?? "an earlier run";
  // This bench's wording, then the wording of the bench before the 0.2.0 port.
  const num = (sign, digits) => (sign === "−" || sign === "-" ? -1 : 1) * Number(digits);
  let m = /Extra start time of the package \(package − bare\): start → ready ([+−-]?)([\d.]+) ms, first request ([+−-]?)([\d.]+) ms/.exec(js);
  if (m) return { startToReady: num(m[1], m[2]), firstRequest: num(m[3], m[4]), date };
  m = /start → ready, package − bare\): (-?)([\d.]+) ms; first request, package − bare: (-?)([\d.]+) ms/.exec(js);
  return m ? { startToReady: num(m[1], m[2]), firstRequest: num(m[3], m[4]), date } : null;
}
report.previous = previousStartCost();

/**
 * The previous run's Node middleware figures, from the same table of
 * bench/RESULTS.md: row label -> "overhead, ratio" as printed there (the
 * ratio only where that run had the column).
 */
function previousNodeOverhead() {
  const path = join(PACKAGE_ROOT, "../../bench/RESULTS.md");
  if (!existsSync(path)) return {};
  const text = readFileSync(path, "utf8");
  const start = text.indexOf("### Per request on Node");
  if (start === -1) return {};
  const section = text.slice(start, text.indexOf("\n### ", start + 1) === -1 ? undefined : text.indexOf("\n### ", start + 1));
  const found = {};
  for (const line of section.split("\n")) {
    const cells = line.split("|").map((c) => c.trim());
    if (!/^(Hono|Express), /.test(cells[1] ?? "")) continue;
    const overhead = cells.find((c) => /^\*\*[+−-][\d.]+ ms\*\*$/.test(c))?.replaceAll("*", "");
    const ratio = cells.find((c) => /^\*\*[\d.]+x\*\*$/.test(c))?.replaceAll("*", "");
    if (overhead) found[cells[1]] = ratio ? `${overhead}, ${ratio}` : overhead;
  }
  return found;
}
report.previousNodeOverhead = previousNodeOverhead();

// ---------------------------------------------------------------------------
// 1. Start cost in workerd.

/** One cold start through miniflare: a new workerd process with the Worker and a migrated local D1. */
async function coldStartOnce(script) {
  const cpu0 = process.cpuUsage();
  const t0 = performance.now();
  const { mf } = await startWorker({ scriptPath: join(PACKAGE_ROOT, script) });
  const ready = performance.now() - t0;
  const cpu = process.cpuUsage(cpu0);
  const call = async () => {
    const t = performance.now();
    const r = await mf.dispatchFetch("http://bench.test/orders", {
      method: "POST",
      headers: { "idempotency-key": uniqueKey("cold"), "content-type": "application/json" },
      body: '{"sku":"B","qty":1}',
    });
    await r.arrayBuffer();
    if (r.status !== 201) throw new Error(`${script} answered ${r.status}`);
    return performance.now() - t;
  };
  try {
    const first = await call();
    const probe = await (await mf.dispatchFetch("http://bench.test/probe")).json();
    const warm = [];
    for (let i = 0; i < 10; i++) warm.push(await call());
    return { ready, nodeCpu: (cpu.user + cpu.system) / 1000, first, warm: median(warm), probe };
  } finally {
    await mf.dispose();
  }
}

const START_WORKERS = { bare: "bench/bare-worker.js", package: "bench/worker.js" };

async function startCostMiniflare(rounds = count(16)) {
  const samples = { bare: [], package: [] };
  await coldStartOnce(START_WORKERS.package); // the first workerd start of the run is slower for both
  for (let i = 0; i < rounds; i++) {
    log(`start cost (miniflare + D1): round ${i + 1}/${rounds}`);
    for (const name of i % 2 ? ["bare", "package"] : ["package", "bare"]) samples[name].push(await coldStartOnce(START_WORKERS[name]));
  }
  const col = (name, k) => samples[name].map((s) => s[k]);
  const result = { rounds, samples };
  for (const name of ["bare", "package"]) {
    result[name] = { ready: median(col(name, "ready")), first: median(col(name, "first")), warm: median(col(name, "warm")) };
  }
  result.delta = {
    ready: pairedMedian(col("package", "ready"), col("bare", "ready")),
    nodeCpu: pairedMedian(col("package", "nodeCpu"), col("bare", "nodeCpu")),
    first: pairedMedian(col("package", "first"), col("bare", "first")),
    warm: pairedMedian(col("package", "warm"), col("bare", "warm")),
  };
  result.firstInstantiate = median(samples.package.map((s) => s.probe.instantiateMs));
  result.firstSession = median(samples.package.map((s) => s.probe.sessionMs));
  report.startMiniflare = result;
}

const WORKERD = join(PACKAGE_ROOT, "node_modules/workerd/bin/workerd");
const WORKERD_DIR = join(PACKAGE_ROOT, ".tmp/bench-workerd");

/** A workerd config (Cap'n Proto text) serving `script` and its modules on a loopback port. */
function workerdConfig(name, script) {
  const entries = [];
  for (const m of workerModules(join(PACKAGE_ROOT, script))) {
    const rel = relative(PACKAGE_ROOT, m.path);
    const file = join(WORKERD_DIR, name, rel);
    mkdirSync(dirname(file), { recursive: true });
    writeFileSync(file, m.contents);
    entries.push(`(name = "${rel}", ${m.type === "CompiledWasm" ? "wasm" : "esModule"} = embed "${name}/${rel}")`);
  }
  const path = join(WORKERD_DIR, `${name}.capnp`);
  writeFileSync(
    path,
    `using Workerd = import "/workerd/workerd.capnp";
const config :Workerd.Config = (
  services = [ (name = "main", worker = .worker) ],
  sockets = [ (name = "http", address = "127.0.0.1:0", http = (), service = "main") ],
);
const worker :Workerd.Worker = (
  modules = [
    ${entries.join(",\n    ")}
  ],
  compatibilityDate = "2025-09-01",
);
`,
  );
  return path;
}

// workerd's CPU time (every thread, user + system, µs resolution) is read by a
// small Python parent (getrusage of its waited-for child), which a shared machine
// inflates far less than wall time. Without python3 only wall times are given.
const RUSAGE = `
import os, resource, signal, subprocess, sys
p = subprocess.Popen(sys.argv[1:], pass_fds=(3,), stdout=subprocess.DEVNULL)
signal.signal(signal.SIGTERM, lambda *_: p.kill())
print("started", flush=True)
p.wait()
r = resource.getrusage(resource.RUSAGE_CHILDREN)
print("cpu %.6f" % (r.ru_utime + r.ru_stime), flush=True)
`;
const PYTHON = ["python3", "/usr/bin/python3"].find((p) => {
  try {
    return execFileSync(p, ["-c", "import resource"], { stdio: "ignore" }) !== undefined;
  } catch {
    return false;
  }
});

/** One cold start of workerd alone: spawn -> listening -> first request -> second request; workerd's CPU time for all of it. */
async function workerdOnce(config) {
  const argv = [WORKERD, "serve", config, "--control-fd=3"];
  const child = PYTHON
    ? spawn(PYTHON, ["-c", RUSAGE, ...argv], { stdio: ["ignore", "pipe", "inherit", "pipe"] })
    : spawn(argv[0], argv.slice(1), { stdio: ["ignore", "pipe", "inherit", "pipe"] });
  let out = "";
  child.stdout.on("data", (d) => (out += d));
  const exited = new Promise((resolve) => child.on("exit", resolve));
  // the clock starts once workerd was spawned (not counting Python's own start)
  let t0 = performance.now();
  if (PYTHON) {
    await new Promise((resolve, reject) => {
      const check = () => (out.includes("started") ? resolve() : null);
      child.stdout.on("data", check);
      child.on("exit", () => reject(new Error("the rusage wrapper exited early")));
    });
    t0 = performance.now();
  }
  try {
    const port = await new Promise((resolve, reject) => {
      let control = "";
      child.stdio[3].on("data", (d) => {
        control += d;
        const m = /"port":(\d+)/.exec(control);
        if (m) resolve(Number(m[1]));
      });
      child.on("exit", (code) => reject(new Error(`workerd exited (${code}) before listening`)));
    });
    const ready = performance.now() - t0;
    const call = async () => {
      const t = performance.now();
      const r = await fetch(`http://127.0.0.1:${port}/orders`, {
        method: "POST",
        headers: { "idempotency-key": uniqueKey("wd"), "content-type": "application/json" },
        body: '{"sku":"B","qty":1}',
      });
      await r.arrayBuffer();
      if (r.status !== 201) throw new Error(`workerd answered ${r.status}`);
      return performance.now() - t;
    };
    const first = await call();
    const second = await call();
    child.kill(PYTHON ? "SIGTERM" : "SIGKILL");
    await exited;
    const cpu = /cpu ([\d.]+)/.exec(out);
    return { ready, first, second, cpu: cpu ? Number(cpu[1]) * 1000 : null };
  } finally {
    if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
    await exited;
  }
}

async function startCostWorkerd(rounds = count(30)) {
  rmSync(WORKERD_DIR, { recursive: true, force: true });
  const configs = { bare: workerdConfig("bare", "bench/nodb-bare-worker.js"), package: workerdConfig("package", "bench/nodb-worker.js") };
  const samples = { bare: [], package: [] };
  await workerdOnce(configs.package);
  log(`start cost (workerd alone): ${rounds} rounds`);
  for (let i = 0; i < rounds; i++) {
    for (const name of i % 2 ? ["bare", "package"] : ["package", "bare"]) samples[name].push(await workerdOnce(configs[name]));
  }
  const col = (name, k) => samples[name].map((s) => s[k]);
  const result = { rounds, samples };
  const cpu = PYTHON !== undefined;
  for (const name of ["bare", "package"]) {
    result[name] = { ready: median(col(name, "ready")), first: median(col(name, "first")), second: median(col(name, "second")), cpu: cpu ? median(col(name, "cpu")) : null };
  }
  result.delta = {
    ready: pairedMedian(col("package", "ready"), col("bare", "ready")),
    first: pairedMedian(col("package", "first"), col("bare", "first")),
    second: pairedMedian(col("package", "second"), col("bare", "second")),
    cpu: cpu ? pairedMedian(col("package", "cpu"), col("bare", "cpu")) : null,
  };
  report.startWorkerd = result;
}

/** What a Worker importing the package loads: the core modules and the JS modules. */
function packageWeight() {
  const mods = workerModules(join(PACKAGE_ROOT, "src/worker.js"));
  const row = (m) => {
    const bytes = Buffer.from(m.contents);
    return { file: relative(PACKAGE_ROOT, m.path), bytes: bytes.length, gzip: gzipSync(bytes, { level: 9 }).length };
  };
  const wasm = mods.filter((m) => m.type === "CompiledWasm").map(row);
  const js = mods.filter((m) => m.type === "ESModule").map(row);
  const sum = (rows, k) => rows.reduce((a, r) => a + r[k], 0);
  const binding = js.filter((r) => r.file.startsWith("generated/") || r.file === "src/component.js");
  report.weight = {
    wasm,
    js,
    binding,
    totals: {
      wasm: { bytes: sum(wasm, "bytes"), gzip: sum(wasm, "gzip") },
      js: { bytes: sum(js, "bytes"), gzip: sum(js, "gzip") },
      binding: { bytes: sum(binding, "bytes"), gzip: sum(binding, "gzip") },
    },
    componentWasm: readFileSync(join(PACKAGE_ROOT, "../../target/component/idempotency_ledger.wasm")).length,
  };
}

// ---------------------------------------------------------------------------
// 2. Per-request cost on D1: the package's handler vs the recipe's plain-JS handler, interleaved.
const PATHS = [
  ["fresh", "fresh key (claim + mutation + completion)", 201],
  ["replay", "replay of a completed key", 201],
  ["reuse", "409: key reused with another body", 409],
  ["inProgress", "409: key in progress (fresh pending row)", 409],
];
const IMPLS = ["component", "recipe"];
const BODY = '{"sku":"B","qty":1}';
const OTHER_BODY = '{"sku":"B","qty":2}';

async function post(mf, path, key, body = BODY) {
  const t = performance.now();
  const r = await mf.dispatchFetch(`http://bench.test${path}`, {
    method: "POST",
    headers: { "idempotency-key": key, "content-type": "application/json" },
    body,
  });
  const text = await r.text();
  return { ms: performance.now() - t, status: r.status, text };
}

async function seed(mf, impl, key, ageMs) {
  const r = await mf.dispatchFetch(`http://bench.test/seed?path=/${impl}&key=${encodeURIComponent(key)}&age=${ageMs}`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: BODY,
  });
  await r.arrayBuffer();
  if (r.status !== 204) throw new Error(`seed answered ${r.status}`);
}

/** Runs one path for one handler (its setup already done); `prefix` "/count" for the counting route. */
async function runPath(mf, impl, pathName, keys, prefix = "") {
  const route = `${prefix}/${impl}`;
  switch (pathName) {
    case "fresh":
    case "replay":
      return post(mf, route, keys.done);
    case "reuse":
      return post(mf, route, keys.done, OTHER_BODY);
    case "inProgress":
      return post(mf, route, keys.pending);
    default:
      throw new Error(pathName);
  }
}

async function setupKeys(mf, impl) {
  const keys = { done: uniqueKey("d"), pending: uniqueKey("p") };
  await seed(mf, impl, keys.pending, 0);
  return keys;
}

async function perRequestD1(mf, n = count(200), warm = count(25)) {
  const samples = Object.fromEntries(IMPLS.map((impl) => [impl, Object.fromEntries(PATHS.map(([p]) => [p, []]))]));
  for (let i = 0; i < warm + n; i++) {
    if (i % 50 === 0) log(`D1 per request (client-measured): round ${i}/${warm + n}`);
    const ordering = i % 2 ? IMPLS : [...IMPLS].reverse();
    const keys = {};
    for (const impl of IMPLS) keys[impl] = await setupKeys(mf, impl);
    for (const [pathName, , expected] of PATHS) {
      for (const impl of ordering) {
        const r = await runPath(mf, impl, pathName, keys[impl]);
        if (r.status !== expected) throw new Error(`${impl} ${pathName} answered ${r.status}: ${r.text}`);
        if (i >= warm) samples[impl][pathName].push(r.ms);
      }
    }
  }
  const result = {};
  for (const [p] of PATHS) {
    result[p] = {};
    for (const impl of IMPLS) {
      const xs = samples[impl][p];
      result[p][impl] = { median: median(xs), p99: pct(xs, 99), n: xs.length };
    }
  }
  report.perRequestD1 = { requestsPerPathAndHandler: n, warmup: warm, result };
}

// The same comparison inside the isolate (no Node -> workerd hop): mean of chunks of n handler calls, median over rounds.
async function perRequestInIsolate(mf, rounds = count(8), warm = count(1), n = count(20)) {
  const means = Object.fromEntries(IMPLS.map((impl) => [impl, Object.fromEntries(PATHS.map(([p]) => [p, []]))]));
  for (let i = 0; i < warm + rounds; i++) {
    log(`D1 per request (in the isolate): round ${i + 1}/${warm + rounds}`);
    const ordering = i % 2 ? IMPLS : [...IMPLS].reverse();
    for (const [pathName] of PATHS) {
      for (const impl of ordering) {
        const r = await mf.dispatchFetch(`http://bench.test/iso?impl=${impl}&path=${pathName}&n=${n}`);
        if (r.status !== 200) throw new Error(`in-isolate ${impl} ${pathName}: ${r.status} ${await r.text()}`);
        const { meanMs } = await r.json();
        if (i >= warm) means[impl][pathName].push(meanMs);
      }
    }
  }
  const result = {};
  for (const [p] of PATHS) result[p] = Object.fromEntries(IMPLS.map((impl) => [impl, { medianOfMeans: median(means[impl][p]), means: means[impl][p] }]));
  report.perRequestInIsolate = { rounds, warmup: warm, callsPerRound: n, result };
}

// D1 round trips per path for both handlers, counted by a wrapper around the real binding (not timed).
async function countRoundTrips(mf) {
  const result = {};
  for (const impl of IMPLS) {
    const keys = await setupKeys(mf, impl);
    for (const [pathName, , expected] of PATHS) {
      const r = await runPath(mf, impl, pathName, keys, "/count");
      const c = JSON.parse(r.text);
      if (c.status !== expected) throw new Error(`${impl} ${pathName} (counted) answered ${c.status}`);
      const ledger = c.log.filter((k) => k !== "mutation");
      const onPath = c.log.slice(0, c.onRequestPath).filter((k) => k !== "mutation" && !k.includes("sweep")).length;
      (result[pathName] ??= {})[impl] = { onRequestPath: onPath, inWaitUntil: ledger.length - onPath, calls: c.log };
    }
  }
  report.roundTripsCompared = result;
}

// The package's own paths through the test harness (incl. 400 / pass-through / fail closed), batches counted.
async function harnessRoundTrips() {
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
    await record("400 missing key", await send(mf, { body: order(sku) }));
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
  report.harnessRoundTrips = paths;
}

// ---------------------------------------------------------------------------
// 3. Node: the Hono and Express middleware vs the same app without it, over loopback HTTP.
const FRAMEWORKS = ["hono", "express"];

/** `tag`: which measure the server files the request under (x-bench-path: fresh, replay or warm). */
function httpPost(agent, port, key, body, tag) {
  return new Promise((resolve, reject) => {
    const t = performance.now();
    const req = httpRequest(
      {
        agent,
        host: "127.0.0.1",
        port,
        path: "/orders",
        method: "POST",
        headers: { "content-type": "application/json", "idempotency-key": key, "content-length": Buffer.byteLength(body), "x-bench-path": tag },
      },
      (res) => {
        const chunks = [];
        res.on("data", (c) => chunks.push(c));
        res.on("end", () => resolve({ ms: performance.now() - t, status: res.statusCode, text: Buffer.concat(chunks).toString() }));
        res.on("error", reject);
      },
    );
    req.on("error", reject);
    req.end(body);
  });
}

async function nodeOverhead(n = count(1500), warm = count(300)) {
  const child = spawn(process.execPath, [join(PACKAGE_ROOT, "bench/node-apps.js")], { stdio: ["pipe", "pipe", "inherit"] });
  // The child prints one JSON line when listening and one more (what its servers measured) when its stdin closes.
  let out = "";
  const lines = [];
  let onLine = null;
  child.stdout.on("data", (d) => {
    out += d;
    let nl;
    while ((nl = out.indexOf("\n")) !== -1) {
      const line = out.slice(0, nl);
      out = out.slice(nl + 1);
      if (line.startsWith("{")) lines.push(JSON.parse(line));
      onLine?.();
    }
  });
  const nextLine = (what) =>
    new Promise((resolve, reject) => {
      const check = () => {
        if (lines.length > 0) resolve(lines.shift());
        else if (child.exitCode !== null) reject(new Error(`bench/node-apps.js exited (${child.exitCode}) before ${what}`));
      };
      onLine = check;
      child.on("exit", check);
      check();
    });
  const { ports } = await nextLine("listening");
  const agents = Object.fromEntries(Object.keys(ports).map((name) => [name, new Agent({ keepAlive: true, maxSockets: 1 })]));
  const samples = {};
  for (const fw of FRAMEWORKS) for (const v of ["bare", "ledger"]) samples[`${fw} ${v}`] = { fresh: [], replay: [] };
  try {
    for (let i = 0; i < warm + n; i++) {
      if (i % 300 === 0) log(`Node middleware overhead: round ${i}/${warm + n}`);
      for (const fw of FRAMEWORKS) {
        for (const v of i % 2 ? ["bare", "ledger"] : ["ledger", "bare"]) {
          const name = `${fw} ${v}`;
          const key = uniqueKey("n");
          const body = `{"sku":"B${i}","qty":1}`;
          const fresh = await httpPost(agents[name], ports[name], key, body, i >= warm ? "fresh" : "warm");
          const replay = await httpPost(agents[name], ports[name], key, body, i >= warm ? "replay" : "warm");
          if (fresh.status !== 201 || replay.status !== 201) throw new Error(`${name} answered ${fresh.status}/${replay.status}: ${fresh.text} ${replay.text}`);
          if (v === "ledger" && replay.text !== fresh.text) throw new Error(`${name}: the replay differs from the first answer`);
          if (i >= warm) {
            samples[name].fresh.push(fresh.ms);
            samples[name].replay.push(replay.ms);
          }
        }
      }
    }
  } finally {
    for (const a of Object.values(agents)) a.destroy();
    child.stdin.end();
  }
  const { measured } = await nextLine("what its servers measured");
  await new Promise((resolve) => (child.exitCode !== null ? resolve() : child.on("exit", resolve)));
  const result = {};
  for (const fw of FRAMEWORKS) {
    result[fw] = {};
    for (const path of ["fresh", "replay"]) {
      const bare = samples[`${fw} bare`][path];
      const ledger = samples[`${fw} ledger`][path];
      result[fw][path] = {
        bare: { median: median(bare), p99: pct(bare, 99) },
        ledger: { median: median(ledger), p99: pct(ledger, 99) },
        overhead: median(ledger) - median(bare),
        // In the server: CPU and wall time per request, and (with the middleware) the request's SQLite batches.
        server: {
          bareCpuUs: median(measured[`${fw} bare`][path].cpuUs),
          ledgerCpuUs: median(measured[`${fw} ledger`][path].cpuUs),
          bareWallUs: median(measured[`${fw} bare`][path].wallUs),
          ledgerWallUs: median(measured[`${fw} ledger`][path].wallUs),
          batchesUs: median(measured[`${fw} ledger`][path].batchUs),
        },
      };
    }
  }
  report.nodeOverhead = { requests: n, warmup: warm, result };
}

/**
 * Where the middleware's own time goes on Node, in-process (no HTTP): the
 * steps of one exchange (IdempotencyLedger.exchange) performed one by one on
 * a better-sqlite3 file, each timed around itself; mean per call over n
 * requests. Then the whole exchange, fresh and replay, as the adapters run it.
 */
async function nodeBreakdown(n = count(3000), warm = count(500)) {
  const { ledgerFor, mutationOf, openLedgerDatabase } = await import("../src/node.js");
  const dir = mkdtempSync(join(tmpdir(), "idem-bench-steps-"));
  const db = await openLedgerDatabase(join(dir, "ledger.sqlite"));
  const OPTIONS = { sweep: false };
  const ledger = ledgerFor(db, OPTIONS);
  const session = ledger.session;
  const body = Buffer.from(BODY);
  const principal = "bench";
  // What @hono/node-server / node:http hand over for a typical request.
  const rawHeaders = (key) => ["host", "127.0.0.1:3000", "content-type", "application/json", "idempotency-key", key, "content-length", String(body.length), "connection", "keep-alive"];
  const head = (key) => {
    const raw = rawHeaders(key);
    const headers = [];
    for (let i = 0; i < raw.length; i += 2) headers.push({ name: raw[i], value: raw[i + 1] });
    return { method: "POST", pathAndQuery: "/orders", headers };
  };
  const result = { status: 201, body: '{"ok":true,"sku":"B"}', headers: { "content-type": "application/json" } };
  const steps = {};
  const time = async (name, fn) => {
    const t = performance.now();
    const value = await fn();
    (steps[name] ??= []).push(performance.now() - t);
    return value;
  };
  const expect = (action, tag, what) => {
    if (action.tag !== tag) throw new Error(`${what}: expected ${tag}, got ${action.tag}`);
    return action;
  };
  for (let i = 0; i < warm + n; i++) {
    if (i === warm) for (const k of Object.keys(steps)) steps[k] = [];
    const key = uniqueKey("s");
    const h = await time("request head (from raw headers)", () => head(key));
    const started = await time("session.start (admission; read-body)", () => session.start(h, principal, Date.now()));
    const exchange = started.exchange;
    try {
      const read = expect(started.action, "read-body", "start");
      const fp = await time("fingerprint (SHA-256 over prefix + body)", () => ledger.digest(read.val.prefix, body));
      const plan = expect(await time("step body-hashed (plans the decision batch)", () => exchange.step(Date.now(), { tag: "body-hashed", val: fp })), "run-batch", "body-hashed");
      const decided = await time("decision batch (better-sqlite3 transaction)", () => ledger.runBatch(plan.val));
      expect(await time("step batch-done (claim won: run-handler)", () => exchange.step(Date.now(), decided)), "run-handler", "decision");
      const completion = expect(
        await time("mutationOf + step handler-done (plans the completion)", async () => exchange.step(Date.now(), { tag: "handler-done", val: { tag: "answered", val: (await mutationOf(result)).wit } })),
        "run-batch",
        "handler-done",
      );
      const done = await time("completion batch (better-sqlite3 transaction)", () => ledger.runBatch(completion.val));
      expect(await time("step batch-done (respond)", () => exchange.step(Date.now(), done)), "respond", "completion");
    } finally {
      exchange?.drop();
    }
    // the replay of the same key, right after
    const again = session.start(head(key), principal, Date.now());
    try {
      const read = expect(again.action, "read-body", "replay start");
      const plan = expect(again.exchange.step(Date.now(), { tag: "body-hashed", val: ledger.digest(read.val.prefix, body) }), "run-batch", "replay body-hashed");
      const decided = await time("decision batch, replay (better-sqlite3 transaction)", () => ledger.runBatch(plan.val));
      const reply = expect(await time("step batch-done (replay: respond)", () => again.exchange.step(Date.now(), decided)), "respond", "replay decision");
      if (reply.val.outcome !== "replayed") throw new Error(`expected a replay, got ${reply.val.outcome}`);
    } finally {
      again.exchange?.drop();
    }
  }
  const mean = (xs) => xs.reduce((a, x) => a + x, 0) / xs.length;
  const out = {};
  for (const [name, xs] of Object.entries(steps)) out[name] = { meanUs: mean(xs) * 1000 };
  // The whole exchange (what the adapters call), in-process.
  const io = {
    readBody: () => body,
    runHandler: async () => ({ tag: "answered", val: (await mutationOf(result)).wit }),
  };
  // Back to back, and (interleaved) each exchange after the process sat idle
  // for a millisecond, as a server does between requests.
  const whole = { fresh: [], replay: [] };
  const idle = { fresh: [], replay: [] };
  const rest = () => new Promise((resolve) => setTimeout(resolve, 1));
  for (let i = 0; i < n; i++) {
    for (const side of i % 2 === 0 ? [whole, idle] : [idle, whole]) {
      const key = uniqueKey("w");
      if (side === idle) await rest();
      let t = performance.now();
      const fresh = await ledger.exchange(head(key), principal, io);
      side.fresh.push(performance.now() - t);
      if (fresh.outcome !== "executed") throw new Error(`expected executed, got ${fresh.outcome}`);
      if (side === idle) await rest();
      t = performance.now();
      const again = await ledger.exchange(head(key), principal, io);
      side.replay.push(performance.now() - t);
      if (again.outcome !== "replayed") throw new Error(`expected a replay, got ${again.outcome}`);
    }
  }
  // The same fresh exchange on a file opened with better-sqlite3's defaults
  // (journal_mode=delete: each commit writes, syncs and deletes a journal),
  // interleaved with the WAL file above: what a Database the app opened
  // itself without WAL costs (README: openLedgerDatabase).
  const { default: Database } = await import("better-sqlite3");
  const plain = new Database(join(dir, "rollback-journal.sqlite"));
  plain.pragma("busy_timeout = 5000");
  const journaled = ledgerFor(plain, { ...OPTIONS, logger: { warn: () => {} } });
  await journaled.migrate();
  const journal = { mode: String(plain.pragma("journal_mode", { simple: true })), rollback: [], wal: [] };
  for (let i = 0; i < Math.max(50, Math.floor(n / 10)); i++) {
    for (const [side, l] of i % 2 === 0 ? [["rollback", journaled], ["wal", ledger]] : [["wal", ledger], ["rollback", journaled]]) {
      const t = performance.now();
      const fresh = await l.exchange(head(uniqueKey("j")), principal, io);
      journal[side].push(performance.now() - t);
      if (fresh.outcome !== "executed") throw new Error(`expected executed, got ${fresh.outcome}`);
    }
  }
  plain.close();
  db.close();
  rmSync(dir, { recursive: true, force: true });
  report.nodeBreakdown = {
    requests: n,
    steps: out,
    whole: { freshMedianUs: median(whole.fresh) * 1000, replayMedianUs: median(whole.replay) * 1000 },
    afterIdle: { freshMedianUs: median(idle.fresh) * 1000, replayMedianUs: median(idle.replay) * 1000 },
    journal: { mode: journal.mode, requests: journal.wal.length, rollbackFreshMedianUs: median(journal.rollback) * 1000, walFreshMedianUs: median(journal.wal) * 1000 },
  };
}

/**
 * What OpenTelemetry costs per exchange, in-process on better-sqlite3 (a
 * fresh key, then its replay): telemetry off for the options object
 * (`telemetry: false`), on with @opentelemetry/api but no provider
 * registered, and on with the SDK's meter and tracer providers (in-memory
 * exporters, an AsyncLocalStorage context manager). Variants interleaved,
 * order alternating each round; per round the mean of m pairs after one
 * untimed pair; median over the rounds.
 */
async function telemetryCost(rounds = count(30), m = count(100)) {
  const api = await import("@opentelemetry/api");
  const { AsyncLocalStorageContextManager } = await import("@opentelemetry/context-async-hooks");
  const { InMemoryMetricExporter, AggregationTemporality, MeterProvider, PeriodicExportingMetricReader } = await import("@opentelemetry/sdk-metrics");
  const { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } = await import("@opentelemetry/sdk-trace-base");
  const { ledgerFor, mutationOf, openLedgerDatabase } = await import("../src/node.js");
  const dir = mkdtempSync(join(tmpdir(), "idem-bench-otel-"));
  const db = await openLedgerDatabase(join(dir, "ledger.sqlite"));
  const off = ledgerFor(db, { sweep: false, telemetry: false });
  const on = ledgerFor(db, { sweep: false });
  const body = Buffer.from(BODY);
  const head = (key) => ({ method: "POST", pathAndQuery: "/orders", headers: [{ name: "content-type", value: "application/json" }, { name: "idempotency-key", value: key }] });
  const result = { status: 201, body: '{"ok":true}', headers: { "content-type": "application/json" } };
  const io = { readBody: () => body, runHandler: async () => ({ tag: "answered", val: (await mutationOf(result)).wit }) };
  const spans = new InMemorySpanExporter();
  const metrics = new InMemoryMetricExporter(AggregationTemporality.DELTA);
  const reader = new PeriodicExportingMetricReader({ exporter: metrics, exportIntervalMillis: 3_600_000 });
  const meterProvider = new MeterProvider({ readers: [reader] });
  const tracerProvider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(spans)] });
  const contextManager = new AsyncLocalStorageContextManager().enable();
  const setSdk = (installed) => {
    api.metrics.disable();
    api.trace.disable();
    api.context.disable();
    if (installed) {
      api.context.setGlobalContextManager(contextManager);
      api.metrics.setGlobalMeterProvider(meterProvider);
      api.trace.setGlobalTracerProvider(tracerProvider);
    }
  };
  const VARIANTS = { off: [off, false], "no provider": [on, false], SDK: [on, true] };
  const pair = async (ledger) => {
    const key = uniqueKey("o");
    const a = await ledger.exchange(head(key), "bench", io);
    const b = await ledger.exchange(head(key), "bench", io);
    if (a.outcome !== "executed" || b.outcome !== "replayed") throw new Error(`telemetry bench: ${a.outcome}, ${b.outcome}`);
  };
  const means = Object.fromEntries(Object.keys(VARIANTS).map((v) => [v, []]));
  try {
    for (let i = 0; i < rounds; i++) {
      const names = Object.keys(VARIANTS);
      for (const name of i % 2 ? names : [...names].reverse()) {
        const [ledger, sdk] = VARIANTS[name];
        setSdk(sdk);
        await pair(ledger);
        const t = performance.now();
        for (let j = 0; j < m; j++) await pair(ledger);
        means[name].push((performance.now() - t) / m);
      }
      spans.reset();
      await reader.forceFlush();
      metrics.reset();
    }
  } finally {
    setSdk(false);
    await meterProvider.shutdown();
    await tracerProvider.shutdown();
    db.close();
    rmSync(dir, { recursive: true, force: true });
  }
  const out = {};
  for (const name of Object.keys(VARIANTS)) out[name] = { medianPairUs: median(means[name]) * 1000 };
  report.telemetry = { rounds, pairsPerRound: m, result: out, sdk: versionOf("@opentelemetry/sdk-metrics"), api: versionOf("@opentelemetry/api") };
}

// ---------------------------------------------------------------------------
// 4. PostgreSQL: the pg ledger vs a bare `INSERT ... ON CONFLICT` of the same row, same pool, interleaved.
async function pgCompare(n = count(1500), warm = count(200)) {
  const { freshSchema } = await import("../test/helpers/pg.js");
  const { ledgerFor, migrate } = await import("../src/node.js");
  const { pgLedger } = await import("../src/pg.js");
  const { default: pg } = await import("pg");
  const handle = await freshSchema({ max: 2 });
  const { pool } = handle;
  let preparedPool;
  try {
    await migrate(pool);
    const OPTIONS = { sweep: false };
    const ledgers = { ledger: ledgerFor(pool, OPTIONS) };
    // The same ledger with the protocol's statements prepared by name, on a pool of its own (same server, same schema).
    preparedPool = new pg.Pool({ connectionString: handle.url, max: 2 });
    ledgers.prepared = ledgerFor(pgLedger(preparedPool, { preparedStatements: true }), OPTIONS);
    const body = Buffer.from(BODY);
    const head = (key) => ({
      method: "POST",
      pathAndQuery: "/orders",
      headers: [
        { name: "content-type", value: "application/json" },
        { name: "idempotency-key", value: key },
      ],
    });
    const result = { status: 201, body: '{"ok":true}', headers: { "content-type": "application/json" } };
    const { mutationOf } = await import("../src/node.js");
    const io = {
      readBody: () => body,
      runHandler: async () => ({ tag: "answered", val: (await mutationOf(result)).wit }),
    };
    const CLAIM =
      "INSERT INTO idempotency_keys (principal, key, fingerprint, status, generation, created_at, updated_at) VALUES ($1, $2, $3, 'pending', 1, $4, $5) ON CONFLICT (principal, key) DO NOTHING";
    const bare = async (key) => {
      const t = performance.now();
      const now = Date.now();
      const fp = createHash("sha256").update(`POST\n/orders\n${key}\n`).update(body).digest("hex");
      await pool.query(CLAIM, ["bare", key, fp, now, now]);
      return performance.now() - t;
    };
    const samples = { ledger: { fresh: [], replay: [] }, prepared: { fresh: [], replay: [] }, bare: { fresh: [], replay: [] } };
    const sides = ["bare", "ledger", "prepared"];
    for (let i = 0; i < warm + n; i++) {
      if (i % 300 === 0) log(`PostgreSQL: round ${i}/${warm + n}`);
      // Each side first, second and third in turn.
      for (const side of sides.map((_, k) => sides[(i + k) % sides.length])) {
        const key = uniqueKey("pg");
        let fresh;
        let replay;
        if (side !== "bare") {
          const ledger = ledgers[side];
          let t = performance.now();
          const first = await ledger.exchange(head(key), "bench", io);
          if (first.outcome !== "executed") throw new Error(`pg ledger: expected executed, got ${first.outcome}`);
          fresh = performance.now() - t;
          t = performance.now();
          const again = await ledger.exchange(head(key), "bench", io);
          if (again.outcome !== "replayed") throw new Error(`pg ledger: expected a replay, got ${again.outcome}`);
          replay = performance.now() - t;
        } else {
          fresh = await bare(key);
          replay = await bare(key);
        }
        if (i >= warm) {
          samples[side].fresh.push(fresh);
          samples[side].replay.push(replay);
        }
      }
    }
    const server = (await pool.query("SHOW server_version")).rows[0].server_version;
    const out = {};
    for (const path of ["fresh", "replay"]) {
      out[path] = Object.fromEntries(sides.map((side) => [side, { median: median(samples[side][path]), p99: pct(samples[side][path], 99) }]));
    }
    report.pg = { requests: n, warmup: warm, server, pgVersion: versionOf("pg"), result: out };
  } finally {
    await preparedPool?.end();
    await handle.dispose();
  }
}

// ---------------------------------------------------------------------------
packageWeight();
await startCostWorkerd();
await startCostMiniflare();
log("D1 compare worker: round trips, per-request cost (client-measured, in the isolate)");
{
  const { mf } = await startWorker({ scriptPath: join(PACKAGE_ROOT, "bench/compare-worker.js") });
  try {
    await countRoundTrips(mf);
    await perRequestD1(mf);
    await perRequestInIsolate(mf);
  } finally {
    await mf.dispose();
  }
}
log("harness round trips");
await harnessRoundTrips();
log("Node middleware overhead");
await nodeOverhead();
log("Node: where the time goes");
await nodeBreakdown();
log("Node: what OpenTelemetry costs");
await telemetryCost();
if (PG_URL) {
  log("PostgreSQL");
  await pgCompare();
} else log("PostgreSQL skipped: IDEMPOTENCY_PG_URL is not set");
report.seconds = (performance.now() - started) / 1000;
report.load = { start: loadAtStart, end: loadavg()[0] };
report.versions = {
  node: process.version,
  workerd: versionOf("workerd"),
  miniflare: versionOf("miniflare"),
  jco: versionOf("@bytecodealliance/jco"),
  hono: versionOf("hono"),
  honoNodeServer: versionOf("@hono/node-server"),
  express: versionOf("express"),
  betterSqlite3: versionOf("better-sqlite3"),
  opentelemetryApi: versionOf("@opentelemetry/api"),
  sqlite: new Database(":memory:").prepare("select sqlite_version() as v").get().v,
};
mkdirSync(join(PACKAGE_ROOT, ".tmp"), { recursive: true });
writeFileSync(join(PACKAGE_ROOT, ".tmp/bench.json"), `${JSON.stringify(report, null, 2)}\n`);
log("written: .tmp/bench.json");

// ---------------------------------------------------------------------------
// The Markdown section.
const v = report.versions;
md.push("## JavaScript host (workerd + D1 via miniflare; Node with Hono, Express, better-sqlite3, pg)", "");
md.push(
  `Command: \`make -s -C bindings/js bench\` (runs \`node bench/bench.js\`; part of the top-level \`make bench\`, inside \`scripts/postgres.sh run\`), ${report.seconds.toFixed(0)} s. ` +
    `Node ${v.node}, workerd ${v.workerd} (miniflare ${v.miniflare}, \`cf: false\`, offline, local D1), jco ${v.jco}, Hono ${v.hono} (@hono/node-server ${v.honoNodeServer}), Express ${v.express}, better-sqlite3 ${v.betterSqlite3} (SQLite ${v.sqlite})` +
    `${report.pg ? `, pg ${report.pg.pgVersion} (PostgreSQL ${report.pg.server})` : ""}; ${cpus().length} cores. ` +
    `Load average (1 min) ${report.load.start.toFixed(2)} at the start, ${report.load.end.toFixed(2)} at the end: other processes on the machine inflate wall times, and differences between runs more than differences within one. ` +
    "Both sides of every comparison are measured in the same run, interleaved (order alternating each round); figures are medians unless named. " +
    "Raw figures: `bindings/js/.tmp/bench.json`.",
  "",
);

// 1. Start cost
{
  const m = report.startMiniflare;
  const w = report.startWorkerd;
  const wt = report.weight;
  const prev = report.previous;
  md.push("### Start cost in workerd: a Worker with the package vs the same Worker without it", "");
  md.push(
    `*miniflare + D1*: ${m.rounds} rounds, each a fresh workerd process (through miniflare, with the D1 migration) per Worker: \`bench/bare-worker.js\` (read the body, one D1 insert, 201) ` +
      "and `bench/worker.js` (the same insert behind `handleIdempotentMutation`, default settings). *start → ready*: `new Miniflare()` until ready and migrated; " +
      "it includes miniflare serializing every module into workerd's configuration in Node (Cap'n Proto in JS, proportional to the bytes; on Cloudflare that is the upload, not the start). " +
      "*first request*: the first `dispatchFetch` (Node → workerd loopback included); *warm*: median of the next 10. Δ = median of the per-round differences package − bare.",
    "",
  );
  table(
    ["Worker", "start → ready", "first request", "warm request"],
    [
      ["without the package", ms(m.bare.ready), ms(m.bare.first), ms(m.bare.warm)],
      ["with the package", ms(m.package.ready), ms(m.package.first), ms(m.package.warm)],
      ["**Δ package − bare**", `**${signed(m.delta.ready)}**`, `**${signed(m.delta.first)}**`, signed(m.delta.warm)],
    ],
  );
  md.push(
    `Extra start time of the package (package − bare): start → ready ${signed(m.delta.ready)}, first request ${signed(m.delta.first)} ` +
      `(${f2(m.delta.ready + m.delta.first)} ms together).`,
    "",
    `- Over the same start, this Node process (miniflare: the larger modules serialized into workerd's configuration, the D1 migration) used ${signed(m.delta.nodeCpu)} more CPU time (median of the per-round differences; Node's CPU time for a start varies by ±25 ms, so this is a rough split).`,
    `- Of the first-request difference, ${f2(m.delta.warm)} ms is what every request costs more (the warm difference: the decision and completion batches); ` +
      `the one-time part is about ${f2(m.delta.first - m.delta.warm)} ms. Inside it (isolate clock, 1 ms resolution): instantiating the component ${f2(m.firstInstantiate)} ms, opening the core session ${f2(m.firstSession)} ms.`,
    prev
      ? `- Previous figure (bench/RESULTS.md of ${prev.date}): start → ready ${signed(prev.startToReady)}, first request ${signed(prev.firstRequest)} (${f2(prev.startToReady + prev.firstRequest)} ms together); ` +
          `this run: ${f2(m.delta.ready + m.delta.first)} ms (${ratio((m.delta.ready + m.delta.first) / (prev.startToReady + prev.firstRequest))} of it). Machine load differs between runs; the differences above are within one run.`
      : "- No previous figure in bench/RESULTS.md.",
    "",
  );
  md.push(
    `*workerd alone*: the same comparison without miniflare and without a database, ${w.rounds} rounds: the \`workerd\` binary started on a generated config (modules embedded from files), ` +
      "until it listens; then two requests over loopback HTTP. `bench/nodb-bare-worker.js` answers 201; `bench/nodb-worker.js` also does what the package does for a protected request " +
      "before its first database batch (instantiate the component and open the session on the first request; on each: start the exchange, hash the body, feed it and get the decision batch).",
    "",
  );
  const cpuCol = w.delta.cpu !== null;
  table(
    ["Worker", "start → listening", "first request", "second request", ...(cpuCol ? ["workerd CPU time, start + both requests"] : [])],
    [
      ["without the package", ms(w.bare.ready), ms(w.bare.first), ms(w.bare.second), ...(cpuCol ? [ms(w.bare.cpu)] : [])],
      ["with the package", ms(w.package.ready), ms(w.package.first), ms(w.package.second), ...(cpuCol ? [ms(w.package.cpu)] : [])],
      ["**Δ package − bare**", `**${signed(w.delta.ready)}**`, `**${signed(w.delta.first)}**`, signed(w.delta.second), ...(cpuCol ? [`**${signed(w.delta.cpu)}**`] : [])],
    ],
  );
  md.push(
    `Workerd alone: the package adds ${f2(w.delta.ready)} ms to the start and ${f2(w.delta.first)} ms to the first request (${f2(w.delta.ready + w.delta.first)} ms together)` +
      `${cpuCol ? `; workerd's CPU time (all threads, read with getrusage by a Python parent process; less sensitive than wall time to other processes on a shared machine) grows by ${f2(w.delta.cpu)} ms` : ""}.`,
    "",
  );
  md.push(`What a Worker importing the package loads (raw / gzip -9; the component given to jco: ${kib(wt.componentWasm)}):`, "");
  table(
    ["part", "modules", "raw", "gzip"],
    [
      ...wt.wasm.map((r) => [`core module \`${r.file}\``, "1", kib(r.bytes), kib(r.gzip)]),
      [`JS modules (${wt.binding.map((r) => `\`${r.file}\``).join(", ")} binds the component)`, String(wt.js.length), kib(wt.totals.js.bytes), kib(wt.totals.js.gzip)],
      ...wt.binding.map((r) => [`of which \`${r.file}\``, "1", kib(r.bytes), kib(r.gzip)]),
      ["**total**", String(wt.wasm.length + wt.js.length), `**${kib(wt.totals.wasm.bytes + wt.totals.js.bytes)}**`, `**${kib(wt.totals.wasm.gzip + wt.totals.js.gzip)}**`],
    ],
  );
}

// 2. D1 per request
{
  const pr = report.perRequestD1;
  const iso = report.perRequestInIsolate;
  md.push("### Per request on D1: the package vs the recipe's handler in plain JS", "");
  md.push(
    "*package*: `handleIdempotentMutation` (one `env.DB.batch()` per decision and per completion, Web Crypto over the core's fingerprint prefix, sweep in `ctx.waitUntil` on the core's rule). " +
      "*recipe*: the recipe's reference handler ported to plain JS (`bench/recipe.js`: claim, SELECT, takeover and completion as separate statements, sweep after every execution). " +
      `Same Worker (\`bench/compare-worker.js\`), same D1, same mutation (one order insert), the recipe's constants. ${pr.requestsPerPathAndHandler} requests per path and handler after ${pr.warmup} warm-up rounds; ` +
      "the pending rows of the in-progress path are seeded untimed. Client-measured `dispatchFetch` latency (Node → workerd loopback included). Ratio = package / recipe (< 1: the package is faster).",
    "",
  );
  table(
    ["path", "package", "package p99", "recipe", "recipe p99", "ratio", "ratio p99", "in the isolate: package / recipe"],
    PATHS.map(([p, label]) => {
      const c = pr.result[p].component;
      const r = pr.result[p].recipe;
      const ic = iso.result[p].component.medianOfMeans;
      const ir = iso.result[p].recipe.medianOfMeans;
      return [label, ms(c.median), ms(c.p99), ms(r.median), ms(r.p99), ratio(c.median / r.median), ratio(c.p99 / r.p99), `${f2(ic)} / ${f2(ir)} ms = ${ratio(ic / ir)}`];
    }),
  );
  md.push(
    `Last column: the same handlers called inside the Worker (no Node → workerd hop), each call timed around the handler alone, earlier waitUntil work settled first; ` +
      `mean of ${iso.callsPerRound} calls per round (the isolate clock has 1 ms resolution), median over ${iso.rounds} rounds after ${iso.warmup} warm-up round.`,
    "",
  );
  md.push("D1 round trips per path, counted by a wrapper around the real binding (one per `first`/`run`/`all`/`raw`, one per `batch()`; the mutation's insert not counted; *waitUntil* = the sweep):", "");
  const describeCalls = (calls) => calls.filter((k) => k !== "mutation").join(", ");
  table(
    ["path", "package (request path + waitUntil)", "recipe (request path + waitUntil)", "package calls", "recipe calls"],
    PATHS.map(([p, label]) => {
      const c = report.roundTripsCompared[p].component;
      const r = report.roundTripsCompared[p].recipe;
      return [label, `${c.onRequestPath} + ${c.inWaitUntil}`, `${r.onRequestPath} + ${r.inWaitUntil}`, describeCalls(c.calls), describeCalls(r.calls)];
    }),
  );
  md.push("The package's own paths through the test harness (`test/fixtures/harness.js`, batches named by their first statement; the sweep runs on one execution in 8):", "");
  table(
    ["path", "status", "batches on the request path", "in waitUntil", "batches"],
    Object.entries(report.harnessRoundTrips).map(([name, p]) => [name, p.status, p.batchesOnRequestPath, p.batchesInWaitUntil, p.batches.join(", ") || "none"]),
  );
}

// 3. Node
{
  const o = report.nodeOverhead;
  const TARGET = { fresh: 0.25, replay: 0.1 };
  // Issue 24's measure: the overhead over the SQLite batches the path needs
  // (the breakdown below, same run): fresh the decision and completion batches, a replay its decision batch.
  const steps = report.nodeBreakdown.steps;
  const batchesMs = {
    fresh: (steps["decision batch (better-sqlite3 transaction)"].meanUs + steps["completion batch (better-sqlite3 transaction)"].meanUs) / 1000,
    replay: steps["decision batch, replay (better-sqlite3 transaction)"].meanUs / 1000,
  };
  const RATIO_TARGET = 2.5;
  md.push("### Per request on Node: the Hono and Express middleware vs the same app without it", "");
  md.push(
    "One app (`bench/node-apps.js`: `POST /orders` parses the JSON body, inserts one order into SQLite, answers 201) on Hono (@hono/node-server) and on Express, " +
      "each without and with the package's middleware (default settings; the ledger in the app's own better-sqlite3 file, WAL, `synchronous=NORMAL`), all four in one child process; " +
      `the client (this process) sends over loopback HTTP with keep-alive, sequentially: a fresh key, then the same request again (with the middleware: a replay; without it: the app runs again). ` +
      `${o.requests} pairs per app after ${o.warmup} warm-up pairs, apps interleaved. Overhead = median with − median without. Targets: at most +${TARGET.fresh} ms fresh, +${TARGET.replay} ms replay; ` +
      `and at most ${RATIO_TARGET}x the SQLite batches the path needs, as the breakdown below times them in this run (fresh: the decision and the completion batch, ${ms(batchesMs.fresh)}; replay: the decision batch, ${ms(batchesMs.replay)}).`,
    "",
  );
  const rows = [];
  for (const fw of FRAMEWORKS) {
    for (const path of ["fresh", "replay"]) {
      const r = o.result[fw][path];
      const label = `${fw === "hono" ? "Hono" : "Express"}, ${path === "fresh" ? "fresh key" : "replay (same request again)"}`;
      rows.push([
        label,
        ms(r.bare.median),
        ms(r.bare.p99),
        ms(r.ledger.median),
        ms(r.ledger.p99),
        `**${signed(r.overhead, 3)}**`,
        r.overhead <= TARGET[path] ? `met (≤ +${TARGET[path]} ms)` : `**not met** (> +${TARGET[path]} ms)`,
        `**${(r.overhead / batchesMs[path]).toFixed(2)}x**`,
        r.overhead / batchesMs[path] <= RATIO_TARGET ? `met (≤ ${RATIO_TARGET}x)` : `**not met** (> ${RATIO_TARGET}x)`,
        report.previousNodeOverhead[label] ?? "-",
      ]);
    }
  }
  table(["app, request", "without", "without p99", "with the middleware", "with p99", "overhead", "target", "overhead / the path's SQLite batches", "target", "previous run: overhead, ratio"], rows);
  const b = report.nodeBreakdown;
  md.push(
    "What the overhead is made of, measured in the server during the same requests (`bench/node-apps.js`, medians per request): the CPU time the server process spent " +
      "from the request's arrival until its response finished (`process.cpuUsage`, user + system), the wall time between the two, and, with the middleware, the time of the " +
      "request's own SQLite batches (the package's better-sqlite3 ledger behind a LedgerDb that times each batch). *Rest*: the CPU the middleware adds beyond its batches " +
      "(its JavaScript, the component's calls, the held response; under Express the body is read twice, by the middleware and again by `express.json()` from the stream it put back). " +
      "A replay is compared with the app running again (without the middleware the same request inserts another order): its batches replace the app's work.",
    "",
  );
  const serverRows = [];
  for (const fw of FRAMEWORKS) {
    for (const path of ["fresh", "replay"]) {
      const v = o.result[fw][path].server;
      const cpuAdded = v.ledgerCpuUs - v.bareCpuUs;
      serverRows.push([
        `${fw === "hono" ? "Hono" : "Express"}, ${path === "fresh" ? "fresh key" : "replay"}`,
        us(v.bareCpuUs),
        us(v.ledgerCpuUs),
        signedUs(cpuAdded),
        signedUs(v.ledgerWallUs - v.bareWallUs),
        us(v.batchesUs),
        signedUs(cpuAdded - v.batchesUs),
        `${(cpuAdded / v.batchesUs).toFixed(2)}x`,
      ]);
    }
  }
  table(["app, request", "server CPU without", "with the middleware", "CPU added", "wall time added", "its SQLite batches, in the request", "rest", "CPU added / its batches"], serverRows);
  const inflated = (path) => (b.afterIdle[`${path}MedianUs`] / b.whole[`${path}MedianUs`]).toFixed(2);
  md.push(
    `The same exchange costs more when the process sat idle before it, as a server does between requests: in-process (no HTTP), the whole exchange after a 1 ms sleep ` +
      `takes ${us(b.afterIdle.freshMedianUs)} for a fresh key and ${us(b.afterIdle.replayMedianUs)} for a replay, against ${us(b.whole.freshMedianUs)} and ` +
      `${us(b.whole.replayMedianUs)} back to back (${inflated("fresh")}x and ${inflated("replay")}x; the two interleaved, ${b.requests} pairs each, medians). ` +
      "The SQLite batches above, timed inside the HTTP requests, can be compared with the same batches timed in the loop below.",
    "",
  );
  md.push(
    `Where the middleware's time goes (in-process, no HTTP, better-sqlite3 file): the steps of one exchange (\`IdempotencyLedger.exchange\`) performed one by one, mean per call over ${b.requests} requests. ` +
      `The whole exchange of a fresh key: ${us(b.whole.freshMedianUs)}; of a replay: ${us(b.whole.replayMedianUs)} (medians). ` +
      `On a file opened with better-sqlite3's defaults (\`journal_mode=${b.journal.mode}\`, where each commit writes, syncs and deletes a journal file; ` +
      `what a Database opened without \`openLedgerDatabase\` or WAL costs), the whole exchange of a fresh key takes ${us(b.journal.rollbackFreshMedianUs)} ` +
      `against ${us(b.journal.walFreshMedianUs)} on the WAL file, interleaved (${b.journal.requests} keys each; medians).`,
    "",
  );
  table(
    ["step", "per call"],
    Object.entries(b.steps).map(([name, s]) => [name, us(s.meanUs)]),
  );
}

// 3b. OpenTelemetry
{
  const t = report.telemetry;
  const base = t.result.off.medianPairUs;
  md.push("### What OpenTelemetry costs per request (Node, in-process)", "");
  md.push(
    `\`IdempotencyLedger.exchange\` on a better-sqlite3 file (WAL, \`synchronous=NORMAL\`), a fresh key then its replay (one pair), no HTTP: ` +
      `*off* (\`telemetry: false\`), *no provider* (@opentelemetry/api ${t.api} loaded, nothing registered), *SDK* (@opentelemetry/sdk-metrics and sdk-trace-base ${t.sdk}: ` +
      "meter and tracer providers with in-memory exporters, an AsyncLocalStorage context manager: the counter, the histogram and the span of each exchange recorded). " +
      `${t.rounds} rounds, variants interleaved; per round the mean of ${t.pairsPerRound} pairs; median over the rounds.`,
    "",
  );
  table(
    ["variant", "per pair (fresh + replay)", "over off"],
    Object.entries(t.result).map(([name, r]) => [name, us(r.medianPairUs), name === "off" ? "" : `${r.medianPairUs - base >= 0 ? "+" : "−"}${Math.abs(r.medianPairUs - base).toFixed(1)} µs`]),
  );
}

// 4. PostgreSQL
if (report.pg) {
  const p = report.pg;
  md.push("### PostgreSQL: the pg ledger vs a bare `INSERT ... ON CONFLICT` of the same row", "");
  md.push(
    `In-process on Node, one \`pg.Pool\` (max 2) on the throwaway server of \`scripts/postgres.sh\` (loopback), a fresh schema. *ledger*: \`IdempotencyLedger.exchange\` for a fresh key ` +
      "(the decision batch and the completion batch, each one transaction in one round trip), then the same request again (a replay: the decision batch). " +
      "*bare*: `pool.query` of the ledger's own claim statement (`INSERT INTO idempotency_keys ... ON CONFLICT (principal, key) DO NOTHING`, autocommit, SHA-256 in Node), " +
      `for a fresh key and again for the same key. *prepared*: the same ledger on a pool of its own with \`pgLedger(pool, { preparedStatements: true })\` ` +
      "(the protocol's statements prepared by name once per connection; each statement is otherwise parsed and planned by the server in every batch). " +
      `${p.requests} keys per side after ${p.warmup} warm-up, the three sides interleaved.`,
    "",
  );
  table(
    ["path", "pg ledger", "ledger p99", "bare INSERT", "bare p99", "ledger / bare", "pg ledger, prepared", "prepared p99", "prepared / bare", "prepared / ledger"],
    ["fresh", "replay"].map((path) => {
      const r = p.result[path];
      return [
        path === "fresh" ? "fresh key" : "replay",
        ms(r.ledger.median),
        ms(r.ledger.p99),
        ms(r.bare.median),
        ms(r.bare.p99),
        ratio(r.ledger.median / r.bare.median),
        ms(r.prepared.median),
        ms(r.prepared.p99),
        ratio(r.prepared.median / r.bare.median),
        ratio(r.prepared.median / r.ledger.median),
      ];
    }),
  );
} else {
  md.push("### PostgreSQL", "", "Not measured: IDEMPOTENCY_PG_URL was not set (`scripts/bench.sh` runs this bench inside `scripts/postgres.sh run --`).", "");
}

writeMarkdown(`${md.join("\n").trimEnd()}\n`);
