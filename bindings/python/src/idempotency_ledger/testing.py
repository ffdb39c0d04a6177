"""Testing your own protected handlers: a throwaway SQLite ledger, a clock
you move past the pending TTL or the retention, the ledger's rows as the core
wrote them, and helpers that fire N duplicates at once.

    from idempotency_ledger.testing import TestLedger, fire_duplicates

    with TestLedger(wait_ms=5000) as kit:
        app = make_app(kit.ledger)            # your app, on the kit's ledger
        answers = fire_duplicates(5, lambda i: client.post("/orders", ...))
        assert kit.row("alice", "k-1").status == "completed"
        kit.clock.advance(kit.ledger.config.retention_ms + 1)
        assert kit.sweep() == 1

The same kit as the Rust crate's `testing` feature and the npm package's
`@idempotency/ledger/testing` (README, "Testing your handlers").
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Optional, TypeVar, Union

from ._ledger import Ledger

__all__ = ["TEST_EPOCH_MS", "Row", "TestClock", "TestLedger", "fire_duplicates", "fire_duplicates_async"]

#: 2030-01-01T00:00:00Z: where a `TestClock` starts unless told otherwise.
TEST_EPOCH_MS = 1_893_456_000_000

T = TypeVar("T")


class TestClock:
    """A clock for the ledger's `clock=`: Unix milliseconds that run with
    real time (so a duplicate's wait for the first request ends as it would
    in production) unless `frozen`, and that a test moves at will."""

    __test__ = False  # not a pytest test class

    def __init__(self, start_ms: int = TEST_EPOCH_MS, *, frozen: bool = False) -> None:
        self._lock = threading.Lock()
        self._base = int(start_ms)
        self._origin = time.monotonic()
        self._frozen = frozen

    def _elapsed(self) -> int:
        return 0 if self._frozen else int((time.monotonic() - self._origin) * 1000)

    def __call__(self) -> int:
        with self._lock:
            return self._base + self._elapsed()

    def now(self) -> int:
        """The time now, integer ms since the Unix epoch."""
        return self()

    def advance(self, ms: int) -> int:
        """Moves the clock `ms` forward (past the TTL, past the retention); the new time."""
        if not isinstance(ms, int) or ms < 0:
            raise ValueError("advance(ms): a non-negative integer")
        with self._lock:
            self._base += ms
            return self._base + self._elapsed()

    def set(self, ms: int) -> int:
        """Sets the clock to `ms` (it keeps running from there unless frozen)."""
        with self._lock:
            self._base = int(ms)
            self._origin = time.monotonic()
            return self._base


@dataclass(frozen=True)
class Row:
    """One row of the ledger, as the core stored it."""

    principal: str
    key: str
    #: "pending" (a handler owns it, or it was left behind) or "completed".
    status: str
    #: Bumped by every takeover; a completion is fenced by it.
    generation: int
    fingerprint: str
    response_status: Optional[int]
    response_body: Optional[str]
    created_at: int
    updated_at: int


_COLUMNS = "principal, key, status, generation, fingerprint, response_status, response_body, created_at, updated_at"


class TestLedger:
    """A ledger for tests: a `Ledger` on a SQLite file in a fresh temporary
    directory (removed by `close()`; a file rather than ":memory:" so every
    thread's connection and a transactional handler's see the same data), on
    a `TestClock`, migrated. `settings` are the `Ledger` settings
    (`wait_ms=`, `pending_ttl_ms=`, `on_server_error=`, ...)."""

    __test__ = False  # not a pytest test class

    def __init__(self, *, clock: Optional[TestClock] = None, **settings: Any) -> None:
        self.clock = clock if clock is not None else TestClock()
        self._dir = tempfile.TemporaryDirectory(prefix="idempotency-ledger-test")
        #: The SQLite file: open it for your own tables (a transactional
        #: handler's writes commit here) or to look around.
        self.path = os.path.join(self._dir.name, "ledger.sqlite")
        #: The ledger to build your app with.
        self.ledger = Ledger(self.path, clock=self.clock, **settings)
        self.ledger.migrate()

    def rows(self) -> list[Row]:
        """Every row, ordered by principal and key."""
        return self._select("ORDER BY principal, key", ())

    def row(self, principal: str, key: str) -> Optional[Row]:
        """The row of (principal, key), or None."""
        found = self._select("WHERE principal = ? AND key = ?", (principal, key))
        return found[0] if found else None

    def sweep(self) -> int:
        """Sweeps what is past the retention at the clock's now; the rows deleted."""
        return self.ledger.sweep_all()

    def close(self) -> None:
        self.ledger.close()
        self._dir.cleanup()

    def __enter__(self) -> "TestLedger":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _select(self, where: str, params: tuple[Any, ...]) -> list[Row]:
        with sqlite3.connect(self.path) as conn:
            found = conn.execute(f"SELECT {_COLUMNS} FROM idempotency_keys {where}", params).fetchall()
        return [Row(*r) for r in found]


def fire_duplicates(n: int, send: Callable[[int], T]) -> list[Union[T, BaseException]]:
    """Calls `send(i)` for i in 0..n on n threads released at once (a
    barrier); the n results in order, an exception in the place of a call
    that raised."""
    if not isinstance(n, int) or n < 1:
        raise ValueError("fire_duplicates(n, send): n is a positive integer")
    barrier = threading.Barrier(n)
    results: list[Any] = [None] * n

    def run(i: int) -> None:
        barrier.wait()
        try:
            results[i] = send(i)
        except BaseException as error:  # noqa: BLE001 - handed back to the test
            results[i] = error

    threads = [threading.Thread(target=run, args=(i,), name=f"duplicate-{i}") for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


async def fire_duplicates_async(n: int, send: Callable[[int], Awaitable[T]]) -> list[Union[T, BaseException]]:
    """`fire_duplicates` for coroutines: all n started in the same turn of
    the event loop (asyncio.gather), an exception in the place of a call
    that raised."""
    if not isinstance(n, int) or n < 1:
        raise ValueError("fire_duplicates_async(n, send): n is a positive integer")
    return await asyncio.gather(*(send(i) for i in range(n)), return_exceptions=True)
