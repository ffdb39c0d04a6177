"""PostgreSQL on your own psycopg 3 pool (`Ledger(psycopg_pool.ConnectionPool)`)
or connection: each ledger batch borrows a connection and runs as ONE READ
COMMITTED transaction in one network round trip (pipeline mode: BEGIN, the
core's statements with their `$n` placeholders unchanged through
`psycopg.RawCursor`, COMMIT, then a single Sync).

Importing this module needs psycopg (the `postgres` extra). For PostgreSQL by
URL, `Ledger.postgres(url)` uses the Rust crate's own pool instead and needs
no Python driver at all.

A transactional handler's transaction (docs/SPEC.md 10.2) opens on a
connection of the pool (or on your connection), kept for the request from
`begin()` to `commit()` or `rollback()`: psycopg's own transaction (not
autocommit) at READ COMMITTED, so a `with conn.transaction():` in the handler
is a savepoint inside it, and the handler writes through
`HandlerTransaction.connection` with psycopg's placeholders as usual.

The callback reports what happened as the driver saw it (`BatchFailure`):
the server's error with its SQLSTATE, an exhausted pool, an unreachable
server, or a connection lost after the batch was sent (its commit unknown).
The core classifies; nothing here decides what an error means.
"""

from __future__ import annotations

import logging
import os
import select
import threading
from decimal import Decimal
from typing import Any, Sequence

import psycopg
from psycopg import pq
from psycopg.rows import tuple_row
from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout

from ._native import BatchFailure

log = logging.getLogger("idempotency_ledger")

Statement = tuple[str, Sequence[Any]]
StatementResult = tuple[list[list[Any]], int]

_IDLE = pq.TransactionStatus.IDLE
_CONN_OK = pq.ConnStatus.OK


def _message(error: BaseException) -> str:
    return str(error).strip() or type(error).__name__


def lock_timeout_literal(ms: int) -> str:
    """`SET LOCAL lock_timeout` for `ms` milliseconds; 0 (do not wait) is
    '1ms', since PostgreSQL reads 0 as "wait forever" (the Rust crate rounds
    0 up to 1 ms the same way for `Ledger.postgres`)."""
    if isinstance(ms, bool) or not isinstance(ms, int) or ms < 0:
        raise ValueError("busy_timeout_ms must be a non-negative int")
    if ms == 0:
        return "1ms"
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def _value(v: Any) -> Any:
    if v is None or type(v) in (int, float, str, bytes):
        return v
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, Decimal):
        return int(v) if v == v.to_integral_value() else float(v)
    if isinstance(v, (bytearray, memoryview)):
        return bytes(v)
    if isinstance(v, (int, float, str)):
        return v
    # Not a column type of the ledger's schema: the server's word for it is
    # 42804 (datatype mismatch), as the Rust backend reports it.
    raise BatchFailure("database", "42804", f"the ledger table returned a {type(v).__name__} column")


def _socket_readable(fd: int) -> bool:
    poll = getattr(select, "poll", None)
    if poll is not None:
        p = poll()
        p.register(fd, select.POLLIN | select.POLLERR | select.POLLHUP)
        return bool(p.poll(0))
    readable, _, _ = select.select([fd], [], [], 0)
    return bool(readable)


def _stale(conn: "psycopg.Connection[Any]") -> bool:
    """True when a pooled connection is known to be dead before anything is
    sent on it (closed, or terminated by the server while idle)."""
    try:
        if conn.closed or conn.pgconn.status != _CONN_OK:
            return True
        if not _socket_readable(conn.fileno()):
            return False
        fatal: list[str] = []

        def on_notice(diag: psycopg.errors.Diagnostic) -> None:
            if (diag.severity_nonlocalized or diag.severity or "") in ("FATAL", "PANIC"):
                fatal.append(diag.sqlstate or "")

        conn.add_notice_handler(on_notice)
        try:
            for _ in range(4):
                conn.pgconn.consume_input()
                conn.pgconn.is_busy()
                if fatal or conn.pgconn.status != _CONN_OK:
                    return True
                if not _socket_readable(conn.fileno()):
                    return False
        finally:
            conn.remove_notice_handler(on_notice)
        return False
    except Exception:
        return True


