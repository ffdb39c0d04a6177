"""8 processes, one SQLite file, the same keyed request at the same moment."""

from __future__ import annotations

import multiprocessing
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

from conftest import fingerprint, insert_rows, rows
from idempotency_ledger import Ledger
from race_worker import race

PROCESSES = 8


def _orders(db: Path) -> int:
    conn = sqlite3.connect(db)
    try:
        return conn.execute("SELECT count(*) FROM orders").fetchone()[0]
    finally:
        conn.close()


def _run(db: Path, key: str, hold_s: float) -> list[tuple[Any, ...]]:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(PROCESSES)
    results = ctx.Queue()
    procs = [ctx.Process(target=race, args=(str(db), key, barrier, results, hold_s)) for _ in range(PROCESSES)]
    for p in procs:
        p.start()
    out = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    return out


def _prepare(db: Path) -> None:
    with Ledger(db) as ledger:
        ledger.migrate()
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, pid INTEGER)")
    conn.close()


def _check(out: list[tuple[Any, ...]], db: Path, label: str) -> None:
    tally = Counter(f"{outcome} {status}" for _, outcome, status, _ in out)
    print(f"\nmulti-process race ({label}, {PROCESSES} processes): {dict(tally)}; mutations in the database: {_orders(db)}")
    assert not [o for o in out if o[1] == "error"], out
    executed = [o for o in out if o[1] in ("executed", "taken-over")]
    assert len(executed) == 1, tally
    assert _orders(db) == 1, "exactly one mutation ran"
    for _, outcome, status, body in out:
        if outcome in ("replayed", "replayed-after-wait"):
            assert (status, body) == (201, executed[0][3])
        elif outcome == "in-progress":
            assert status == 409, tally
        else:
            assert outcome in ("executed", "taken-over"), tally


def test_eight_processes_same_key_one_mutation(tmp_path: Path) -> None:
    db = tmp_path / "race.sqlite"
    _prepare(db)
    _check(_run(db, "race-key", hold_s=0.5), db, "fresh key")
    # A second wave after completion: every answer is the stored replay.
    again = _run(db, "race-key", hold_s=0.0)
    assert {(o[1], o[2]) for o in again} == {("replayed", 201)}
    assert _orders(db) == 1
    assert [r["generation"] for r in rows(db)] == [1]


def test_eight_processes_race_one_stale_takeover(tmp_path: Path) -> None:
    db = tmp_path / "takeover.sqlite"
    _prepare(db)
    insert_rows(db, [{
        "principal": "acct-1", "key": "stale-key", "status": "pending", "generation": 1,
        "fingerprint": fingerprint("POST", "/orders", [("Content-Type", "application/json")], b'{"sku":"A-1","qty":2}'),
        "response_status": None, "response_body": None, "response_headers": None, "created_at": 1, "updated_at": 1,
    }])
    out = _run(db, "stale-key", hold_s=0.5)
    _check(out, db, "stale pending row")
    assert [(r["generation"], r["status"]) for r in rows(db)] == [(2, "completed")]
