"""`Ledger`: the Rust host crate's ledger (the core component under wasmtime,
the SQL on SQLite, PostgreSQL or a connection you bring), driven from Python.

Every call into the extension releases the GIL; the mutation runs in Python
between `begin` (admission, body cap, fingerprint, decision) and `finish`
(shaping and the fenced completion). Python only moves values around.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence, Union

from . import _native
from ._types import (
    Admission,
    Header,
    HeadersLike,
    IdempotencyError,
    MutationResponse,
    NothingChanged,
    Outcome,
    Response,
    Result,
    Ticket,
    _parts_of,
)

#: The settings `Ledger(**settings)` takes: the WIT `config` fields in snake_case.
SETTINGS: tuple[str, ...] = tuple(_native.SETTINGS)

Produced = Union[MutationResponse, Response, Result, tuple[int, Sequence[tuple[str, str]], Union[bytes, str, None]]]

_EXECUTED = Outcome.EXECUTED
_REJECTED = Outcome.REJECTED
_REPLAYED = Outcome.REPLAYED
_PASS = Outcome.PASS_THROUGH
_quick = Result._quick
_STORED = {"completed": (True, False, False), "released": (False, False, True), "fenced-out": (False, True, False), "failed": (False, False, False)}


@dataclass(frozen=True)
class Begun:
    """The first half of `handle` (for hosts whose mutation is asynchronous).

    Exactly one of: `result` (send it; nothing may run), `ticket` (run the
    mutation once, then `Ledger.finish(ticket, produced)`), or `pass_through`
    (run the handler without any ledger access).
    """

    result: Optional[Result] = None
    ticket: Optional[Ticket] = None
    pass_through: bool = False


def _text(value: Any) -> str:
    if type(value) is str:
        return value
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("latin-1")
    if isinstance(value, str):
        return str(value)
    raise TypeError(f"expected str (or bytes, decoded as ISO-8859-1), got {type(value).__name__}")


def _headers(headers: HeadersLike) -> list[tuple[str, str]]:
    if headers is None:
        return []
    items: Iterable[Any] = headers.items() if isinstance(headers, Mapping) else headers
    out = []
    for name, value in items:
        if type(name) is not str or type(value) is not str:
            name, value = _text(name), _text(value)
        out.append((name, value))
    return out


def _body(body: Any) -> bytes:
    if body is None:
        return b""
    if type(body) is bytes:
        return body
    if isinstance(body, (bytes, bytearray, memoryview)):
        return bytes(body)
    raise TypeError("body must be the raw request bytes (bytes, bytearray or memoryview)")


def _unpack(produced: Any) -> tuple[int, list[tuple[str, str]], Union[str, bytes]]:
    if isinstance(produced, (MutationResponse, Response, Result)):
        status, headers, body = produced.status, produced.headers, produced.body
    elif isinstance(produced, tuple) and len(produced) == 3:
        status, headers, body = produced
    else:
        raise TypeError("the mutation must return a MutationResponse or a (status, headers, body) tuple")
    if body is None:
        body = b""
    elif isinstance(body, (bytearray, memoryview)):
        body = bytes(body)
    elif not isinstance(body, (str, bytes)):
        raise TypeError("a mutation body must be str or bytes")
    return status, _headers(headers), body


def _attach(error: BaseException, ticket: Ticket, released: bool) -> None:
    try:
        error.idempotency_ticket = ticket  # type: ignore[attr-defined]
        error.idempotency_released = released  # type: ignore[attr-defined]
    except Exception:
        pass


def ticket_of(error: BaseException) -> Optional[Ticket]:
    """The ticket `handle` attached to a mutation's exception, if any."""
    ticket = getattr(error, "idempotency_ticket", None)
    return ticket if isinstance(ticket, Ticket) else None


def _describe(error: BaseException) -> str:
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _is_psycopg_pool(database: Any) -> bool:
    module = sys.modules.get("psycopg_pool")
    return module is not None and isinstance(database, (module.ConnectionPool, module.AsyncConnectionPool))