def _failure(error: BaseException, sent: bool) -> BatchFailure:
    if isinstance(error, BatchFailure):
        return error
    sqlstate = getattr(error, "sqlstate", None)
    if isinstance(sqlstate, str) and sqlstate:
        return BatchFailure("database", sqlstate, _message(error))
    if isinstance(error, psycopg.Error):
        # No SQLSTATE: the connection failed under us.
        return BatchFailure("outcome-unknown" if sent else "unreachable", None, f"postgres: {_message(error)}")
    return BatchFailure("host", None, f"{type(error).__name__}: {_message(error)}")


def run_on(conn: "psycopg.Connection[Any]", statements: Sequence[Statement], prelude: Sequence[str]) -> list[StatementResult]:
    """The batch as one transaction in one round trip on `conn` (autocommit)."""
    sent = False
    try:
        if conn.info.transaction_status != _IDLE:
            raise BatchFailure("host", None, "the connection was handed out inside a transaction")
        cursors: list[psycopg.RawCursor[tuple[Any, ...]]] = []
        sent = True
        with conn.pipeline():
            for sql in prelude:
                psycopg.RawCursor(conn, row_factory=tuple_row).execute(sql)
            for sql, params in statements:
                cur = psycopg.RawCursor(conn, row_factory=tuple_row)
                cur.execute(sql, list(params))
                cursors.append(cur)
            psycopg.RawCursor(conn, row_factory=tuple_row).execute("COMMIT")
        results: list[StatementResult] = []
        for cur in cursors:
            rows = [] if cur.description is None else [[_value(v) for v in row] for row in cur.fetchall()]
            tag = (cur.statusmessage or "").split(" ", 1)[0].upper()
            changes = max(cur.rowcount, 0) if tag in ("INSERT", "UPDATE", "DELETE", "MERGE") else 0
            results.append((rows, changes))
        return results
    except BaseException as error:
        if isinstance(error, Exception):
            raise _failure(error, sent) from error
        raise


def _discards(failure: BatchFailure) -> bool:
    """The connection must leave the pool: its server refuses writes on it
    (25006: a standby, as a primary that failed over becomes), or reports it
    broken (class 08) or shutting down (57P01-57P03). The same rule as the
    Rust crate's pool."""
    kind, code = failure.args[0], failure.args[1]
    return kind == "database" and isinstance(code, str) and (code == "25006" or code.startswith("08") or code in ("57P01", "57P02", "57P03"))


def _give_back(pool: ConnectionPool[Any], conn: "psycopg.Connection[Any]", restore_autocommit: bool) -> None:
    """Returns `conn` to the pool idle, or closed (the pool then replaces it)."""
    try:
        if not conn.closed and conn.pgconn.status == _CONN_OK:
            if conn.info.transaction_status != _IDLE:
                conn.rollback()
            if restore_autocommit:
                conn.autocommit = False
            if conn.info.transaction_status != _IDLE:
                conn.close()
        elif not conn.closed:
            conn.close()
    except Exception:
        try:
            conn.close()
        except Exception:
            pass
    pool.putconn(conn)


def _timed_out(pool: ConnectionPool[Any], error: PoolTimeout, failed_before: int) -> BatchFailure:
    """What a pool that gave no connection in time saw: a server it could
    not connect to (a connection attempt failed while we waited, or it never
    made one, or it could still grow: unreachable), or every connection in
    use (exhausted)."""
    stats = pool.get_stats()
    failed, made = stats.get("connections_errors", 0), stats.get("connections_num", 0)
    if failed > failed_before or (failed and not made) or stats.get("pool_size", 0) < pool.max_size:
        return BatchFailure("unreachable", None, f"{_message(error)} (the pool could not open a connection)")
    return BatchFailure("pool-exhausted", None, f"{_message(error)} (all {pool.max_size} connections in use)")


