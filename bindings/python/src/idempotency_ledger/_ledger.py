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


def _conninfo_pairs(conninfo: str) -> list[tuple[str, str]]:
    """The parameters of a libpq `key=value` string (values quoted with '...'
    and backslash escapes, as libpq reads them)."""
    pairs: list[tuple[str, str]] = []
    i, n = 0, len(conninfo)
    while True:
        while i < n and conninfo[i].isspace():
            i += 1
        if i >= n:
            return pairs
        start = i
        while i < n and conninfo[i] != "=" and not conninfo[i].isspace():
            i += 1
        key = conninfo[start:i]
        while i < n and conninfo[i].isspace():
            i += 1
        if not key or i >= n or conninfo[i] != "=":
            raise ValueError(f"connection string: expected key=value at {conninfo[start:start + 20]!r}")
        i += 1
        while i < n and conninfo[i].isspace():
            i += 1
        value: list[str] = []
        quoted = i < n and conninfo[i] == "'"
        i += quoted
        while i < n:
            c = conninfo[i]
            if c == "\\" and i + 1 < n:
                value.append(conninfo[i + 1])
                i += 2
                continue
            if (quoted and c == "'") or (not quoted and c.isspace()):
                i += quoted
                break
            value.append(c)
            i += 1
        else:
            if quoted:
                raise ValueError("connection string: unterminated quoted value")
        pairs.append((key, "".join(value)))


def _conninfo_with(url: str, params: Mapping[str, Any], options: str = "") -> str:
    """`url` (a `postgresql://` URL or a libpq `key=value` string) with
    `params` set (replacing the same keys) and `options` (server settings,
    `-c name=value ...`) appended to its `options`."""
    extra: list[tuple[str, str]] = []
    for key, value in params.items():
        if not isinstance(key, str) or not key or not key.replace("_", "").isalnum():
            raise ValueError(f"connect_kwargs: {key!r} is not a connection parameter name")
        if value is not None:
            extra.append((key, str(int(value) if isinstance(value, bool) else value)))
    if not extra and not options:
        return url
    is_url = url.startswith(("postgres://", "postgresql://"))
    if is_url:
        from urllib.parse import unquote

        base, _, query = url.partition("?")
        pairs = [(unquote(k), unquote(v)) for k, _, v in (item.partition("=") for item in query.split("&") if item)]
    else:
        pairs = _conninfo_pairs(url)
    merged = [(k, v) for k, v in pairs if k not in {key for key, _ in extra}] + extra
    if options:
        current = " ".join(v for k, v in merged if k == "options")
        merged = [(k, v) for k, v in merged if k != "options"] + [("options", f"{current} {options}".strip())]
    if is_url:
        from urllib.parse import quote

        return f"{base}?" + "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in merged)

    def literal(value: str) -> str:
        if value and not any(c.isspace() or c in "'\\" for c in value):
            return value
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"

    return " ".join(f"{k}={literal(v)}" for k, v in merged)


def _lock_timeout_literal(ms: int) -> str:
    """PostgreSQL's `lock_timeout` for `ms` milliseconds; 0 (do not wait) is
    '1ms', since PostgreSQL reads 0 as "wait forever"."""
    if isinstance(ms, bool) or not isinstance(ms, int) or ms < 0:
        raise ValueError("busy_timeout_ms must be a non-negative int")
    if ms == 0:
        return "1ms"
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def _is_psycopg_pool(database: Any) -> bool:
    module = sys.modules.get("psycopg_pool")
    return module is not None and isinstance(database, (module.ConnectionPool, module.AsyncConnectionPool))


def _checked(produced: Any) -> tuple[int, list[tuple[str, str]], Union[str, bytes]]:
    status, headers, body = _unpack(produced)
    if isinstance(status, bool) or not isinstance(status, int):
        raise TypeError(f"the mutation's status {status!r} is not an int")
    if not 0 <= status <= 65535:
        raise ValueError(f"the mutation's status {status!r} is not an int in 0..65535")
    return status, headers, body


