"""Measures the Python host: component compile time, and the per-call cost of
`Ledger.handle` against a bare sqlite3 insert (one transaction each) on the
same kind of file (WAL, synchronous=NORMAL), in the same run.

    make bench            # or: .venv/bin/python bench/bench.py [N]
"""

from __future__ import annotations

import platform
import statistics
import sqlite3
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path

import wasmtime
from wasmtime.component import Component

from idempotency_ledger import Ledger, MutationResponse, Runtime, connect

N = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
HEADERS = [("Content-Type", "application/json"), ("X-Api-Version", "2")]
BODY = b'{"sku":"A-1","qty":2,"note":"' + b"x" * 200 + b'"}'
PRODUCED = MutationResponse.json(201, '{"order":"o_1","status":"accepted"}', [("Location", "/orders/o_1")])


def per_op_us(fn, n: int) -> float:  # type: ignore[no-untyped-def]
    start = time.perf_counter()
    for i in range(n):
        fn(i)
    return (time.perf_counter() - start) / n * 1e6


def main() -> None:
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
        insts.append((time.perf_counter() - t) * 1e6)

    with tempfile.TemporaryDirectory() as tmp:
        bare_db = Path(tmp) / "bare.sqlite"
        conn = connect(bare_db)
        conn.execute("CREATE TABLE t (principal TEXT NOT NULL, key TEXT NOT NULL, fingerprint TEXT NOT NULL, created_at INTEGER, PRIMARY KEY (principal, key))")

        def bare(i: int, tag: str = "a") -> None:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO t VALUES (?, ?, ?, ?)", ("acct-1", f"{tag}{i}", "0" * 64, i))
            conn.execute("COMMIT")

        ledger = Ledger(Path(tmp) / "ledger.sqlite")
        ledger.migrate()

        def handle(i: int, tag: str = "h") -> None:
            r = ledger.handle("acct-1", "POST", "/orders", [*HEADERS, ("Idempotency-Key", f"{tag}{i}")], BODY, lambda: PRODUCED)
            assert r.stored

        def replay(i: int) -> None:
            r = ledger.handle("acct-1", "POST", "/orders", [*HEADERS, ("Idempotency-Key", f"h{i}")], BODY, lambda: PRODUCED)
            assert r.outcome.value == "replayed"

        def get(i: int) -> None:
            ledger.handle("acct-1", "GET", "/orders", HEADERS, b"", lambda: PRODUCED)

        def admit(i: int) -> None:
            ledger.admit("POST", "/orders", [*HEADERS, ("Idempotency-Key", "k")])

        for warm in range(200):  # warm both paths
            bare(warm, "w")
            handle(warm, "w")
        bare1 = per_op_us(bare, N)
        handled = per_op_us(handle, N)
        replayed = per_op_us(replay, N)
        bare2 = per_op_us(lambda i: bare(i, "b"), N)
        passed = per_op_us(get, N)
        admitted = per_op_us(admit, N)
        ledger.close()
        conn.close()

    bare_us = statistics.mean([bare1, bare2])
    print(f"python {platform.python_version()}, wasmtime-py {wasmtime.__version__ if hasattr(wasmtime, '__version__') else '50.0.1'}, "
          f"sqlite {sqlite3.sqlite_version}, {platform.machine()}, N={N}")
    print(f"component compile (fresh Engine, {len(wasm)} bytes): median {statistics.median(compiles):.1f} ms "
          f"(min {min(compiles):.1f}, max {max(compiles):.1f}; runtime's own first compile {runtime.compile_seconds * 1e3:.1f} ms)")
    print(f"instantiate (Store + linker.instantiate): median {statistics.median(insts):.0f} us")
    print(f"bare sqlite3 insert, one BEGIN IMMEDIATE..COMMIT:  {bare1:8.1f} us/op (before)  {bare2:8.1f} us/op (after)")
    print(f"handle(), new key (admit + decide batch + mutation + complete batch): {handled:8.1f} us/op")
    print(f"handle(), replay (admit + decide batch):          {replayed:8.1f} us/op")
    print(f"handle(), GET pass-through (admit only):          {passed:8.1f} us/op")
    print(f"admit() alone (one pure component call):          {admitted:8.1f} us/op")
    print(f"overhead of handle() over a bare insert: {handled - bare_us:+.1f} us/op ({handled / bare_us:.1f}x); "
          f"replay over a bare insert: {replayed - bare_us:+.1f} us/op")


if __name__ == "__main__":
    main()
