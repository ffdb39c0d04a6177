"""Measures the Python package (the native extension) and prints ONE Markdown
section on stdout; progress goes to stderr.

1. Per request, per path: `Ledger.handle` (the core component under wasmtime
   inside the extension, the Rust SQLite backend) against the same protocol
   in plain Python (bench/plain.py: hashlib + sqlite3, the core's SQL and
   batches): fresh key, replay, reuse (409), in progress (409). The same
   paths on a ledger over a sqlite3 connection you bring (`Ledger(conn)`: the
   batches run by a Python callback) show what the callback costs.
2. A GET pass-through (`handle` with an unprotected method) against a plain
   method check (`method.upper() not in protected`, then the handler).
3. Cold start: a fresh interpreter, from `import idempotency_ledger` to the
   first answer of `handle` on a new file.

    make -C bindings/python bench        # or: .venv/bin/python bench/bench.py [--rounds R] [--per-round N]

Medians (and p99) of single-request times pooled over the timed blocks
(a warm-up round discarded; sides interleaved, order alternating per round).
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

import plain  # noqa: E402

from idempotency_ledger import Ledger, MutationResponse, RunHandler  # noqa: E402

PRINCIPAL = "acct-bench"
PATH = "/orders"
BODY = b'{"sku":"A-1","qty":2,"note":"' + b"x" * 200 + b'"}'
OTHER_BODY = BODY.replace(b"A-1", b"B-2")
HEADERS = [("Content-Type", "application/json"), ("X-Api-Version", "2026-01-01")]
PRODUCED = MutationResponse(201, [("Content-Type", "application/json"), ("Location", "/orders/o_1")], '{"order":"o_1"}')
PATHS = ("fresh", "replay", "reuse", "in_progress")
LABELS = {
    "fresh": "fresh key (decision, mutation, completion)",
    "replay": "replay (completed row)",
    "reuse": "reuse: other body, same key (409)",
    "in_progress": "in progress (409)",
}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def mutation() -> MutationResponse:
    return PRODUCED


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Side:
    def __init__(self, name: str, handle: Callable[..., Any], pending: Callable[[str], None]) -> None:
        self.name = name
        self.handle = handle
        self.pending = pending

    def run(self, path: str, tag: str, n: int) -> list[float]:
        keys = [f"{path}-{tag}-{i}" for i in range(n)]
        if path == "replay":
            keys = ["done"] * n
        elif path == "reuse":
            keys = ["done"] * n
        elif path == "in_progress":
            keys = ["pending"] * n
        body = OTHER_BODY if path == "reuse" else BODY
        expected = {"fresh": 201, "replay": 201, "reuse": 409, "in_progress": 409}[path]
        clock = time.perf_counter_ns
        times = []
        gc.collect()
        for key in keys:
            headers = [*HEADERS, ("Idempotency-Key", key)]
            t0 = clock()
            r = self.handle(PRINCIPAL, "POST", PATH, headers, body, mutation)
            times.append((clock() - t0) / 1e3)
            if r.status != expected:
                raise SystemExit(f"{self.name} {path}: status {r.status} {r.body!r}")
        return times


def sides(tmp: Path) -> list[Side]:
    made = []
    native = Ledger(tmp / "native.sqlite")
    native.migrate()
    conn = sqlite3.connect(tmp / "callback.sqlite", isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode = WAL").fetchall()
    conn.execute("PRAGMA synchronous = NORMAL")
    callback = Ledger(conn)
    callback.migrate()
    baseline = plain.PlainLedger(str(tmp / "plain.sqlite"))
    baseline.migrate()
    fp = ""
    for name, ledger in (("package", native), ("package, own sqlite3 connection", callback)):
        ledger.handle(PRINCIPAL, "POST", PATH, [*HEADERS, ("Idempotency-Key", "done")], BODY, mutation)
        # A reservation left pending: an exchange abandoned after the decision.
        with ledger.start(PRINCIPAL, "POST", PATH, [*HEADERS, ("Idempotency-Key", "pending")]) as pending:
            action = pending.body(BODY)
            assert isinstance(action, RunHandler), action
            fp = action.ticket.fingerprint
        made.append(Side(name, ledger.handle, lambda key: None))
    baseline.handle(PRINCIPAL, "POST", PATH, [*HEADERS, ("Idempotency-Key", "done")], BODY, mutation)
    now = baseline.clock()
    baseline._batch([(plain.CLAIM, (PRINCIPAL, "pending", fp, now, now))])
    made.append(Side("plain Python", baseline.handle, lambda key: None))
    return made


def per_request(tmp: Path, rounds: int, per_round: int) -> dict[tuple[str, str], list[float]]:
    all_sides = sides(tmp)
    samples: dict[tuple[str, str], list[float]] = {}
    for rnd in range(rounds + 1):
        n = max(50, per_round // 4) if rnd == 0 else per_round
        order = all_sides if rnd % 2 == 0 else all_sides[::-1]
        for path in PATHS:
            for side in order:
                times = side.run(path, f"r{rnd}", n)
                if rnd:
                    samples.setdefault((side.name, path), []).extend(times)
        log(f"per-request round {rnd}/{rounds} done" + (" (warm-up)" if rnd == 0 else ""))
    return samples


def get_pass_through(tmp: Path, rounds: int, per_round: int) -> dict[str, list[float]]:
    ledger = Ledger(tmp / "get.sqlite")
    protected = frozenset(("POST", "PATCH", "DELETE"))
    handler = mutation

    def plain_check(method: str) -> Any:
        if method.upper() not in protected:
            return handler()
        raise AssertionError

    samples: dict[str, list[float]] = {"package": [], "plain": []}
    clock = time.perf_counter_ns
    for rnd in range(rounds + 1):
        for name in ("package", "plain"):
            times = []
            gc.collect()
            for _ in range(per_round * 4):
                t0 = clock()
                if name == "package":
                    ledger.handle(PRINCIPAL, "GET", PATH, HEADERS, b"", handler)
                else:
                    plain_check("GET")
                times.append((clock() - t0) / 1e3)
            if rnd:
                samples[name].extend(times)
    return samples


COLD = r"""
import sys, time
t0 = time.perf_counter()
import idempotency_ledger
t1 = time.perf_counter()
ledger = idempotency_ledger.Ledger(sys.argv[1]); ledger.migrate()
r = ledger.handle("p", "POST", "/o", [("Idempotency-Key", "k")], b"{}", lambda: idempotency_ledger.MutationResponse(201, [], "{}"))
t2 = time.perf_counter()
assert r.status == 201
print((t1 - t0) * 1e3, (t2 - t1) * 1e3)
"""


def cold_start(tmp: Path) -> tuple[float, float, int]:
    imports, firsts = [], []
    for i in range(7):
        out = subprocess.run([sys.executable, "-c", COLD, str(tmp / f"cold-{i}.sqlite")], capture_output=True, text=True, check=True)
        a, b = (float(x) for x in out.stdout.split())
        imports.append(a)
        firsts.append(b)
    return statistics.median(imports), statistics.median(firsts), len(imports)


ASGI_VARIANTS = ("bare", "ledger", "ledger-thread")


def asgi_over_http(tmp: Path, pairs: int, warm: int) -> tuple[dict[str, dict[str, list[float]]], dict[str, Any]]:
    """The ASGI middleware as a user sees it: bench/asgi_app.py under uvicorn,
    one process per variant, a keep-alive client over loopback sending a
    fresh key and then the same request again; variants interleaved (order
    alternating). Returns ms per request, per variant, fresh and replay;
    and what each server measured (CPU time and wall time to the answer per request, in us)."""
    import http.client
    import socket

    def free_port() -> int:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            return int(sock.getsockname()[1])

    ports = {v: free_port() for v in ASGI_VARIANTS}
    app = Path(__file__).resolve().parent / "asgi_app.py"
    procs = [subprocess.Popen([sys.executable, str(app), v, str(ports[v]), str(tmp)]) for v in ASGI_VARIANTS]
    try:
        conns: dict[str, http.client.HTTPConnection] = {}
        deadline = time.monotonic() + 30
        for v in ASGI_VARIANTS:
            while True:
                try:
                    conn = http.client.HTTPConnection("127.0.0.1", ports[v], timeout=10)
                    conn.connect()
                    conns[v] = conn
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"bench/asgi_app.py {v} did not start")
                    time.sleep(0.05)
        samples: dict[str, dict[str, list[float]]] = {v: {"fresh": [], "replay": []} for v in ASGI_VARIANTS}

        def post(conn: http.client.HTTPConnection, key: str, body: str, tag: str) -> tuple[float, int, bytes]:
            started = time.perf_counter()
            conn.request("POST", "/orders", body=body, headers={"content-type": "application/json", "idempotency-key": key, "x-bench-path": tag})
            answer = conn.getresponse()
            text = answer.read()
            return (time.perf_counter() - started) * 1000, answer.status, text

        for i in range(warm + pairs):
            if i % 500 == 0:
                log(f"ASGI over HTTP: pair {i}/{warm + pairs}")
            order = ASGI_VARIANTS if i % 2 == 0 else tuple(reversed(ASGI_VARIANTS))
            for v in order:
                key, body = f"{v}-{i}", f'{{"sku":"B{i}","qty":1}}'
                fresh, status, first = post(conns[v], key, body, "fresh" if i >= warm else "warm")
                replay, again, second = post(conns[v], key, body, "replay" if i >= warm else "warm")
                if status != 201 or again != 201 or (v != "bare" and first != second):
                    raise RuntimeError(f"{v}: {status}/{again}: {first!r} {second!r}")
                if i >= warm:
                    samples[v]["fresh"].append(fresh)
                    samples[v]["replay"].append(replay)
        measured: dict[str, Any] = {}
        for v, conn in conns.items():
            conn.request("GET", "/bench-measured")
            measured[v] = json.loads(conn.getresponse().read())
            conn.close()
        return samples, measured
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(10)


def fmt(us: float) -> str:
    return f"{us:,.1f}" if us < 100 else f"{us:,.0f}"


def _package_sqlite_version() -> str:
    """The SQLite the extension runs on: it links the process's libsqlite3,
    the one Python's sqlite3 loaded (tests/test_shared_sqlite.py checks it)."""
    return sqlite3.sqlite_version


