"""The ledger import over the standard `sqlite3` module.

Each batch is one `BEGIN IMMEDIATE` ... `COMMIT` transaction (rolled back on
any error), so the decision batch (claim, takeover, lookup) is atomic across
connections and processes. Files opened here use WAL and a busy timeout.
"""

from __future__ import annotations

import os
import sqlite3
from typing import Any, Callable, Protocol, Sequence, Union

#: How long a writer waits for another writer's lock before `busy`.
DEFAULT_BUSY_TIMEOUT_MS = 5000

SqlValue = Union[None, int, float, str, bytes]
Statement = tuple[str, Sequence[SqlValue]]
StatementResult = tuple[list[list[SqlValue]], int]

# Primary SQLite result codes (the low byte of an extended code).
_SQLITE_PERM = 3
_SQLITE_BUSY = 5
_SQLITE_LOCKED = 6
_SQLITE_READONLY = 8
_SQLITE_IOERR = 10
_SQLITE_CORRUPT = 11
_SQLITE_FULL = 13
_SQLITE_CANTOPEN = 14
_SQLITE_CONSTRAINT = 19
_SQLITE_NOTADB = 26
_IO_CODES = {_SQLITE_PERM, _SQLITE_READONLY, _SQLITE_IOERR, _SQLITE_CORRUPT, _SQLITE_FULL, _SQLITE_CANTOPEN, _SQLITE_NOTADB}


class Backend(Protocol):
    """What a ledger backend provides: `SqliteBackend`, and `PostgresBackend`
    in `idempotency_ledger.postgres` (psycopg 3)."""

    def execute_batch(self, statements: Sequence[Statement]) -> list[StatementResult]:
        """Runs `statements` as ONE atomic transaction, one result per
        statement; raises `BatchError` (and nothing else) on failure."""
        ...

    def close(self) -> None:
        """Releases what the backend opened itself."""
        ...


class BatchError(Exception):
    """A batch failed; `reason` is the WIT `ledger-error` case
    (busy, constraint, schema, io, other). Nothing in the batch took effect."""

    def __init__(self, reason: str, message: str = "") -> None:
        super().__init__(f"{reason}: {message}" if message else reason)
        self.reason = reason
        self.message = message


class InvalidText(bytes):
    """A TEXT value that is not valid UTF-8: handed to the core as a blob, so
    it reports the row as corrupt instead of the host mangling it."""


def _text_factory(raw: bytes) -> Any:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return InvalidText(raw)


def ledger_error(error: BaseException) -> BatchError:
    """Maps a sqlite3 (or any) exception onto the WIT `ledger-error` cases."""
    message = str(error) or type(error).__name__
    code = getattr(error, "sqlite_errorcode", None)
    primary = code & 0xFF if isinstance(code, int) else None
    if primary in (_SQLITE_BUSY, _SQLITE_LOCKED) or (primary is None and "database is locked" in message):
        return BatchError("busy", message)
    if primary == _SQLITE_CONSTRAINT or isinstance(error, sqlite3.IntegrityError):
        return BatchError("constraint", message)
    if "no such table" in message or "no such column" in message or "has no column" in message:
        return BatchError("schema", message)
    if primary in _IO_CODES or "closed database" in message or "unable to open" in message:
        return BatchError("io", message)
    if isinstance(error, sqlite3.Error):
        return BatchError("other", message)
    return BatchError("other", f"{type(error).__name__}: {message}")


def connect(
    path: Union[str, "os.PathLike[str]"], busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS, check_same_thread: bool = True
) -> sqlite3.Connection:
    """Opens (creating if needed) a ledger database file in WAL mode with a
    busy timeout, in autocommit mode (the backend issues BEGIN IMMEDIATE)."""
    conn = sqlite3.connect(os.fspath(path), timeout=busy_timeout_ms / 1000.0, isolation_level=None, check_same_thread=check_same_thread)
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        conn.execute("PRAGMA journal_mode = WAL").fetchall()
        conn.execute("PRAGMA synchronous = NORMAL")
    except BaseException:
        conn.close()
        raise
    return conn


class SqliteBackend:
    """Runs ledger batches on one sqlite3 connection (one thread at a time).

    Either owns a file it opens lazily (`path`), or uses a connection the
    caller configured (`connection`; it should be dedicated to the ledger and
    must not hold an open transaction between calls).
    """

    def __init__(
        self,
        path: Union[str, "os.PathLike[str]", None] = None,
        connection: Any = None,
        busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
        connect_fn: Callable[..., Any] = connect,
    ) -> None:
        if (path is None) == (connection is None):
            raise ValueError("give exactly one of path or connection")
        self._path = path
        self._conn = connection
        self._owned = connection is None
        self._busy_timeout_ms = busy_timeout_ms
        self._connect = connect_fn

    @property
    def connection(self) -> Any:
        """The connection (opened on first use when the backend owns a file)."""
        if self._conn is None:
            self._conn = self._connect(self._path, self._busy_timeout_ms)
        return self._conn

    def close(self) -> None:
        if self._owned and self._conn is not None:
            conn, self._conn = self._conn, None
            conn.close()

    def execute_batch(self, statements: Sequence[Statement]) -> list[StatementResult]:
        """Runs `statements` as ONE transaction; raises `BatchError`."""
        try:
            conn = self.connection
        except Exception as error:  # could not open: the ledger is unreachable
            raise ledger_error(error) from error
        try:
            if conn.in_transaction:
                raise BatchError("other", "the ledger connection already holds an open transaction; give the ledger a dedicated connection")
            saved = (conn.text_factory, conn.row_factory)
        except BatchError:
            raise
        except Exception as error:
            raise ledger_error(error) from error
        try:
            conn.text_factory = _text_factory
            conn.row_factory = None
            conn.execute("BEGIN IMMEDIATE")
            try:
                results: list[StatementResult] = []
                for sql, params in statements:
                    before = conn.total_changes
                    rows = [list(row) for row in conn.execute(sql, params).fetchall()]
                    results.append((rows, conn.total_changes - before))
                conn.execute("COMMIT")
            except BaseException:
                try:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                except Exception:
                    pass
                raise
            return results
        except BatchError:
            raise
        except Exception as error:
            raise ledger_error(error) from error
        finally:
            try:
                conn.text_factory, conn.row_factory = saved
            except Exception:
                pass
