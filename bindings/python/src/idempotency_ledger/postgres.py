"""The ledger import over PostgreSQL with psycopg 3 and `psycopg_pool`.

Each batch borrows one connection from a `psycopg_pool.ConnectionPool` and
runs as ONE transaction, sent in ONE network round trip (psycopg's pipeline
mode: every message goes out, then a single Sync is waited for):

    BEGIN ISOLATION LEVEL READ COMMITTED
    SET LOCAL lock_timeout = '5s'          -- the Ledger's busy_timeout_ms
    <the core's statements, $n placeholders passed unchanged (RawCursor)>
    COMMIT

Failures become the WIT `ledger-error` cases (`BatchError`); nothing raises
out of `execute_batch` otherwise. A connection is always handed back to the
pool idle (rolled back) or closed, so the pool discards it.

psycopg is an optional dependency (`pip install 'idempotency-ledger[postgres]'`):
`import idempotency_ledger` never imports it; this module is imported when a
PostgreSQL ledger is built (or when you import it yourself).
"""

from __future__ import annotations

import logging
import os
import select
import threading
from decimal import Decimal
from typing import Any, Callable, Mapping, Optional, Sequence

import psycopg
from psycopg import pq
from psycopg.rows import tuple_row
from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout

from ._sqlite import DEFAULT_BUSY_TIMEOUT_MS, BatchError, SqlValue, Statement, StatementResult

log = logging.getLogger("idempotency_ledger")

#: How long `Ledger.postgres` waits for a free pool connection before `busy`.
DEFAULT_POOL_TIMEOUT_S = 5.0

#: SQLSTATEs that mean "another transaction is in the way; retry later".
BUSY_SQLSTATES = frozenset({
    "40001",  # serialization_failure
    "40P01",  # deadlock_detected
    "55P03",  # lock_not_available (lock_timeout)
    "57014",  # query_canceled (statement_timeout, cancel)
    "53300",  # too_many_connections
})
#: SQLSTATEs that mean the ledger's table or columns are not what the core expects.
SCHEMA_SQLSTATES = frozenset({
    "42P01",  # undefined_table
    "42703",  # undefined_column
    "3F000",  # invalid_schema_name
})
#: SQLSTATE classes and codes that mean the database cannot be reached, read or written.
IO_SQLSTATE_CLASSES = ("08", "53", "58")  # connection exception, insufficient resources, system error
IO_SQLSTATES = frozenset({
    "57P01",  # admin_shutdown (pg_terminate_backend, server stopping)
    "57P02",  # crash_shutdown
    "57P03",  # cannot_connect_now
    "25006",  # read_only_sql_transaction (a standby)
})

_IDLE = pq.TransactionStatus.IDLE
_CONN_OK = pq.ConnStatus.OK


def _message(error: BaseException) -> str:
    text = str(error).strip()
    return text or type(error).__name__


def ledger_error(error: BaseException) -> BatchError:
    """Maps a psycopg / psycopg_pool (or any) exception onto the WIT
    `ledger-error` cases: busy, constraint, schema, io, other."""
    message = _message(error)
    sqlstate = getattr(error, "sqlstate", None)
    if isinstance(sqlstate, str) and sqlstate:
        if sqlstate in BUSY_SQLSTATES:
            return BatchError("busy", message)
        if sqlstate.startswith("23"):
            return BatchError("constraint", message)
        if sqlstate in SCHEMA_SQLSTATES:
            return BatchError("schema", message)
        if sqlstate in IO_SQLSTATES or sqlstate[:2] in IO_SQLSTATE_CLASSES:
            return BatchError("io", message)
        return BatchError("other", message)
    if isinstance(error, PoolClosed):
        return BatchError("io", message)
    if isinstance(error, (psycopg.OperationalError, psycopg.InterfaceError)):
        # No SQLSTATE: the connection failed or was closed under us.
        return BatchError("io", message)
    if isinstance(error, psycopg.Error):
        return BatchError("other", message)
    return BatchError("other", f"{type(error).__name__}: {message}")


def lock_timeout_literal(ms: int) -> str:
    """`SET LOCAL lock_timeout` value for `ms` milliseconds ('5s', '250ms').
    0 means "do not wait" as it does for SQLite's busy timeout: '1ms', since
    PostgreSQL reads a lock_timeout of 0 as "wait forever"."""
    if isinstance(ms, bool) or not isinstance(ms, int) or ms < 0:
        raise ValueError("busy_timeout_ms must be a non-negative int")
    if ms == 0:
        return "1ms"
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def _sql_value(v: Any) -> SqlValue:
    """A result column as a WIT `value` (None, int, float, str, bytes)."""
    if v is None or type(v) in (int, float, str, bytes):
        return v  # type: ignore[no-any-return]
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return int(v)
    if isinstance(v, float):
        return float(v)
    if isinstance(v, Decimal):
        return int(v) if v == v.to_integral_value() else float(v)
    if isinstance(v, str):
        return str(v)
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v)
    # A timestamp, JSON, UUID ...: not a column of the ledger's schema.
    raise BatchError("schema", f"the ledger table returned a {type(v).__name__} column; expected the schema of Ledger.schema()")


