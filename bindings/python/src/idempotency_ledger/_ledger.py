"""`Ledger`: the Rust host crate's ledger pool (the core component under
wasmtime, the SQL on SQLite, PostgreSQL or a connection you bring), seen
from Python. This module only picks the backend and normalises arguments;
every request is an exchange the extension runs (`handle`) or lends to an
adapter (`start`), with the GIL released around every ledger call.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Callable, Iterable, Mapping, Optional, Union

from . import _native, _telemetry
from ._native import Config, Exchange, Handled, PassThrough, Propagate, ReadBody, Respond, RunHandler
from ._transaction import HandlerTransaction
from ._types import HeadersLike, MutationResponse, NothingChanged

#: The settings `Ledger(**settings)` takes: the WIT `config` fields in snake_case.
SETTINGS: tuple[str, ...] = tuple(_native.SETTINGS)

Produced = Union[MutationResponse, _native.Response, tuple[int, Iterable[tuple[str, str]], Union[bytes, str, None]]]
Text = Union[str, bytes]


def _text(value: Any) -> str:
    if type(value) is str:
        return value
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("latin-1")
    if isinstance(value, str):
        return str(value)
    raise TypeError(f"expected str (or bytes, read as ISO-8859-1), got {type(value).__name__}")


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


def ticket_of(error: BaseException) -> Optional[_native.Ticket]:
    """The ticket `handle` attached to a handler's exception, if it ran under one."""
    ticket = getattr(error, "idempotency_ticket", None)
    return ticket if isinstance(ticket, _native.Ticket) else None


def _is_psycopg_pool(database: Any) -> bool:
    module = sys.modules.get("psycopg_pool")
    return module is not None and isinstance(database, (module.ConnectionPool, module.AsyncConnectionPool))


def _with_parameters(url: str, parameters: Mapping[str, Any]) -> str:
    """`url` (a URL or a libpq `key=value` string) with `parameters` set,
    written by psycopg's conninfo (the one place a connection string is
    built, so the one place psycopg is needed)."""
    try:
        from psycopg import ProgrammingError
        from psycopg.conninfo import make_conninfo
    except ImportError as missing:
        raise ImportError("Ledger.postgres(connect_kwargs=...) builds the connection string with psycopg: pip install 'idempotency-ledger[postgres]'") from missing
    values = {key: int(value) if isinstance(value, bool) else value for key, value in parameters.items()}
    try:
        return make_conninfo(url, **values)
    except ProgrammingError as error:
        raise ValueError(f"connect_kwargs: {error}") from error


