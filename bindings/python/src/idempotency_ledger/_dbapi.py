"""Bring your own connection: ledger batches run in Python on a DB-API
connection (sqlite3, psycopg, or any driver whose paramstyle matches the
dialect's placeholders: `?` for sqlite, `$n` for postgres).

The callback only runs SQL and reports what the driver said: a failure is
`BatchFailure("database", <the driver's code>, <its message>)` (sqlite3's
`sqlite_errorname`, psycopg's `sqlstate`), and the core classifies it.

A transactional handler's transaction (docs/SPEC.md 10.2) opens on that same
connection (`transaction()`): the connection is held for it from `begin()`
to `commit()` or `rollback()`, so no other request's batch runs inside it
(they wait, as SQLite's single writer makes them wait anyway).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from typing import Any, Callable, Optional, Sequence

from ._native import BatchFailure

Statement = tuple[str, Sequence[Any]]
StatementResult = tuple[list[tuple[Any, ...]], int]
BatchFn = Callable[[Sequence[Statement]], Any]


def driver_code(error: BaseException) -> Optional[str]:
    """The driver's own error code, as it gave it (never interpreted here)."""
    for attribute in ("sqlite_errorname", "sqlstate", "pgcode"):
        code = getattr(error, attribute, None)
        if isinstance(code, str) and code:
            return code
    code = getattr(error, "sqlite_errorcode", None)
    return str(code) if isinstance(code, int) else None


def _text_factory(raw: bytes) -> Any:
    # TEXT that is not UTF-8 goes to the core as a blob: it reports the row
    # as corrupt instead of the host mangling it.
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw


class _Forked:
    """A connection opened before fork() must not be used by the child."""

    def __init__(self) -> None:
        self.pid = os.getpid()

    def check(self) -> None:
        if os.getpid() != self.pid:
            raise BatchFailure(
                "unreachable",
                None,
                "this connection was opened before fork(); a forked worker must open its own (build the Ledger after the fork)",
            )


class _Held:
    """A handler's transaction on a connection a batch object serialises:
    the connection is held (its lock taken) from `begin()` until the
    transaction ends, `commit()` or `rollback()` (a commit that failed with
    the transaction still open keeps it for the rollback that follows)."""

    def __init__(self, batch: Any) -> None:
        self._batch = batch
        self.connection = batch.connection
        self._held = False

    def _take(self) -> None:
        self._batch._fork.check()
        self._batch._lock.acquire()
        self._held = True

    def _release(self) -> None:
        if self._held:
            self._held = False
            self._batch._lock.release()


class SqliteTransaction(_Held):
    """A handler's transaction on the caller's `sqlite3.Connection`: a plain
    (deferred) `BEGIN`, the handler's writes and the core's completion on
    the connection, then `COMMIT` or `ROLLBACK`."""

    def begin(self) -> None:
        self._take()
        conn = self.connection
        try:
            if conn.in_transaction:
                raise BatchFailure("host", None, "the sqlite3 connection is already inside a transaction (one the application left open)")
            conn.execute("BEGIN")
        except sqlite3.Error as error:
            self._release()
            raise BatchFailure("database", driver_code(error), str(error)) from error
        except BaseException:
            self._release()
            raise

    def execute(self, statements: Sequence[Statement]) -> list[StatementResult]:
        conn = self.connection
        results: list[StatementResult] = []
        for sql, params in statements:
            before = conn.total_changes
            try:
                rows = conn.execute(sql, params).fetchall()
            except sqlite3.Error as error:
                raise BatchFailure("database", driver_code(error), str(error)) from error
            results.append((rows, conn.total_changes - before))
        return results

    def commit(self) -> None:
        try:
            self.connection.execute("COMMIT")
        except sqlite3.Error as error:
            # SQLite keeps the transaction after a COMMIT that failed busy:
            # still held, for the rollback the exchange asks next.
            raise BatchFailure("database", driver_code(error), str(error)) from error
        self._release()

    def rollback(self) -> None:
        try:
            if self.connection.in_transaction:
                self.connection.execute("ROLLBACK")
        except sqlite3.Error:
            pass
        finally:
            self._release()


class DbapiTransaction(_Held):
    """A handler's transaction on any DB-API 2.0 connection: the driver's
    implicit transaction, `commit()` or `rollback()`."""

    def begin(self) -> None:
        self._take()

    def execute(self, statements: Sequence[Statement]) -> list[StatementResult]:
        try:
            return _run_cursor(self.connection.cursor(), statements)
        except Exception as error:
            raise BatchFailure("database", driver_code(error), str(error) or type(error).__name__) from error

    def commit(self) -> None:
        try:
            self.connection.commit()
        except Exception as error:
            raise BatchFailure("database", driver_code(error), str(error) or type(error).__name__) from error
        self._release()

    def rollback(self) -> None:
        try:
            self.connection.rollback()
        except Exception:
            pass
        finally:
            self._release()


def _run_cursor(cursor: Any, statements: Sequence[Statement]) -> list[StatementResult]:
    results: list[StatementResult] = []
    for sql, params in statements:
        cursor.execute(sql, list(params))
        if cursor.description is None:
            results.append(([], max(int(cursor.rowcount), 0)))
        else:
            rows = [tuple(r) for r in cursor.fetchall()]
            verb = sql.lstrip()[:6].upper()
            results.append((rows, 0 if verb == "SELECT" else max(int(cursor.rowcount), 0)))
    return results


