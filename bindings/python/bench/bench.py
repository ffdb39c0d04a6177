"""Measures the Python host (issue 6) and prints ONE Markdown section on
stdout (appended to bench/RESULTS.md by the top-level `make bench`); progress
goes to stderr.

1. Per-request cost of `Ledger.handle` (the component under wasmtime-py)
   against the same protocol in plain Python (bench/plain.py: hashlib +
   sqlite3, the core's SQL and batches), per path: fresh key, replay, reuse
   (409), in progress (409), takeover of a stale pending row. Both sides are
   first checked to answer each path with the same status, headers and body
   (and to store the same rows), then timed in interleaved blocks.
2. Fingerprint throughput: hashlib over the core's prefix + body (what the
   package does) against the component's in-wasm `fingerprint` (the body
   crosses as list<u8>).
3. Cold start: compile, instantiate, a new Ledger; `handle()` against a bare
   sqlite3 insert (one transaction each).
4. Only when IDEMPOTENCY_PG_URL names a PostgreSQL server: `handle()` on a
   fresh key and on a replay, PostgreSQL (`Ledger.postgres`, in a throwaway
   schema) against SQLite in the same rounds, with a bare one-statement
   PostgreSQL insert for scale.

    make -C bindings/python bench        # or: .venv/bin/python bench/bench.py [--rounds R] [--per-round N]

Timings are medians (and p99) of per-request times over all timed blocks,
after a warm-up block; nothing here is a test assertion except the
equivalence check that runs before any timing.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
import uuid
from importlib import metadata, resources
from pathlib import Path
from typing import Any, Callable

import wasmtime
from wasmtime.component import Component

sys.path.insert(0, str(Path(__file__).resolve().parent))
import plain as plain_sql  # noqa: E402
from plain import PlainLedger  # noqa: E402

from idempotency_ledger import Ledger, MutationResponse, Runtime, connect  # noqa: E402
from idempotency_ledger._sqlite import SqliteBackend  # noqa: E402

PRINCIPAL = "acct-1"
PATH = "/orders"
HEADERS = [("Content-Type", "application/json"), ("X-Api-Version", "2")]
BODY = b'{"sku":"A-1","qty":2,"note":"' + b"x" * 200 + b'"}'
OTHER_BODY = b'{"sku":"A-1","qty":3,"note":"' + b"x" * 200 + b'"}'
PRODUCED = MutationResponse.json(201, '{"order":"o_1","status":"accepted"}', [("Location", "/orders/o_1"), ("X-Trace", "t-1")])
TTL_MS = 30_000  # the core's default pending_ttl_ms, used by both sides
PATHS = ("fresh", "replay", "reuse", "in progress", "takeover")
EXPECTED = {"fresh": 201, "replay": 201, "reuse": 409, "in progress": 409, "takeover": 201}


def log(msg: str) -> None:
    print(f"[bench python] {msg}", file=sys.stderr, flush=True)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def mutation() -> MutationResponse:
    return PRODUCED


def pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, max(0, int(round(q * (len(s) - 1)))))]


def fmt_us(us: float) -> str:
    return f"{us:,.0f}" if us >= 100 else f"{us:.1f}"


def fmt_ms(ms: float) -> str:
    return f"{ms:,.0f}" if ms >= 100 else f"{ms:.1f}" if ms >= 1 else f"{ms:.3f}"


class Side:
    """One implementation (component or plain) on its own ledger file, with
    a setup connection to stage rows for the 409 and takeover paths."""

    def __init__(self, name: str, handle: Callable[..., Any], db: Path) -> None:
        self.name = name
        self.handle = handle
        self.db = connect(db)  # setup only, never timed
        self.requests: list[tuple[list[tuple[str, str]], bytes]] = []

    def headers(self, key: str) -> list[tuple[str, str]]:
        return [*HEADERS, ("Idempotency-Key", key)]

    def stage_pending(self, keys: list[str], fingerprint: str, updated_at: int) -> None:
        self.db.execute("BEGIN IMMEDIATE")
        self.db.executemany(
            "INSERT OR REPLACE INTO idempotency_keys (principal, key, fingerprint, status, generation, created_at, updated_at) "
            "VALUES (?, ?, ?, 'pending', 1, ?, ?)",
            [(PRINCIPAL, k, fingerprint, updated_at, updated_at) for k in keys],
        )
        self.db.execute("COMMIT")

    def row(self, key: str) -> tuple[Any, ...]:
        return self.db.execute(
            "SELECT fingerprint, status, generation, response_status, response_body, response_headers "
            "FROM idempotency_keys WHERE principal = ? AND key = ?",
            (PRINCIPAL, key),
        ).fetchone()

    def prepare(self, path: str, tag: str, n: int, fingerprint: str) -> list[tuple[list[tuple[str, str]], bytes]]:
        """The n requests of one block (rows staged now, outside the timing)."""
        if path == "fresh":
            return [(self.headers(f"fresh-{tag}-{i}"), BODY) for i in range(n)]
        if path == "replay":
            return [(self.headers("done"), BODY)] * n
        if path == "reuse":
            return [(self.headers("done"), OTHER_BODY)] * n
        if path == "in progress":
            self.stage_pending(["pending"], fingerprint, now_ms())  # fresh for the next TTL_MS
            return [(self.headers("pending"), BODY)] * n
        keys = [f"stale-{tag}-{i}" for i in range(n)]
        self.stage_pending(keys, fingerprint, now_ms() - 2 * TTL_MS)
        return [(self.headers(k), BODY) for k in keys]

    def run(self, requests: list[tuple[list[tuple[str, str]], bytes]], expected: int) -> list[float]:
        handle, clock = self.handle, time.perf_counter_ns
        out: list[float] = []
        statuses: list[int] = []
        gc.collect()
        for headers, body in requests:
            t0 = clock()
            r = handle(PRINCIPAL, "POST", PATH, headers, body, mutation)
            out.append((clock() - t0) / 1e3)
            statuses.append(r.status)
        if any(s != expected for s in statuses):
            raise SystemExit(f"{self.name}: unexpected statuses {sorted(set(statuses))} (expected {expected})")
        return out


def check_equivalence(sides: list[Side], fingerprint: str) -> None:
    """Before timing: both sides answer every path identically and store the same rows."""
    answers: dict[str, list[Any]] = {p: [] for p in PATHS}
    for side in sides:
        for path in PATHS:
            (headers, body), = side.prepare(path, "check", 1, fingerprint)
            r = side.handle(PRINCIPAL, "POST", PATH, headers, body, mutation)
            answers[path].append((r.status, [tuple(h) for h in r.headers], bytes(r.body)))
        for key in ("done", "fresh-check-0", "stale-check-0", "pending"):
            answers.setdefault(f"row {key}", []).append(side.row(key))
    for what, (component, plain) in answers.items():
        assert component == plain, f"{what}: component {component!r} != plain {plain!r}"
    for path in PATHS:
        assert answers[path][0][0] == EXPECTED[path], (path, answers[path][0])
    assert answers["row stale-check-0"][0][2] == 2, "takeover did not bump the generation"


Stats = tuple[float, float, int]  # median, p99, samples


def per_request(
    ledger: Ledger, plain: PlainLedger, tmp: Path, rounds: int, per_round: int
) -> tuple[dict[tuple[str, str], Stats], dict[str, Stats]]:
    fingerprint = ledger.fingerprint("POST", PATH, HEADERS, BODY)
    sides = [Side("component", ledger.handle, tmp / "component.sqlite"), Side("plain", plain.handle, tmp / "plain.sqlite")]
    for side in sides:
        r = side.handle(PRINCIPAL, "POST", PATH, side.headers("done"), BODY, mutation)  # the completed row
        assert r.status == 201
    check_equivalence(sides, fingerprint)
    log("component and plain Python give the same status, headers, body and rows on every path")

    # Extra blocks for the 'handle() vs a bare insert' table (component only).
    bare_conn = connect(tmp / "bare.sqlite")
    bare_conn.execute("CREATE TABLE t (principal TEXT NOT NULL, key TEXT NOT NULL, fingerprint TEXT NOT NULL, created_at INTEGER, PRIMARY KEY (principal, key))")
    clock = time.perf_counter_ns

    def bare_block(tag: str, n: int) -> list[float]:
        out = []
        gc.collect()
        for i in range(n):
            t0 = clock()
            bare_conn.execute("BEGIN IMMEDIATE")
            bare_conn.execute("INSERT INTO t VALUES (?, ?, ?, ?)", (PRINCIPAL, f"{tag}-{i}", fingerprint, i))
            bare_conn.execute("COMMIT")
            out.append((clock() - t0) / 1e3)
        return out

    def component_block(fn: Callable[[], Any], n: int) -> list[float]:
        out = []
        gc.collect()
        for _ in range(n):
            t0 = clock()
            fn()
            out.append((clock() - t0) / 1e3)
        return out

    get = lambda: ledger.handle(PRINCIPAL, "GET", PATH, HEADERS, b"", mutation)  # noqa: E731
    admit = lambda: ledger.admit("POST", PATH, [*HEADERS, ("Idempotency-Key", "k")])  # noqa: E731
    # The reuse path (409) taken apart on the component side.
    other_fp = ledger.fingerprint("POST", PATH, HEADERS, OTHER_BODY)
    reuse_headers = [*HEADERS, ("Idempotency-Key", "done")]
    decide = lambda: ledger.decide(PRINCIPAL, "done", other_fp)  # noqa: E731
    assert decide().reason == "key-reused"
    prefix = ledger.fingerprint_prefix("POST", PATH, HEADERS).encode("utf-8")
    hash_only = lambda: hashlib.sha256(prefix + OTHER_BODY).hexdigest()  # noqa: E731
    assert hash_only() == other_fp
    now = now_ms()
    batch: list[tuple[str, tuple[Any, ...]]] = [
        (plain_sql.CLAIM, (PRINCIPAL, "done", other_fp, now, now)),
        (plain_sql.TAKEOVER, (now, PRINCIPAL, "done", other_fp, now - TTL_MS)),
        (plain_sql.LOOKUP, (PRINCIPAL, "done")),
    ]
    backend = SqliteBackend(path=tmp / "component.sqlite")
    package_batch = lambda: backend.execute_batch(batch)  # noqa: E731
    plain_batch = lambda: plain._batch(batch)  # noqa: E731
    assert package_batch()[2][0][0][0] == fingerprint and plain_batch()[2][0][0] == fingerprint

    samples: dict[tuple[str, str], list[float]] = {}
    parts = {"get": get, "admit": admit, "decide": decide, "hash": hash_only, "package_batch": package_batch, "plain_batch": plain_batch}
    extra: dict[str, list[float]] = {"bare": [], **{k: [] for k in parts}}
    for rnd in range(rounds + 1):  # round 0 is the warm-up
        n = max(50, per_round // 4) if rnd == 0 else per_round
        order = sides if rnd % 2 == 0 else sides[::-1]
        for path in PATHS:
            for side in order:
                requests = side.prepare(path, f"r{rnd}", n, fingerprint)
                times = side.run(requests, EXPECTED[path])
                if rnd:
                    samples.setdefault((side.name, path), []).extend(times)
        bare = bare_block(f"r{rnd}", n)
        if rnd:
            extra["bare"] += bare
        for name, fn in parts.items():
            times = component_block(fn, n)
            if rnd:
                extra[name] += times
        log(f"per-request round {rnd}/{rounds} done" + (" (warm-up)" if rnd == 0 else ""))
    bare_conn.close()
    backend.close()
    for side in sides:
        side.db.close()
    return {k: (statistics.median(v), pct(v, 0.99), len(v)) for k, v in samples.items()}, {
        k: (statistics.median(v), pct(v, 0.99), len(v)) for k, v in extra.items()
    }


def fingerprints(ledger: Ledger) -> list[tuple[int, dict[str, float], int, int]]:
    prefix = ledger.fingerprint_prefix("POST", PATH, HEADERS)
    rows = []
    for size, fast_n, wasm_n in ((1024, 400, 60), (16 * 1024, 400, 12), (1 << 20, 40, 3)):
        body = bytes(i * 7 & 0xFF for i in range(size))

        def hashlib_only() -> str:
            h = hashlib.sha256(prefix.encode("utf-8"))
            h.update(body)
            return h.hexdigest()

        fns = {
            "hashlib": hashlib_only,
            "package": lambda: ledger.fingerprint("POST", PATH, HEADERS, body),
            "wasm": lambda: ledger.fingerprint_in_component("POST", PATH, HEADERS, body),
        }
        digests = {name: fn() for name, fn in fns.items()}  # also the warm-up
        assert len(set(digests.values())) == 1, digests
        medians = {}
        for name, fn in fns.items():
            n = wasm_n if name == "wasm" else fast_n
            times = []
            gc.collect()
            for _ in range(n):
                t0 = time.perf_counter_ns()
                fn()
                times.append((time.perf_counter_ns() - t0) / 1e3)
            medians[name] = statistics.median(times)
        rows.append((size, medians, fast_n, wasm_n))
        log(f"fingerprint {size} bytes done")
    return rows


def cold_start(tmp: Path) -> dict[str, tuple[Any, ...]]:
    wasm = resources.files("idempotency_ledger").joinpath("idempotency_ledger.wasm").read_bytes()
    compiles = []
    for _ in range(5):
        engine = wasmtime.Engine()
        t = time.perf_counter()
        Component(engine, wasm)
        compiles.append((time.perf_counter() - t) * 1e3)
    runtime = Runtime.shared()
    insts = []
    for _ in range(50):
        store = wasmtime.Store(runtime.engine)
        t = time.perf_counter()
        runtime.linker.instantiate(store, runtime.component)
        insts.append((time.perf_counter() - t) * 1e3)
    news, firsts = [], []
    for i in range(7):
        db = tmp / f"cold-{i}.sqlite"
        t = time.perf_counter()
        ledger = Ledger(db)  # Store + instance + default-config + validate-config
        news.append((time.perf_counter() - t) * 1e3)
        ledger.migrate()
        t = time.perf_counter()
        r = ledger.handle(PRINCIPAL, "POST", PATH, [*HEADERS, ("Idempotency-Key", "first")], BODY, mutation)
        firsts.append((time.perf_counter() - t) * 1e3)
        assert r.status == 201
        ledger.close()
    # A thread's first call builds its own Store + instance + connection.
    thread_firsts = []
    ledger = Ledger(tmp / "threads.sqlite")
    ledger.migrate()
    for i in range(7):
        def first_call(i: int = i) -> None:
            t = time.perf_counter()
            ledger.handle(PRINCIPAL, "POST", PATH, [*HEADERS, ("Idempotency-Key", f"t{i}")], BODY, mutation)
            thread_firsts.append((time.perf_counter() - t) * 1e3)

        th = threading.Thread(target=first_call)
        th.start()
        th.join()
    ledger.close()
    return {
        "compile": (statistics.median(compiles), len(compiles), len(wasm)),
        "instantiate": (statistics.median(insts), len(insts)),
        "first_compile": (runtime.compile_seconds * 1e3, 1),
        "new_ledger": (statistics.median(news[1:]), len(news) - 1),
        "first_handle": (statistics.median(firsts[1:]), len(firsts) - 1),
        "thread_first": (statistics.median(thread_firsts[1:]), len(thread_firsts) - 1),
    }


def postgres_vs_sqlite(url: str, tmp: Path, rounds: int, per_round: int) -> dict[str, Any]:
    """`handle()` on PostgreSQL vs SQLite, same process, interleaved blocks."""
    import psycopg
    from psycopg.conninfo import make_conninfo

    schema = f"bench_{uuid.uuid4().hex[:12]}"
    conninfo = make_conninfo(url, options=f"-c search_path={schema}")
    admin = psycopg.connect(url, autocommit=True)
    admin.execute(f'CREATE SCHEMA "{schema}"')
    try:
        ledgers = {"sqlite": Ledger(tmp / "pg-compare.sqlite"), "postgres": Ledger.postgres(conninfo, min_size=1, max_size=1)}
        for ledger in ledgers.values():
            ledger.migrate()
            assert ledger.handle(PRINCIPAL, "POST", PATH, [*HEADERS, ("Idempotency-Key", "done")], BODY, mutation).status == 201
        bare = psycopg.connect(conninfo, autocommit=True)
        bare.execute("CREATE TABLE t (principal TEXT NOT NULL, key TEXT NOT NULL, fingerprint TEXT NOT NULL, created_at BIGINT, "
                     "PRIMARY KEY (principal, key))")
        fingerprint = ledgers["sqlite"].fingerprint("POST", PATH, HEADERS, BODY)
        samples: dict[tuple[str, str], list[float]] = {}
        clock = time.perf_counter_ns
        for rnd in range(rounds + 1):
            n = max(25, per_round // 8) if rnd == 0 else per_round
            order = list(ledgers.items()) if rnd % 2 == 0 else list(ledgers.items())[::-1]
            for name, ledger in order:
                for path in ("fresh", "replay"):
                    times = []
                    gc.collect()
                    for i in range(n):
                        key = f"pg-{rnd}-{i}" if path == "fresh" else "done"
                        t0 = clock()
                        r = ledger.handle(PRINCIPAL, "POST", PATH, [*HEADERS, ("Idempotency-Key", key)], BODY, mutation)
                        times.append((clock() - t0) / 1e3)
                        if r.status != 201:
                            raise SystemExit(f"{name} {path}: status {r.status} {r.body!r}")
                    if rnd:
                        samples.setdefault((name, path), []).extend(times)
            times = []
            gc.collect()
            for i in range(n):
                t0 = clock()
                bare.execute("INSERT INTO t VALUES (%s, %s, %s, %s)", (PRINCIPAL, f"b-{rnd}-{i}", fingerprint, i))
                times.append((clock() - t0) / 1e3)
            if rnd:
                samples.setdefault(("postgres", "bare"), []).extend(times)
            log(f"postgres vs sqlite round {rnd}/{rounds} done" + (" (warm-up)" if rnd == 0 else ""))
        version = admin.execute("SHOW server_version").fetchone()
        bare.close()
        for ledger in ledgers.values():
            ledger.close()
    finally:
        admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        admin.close()
    return {
        "server": version[0] if version else "?",
        "psycopg": metadata.version("psycopg"),
        "stats": {k: (statistics.median(v), pct(v, 0.99), len(v)) for k, v in samples.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds of interleaved blocks (after one warm-up round)")
    parser.add_argument("--per-round", type=int, default=400, help="requests per path, side and round")
    args = parser.parse_args()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        log("cold start: compile, instantiate, new Ledger")
        cold = cold_start(tmp)
        ledger = Ledger(tmp / "component.sqlite")
        ledger.migrate()
        plain = PlainLedger(str(tmp / "plain.sqlite"))
        plain.migrate()
        log(f"per-request: {args.rounds} rounds x {args.per_round} requests per path and side")
        per_path, extra = per_request(ledger, plain, tmp, args.rounds, args.per_round)
        log("fingerprint throughput")
        fps = fingerprints(ledger)
        ledger.close()
        plain.close()
        pg_url = os.environ.get("IDEMPOTENCY_PG_URL", "")
        pg = None
        if pg_url:
            log("PostgreSQL vs SQLite: handle() fresh key and replay")
            pg = postgres_vs_sqlite(pg_url, tmp, args.rounds, max(50, args.per_round // 2))
    elapsed = time.perf_counter() - started

    wasmtime_version = metadata.version("wasmtime")
    out: list[str] = []
    w = out.append
    w(f"## Python host (wasmtime-py {wasmtime_version}, sqlite3)")
    w("")
    w(f"Python {platform.python_version()} ({platform.python_implementation()}), wasmtime-py {wasmtime_version}, "
      f"SQLite {sqlite3.sqlite_version}, {platform.machine()}. Command: `make -C bindings/python bench` "
      f"(`.venv/bin/python bench/bench.py --rounds {args.rounds} --per-round {args.per_round}`); took {elapsed:.0f} s.")
    w("Ledger files: WAL, `synchronous=NORMAL`, one `BEGIN IMMEDIATE` transaction per batch, in a temporary directory. "
      "Per-request figures are medians and p99 of single-request times pooled over the timed blocks "
      "(one warm-up round discarded; component and plain Python blocks interleaved, order alternating per round).")
    w("")
    w("### Per-request cost: `Ledger.handle` (component) vs the same protocol in plain Python")
    w("")
    w("Plain Python is `bindings/python/bench/plain.py`: hashlib + sqlite3, the core's SQL text, the same decision batch "
      "(claim, fingerprint-guarded takeover, lookup) and completion batch, the same shaping and replay checks. "
      "Before timing, both answered every path with the same status, headers and body and stored the same rows. "
      "Body 233 bytes; the mutation returns a constant 201.")
    w("")
    w("| path | status | requests | component median (µs) | component p99 (µs) | plain median (µs) | plain p99 (µs) | ratio (median) | ratio (p99) |")
    w("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    worst = ("", 0.0)
    for path in PATHS:
        cm, cp, n = per_path[("component", path)]
        pm, pp, _ = per_path[("plain", path)]
        ratio = cm / pm
        if ratio > worst[1]:
            worst = (path, ratio)
        label = {"fresh": "fresh key (claim, mutation, completion)", "replay": "replay (completed row)",
                 "reuse": "reuse: other body, same key", "in progress": "in progress (fresh pending row)",
                 "takeover": "takeover (stale pending row, mutation, completion)"}[path]
        w(f"| {label} | {EXPECTED[path]} | {n} | {fmt_us(cm)} | {fmt_us(cp)} | {fmt_us(pm)} | {fmt_us(pp)} | "
          f"{ratio:.1f}x | {cp / pp:.1f}x |")
    w("")
    calls = "admit, decide, complete" if worst[0] in ("fresh", "takeover") else "admit, decide"
    cm = per_path[("component", worst[0])][0]
    w(f"Worst median ratio: {worst[0]} ({worst[1]:.1f}x). That path makes {len(calls.split(', '))} component calls ({calls}); "
      f"of its {fmt_us(cm)} µs the decision batch in SQLite is ~{fmt_us(extra['package_batch'][0])} µs and hashlib "
      f"~{fmt_us(extra['hash'][0])} µs. The rest is crossing the component boundary in wasmtime-py: every argument and result "
      "(records, lists, variants, strings) and every row returned through the `execute-batch` import is lowered and lifted "
      "in Python through ctypes. The plain side does the same SQL in a few tens of µs, so the 409 paths, where it is "
      "cheapest, show the largest ratios.")
    w("")
    w("Where the time goes on the reuse path (409): the pieces timed on their own, in the same rounds.")
    w("")
    w("| piece | median (µs) | p99 (µs) |")
    w("| --- | ---: | ---: |")
    for label, key in (
        ("`Ledger.handle`, whole request (component)", None),
        ("`Ledger.admit`: one component call (key check, fingerprint prefix)", "admit"),
        ("hashlib SHA-256 of prefix + 233-byte body", "hash"),
        ("`Ledger.decide`: one component call, including the `execute-batch` import and its SQLite batch", "decide"),
        ("the decision batch alone through the package's `SqliteBackend.execute_batch` (no component)", "package_batch"),
        ("the decision batch alone in plain Python (`PlainLedger._batch`)", "plain_batch"),
        ("plain Python, whole request", "plain"),
    ):
        if key is None:
            m, p, _ = per_path[("component", "reuse")]
        elif key == "plain":
            m, p, _ = per_path[("plain", "reuse")]
        else:
            m, p, _ = extra[key]
        w(f"| {label} | {fmt_us(m)} | {fmt_us(p)} |")
    w("")
    w("### Fingerprint throughput")
    w("")
    w("SHA-256 over the core's prefix + body. *hashlib*: the prefix already known; *package*: `Ledger.fingerprint` "
      "(one component call for the prefix, then hashlib: what `handle` does); *in wasm*: `Ledger.fingerprint_in_component` "
      "(the body crosses as `list<u8>`, converted by wasmtime-py byte by byte). MB = 10^6 bytes of body. All three digests agree.")
    w("")
    w("| body | hashlib median | hashlib MB/s | package median | package MB/s | in wasm median | in wasm MB/s | in wasm / package (time) | in wasm / hashlib (time) | calls (hashlib, package / in wasm) |")
    w("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for size, med, fast_n, wasm_n in fps:
        mbs = {k: size / v for k, v in med.items()}  # bytes per µs = MB/s
        label = f"{size // 1024} KiB" if size < 1 << 20 else f"{size >> 20} MiB"
        cells = " | ".join(f"{fmt_us(med[k])} µs | {mbs[k]:,.1f}" for k in ("hashlib", "package", "wasm"))
        w(f"| {label} | {cells} | {med['wasm'] / med['package']:,.0f}x | {med['wasm'] / med['hashlib']:,.0f}x | {fast_n} / {wasm_n} |")
    w("")
    w("### Cold start")
    w("")
    comp_ms, comp_n, wasm_len = cold["compile"]
    w("| step | median | runs |")
    w("| --- | ---: | ---: |")
    w(f"| compile the component ({wasm_len:,} bytes), fresh `Engine` | {fmt_ms(comp_ms)} ms | {comp_n} |")
    w(f"| the package's own first compile (`Runtime.shared()`) | {fmt_ms(cold['first_compile'][0])} ms | 1 |")
    w(f"| instantiate (`linker.instantiate` into a new `Store`) | {cold['instantiate'][0] * 1e3:.0f} µs | {cold['instantiate'][1]} |")
    w(f"| `Ledger(path)` (Store + instance + 2 config calls; component already compiled) | {fmt_ms(cold['new_ledger'][0])} ms | {cold['new_ledger'][1]} |")
    w(f"| first `handle()` on that ledger (new key; first use of admit, decide, complete) | {fmt_ms(cold['first_handle'][0])} ms | {cold['first_handle'][1]} |")
    w(f"| first `handle()` in a new thread (its own Store, instance, connection) | {fmt_ms(cold['thread_first'][0])} ms | {cold['thread_first'][1]} |")
    w("")
    w("### `handle()` vs a bare sqlite3 insert")
    w("")
    w("The bare insert is one `BEGIN IMMEDIATE; INSERT; COMMIT` into a 4-column table on its own file, same settings, "
      "timed in the same rounds.")
    w("")
    w("| call | median (µs) | p99 (µs) | requests | vs bare insert (median) |")
    w("| --- | ---: | ---: | ---: | ---: |")
    bm = extra["bare"][0]
    rows = [
        ("bare sqlite3 insert (one transaction)", extra["bare"]),
        ("`handle()`, new key (admit + decide batch + mutation + complete batch)", per_path[("component", "fresh")]),
        ("`handle()`, replay (admit + decide batch)", per_path[("component", "replay")]),
        ("`handle()`, GET pass-through (admit only)", extra["get"]),
        ("`admit()` alone (one pure component call)", extra["admit"]),
        ("plain Python, new key (two transactions)", per_path[("plain", "fresh")]),
    ]
    for label, (m, p, n) in rows:
        w(f"| {label} | {fmt_us(m)} | {fmt_us(p)} | {n} | {m / bm:.1f}x |")
    if pg is not None:
        st = pg["stats"]
        w("")
        w("### `handle()` on PostgreSQL vs SQLite (same run)")
        w("")
        w(f"PostgreSQL {pg['server']} at `IDEMPOTENCY_PG_URL` (loopback when `scripts/postgres.sh` started it), "
          f"psycopg {pg['psycopg']} through `Ledger.postgres` (one pooled connection; each batch one READ COMMITTED "
          "transaction in one pipelined round trip), against `Ledger(path)` on SQLite, blocks interleaved in the same rounds.")
        w("")
        w("| call | SQLite median (µs) | SQLite p99 (µs) | PostgreSQL median (µs) | PostgreSQL p99 (µs) | requests each | PostgreSQL / SQLite (median) |")
        w("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for label, path in (("`handle()`, new key (decide batch + mutation + complete batch)", "fresh"), ("`handle()`, replay (decide batch)", "replay")):
            sm, sp, n = st[("sqlite", path)]
            pm, pp, _ = st[("postgres", path)]
            w(f"| {label} | {fmt_us(sm)} | {fmt_us(sp)} | {fmt_us(pm)} | {fmt_us(pp)} | {n} | {pm / sm:.1f}x |")
        bm2, bp2, bn = st[("postgres", "bare")]
        w(f"| bare psycopg INSERT, autocommit (one statement, one round trip), for scale | | | {fmt_us(bm2)} | {fmt_us(bp2)} | {bn} | |")
    print("\n".join(out))
    log(f"done in {elapsed:.0f} s")


if __name__ == "__main__":
    main()
