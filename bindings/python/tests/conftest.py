"""Shared fixtures: real SQLite files in tmp_path, a manual clock, counting mutations."""

from __future__ import annotations

import os
import sqlite3
import sys
from pathlib import Path
from typing import Any, Callable

import pytest

import idempotency_ledger
from idempotency_ledger import Ledger, MutationResponse

REPO = Path(__file__).resolve().parents[3]
VECTORS = REPO / "conformance" / "vectors.json"

T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z in ms

COLUMNS = (
    "principal", "key", "fingerprint", "status", "generation",
    "response_status", "response_body", "response_headers", "created_at", "updated_at",
)


def pytest_report_header(config: Any) -> list[str]:
    return [f"idempotency_ledger from {os.path.dirname(idempotency_ledger.__file__)}", f"python {sys.version.split()[0]}"]


class ManualClock:
    """Unix milliseconds that move only when told to."""

    def __init__(self, now: int = T0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


class Mutation:
    """A mutation that counts its runs and records them in the database file
    (a separate sqlite3 connection, like an application's own write)."""

    def __init__(self, db_path: Path | None = None, status: int = 201, body: Any = '{"order":"o_1"}', headers: Any = None) -> None:
        self.calls = 0
        self.db_path = db_path
        self.status = status
        self.body = body
        self.headers = headers if headers is not None else [("Content-Type", "application/json"), ("Location", "/orders/o_1")]

    def __call__(self) -> MutationResponse:
        self.calls += 1
        if self.db_path is not None:
            conn = sqlite3.connect(self.db_path, timeout=10)
            with conn:
                conn.execute("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, note TEXT)")
                conn.execute("INSERT INTO orders (note) VALUES ('made')")
            conn.close()
        return MutationResponse(self.status, self.headers, self.body)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "ledger.sqlite"


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def ledger(db_path: Path, clock: ManualClock) -> Any:
    with Ledger(db_path, clock=clock) as ledger:
        ledger.migrate()
        yield ledger


def rows(db_path: Path) -> list[dict[str, Any]]:
    conn = sqlite3.connect(db_path)
    try:
        conn.text_factory = lambda b: b.decode("utf-8", "replace")
        cur = conn.execute(f"SELECT {', '.join(COLUMNS)} FROM idempotency_keys ORDER BY principal, key")
        out = []
        for r in cur.fetchall():
            out.append({c: ({"blob": len(v)} if isinstance(v, bytes) else v) for c, v in zip(COLUMNS, r)})
        return out
    finally:
        conn.close()


def insert_rows(db_path: Path, items: list[dict[str, Any]]) -> None:
    conn = sqlite3.connect(db_path)
    try:
        with conn:
            for row in items:
                for value in row.values():
                    assert value is None or isinstance(value, (str, int)) and not isinstance(value, bool), row
                conn.execute(
                    f"INSERT INTO idempotency_keys ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})",
                    [row[c] for c in COLUMNS],
                )
    finally:
        conn.close()


def order_count(db_path: Path) -> int:
    conn = sqlite3.connect(db_path, timeout=10)
    try:
        exists = conn.execute("SELECT count(*) FROM sqlite_master WHERE name = 'orders'").fetchone()[0]
        return conn.execute("SELECT count(*) FROM orders").fetchone()[0] if exists else 0
    finally:
        conn.close()


def post(ledger: Ledger, key: str | None, mutation: Callable[[], Any], *, body: bytes = b'{"sku":"A-1"}', principal: str = "acct-1",
         path: str = "/orders", method: str = "POST", headers: list[tuple[str, str]] | None = None) -> Any:
    hs = [("Content-Type", "application/json")] if headers is None else list(headers)
    if key is not None:
        hs.append(("Idempotency-Key", key))
    return ledger.handle(principal, method, path, hs, body, mutation)


class ConnectionProxy:
    """A real sqlite3 connection that counts statements and injects faults.

    `faults` holds exceptions raised by the next execute() calls (one each);
    `before` may run extra SQL on the real connection before a statement
    whose text contains a marker (to stage races such as a vanished row).
    """

    _own = ("_conn", "executes", "faults", "before", "statements")

    def __init__(self, path: Path, **kwargs: Any) -> None:
        kwargs.setdefault("isolation_level", None)
        kwargs.setdefault("check_same_thread", False)
        kwargs.setdefault("timeout", 5)
        object.__setattr__(self, "_conn", sqlite3.connect(path, **kwargs))
        object.__setattr__(self, "executes", 0)
        object.__setattr__(self, "faults", [])
        object.__setattr__(self, "before", [])
        object.__setattr__(self, "statements", [])

    def execute(self, sql: str, params: Any = ()) -> Any:
        object.__setattr__(self, "executes", self.executes + 1)
        self.statements.append(sql)
        if self.faults:
            raise self.faults.pop(0)
        for marker, extra in list(self.before):
            if marker in sql:
                self.before.remove((marker, extra))
                self._conn.execute(extra)
        return self._conn.execute(sql, params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._own:
            object.__setattr__(self, name, value)
        else:
            setattr(self._conn, name, value)
