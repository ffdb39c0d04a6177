"""Runs in each process of the multi-process race (spawned, so it imports
only the package: each process compiles the component itself)."""

from __future__ import annotations

import os
import sqlite3
import time
from typing import Any

from idempotency_ledger import Ledger, MutationResponse


def race(db: str, key: str, barrier: Any, results: Any, hold_s: float) -> None:
    try:
        ledger = Ledger(db, busy_timeout_ms=30_000)  # a loaded CI box must not turn the race into 503s
        ledger.sweep(now=0)  # connected and instantiated before the start line (deletes nothing)

        def mutation() -> MutationResponse:
            conn = sqlite3.connect(db, timeout=30)
            with conn:
                conn.execute("INSERT INTO orders (pid) VALUES (?)", (os.getpid(),))
            conn.close()
            time.sleep(hold_s)  # keep the claim pending while the others arrive
            return MutationResponse.json(201, {"order": "o_1", "pid": os.getpid()}, [("Location", "/orders/o_1")])

        barrier.wait(60)
        r = ledger.handle(
            "acct-1", "POST", "/orders",
            [("Idempotency-Key", key), ("Content-Type", "application/json")],
            b'{"sku":"A-1","qty":2}', mutation,
        )
        results.put((os.getpid(), r.outcome, r.status, r.body.decode()))
        ledger.close()
    except BaseException as error:  # reported to the parent, which fails the test
        results.put((os.getpid(), "error", 0, repr(error)))