class _Mutation:
    """`run_mutation` as the extension calls it: `(status, headers, body,
    nothing_changed)`. `NothingChanged` becomes its response marked
    nothing-changed (the core releases the key and sends it as it is). One
    without a response (or with one that is unusable) is released all the
    same, and `raise_after` is raised once it is."""

    __slots__ = ("run", "nothing_changed", "raise_after")

    def __init__(self, run: Callable[[], Produced]) -> None:
        self.run = run
        self.nothing_changed: Optional[NothingChanged] = None
        self.raise_after: Optional[BaseException] = None

    def __call__(self) -> tuple[int, list[tuple[str, str]], Union[str, bytes], bool]:
        try:
            produced = self.run()
        except NothingChanged as error:
            self.nothing_changed = error
            if error.response is None:
                self.raise_after = error
            else:
                try:
                    status, headers, body = _checked(error.response)
                    return (status, headers, body, True)
                except Exception as bad:
                    self.raise_after = bad
            return (204, [], b"", True)
        status, headers, body = _checked(produced)
        return (status, headers, body, False)


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

            run, found = connection_batch(database, dialect, busy_timeout_ms=busy_timeout_ms)
            native = _native.NativeLedger.callback(run, found, settings, clock)
        self._native = native
        protected, cap, null_body = native.policy()
        #: The core's request policy: methods it protects (upper-cased).
        self._protected = frozenset(protected)
        self._request_body_cap = cap
        self._null_body = frozenset(null_body)

    @classmethod
    def postgres(
        cls,
        url: str,
        *,
        max_size: int = 10,
        busy_timeout_ms: Optional[int] = None,
        connect_kwargs: Optional[Mapping[str, Any]] = None,
        clock: Optional[Callable[[], int]] = None,
        **settings: Any,
    ) -> "Ledger":
        """A ledger on PostgreSQL at `url` (`postgresql://...` or a libpq
        `key=value` string; TLS per its `sslmode` and `sslrootcert`), through
        the Rust crate's connection pool (at most `max_size` connections,
        made lazily; a request waits up to 5 s for one, then answers 503).
        Run `migrate()` once at deploy time.

        `busy_timeout_ms`: each batch's `lock_timeout` (how long a statement
        waits for a row lock before the batch fails as busy; default the
        crate's 5 s; 0 means 1 ms, never "wait forever"). `connect_kwargs`:
        connection parameters added to `url` (`sslmode`, `sslrootcert`,
        `application_name`, `connect_timeout`, `options`, ...).
        """
        if isinstance(max_size, bool) or not isinstance(max_size, int) or max_size < 1:
            raise ValueError("max_size must be an int >= 1")
        if busy_timeout_ms is not None and (isinstance(busy_timeout_ms, bool) or not isinstance(busy_timeout_ms, int) or busy_timeout_ms < 0):
            raise ValueError("busy_timeout_ms must be a non-negative int")
        # The crate sets the lock timeout on every connection and in every batch.
        url = _conninfo_with(url, connect_kwargs or {})
        return cls(_native.NativeLedger.postgres(url, max_size, settings, clock, busy_timeout_ms))

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
        built included; a pool or connection you passed in stays open).
        Waits for a background sweep in progress."""
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
        call = _Mutation(run_mutation)
        out = self._native.handle(principal, method, _text(path_and_query), _headers(headers), _body(body), call)
        tag = out[0]
        if tag == "executed":
            ticket, stored = out[1], out[5]
            nothing = call.nothing_changed
            if nothing is None:
                flags = _STORED[stored]
                return Result(out[2], out[3], out[4], _EXECUTED, ticket=ticket, stored=flags[0], fenced_out=flags[1], released=flags[2], error=out[6])
            released = stored == "released"
            if call.raise_after is not None:
                _attach(call.raise_after, ticket, released)
                raise call.raise_after
            return Result(out[2], out[3], out[4], Outcome.RELEASED, ticket=ticket, released=released)
        if tag == "raised":
            error = out[1]
            if out[2] is not None:
                _attach(error, out[2], out[3])
            raise error
        if tag == "pass":
            if call.nothing_changed is not None:
                raise call.nothing_changed  # no reservation to release: as a plain call would
            return Result(out[1], out[2], out[3], _PASS)
        return self._begun_result(out, None)

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
        response. A due sweep runs on a background thread (on this one for a
        connection or pool you passed in)."""
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
        `finish` already sweep when the core asks.)"""
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