class PsycopgTransaction:
    """A handler's transaction on a psycopg connection: `acquire()` gives
    the connection (and `release(conn)` takes it back, from `commit()` or
    `rollback()`), which is put out of autocommit at READ COMMITTED with the
    ledger's lock timeout for the transaction, then restored."""

    def __init__(self, acquire: Any, release: Any, lock_timeout: str) -> None:
        self._acquire = acquire
        self._release = release
        self._lock_timeout = lock_timeout
        self.connection: "psycopg.Connection[Any] | None" = None
        self._restore: tuple[bool, Any] = (True, None)

    def begin(self) -> None:
        conn = self._acquire()
        refused = None
        if conn.closed:
            refused = BatchFailure("unreachable", None, "the psycopg connection is closed")
        elif conn.info.transaction_status != _IDLE:
            refused = BatchFailure("host", None, "the psycopg connection is already inside a transaction (one the application left open)")
        if refused is not None:
            self._release(conn)
            raise refused
        self._restore = (conn.autocommit, conn.isolation_level)
        self.connection = conn
        try:
            conn.autocommit = False
            conn.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
            # psycopg opens the transaction with its first statement.
            conn.execute(f"SET LOCAL lock_timeout = '{self._lock_timeout}'")
        except BaseException as error:
            self._end(rollback=True)
            if not isinstance(error, Exception):
                raise
            raise _failure(error, False) from error

    def execute(self, statements: Sequence[Statement]) -> list[StatementResult]:
        conn = self.connection
        if conn is None:
            raise BatchFailure("host", None, "no transaction is open")
        results: list[StatementResult] = []
        try:
            for sql, params in statements:
                cur = psycopg.RawCursor(conn, row_factory=tuple_row)
                cur.execute(sql, list(params))
                rows = [] if cur.description is None else [[_value(v) for v in row] for row in cur.fetchall()]
                tag = (cur.statusmessage or "").split(" ", 1)[0].upper()
                changes = max(cur.rowcount, 0) if tag in ("INSERT", "UPDATE", "DELETE", "MERGE") else 0
                results.append((rows, changes))
        except BatchFailure:
            raise
        except Exception as error:
            # Nothing commits before COMMIT: a lost connection lost the transaction.
            raise _failure(error, False) from error
        return results

    def commit(self) -> None:
        conn = self.connection
        if conn is None:
            raise BatchFailure("host", None, "no transaction is open")
        try:
            conn.commit()
        except Exception as error:
            failure = _failure(error, True)
            if failure.args[0] != "database":
                self._end(rollback=False)  # the connection broke: the transaction is gone with it
            raise failure from error
        self._end(rollback=False)

    def rollback(self) -> None:
        self._end(rollback=True)

    def _end(self, *, rollback: bool) -> None:
        conn, self.connection = self.connection, None
        if conn is None:
            return
        try:
            if rollback and not conn.closed:
                conn.rollback()
            if not conn.closed and conn.info.transaction_status == _IDLE:
                conn.autocommit, conn.isolation_level = self._restore
        except Exception:
            pass
        finally:
            self._release(conn)