def _socket_readable(fd: int) -> bool:
    """True when the server sent something to an idle connection (a
    termination notice, EOF): checked without a round trip."""
    poll = getattr(select, "poll", None)
    if poll is not None:
        p = poll()
        p.register(fd, select.POLLIN | select.POLLERR | select.POLLHUP)
        return bool(p.poll(0))
    readable, _, _ = select.select([fd], [], [], 0)
    return bool(readable)


def _stale(conn: "psycopg.Connection[Any]") -> bool:
    """True when a pooled connection is already known to be dead: closed,
    in a bad state, or the server terminated it while it sat idle in the pool
    (pg_terminate_backend, a restart, an idle timeout). Nothing was sent on
    it, so the batch can safely go to another connection."""
    try:
        if conn.closed or conn.pgconn.status != _CONN_OK:
            return True
        if not _socket_readable(conn.fileno()):
            return False
        # A terminated backend sends a FATAL error, then closes the socket.
        # libpq hands an error that arrives while idle to the notice
        # handlers; the EOF, if it is there yet, makes consume_input raise.
        fatal: list[str] = []

        def on_notice(diag: psycopg.errors.Diagnostic) -> None:
            if (diag.severity_nonlocalized or diag.severity or "") in ("FATAL", "PANIC"):
                fatal.append(diag.sqlstate or "")

        conn.add_notice_handler(on_notice)
        try:
            for _ in range(4):
                conn.pgconn.consume_input()
                conn.pgconn.is_busy()  # parses what was read (consume_input only buffers it)
                if fatal or conn.pgconn.status != _CONN_OK:
                    return True
                if not _socket_readable(conn.fileno()):
                    return False
        finally:
            conn.remove_notice_handler(on_notice)
        return False
    except Exception:
        return True


