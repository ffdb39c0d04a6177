"""Exactly once (docs/SPEC.md 10): what a transactional handler writes
through, and how any handler learns that its lease was lost.

A transactional exchange (`Ledger.start(..., transactional=True)`, the
adapters' `transactional=` routes) runs its handler inside a transaction on
the ledger's own database; the core's fenced completion is the last thing
that runs in it before COMMIT, so the handler's writes commit with the
stored answer or not at all. Where that transaction lives:

- the crate's own connection (`Ledger(path)`, `Ledger.postgres(url)`):
  write with `HandlerTransaction.execute(sql, params)`;
- the connection you brought (`Ledger(sqlite3_connection)`, a psycopg
  connection or pool): `HandlerTransaction.connection` is that connection,
  inside the transaction (write with it as usual; do not commit);
- a transaction object an adapter brings per request (Django's
  `transaction.atomic`, a SQLAlchemy session's connection: see
  `idempotency_ledger.django` and `idempotency_ledger.sqlalchemy`).

A transaction object (the last two) has `begin()`, `execute(statements) ->
[(rows, changes)]` (each statement `(sql, params)` in the ledger dialect's
placeholders), `commit()` and `rollback()`, and reports what the driver
said as `BatchFailure(kind, code, message)`; the core classifies it.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any, Optional, Sequence

from ._native import BatchFailure, Exchange

__all__ = ["HandlerTransaction", "Lease", "format_placeholders"]

#: How often a waiting `Lease` looks at the flag the renewal thread sets.
POLL_SECONDS = 0.05


class Lease:
    """A running handler's lease (SPEC 10.1): while the handler runs, the
    ledger renews its reservation every `renew_every_ms` on another
    connection; `lost` turns True once a renewal found the row taken over
    by another request (or swept). The handler's answer will then not be
    stored, and a transactional handler's writes are rolled back: stop
    before any effect outside the database. With renewal off
    (`lease_renewal=False`) it never turns True."""

    def __init__(self, exchange: Exchange, renew_every_ms: Optional[int]) -> None:
        self._exchange = exchange
        self.renew_every_ms = renew_every_ms

    @property
    def lost(self) -> bool:
        return bool(self._exchange.lease_lost)

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Blocks until the lease is lost (True) or `timeout` seconds passed (False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.lost:
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(POLL_SECONDS if deadline is None else max(0.0, min(POLL_SECONDS, deadline - time.monotonic())))
        return True

    async def until_lost(self) -> None:
        """Returns once the lease is lost (never while it is held): race it
        with the handler's side effect (`asyncio.wait`, a TaskGroup) to stop
        before the effect."""
        if self.renew_every_ms is None:
            await asyncio.Event().wait()  # renewal off: never lost
        while not self.lost:
            await asyncio.sleep(POLL_SECONDS)

    def __repr__(self) -> str:
        return f"Lease(lost={self.lost}, renew_every_ms={self.renew_every_ms})"


class HandlerTransaction:
    """The transaction a transactional handler writes in (from `RunHandler`
    until the handler's end is fed to the exchange)."""

    def __init__(self, exchange: Exchange, renew_every_ms: Optional[int] = None) -> None:
        self._exchange = exchange
        #: The handler's lease (see `Lease`).
        self.lease = Lease(exchange, renew_every_ms)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> tuple[list[tuple[Any, ...]], int]:
        """One statement inside the transaction, in the ledger dialect's
        placeholders (`?` on SQLite, `$1, $2, ...` on PostgreSQL), through
        the ledger's own connection (or the transaction object in use):
        `(rows, changes)`. A failure raises `BatchFailure`."""
        rows, changes = self._exchange.execute(sql, list(params))
        return rows, changes

    @property
    def connection(self) -> Any:
        """The driver connection the transaction is open on, when it is one
        of yours (a sqlite3 or psycopg connection you gave the ledger, a
        connection of your psycopg pool, Django's connection, a SQLAlchemy
        Connection); None on the ledger's own connections."""
        return getattr(self._exchange.transaction, "connection", None)

    @property
    def session(self) -> Any:
        """The SQLAlchemy Session bound to the transaction's connection
        (`idempotency_ledger.sqlalchemy`), else None."""
        return getattr(self._exchange.transaction, "session", None)

    @property
    def lease_lost(self) -> bool:
        return self.lease.lost

    def __repr__(self) -> str:
        return f"HandlerTransaction(connection={self.connection!r}, lease_lost={self.lease_lost})"


_NUMBERED = re.compile(r"\$(\d+)")


def format_placeholders(sql: str, params: Sequence[Any], dialect: str) -> tuple[str, list[Any]]:
    """A statement of the core (`?` for sqlite, `$n` for postgres) in the
    `format` paramstyle (`%s`) that Django's cursors and psycopg's (and
    psycopg2's) client cursors take, with its parameters in order."""
    text = sql.replace("%", "%%")
    if dialect == "sqlite":
        return text.replace("?", "%s"), list(params)
    ordered: list[Any] = []

    def number(match: "re.Match[str]") -> str:
        ordered.append(params[int(match.group(1)) - 1])
        return "%s"

    return _NUMBERED.sub(number, text), ordered


def database_failure(error: BaseException, *, broken: str = "unreachable") -> BatchFailure:
    """What a driver (or a framework wrapping one: Django, SQLAlchemy)
    raised, as the driver saw it: its own code and message for a database
    error (found along `__cause__`), else a connection that failed
    (`broken`: `unreachable` before a commit was sent, `outcome-unknown`
    after)."""
    import sqlite3

    from ._dbapi import driver_code

    cause: Optional[BaseException] = error
    while cause is not None:
        code = driver_code(cause)
        if code is not None or isinstance(cause, sqlite3.Error):
            return BatchFailure("database", code, str(cause).strip() or type(cause).__name__)
        cause = cause.__cause__
    return BatchFailure(broken, None, f"{type(error).__name__}: {error}")