class PoolBatch:
    """Batches on connections borrowed from a `psycopg_pool.ConnectionPool`
    (thread-safe: each batch takes its own connection and gives it back)."""

    #: Many connections: a handler's transaction keeps one, renewals use others.
    one_connection = False

    def __init__(self, pool: ConnectionPool[Any], *, busy_timeout_ms: int = 5000) -> None:
        if not isinstance(pool, ConnectionPool):
            raise TypeError("Ledger needs a psycopg_pool.ConnectionPool (the ledger is synchronous), not an AsyncConnectionPool")
        self.pool = pool
        self._pid = os.getpid()
        self._lock_timeout = lock_timeout_literal(busy_timeout_ms)
        self._prelude = ("BEGIN ISOLATION LEVEL READ COMMITTED", f"SET LOCAL lock_timeout = '{self._lock_timeout}'")

    def _getconn(self) -> "psycopg.Connection[Any]":
        pool = self.pool
        for _ in range((pool.max_size or 1) + 1):
            failed_before = pool.get_stats().get("connections_errors", 0)
            try:
                conn: psycopg.Connection[Any] = pool.getconn()
            except PoolTimeout as error:
                raise _timed_out(pool, error, failed_before) from error
            except PoolClosed as error:
                raise BatchFailure("unreachable", None, f"the psycopg pool is closed: {_message(error)}") from error
            if not _stale(conn):
                return conn
            log.info("discarding a PostgreSQL connection the server closed while it was idle")
            try:
                conn.close()
            finally:
                pool.putconn(conn)
        raise BatchFailure("unreachable", None, "every pooled PostgreSQL connection was found closed by the server")

    def transaction(self) -> PsycopgTransaction:
        """A transactional handler's transaction on a connection of the pool
        (borrowed at `begin()`, given back when it ends)."""
        return PsycopgTransaction(self._borrow, self._give_back, self._lock_timeout)

    def _borrow(self) -> "psycopg.Connection[Any]":
        self._check_fork()
        return self._getconn()

    def _give_back(self, conn: "psycopg.Connection[Any]") -> None:
        _give_back(self.pool, conn, False)

    def _check_fork(self) -> None:
        if os.getpid() != self._pid and not self.pool.closed:
            raise BatchFailure(
                "unreachable",
                None,
                "this psycopg pool was opened before fork(); open the pool in each worker process "
                "(ConnectionPool(..., open=False) and pool.open() after the fork)",
            )

    def __call__(self, statements: Sequence[Statement]) -> list[StatementResult]:
        self._check_fork()
        conn = self._getconn()
        restore = False
        try:
            if not conn.autocommit:
                conn.autocommit = True
                restore = True
            return run_on(conn, statements, self._prelude)
        except BatchFailure as failure:
            if _discards(failure):
                conn.close()  # closed, the pool replaces it instead of lending it again
            raise
        except Exception as error:
            classified = _failure(error, False)
            if _discards(classified):
                conn.close()
            raise classified from error
        finally:
            _give_back(self.pool, conn, restore)


class ConnectionBatch:
    """Batches on one psycopg connection (serialised by a lock)."""

    #: One connection: a handler's transaction holds it (renewals skip it meanwhile).
    one_connection = True

    def __init__(self, connection: "psycopg.Connection[Any]", *, busy_timeout_ms: int = 5000) -> None:
        self.connection = connection
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._lock_timeout = lock_timeout_literal(busy_timeout_ms)
        self._prelude = ("BEGIN ISOLATION LEVEL READ COMMITTED", f"SET LOCAL lock_timeout = '{self._lock_timeout}'")

    def transaction(self) -> PsycopgTransaction:
        """A transactional handler's transaction on this connection (held
        for it: no other batch runs on the connection meanwhile)."""
        return PsycopgTransaction(self._hold, self._let_go, self._lock_timeout)

    def _hold(self) -> "psycopg.Connection[Any]":
        if os.getpid() != self._pid:
            raise BatchFailure("unreachable", None, "this psycopg connection was opened before fork()")
        self._lock.acquire()
        return self.connection

    def _let_go(self, conn: "psycopg.Connection[Any]") -> None:
        self._lock.release()

    def __call__(self, statements: Sequence[Statement]) -> list[StatementResult]:
        if os.getpid() != self._pid:
            raise BatchFailure("unreachable", None, "this psycopg connection was opened before fork()")
        with self._lock:
            conn = self.connection
            if conn.closed:
                raise BatchFailure("unreachable", None, "the psycopg connection is closed")
            restore = not conn.autocommit
            try:
                if restore:
                    conn.autocommit = True
                return run_on(conn, statements, self._prelude)
            finally:
                try:
                    if not conn.closed and conn.info.transaction_status != _IDLE:
                        conn.rollback()
                    if restore and not conn.closed:
                        conn.autocommit = False
                except Exception:
                    pass


def open_pool(conninfo: str = "", *, min_size: int = 1, max_size: int = 10, timeout: float = 5.0, **pool_options: Any) -> ConnectionPool[Any]:
    """A `ConnectionPool` set up for the ledger (autocommit connections),
    opened without waiting for the first connection."""
    kwargs = dict(pool_options.pop("kwargs", None) or {})
    kwargs.setdefault("autocommit", True)
    return ConnectionPool(conninfo, min_size=min_size, max_size=max_size, timeout=timeout, kwargs=kwargs, open=True, **pool_options)


__all__ = ["ConnectionBatch", "PoolBatch", "PsycopgTransaction", "lock_timeout_literal", "open_pool", "run_on"]