class PostgresBackend:
    """Runs ledger batches on connections borrowed from a psycopg pool.

    Thread-safe: every batch takes its own connection from the pool and gives
    it back before returning. `owned` pools (built by `Ledger.postgres`) are
    closed by `close()`; a pool the caller passed in is left open.
    """

    def __init__(
        self,
        pool: Optional[ConnectionPool[Any]] = None,
        *,
        busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
        pool_factory: Optional[Callable[[], ConnectionPool[Any]]] = None,
    ) -> None:
        if (pool is None) == (pool_factory is None):
            raise ValueError("give exactly one of pool or pool_factory")
        if pool is not None and not isinstance(pool, ConnectionPool):
            raise TypeError(f"expected a psycopg_pool.ConnectionPool, got {type(pool).__name__}")
        self._pool = pool
        self._factory = pool_factory
        self._owned = pool_factory is not None
        self._lock = threading.Lock()
        self._closed = False
        self._broken_by_fork: Optional[str] = None
        self._abandoned: list[Any] = []
        self._prelude = (
            "BEGIN ISOLATION LEVEL READ COMMITTED",
            f"SET LOCAL lock_timeout = '{lock_timeout_literal(busy_timeout_ms)}'",
        )

    @property
    def owned(self) -> bool:
        """True when this backend built its pool (and closes it)."""
        return self._owned

    @property
    def pool(self) -> ConnectionPool[Any]:
        """The pool (an owned pool is opened on first use)."""
        pool = self._pool
        if pool is None:
            with self._lock:
                if self._closed:
                    raise PoolClosed("the ledger was closed")
                pool = self._pool
                if pool is None:
                    assert self._factory is not None
                    pool = self._pool = self._factory()
        return pool

    def close(self) -> None:
        """Closes the pool if this backend built it; a caller's pool stays open."""
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if self._owned and pool is not None:
            pool.close()
        elif pool is not None:
            self._pool = pool  # a caller's pool: keep using it if asked to

    def after_fork_in_child(self) -> None:
        """In a forked child: the parent's sockets and pool threads must not
        be used. An owned pool is abandoned (never closed: that would end the
        parent's sessions) and rebuilt on first use; a caller's pool that was
        open at fork time cannot be repaired, so batches fail closed (`io`)."""
        pool = self._pool
        if pool is None:
            return
        if self._owned:
            self._abandoned.append(pool)
            self._pool = None
            self._lock = threading.Lock()
        elif not pool.closed:
            self._broken_by_fork = (
                "this psycopg pool was opened before fork(); open the pool in each worker process "
                "(ConnectionPool(..., open=False) and pool.open() after the fork)"
            )

    # ------------------------------------------------------------------ batches

    def _getconn(self, pool: ConnectionPool[Any]) -> "psycopg.Connection[Any]":
        # A connection the server dropped while it sat in the pool is
        # replaced before anything is sent (no extra round trip). Bounded:
        # after a server restart every pooled connection may be dead.
        attempts = (pool.max_size or 1) + 1
        for _ in range(attempts):
            try:
                conn: psycopg.Connection[Any] = pool.getconn()
            except PoolTimeout as error:
                stats = pool.get_stats()
                if stats.get("pool_size", 0) >= pool.max_size:
                    # Every connection is in use: the pool is exhausted.
                    raise BatchError("busy", f"{_message(error)} (all {pool.max_size} connections in use)") from error
                raise BatchError("io", f"{_message(error)} (the pool could not open connections to the database)") from error
            if not _stale(conn):
                return conn
            log.info("[idempotency] discarding a PostgreSQL connection the server closed while it was idle")
            try:
                conn.close()
            finally:
                pool.putconn(conn)
        raise BatchError("io", "every pooled PostgreSQL connection was found closed by the server")

    def execute_batch(self, statements: Sequence[Statement]) -> list[StatementResult]:
        """Runs `statements` as ONE transaction in one round trip; raises `BatchError`."""
        if self._broken_by_fork is not None:
            raise BatchError("io", self._broken_by_fork)
        try:
            pool = self.pool
            conn = self._getconn(pool)
        except BatchError:
            raise
        except Exception as error:
            raise ledger_error(error) from error
        restore_autocommit = False
        try:
            if conn.info.transaction_status != _IDLE:
                raise BatchError("other", "a pooled connection was handed out inside a transaction")
            if not conn.autocommit:
                # psycopg would send its own BEGIN first; the batch sends its
                # own. A caller's pool gets the setting back in _give_back.
                conn.autocommit = True
                restore_autocommit = True
            return self._run(conn, statements)
        except BatchError:
            raise
        except Exception as error:
            raise ledger_error(error) from error
        finally:
            _give_back(pool, conn, restore_autocommit)

    def _run(self, conn: "psycopg.Connection[Any]", statements: Sequence[Statement]) -> list[StatementResult]:
        cursors: list[psycopg.RawCursor[tuple[Any, ...]]] = []
        with conn.pipeline():
            for sql in self._prelude:
                psycopg.RawCursor(conn, row_factory=tuple_row).execute(sql)
            for sql, params in statements:
                cur = psycopg.RawCursor(conn, row_factory=tuple_row)
                cur.execute(sql, list(params))
                cursors.append(cur)
            psycopg.RawCursor(conn, row_factory=tuple_row).execute("COMMIT")
        # Leaving the pipeline sent the one Sync and read every result.
        results: list[StatementResult] = []
        for cur in cursors:
            if cur.description is None:
                rows: list[list[SqlValue]] = []
            else:
                rows = [[_sql_value(v) for v in row] for row in cur.fetchall()]
            tag = (cur.statusmessage or "").split(" ", 1)[0].upper()
            changes = max(cur.rowcount, 0) if tag in ("INSERT", "UPDATE", "DELETE", "MERGE") else 0
            results.append((rows, changes))
        if conn.info.transaction_status != _IDLE:
            raise BatchError("other", "the batch did not end its transaction")
        return results


def _give_back(pool: ConnectionPool[Any], conn: "psycopg.Connection[Any]", restore_autocommit: bool) -> None:
    """Returns `conn` to the pool idle, or closed (the pool then discards it)."""
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
    except BaseException:
        try:
            conn.close()
        except Exception:
            pass
        pool.putconn(conn)
        raise
    pool.putconn(conn)


def open_pool(
    conninfo: str = "",
    *,
    min_size: int = 1,
    max_size: int = 10,
    timeout: float = DEFAULT_POOL_TIMEOUT_S,
    kwargs: Optional[Mapping[str, Any]] = None,
    **pool_options: Any,
) -> ConnectionPool[Any]:
    """A `ConnectionPool` set up for the ledger: autocommit connections,
    UTF-8, `application_name` idempotency-ledger unless given, opened
    without waiting for the first connection (an unreachable server shows
    up as `io` on the first request, not as an error at start-up)."""
    connect_kwargs: dict[str, Any] = {"autocommit": True, "client_encoding": "UTF8"}
    if "application_name" not in (kwargs or {}) and "application_name" not in conninfo and not os.environ.get("PGAPPNAME"):
        connect_kwargs["application_name"] = "idempotency-ledger"
    connect_kwargs.update(kwargs or {})
    return ConnectionPool(
        conninfo,
        min_size=min_size,
        max_size=max_size,
        timeout=timeout,
        kwargs=connect_kwargs,
        open=True,
        name=pool_options.pop("name", "idempotency-ledger"),
        **pool_options,
    )