class Ledger:
    """An Idempotency-Key ledger on one database, shared by every thread.

    - `Ledger(path, **settings)`: a SQLite file (WAL, `busy_timeout_ms`), run
      by the Rust crate's SQLite backend; one connection and one component
      instance per concurrently active thread.
    - `Ledger.postgres(url, max_size=10, **settings)`: PostgreSQL through the
      crate's pool (TLS from the URL's `sslmode`).
    - `Ledger(psycopg_pool.ConnectionPool)`: PostgreSQL on your pool (its TLS,
      auth and settings), each batch run by a Python callback.
    - `Ledger(sqlite3_connection)` or any DB-API connection (`dialect=`):
      bring your own connection; batches run by a Python callback,
      serialised on the connection.

    Settings are the WIT `config` fields in snake_case (see `SETTINGS`);
    defaults come from the core's `default-config(profile)`. `clock`, a
    callable returning Unix milliseconds, replaces the system clock (tests).
    """

    def __init__(
        self,
        database: Any,
        *,
        busy_timeout_ms: int = 5000,
        clock: Optional[Callable[[], int]] = None,
        dialect: Optional[str] = None,
        **settings: Any,
    ) -> None:
        self._owned_backend: Any = None
        if isinstance(database, _native.NativeLedger):
            native = database
        elif isinstance(database, (str, bytes, os.PathLike)):
            native = _native.NativeLedger.sqlite(os.fsdecode(database), settings, clock, busy_timeout_ms)
        elif _is_psycopg_pool(database):
            from .postgres import PoolBatch

            batch = PoolBatch(database, busy_timeout_ms=busy_timeout_ms)
            native = _native.NativeLedger.callback(batch, "postgres", settings, clock)
        else:
            from ._dbapi import connection_batch

            run, found = connection_batch(database, dialect)
            native = _native.NativeLedger.callback(run, found, settings, clock)
        self._native = native
        protected, cap, null_body = native.policy()
        #: The core's request policy: methods it protects (upper-cased).
        self._protected = frozenset(protected)
        self._request_body_cap = cap
        self._null_body = frozenset(null_body)

    @classmethod
    def postgres(cls, url: str, *, max_size: int = 10, clock: Optional[Callable[[], int]] = None, **settings: Any) -> "Ledger":
        """A ledger on PostgreSQL at `url` (`postgresql://...`, TLS per its
        `sslmode`), through the Rust crate's connection pool (at most
        `max_size` connections; connects lazily). Run `migrate()` once at
        deploy time."""
        return cls(_native.NativeLedger.postgres(url, max_size, settings, clock))

    # ---------------------------------------------------------------- properties

    @property
    def settings(self) -> dict[str, Any]:
        """The settings in force, as the core validated them (snake_case)."""
        return dict(self._native.config())

    @property
    def dialect(self) -> str:
        return str(self._native.config()["dialect"])

    @property
    def protected_methods(self) -> frozenset[str]:
        """The core's `policy().protected-methods` (upper-cased)."""
        return self._protected

    @property
    def request_body_cap_bytes(self) -> int:
        """The core's `policy().request-body-cap-bytes`."""
        return int(self._request_body_cap)

    @property
    def null_body_statuses(self) -> frozenset[int]:
        """The core's `policy().null-body-statuses` (204, 205, 304)."""
        return self._null_body

    def now_ms(self) -> int:
        return int(self._native.now_ms())

    def close(self) -> None:
        """Closes this process's connections (a PostgreSQL pool the ledger
        built included; a pool or connection you passed in stays open)."""
        self._native.close()

    def __enter__(self) -> "Ledger":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---------------------------------------------------------------- the protocol

    def migrate(self) -> None:
        """Creates the table and index if missing (the core's DDL)."""
        self._native.migrate()

    def schema(self) -> list[str]:
        """The migration for this ledger's dialect, one statement per item."""
        return list(_native.schema(self.dialect))

    def handle(
        self,
        principal: Optional[str],
        method: Union[str, bytes],
        path_and_query: Union[str, bytes],
        headers: HeadersLike,
        body: Union[bytes, bytearray, memoryview, None],
        run_mutation: Callable[[], Produced],
    ) -> Result:
        """Runs `run_mutation()` at most once per (principal, Idempotency-Key):
        the whole SPEC. One ledger round trip to decide, one to complete.

        `principal` comes from your auth layer (None: the core's 401).
        `run_mutation` returns a `MutationResponse` or `(status, headers,
        body)`; raising `NothingChanged` releases the reservation. If it
        raises anything else, the core's abandon runs (the row stays pending
        until the TTL, or is released under `on_server_error="release"`) and
        the exception propagates with `exc.idempotency_ticket` set. Ledger
        failures never raise: the result is the core's 5xx (`UNAVAILABLE`).
        """
        if type(method) is not str:
            method = _text(method)
        if method.upper() not in self._protected:
            # The core's own policy: an unprotected method never reaches the ledger.
            produced = run_mutation()
            if type(produced) is MutationResponse:
                status, raw = produced.status, produced.body
                if status in self._null_body:
                    raw = b""
                elif type(raw) is str:
                    raw = raw.encode("utf-8")
                elif type(raw) is not bytes:
                    return self._pass_through(produced)
                return _quick(status, list(produced.headers), raw, _PASS)
            return self._pass_through(produced)
        begun = self._native.begin(principal, method, _text(path_and_query), _headers(headers), _body(body))
        tag = begun[0]
        if tag == "execute":
            return self._run(begun[1], run_mutation)
        return self._begun_result(begun, run_mutation)

    def _begun_result(self, begun: tuple[Any, ...], run_mutation: Optional[Callable[[], Produced]]) -> Result:
        tag = begun[0]
        if tag == "replay":
            return Result(begun[1], begun[2], begun[3], _REPLAYED)
        if tag == "reject":
            return Result(begun[2], begun[3], begun[4], _REJECTED, reason=begun[1])
        if tag == "unavailable":
            return Result(begun[2], begun[3], begun[4], Outcome.UNAVAILABLE, error=begun[1])
        assert tag == "pass" and run_mutation is not None
        return self._pass_through(run_mutation())

    def _pass_through(self, produced: Produced, outcome: Outcome = _PASS, **details: Any) -> Result:
        status, headers, body = _unpack(produced)
        if status in self._null_body:
            body = b""
        return Result(status, headers, body.encode("utf-8") if isinstance(body, str) else body, outcome, **details)

    def _run(self, ticket: Ticket, run_mutation: Callable[[], Produced]) -> Result:
        try:
            produced = run_mutation()
            status, headers, body = _unpack(produced)
        except NothingChanged as nothing:
            released = self._native.abandon(ticket, "nothing-changed", "")
            if nothing.response is None:
                _attach(nothing, ticket, released)
                raise
            return self._pass_through(nothing.response, Outcome.RELEASED, ticket=ticket, released=released)
        except BaseException as error:
            released = self._native.abandon(ticket, "raised", _describe(error))
            _attach(error, ticket, released)
            raise
        return self._finish(ticket, status, headers, body)

    def _finish(self, ticket: Ticket, status: Any, headers: list[tuple[str, str]], body: Union[str, bytes]) -> Result:
        try:
            s, h, b, stored, error = self._native.finish(ticket, status, headers, body)
        except (TypeError, OverflowError) as bad:
            # A status the WIT `u16` cannot carry: the mutation's output is unusable.
            raised: BaseException = ValueError(f"the mutation's status {status!r} is not an int in 0..65535") if isinstance(bad, OverflowError) else bad
            _attach(raised, ticket, self._native.abandon(ticket, "raised", _describe(bad)))
            raise raised from bad
        flags = _STORED[stored]
        return Result(s, h, b, _EXECUTED, ticket=ticket, stored=flags[0], fenced_out=flags[1], released=flags[2], error=error)

    def begin(
        self,
        principal: Optional[str],
        method: Union[str, bytes],
        path_and_query: Union[str, bytes],
        headers: HeadersLike,
        body: Union[bytes, bytearray, memoryview, None],
    ) -> Begun:
        """Admission, body cap, fingerprint and decision (waiting as the core
        says when `wait_ms` is set): one ledger round trip for a protected
        request, none otherwise. Never raises for a ledger failure: that is
        `Begun(result=...)` with the core's 5xx (fail closed)."""
        method = _text(method)
        if method.upper() not in self._protected:
            return Begun(pass_through=True)
        begun = self._native.begin(principal, method, _text(path_and_query), _headers(headers), _body(body))
        if begun[0] == "execute":
            return Begun(ticket=begun[1])
        if begun[0] == "pass":
            return Begun(pass_through=True)
        return Begun(result=self._begun_result(begun, None))

    def finish(self, ticket: Ticket, produced: Produced) -> Result:
        """Stores the mutation's response under `ticket` (the fenced
        completion) and returns what the caller gets. A fenced-out or failed
        completion is logged as the core words it; the caller still gets its
        response. A due sweep runs on a background thread."""
        status, headers, body = _unpack(produced)
        return self._finish(ticket, status, headers, body)

    def abandon(self, ticket: Ticket, error: Optional[BaseException] = None, *, nothing_changed: bool = False) -> bool:
        """What a mutation without a response leaves (SPEC 9.3): released when
        it changed nothing (or raised under `on_server_error="release"`),
        else pending until the TTL. Logged as the core words it."""
        reason = "nothing-changed" if nothing_changed else "raised"
        return bool(self._native.abandon(ticket, reason, "" if error is None else _describe(error)))

    def release(self, ticket: Ticket) -> bool:
        """Frees `ticket`'s reservation when you know nothing ran (the core's
        abandon with nothing-changed). False when the ticket no longer owns
        the row. Raises `ProtocolError` when the batch fails."""
        return bool(self._native.release(ticket))

    def sweep(self, now: Optional[int] = None) -> int:
        """One bounded sweep batch (rows last updated before now - retention);
        run it off the request path. Returns the rows deleted. (`handle` and
        `finish` already sweep in the background when the core asks.)"""
        deleted, _more = self._native.sweep(now)
        return int(deleted)

    def sweep_all(self) -> int:
        """Sweep batches until the core says no more. Returns the rows deleted."""
        return int(self._native.sweep_all())

    def admit(
        self, method: Union[str, bytes], path_and_query: Union[str, bytes], headers: HeadersLike, principal: Optional[str] = None
    ) -> Admission:
        """The core's classification (no ledger access): pass-through, a
        rejection (401 without a principal, 400 for the key, 413 for a
        Content-Length over the cap) or protected with the key."""
        a = self._native.admit(principal, _text(method), _text(path_and_query), _headers(headers))
        if a[0] == "pass":
            return Admission("pass-through")
        if a[0] == "reject":
            return Admission("reject", reason=a[1], response=Response(a[2], a[3], a[4]))
        return Admission("protected", key=a[1], fingerprint_prefix=a[2])

    def body_too_large(self) -> Response:
        """The core's 413 for a body found larger than the cap while reading it."""
        status, headers, body = self._native.body_too_large()
        return Response(status, headers, body)

    def fingerprint_prefix(self, method: Union[str, bytes], path_and_query: Union[str, bytes], headers: HeadersLike) -> str:
        return str(self._native.fingerprint_prefix(_text(method), _text(path_and_query), _headers(headers)))

    def fingerprint(
        self, method: Union[str, bytes], path_and_query: Union[str, bytes], headers: HeadersLike, body: Union[bytes, bytearray, memoryview, None]
    ) -> str:
        """SPEC 4: the core's prefix, hashed natively with the body."""
        return str(self._native.fingerprint(_text(method), _text(path_and_query), _headers(headers), _body(body)))

    def fingerprint_in_component(
        self, method: Union[str, bytes], path_and_query: Union[str, bytes], headers: HeadersLike, body: Union[bytes, bytearray, memoryview, None]
    ) -> str:
        """SPEC 4 entirely inside the component."""
        return str(self._native.fingerprint_in_component(_text(method), _text(path_and_query), _headers(headers), _body(body)))

    def error_response(self, error: BaseException) -> Response:
        """The core's answer for a call that failed before anything ran (503
        busy, 503 outcome unknown, else 500), in the profile's format."""
        kind, reason, message = _parts_of(error)
        status, headers, body = self._native.error_response(kind, reason, message)
        return Response(status, headers, body)


def schema(dialect: str = "sqlite") -> list[str]:
    """The migration for `dialect` ("sqlite" | "postgres"): the core's DDL."""
    return list(_native.schema(dialect))


def default_settings(profile: str = "recipe") -> dict[str, Any]:
    """The core's `default-config(profile)` in snake_case."""
    return dict(_native.default_config(profile))


__all__ = ["Begun", "Ledger", "SETTINGS", "default_settings", "schema", "ticket_of", "IdempotencyError"]