def previous_figures() -> dict[str, str]:
    """The run this one replaces, from bench/RESULTS.md: per row label of
    the `Ledger.handle` and ASGI tables, what that run printed ("package /
    plain" ratio; "fresh, replay" overheads)."""
    path = Path(__file__).resolve().parents[3] / "bench" / "RESULTS.md"
    if not path.exists():
        return {}
    text = path.read_text(encoding="utf-8")
    python = text[text.find("## Python host"):] if "## Python host" in text else ""
    found: dict[str, str] = {}
    for line in python.splitlines():
        cells = [c.strip() for c in line.split("|")[1:-1]]
        if len(cells) >= 5 and cells[4].endswith("x") and cells[0] in LABELS.values():
            found[cells[0]] = cells[4]
        elif len(cells) >= 5 and cells[2].startswith("**") and cells[4].startswith("**"):
            found[cells[0]] = f"{cells[2].strip('*')}, {cells[4].strip('*')}"
    return found


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--per-round", type=int, default=400)
    parser.add_argument("--asgi-pairs", type=int, default=1000)
    args = parser.parse_args()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        samples = per_request(tmp, args.rounds, args.per_round)
        get = get_pass_through(tmp, args.rounds, args.per_round)
        imports, first, cold_n = cold_start(tmp)
        asgi, asgi_server = asgi_over_http(tmp, args.asgi_pairs, 200)
    took = time.perf_counter() - started
    previous = previous_figures()
    out = []
    out.append("## Python host (native extension: PyO3 over the Rust host crate, wasmtime, Rust SQLite backend)")
    out.append("")
    package_sqlite = _package_sqlite_version()
    if package_sqlite == sqlite3.sqlite_version:
        which = f"SQLite {package_sqlite} (the system libsqlite3, in the package and in plain Python's sqlite3)"
    else:
        which = f"SQLite {package_sqlite} in the package, {sqlite3.sqlite_version} in plain Python's sqlite3"
    out.append(
        f"Python {platform.python_version()} ({platform.python_implementation()}), {which}, "
        f"{platform.machine()}. Command: `make -C bindings/python bench` (`bench/bench.py --rounds {args.rounds} --per-round {args.per_round}`); took {took:.0f} s."
    )
    out.append("")
    out.append("### Per request: `Ledger.handle` vs the same protocol in plain Python (bench/plain.py)")
    out.append("")
    out.append("Body 233 bytes; the mutation returns a constant 201. Target: at most 1.5x plain Python per path.")
    out.append("")
    out.append("| path | package median / p99 (µs) | own sqlite3 connection (callback) median / p99 (µs) | plain Python median / p99 (µs) | package / plain (median) | callback / plain (median) | previous run: package / plain |")
    out.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for path in PATHS:
        p = samples[("package", path)]
        c = samples[("package, own sqlite3 connection", path)]
        b = samples[("plain Python", path)]
        pm, cm, bm = statistics.median(p), statistics.median(c), statistics.median(b)
        out.append(
            f"| {LABELS[path]} | {fmt(pm)} / {fmt(pct(p, 0.99))} | {fmt(cm)} / {fmt(pct(c, 0.99))} | {fmt(bm)} / {fmt(pct(b, 0.99))} | {pm / bm:.2f}x | {cm / bm:.2f}x | {previous.get(LABELS[path], '-')} |"
        )
    out.append("")
    gp, gb = statistics.median(get["package"]), statistics.median(get["plain"])
    out.append("### GET pass-through")
    out.append("")
    out.append("| what | median (µs) | p99 (µs) | ratio |")
    out.append("| --- | ---: | ---: | ---: |")
    out.append(f"| `Ledger.handle` with GET (the core's protected methods checked in Python, handler run, result built) | {gp:.2f} | {pct(get['package'], 0.99):.2f} | {gp / gb:.1f}x |")
    out.append(f"| plain method check, then the handler | {gb:.2f} | {pct(get['plain'], 0.99):.2f} | 1x |")
    out.append("")
    out.append("Target: at most 10x the plain method check.")
    out.append("")
    out.append("### ASGI under uvicorn: the same Starlette app with and without the middleware (loopback HTTP/1.1, keep-alive)")
    out.append("")
    out.append(
        f"`bench/asgi_app.py` (`POST /orders` parses the JSON body, inserts one order into its own SQLite file, answers 201) under uvicorn, one process per variant: "
        "without the middleware, with it as it runs by default (`Ledger(path)`, `wait_ms` 0: the ledger calls on the event loop), and with `inline=False` "
        f"(every ledger call in a worker thread). The client sends a fresh key, then the same request again (a replay; without the middleware the app runs again); "
        f"{args.asgi_pairs} pairs per variant after 200 warm-up pairs, variants interleaved. Overhead = median with - median without. "
        "Targets (issue 24): at most +0.25 ms fresh, +0.08 ms replay."
    )
    out.append("")
    out.append("| variant | fresh median (ms) | fresh overhead | replay median (ms) | replay overhead | targets | previous run: fresh, replay overhead |")
    out.append("| --- | ---: | ---: | ---: | ---: | --- | --- |")
    bare_fresh, bare_replay = statistics.median(asgi["bare"]["fresh"]), statistics.median(asgi["bare"]["replay"])
    for v, label in (("bare", "without the middleware"), ("ledger", "the middleware (default: on the event loop)"), ("ledger-thread", "the middleware, `inline=False` (worker threads)")):
        f, r = statistics.median(asgi[v]["fresh"]), statistics.median(asgi[v]["replay"])
        if v == "bare":
            out.append(f"| {label} | {f:.3f} | | {r:.3f} | | | |")
            continue
        met = "met" if f - bare_fresh <= 0.25 and r - bare_replay <= 0.08 else "**not met**"
        out.append(f"| {label} | {f:.3f} | **{f - bare_fresh:+.3f} ms** | {r:.3f} | **{r - bare_replay:+.3f} ms** | {met} | {previous.get(label, '-')} |")
    out.append("")
    out.append(
        "Measured in each server during the same requests (`bench/asgi_app.py`, around the whole app, medians per request): the CPU time the process spent "
        "(`time.process_time`, all its threads) and the wall time until the response's start was sent (the answer ready: the middleware holds the handler's answer until its completion committed). "
        "A replay is compared with the app running again."
    )
    out.append("")
    out.append("| variant | fresh: server CPU | CPU added | wall time to the answer, added | replay: server CPU | CPU added | wall time to the answer, added |")
    out.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")

    def server(v: str, path: str, what: str) -> float:
        return statistics.median(asgi_server[v][path][what])

    for v, label in (("bare", "without the middleware"), ("ledger", "the middleware (default: on the event loop)"), ("ledger-thread", "the middleware, `inline=False` (worker threads)")):
        cells = [label]
        for path in ("fresh", "replay"):
            cpu = server(v, path, "cpu_us")
            cells.append(f"{fmt(cpu)} µs")
            if v == "bare":
                cells += ["", ""]
            else:
                cells.append(f"{cpu - server('bare', path, 'cpu_us'):+.1f} µs")
                cells.append(f"{server(v, path, 'answer_us') - server('bare', path, 'answer_us'):+.1f} µs")
        out.append("| " + " | ".join(cells) + " |")
    out.append("")
    out.append("### Cold start (a fresh interpreter each time)")
    out.append("")
    out.append("| what | median (ms) | runs |")
    out.append("| --- | ---: | ---: |")
    out.append(f"| `import idempotency_ledger` | {imports:.1f} | {cold_n} |")
    out.append(f"| `Ledger(path)`, `migrate()`, first `handle` (the precompiled component deserialized, a connection, an instance) | {first:.1f} | {cold_n} |")
    print("\n".join(out))


if __name__ == "__main__":
    main()