class _OneConnectionBatch:
    """Batches on one connection the caller brought: serialised by a lock
    (which a handler's transaction, `_Held`, takes too) and refused in a
    forked child. A subclass runs one batch on the connection (`_run`)."""

    #: One connection: a handler's transaction holds it (renewals skip it meanwhile).
    one_connection = True

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self._lock = threading.Lock()
        self._fork = _Forked()

    def __call__(self, statements: Sequence[Statement]) -> list[StatementResult]:
        self._fork.check()
        with self._lock:
            return self._run(self.connection, statements)

    def _run(self, conn: Any, statements: Sequence[Statement]) -> list[StatementResult]:
        raise NotImplementedError


class SqliteConnectionBatch(_OneConnectionBatch):
    """Batches on one `sqlite3.Connection` (serialised by a lock): each is one
    `BEGIN IMMEDIATE` ... `COMMIT` transaction, rolled back on any error."""

    def transaction(self) -> SqliteTransaction:
        """A transactional handler's transaction on this connection."""
        return SqliteTransaction(self)

    def _run(self, conn: Any, statements: Sequence[Statement]) -> list[StatementResult]:
        try:
            factory = conn.text_factory
        except sqlite3.Error as error:
            raise BatchFailure("database", driver_code(error), str(error)) from error
        conn.text_factory = _text_factory
        began = False
        try:
            conn.execute("BEGIN IMMEDIATE")
            began = True
            results: list[StatementResult] = []
            for sql, params in statements:
                before = conn.total_changes
                rows = conn.execute(sql, params).fetchall()
                results.append((rows, conn.total_changes - before))
            conn.execute("COMMIT")
            return results
        except BaseException as error:
            try:
                if began and conn.in_transaction:  # never a transaction the caller left open
                    conn.execute("ROLLBACK")
            except Exception:
                pass
            if isinstance(error, sqlite3.Error):
                raise BatchFailure("database", driver_code(error), str(error)) from error
            raise
        finally:
            try:
                conn.text_factory = factory
            except sqlite3.Error:
                pass


class DbapiConnectionBatch(_OneConnectionBatch):
    """Batches on any DB-API 2.0 connection (serialised by a lock): the
    statements on one cursor, then `commit()`; `rollback()` on any error."""

    def transaction(self) -> DbapiTransaction:
        """A transactional handler's transaction on this connection."""
        return DbapiTransaction(self)

    def _run(self, conn: Any, statements: Sequence[Statement]) -> list[StatementResult]:
        try:
            results = _run_cursor(conn.cursor(), statements)
            conn.commit()
            return results
        except Exception as error:
            try:
                conn.rollback()
            except Exception:
                pass
            raise BatchFailure("database", driver_code(error), str(error) or type(error).__name__) from error


_ROLLBACK_JOURNALS = ("delete", "truncate", "persist")


def journal_advice(connection: sqlite3.Connection) -> Optional[str]:
    """A warning for a ledger on `connection` when its main database is a
    file in a rollback-journal mode (what `sqlite3.connect` opens): every
    ledger commit then writes and syncs a journal file beside the database
    (a new key commits twice), which WAL does not. None otherwise."""
    try:
        path = next((row[2] for row in connection.execute("PRAGMA database_list") if row[1] == "main"), "")
        mode = str(connection.execute("PRAGMA journal_mode").fetchone()[0]).lower()
    except sqlite3.Error:
        return None  # a closed connection: its batches fail on their own
    if not path or mode not in _ROLLBACK_JOURNALS:
        return None
    return (
        f"the sqlite3 connection to {path} is in journal_mode={mode} (what sqlite3.connect opens): every ledger commit "
        "writes and syncs a rollback journal, twice per new key. Run connection.execute('PRAGMA journal_mode=WAL') once, "
        "or give the Ledger the path (Ledger(path) opens the file in WAL mode)."
    )


def connection_batch(connection: Any, dialect: Optional[str], *, busy_timeout_ms: int = 5000) -> tuple[BatchFn, str]:
    """The batch callback and the dialect for a connection the caller brought
    (`busy_timeout_ms`: a psycopg connection's `lock_timeout` per batch; a
    sqlite3 connection keeps its own timeout)."""
    if isinstance(connection, sqlite3.Connection) or hasattr(connection, "total_changes"):
        if dialect not in (None, "sqlite"):
            raise ValueError("a sqlite3 connection speaks the sqlite dialect")
        advice = journal_advice(connection) if isinstance(connection, sqlite3.Connection) else None
        if advice is not None:
            logging.getLogger("idempotency_ledger").warning(advice)
        return SqliteConnectionBatch(connection), "sqlite"
    module = type(connection).__module__.split(".")[0]
    if module == "psycopg":
        from .postgres import ConnectionBatch

        return ConnectionBatch(connection, busy_timeout_ms=busy_timeout_ms), "postgres"
    if not callable(getattr(connection, "cursor", None)):
        raise TypeError(
            "Ledger takes a SQLite path, a sqlite3 or DB-API connection, or a psycopg_pool.ConnectionPool "
            f"(use Ledger.postgres(url) for PostgreSQL by URL); got {type(connection).__name__}"
        )
    return DbapiConnectionBatch(connection), dialect or "sqlite"