def _check_ms(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative int")


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
    each one left out is the core's `default-config(profile)`. `clock`, a
    callable returning Unix milliseconds, replaces the system clock (tests).
    `telemetry=False`: this ledger records no OpenTelemetry metrics or
    spans; `record_keys=True`: spans carry the key and the principal in
    clear (`idempotency.key`, `enduser.id`), not only the key's hash.
    """

    def __init__(
        self,
        database: Any,
        *,
        busy_timeout_ms: int = 5000,
        clock: Optional[Callable[[], int]] = None,
        dialect: Optional[str] = None,
        telemetry: bool = True,
        record_keys: bool = False,
        **settings: Any,
    ) -> None:
        _check_ms("busy_timeout_ms", busy_timeout_ms)
        self._telemetry = bool(telemetry)
        self._record_keys = bool(record_keys)
        if isinstance(database, _native.NativeLedger):
            native = database
        elif isinstance(database, (str, bytes, os.PathLike)):
            native = _native.NativeLedger.sqlite(os.fsdecode(database), settings, clock, busy_timeout_ms)
        elif _is_psycopg_pool(database):
            from .postgres import PoolBatch

            native = _native.NativeLedger.callback(PoolBatch(database, busy_timeout_ms=busy_timeout_ms), "postgres", settings, clock)
        else:
            from ._dbapi import connection_batch

            run, found = connection_batch(database, dialect, busy_timeout_ms=busy_timeout_ms)
            native = _native.NativeLedger.callback(run, found, settings, clock)
        self._native = native
        #: A SQLite file this ledger opened itself (its batches are local work
        #: of microseconds: an async adapter may run them on its event loop).
        self._local_file = isinstance(database, (str, bytes, os.PathLike))
        #: The core's protected methods (its `protected-methods`, upper-cased):
        #: a request with another method passes through without a ledger call.
        self._protected = frozenset(m.upper() for m in native.config.protected_methods)
        #: The request headers an exchange reads (the core's `request-headers`,
        #: lower-cased, as ISO-8859-1 bytes): adapters convert only these.
        self._read_header_names = frozenset(native.request_headers)
        self._read_headers = frozenset(name.encode("latin-1") for name in self._read_header_names)

    @classmethod
    def postgres(
        cls,
        url: str,
        *,
        max_size: int = 10,
        busy_timeout_ms: Optional[int] = None,
        connect_kwargs: Optional[Mapping[str, Any]] = None,
        prepared_statements: bool = False,
        clock: Optional[Callable[[], int]] = None,
        telemetry: bool = True,
        record_keys: bool = False,
        **settings: Any,
    ) -> "Ledger":
        """A ledger on PostgreSQL at `url` (`postgresql://...` or a libpq
        `key=value` string; TLS per its `sslmode` and `sslrootcert`), through
        the Rust crate's connection pool (at most `max_size` connections,
        made lazily; a request waits up to 5 s for one, then the core's 503).
        Run `migrate()` once at deploy time.

        `busy_timeout_ms`: each batch's `lock_timeout` (how long a statement
        waits for a row lock before the batch fails as busy; default the
        crate's 5 s; 0 means 1 ms, never "wait forever"). `connect_kwargs`:
        connection parameters added to `url` (`sslmode`, `sslrootcert`,
        `application_name`, `connect_timeout`, `options`, ...), merged by
        psycopg's conninfo (so they need psycopg installed).
        `prepared_statements`: prepare each statement by name once per
        connection, sparing the server parsing and planning it in every
        batch; only on a direct connection or a pooler that keeps prepared
        statements (PgBouncer 1.21+ with `max_prepared_statements`), never
        behind an older transaction pooler.
        """
        if isinstance(max_size, bool) or not isinstance(max_size, int) or max_size < 1:
            raise ValueError("max_size must be an int >= 1")
        if busy_timeout_ms is not None:
            _check_ms("busy_timeout_ms", busy_timeout_ms)
        if connect_kwargs:
            url = _with_parameters(url, connect_kwargs)
        if not isinstance(prepared_statements, bool):
            raise TypeError("prepared_statements must be a bool")
        return cls(
            _native.NativeLedger.postgres(url, max_size, settings, clock, busy_timeout_ms, prepared_statements),
            telemetry=telemetry,
            record_keys=record_keys,
        )

    # ---------------------------------------------------------------- properties

    @property
    def config(self) -> Config:
        """The settings in force, as the core validated them (the WIT `config`)."""
        return self._native.config

    @property
    def dialect(self) -> str:
        return self._native.config.dialect

    def protects(self, method: Text) -> bool:
        """True when requests with this method go through the ledger (the
        core's protected methods); others pass through without an exchange."""
        return _text(method).upper() in self._protected

    def now_ms(self) -> int:
        return self._native.now_ms()

    def close(self) -> None:
        """Closes this process's connections (a PostgreSQL pool the ledger
        built included; a pool or connection you passed in stays open) and
        waits for a background sweep in progress. Requests after it get the
        core's answer for an unreachable database."""
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
        return _native.schema(self.dialect)

    def handle(
        self,
        principal: Optional[str],
        method: Text,
        path_and_query: Text,
        headers: HeadersLike,
        body: Union[bytes, bytearray, memoryview, None],
        handler: Callable[..., Produced],
        *,
        transactional: bool = False,
    ) -> Handled:
        """Runs `handler()` at most once per (principal, Idempotency-Key): the
        whole exchange, in Rust (one ledger round trip to decide, one to
        complete), the handler called back with the GIL.

        `principal` comes from your auth layer (None: the core's 401).
        `handler` returns a `MutationResponse` or `(status, headers, body)`;
        raising `NothingChanged` releases the reservation. If it raises
        anything else, the core decides what the row keeps (pending until the
        TTL, or released under `on_server_error="release"`) and the exception
        propagates with `idempotency_ticket` and `idempotency_outcome` set.
        Ledger failures never raise: the answer is the core's 5xx.

        `transactional=True` (docs/SPEC.md 10.2): `handler(tx)` gets a
        `HandlerTransaction` open on the ledger's database; its writes
        commit with the stored answer, or are rolled back with it (a
        takeover that superseded this owner, a failed completion or
        commit, a raised handler, `NothingChanged`).
        """
        method = _text(method)
        if method.upper() not in self._protected:
            if self._telemetry:
                _telemetry.passed_through(method)
            try:
                produced = handler(_PassedThrough()) if transactional else handler()
            except NothingChanged as nothing:
                if nothing.response is None:
                    raise  # no reservation to release: as a plain call would
                produced = nothing.response
            return Handled.passed_through(produced)
        if transactional or (self._telemetry and _telemetry.instruments() is not None):
            return self._handle_exchange(principal, method, _text(path_and_query), _headers(headers), _body(body), handler, transactional)
        return self._native.handle(principal, method, _text(path_and_query), _headers(headers), _body(body), handler)

    def _handle_exchange(
        self,
        principal: Optional[str],
        method: str,
        path_and_query: str,
        headers: list[tuple[str, str]],
        body: bytes,
        handler: Callable[..., Produced],
        transactional: bool,
    ) -> Handled:
        """`handle` as the exchange's loop in Python: for a transactional
        handler (called with its transaction), and while OpenTelemetry
        records (the handler runs inside the exchange's span)."""
        small = body if len(body) <= _native.BODY_AT_START_MAX_BYTES else None
        with self.start(principal, method, path_and_query, headers, transactional=transactional, body=small) as exchange:
            action: Any = exchange.action
            produced: Any = None
            failure: Optional[BaseException] = None
            while True:
                if isinstance(action, ReadBody):
                    action = exchange.body_too_large() if len(body) > action.cap else exchange.body(body)
                elif isinstance(action, RunHandler):
                    try:
                        with _telemetry.current(exchange.recording):
                            produced = handler(HandlerTransaction(exchange, action.renew_every_ms)) if transactional else handler()
                        status, response_headers, response_body = _produced(produced)
                    except NothingChanged as nothing:
                        produced = nothing.response
                        if produced is None:
                            failure = nothing
                        action = exchange.nothing_changed()
                        continue
                    except BaseException as error:
                        failure = error
                        action = exchange.raised(f"{type(error).__name__}: {error}" if str(error) else type(error).__name__)
                        continue
                    action = exchange.answered(status, response_headers, response_body)
                elif isinstance(action, Respond):
                    if failure is not None:
                        _attach(failure, exchange.ticket, action.outcome)
                        raise failure
                    if action.response is None:
                        return Handled.of(produced, action.outcome, exchange.ticket, action.close)
                    return Handled.of(action.response, action.outcome, exchange.ticket, action.close)
                elif isinstance(action, Propagate):
                    if failure is not None:
                        _attach(failure, exchange.ticket, action.outcome)
                        raise failure
                    return Handled.of(action.response, action.outcome, exchange.ticket, False)
                else:
                    assert isinstance(action, PassThrough)
                    return Handled.passed_through(handler(_PassedThrough()) if transactional else handler())

    def start(
        self,
        principal: Optional[str],
        method: Text,
        path_and_query: Text,
        headers: HeadersLike,
        *,
        transactional: bool = False,
        transaction: Any = None,
        route: _telemetry.Route = None,
        body: Optional[bytes] = None,
    ) -> Exchange:
        """Starts a request's exchange, for an adapter that runs the handler
        itself: perform `exchange.action`, feed what happened, until a final
        action (`PassThrough`, `Respond`, `Propagate`). The exchange keeps a
        pooled ledger lent until then (or until `exchange.close()`).

        `transactional=True`: at `RunHandler` (its `transaction` True) a
        transaction is open on the ledger's database for the handler's
        writes (`exchange.execute`, or `exchange.transaction`'s connection);
        the exchange completes, commits or rolls it back itself when it is
        fed the handler's end. `transaction`: a transaction object of the
        adapter's to open it on instead of the ledger's own connection (see
        `idempotency_ledger._transaction`). `route`: the route template (or a
        callable giving it once the exchange ends) for the telemetry's
        `http.route`. `body`: the whole request body, when the adapter already
        read it: the exchange then never asks for it (no `ReadBody`), and its
        decision runs in this call, so the first action may be `RunHandler`
        or the answer. Cheapest for the small bodies of most API requests; a
        body of more than a few KiB hashes faster at `ReadBody`."""
        method = _text(method)
        recording = _telemetry.begin(method, principal, self._record_keys, route) if self._telemetry else None
        return self._native.start(principal, method, _text(path_and_query), _headers(headers), transactional, transaction, recording, body)

    def sweep(self, now: Optional[int] = None) -> int:
        """One bounded sweep batch (rows last updated before now - retention);
        run it off the request path. Returns the rows deleted. (`handle` and
        exchanges already sweep when the core asks.)"""
        return self._native.sweep(now).deleted

    def sweep_all(self) -> int:
        """Sweep batches until the core says no more. Returns the rows deleted."""
        return self._native.sweep_all()


class _PassedThrough:
    """The transaction a transactional handler gets on a request the core
    does not protect: none (it runs as a plain handler, its writes its own)."""

    lease_lost = False
    connection = None
    session = None

    def execute(self, sql: str, params: Any = ()) -> Any:
        raise RuntimeError("this request is not protected (its method is not one the ledger protects): no transaction is open")


def _produced(produced: Any) -> tuple[int, Any, Any]:
    if isinstance(produced, tuple) and len(produced) == 3:
        return produced[0], produced[1], produced[2]
    try:
        return produced.status, produced.headers, produced.body
    except AttributeError:
        raise TypeError(f"the handler must return a MutationResponse or a (status, headers, body) tuple, not {type(produced).__name__}") from None


def _attach(error: BaseException, ticket: Any, outcome: str) -> None:
    try:
        error.idempotency_ticket = ticket  # type: ignore[attr-defined]
        error.idempotency_outcome = outcome  # type: ignore[attr-defined]
    except (AttributeError, TypeError):
        pass


def schema(dialect: str = "sqlite") -> list[str]:
    """The migration for `dialect` ("sqlite" | "postgres"): the core's DDL."""
    return _native.schema(dialect)


def default_config(profile: str = "recipe") -> Config:
    """The core's `default-config(profile)`."""
    return _native.default_config(profile)


__all__ = ["Ledger", "SETTINGS", "default_config", "schema", "ticket_of"]
