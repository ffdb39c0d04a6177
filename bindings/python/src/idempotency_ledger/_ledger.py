"""`Ledger`: the SPEC flow over the component and sqlite3 or PostgreSQL (psycopg 3)."""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence, Union

import wasmtime
from wasmtime.component import Variant

from ._runtime import Runtime, Slot, field, record, unwrap
from ._sqlite import DEFAULT_BUSY_TIMEOUT_MS, Backend, SqliteBackend, connect
from ._types import (
    Admission,
    Completion,
    ComponentTrap,
    Decision,
    HeadersLike,
    IdempotencyError,
    InvalidConfig,
    MutationResponse,
    Outcome,
    Response,
    Result,
    Ticket,
)

log = logging.getLogger("idempotency_ledger")

#: The settings `Ledger(**settings)` takes, named after the WIT `config` fields.
SETTINGS = (
    "protected_methods",
    "fingerprint_headers",
    "replay_headers",
    "pending_ttl_ms",
    "retention_ms",
    "body_cap_bytes",
    "sweep_batch",
)
_LIST_SETTINGS = SETTINGS[:3]

# Used only when even the component's `error-response` cannot be reached
# (the instance trapped and could not be rebuilt); same shape as the core's.
_FALLBACK_ERROR = Response(
    500,
    [("content-type", "application/json")],
    b'{"error":"idempotency_ledger_unavailable","message":"The idempotency ledger is unavailable."}',
)

Produced = Union[MutationResponse, Response, Result, tuple[int, Sequence[tuple[str, str]], Union[bytes, str, None]]]


def _system_clock() -> int:
    return time.time_ns() // 1_000_000


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


class _PerThread(threading.local):
    slot: Optional[Slot] = None
    backend: Optional[SqliteBackend] = None


_LEDGERS: "weakref.WeakSet[Ledger]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    # A SQLite connection must not be used across fork(): a child (a
    # pre-forking server's worker) starts with fresh per-thread state and
    # opens its own connections. The inherited ones are abandoned, not
    # closed (closing them could disturb the parent's locks).
    for ledger in list(_LEDGERS):
        if ledger._path is not None:
            ledger._local = _PerThread()
            ledger._backends = weakref.WeakSet()
            ledger._backends_lock = threading.Lock()
        elif ledger._dialect == "postgres" and ledger._shared_backend is not None:
            # The parent's pool (threads, sockets) is not the child's: see
            # PostgresBackend.after_fork_in_child.
            ledger._local = _PerThread()
            after_fork = getattr(ledger._shared_backend, "after_fork_in_child", None)
            if after_fork is not None:
                after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class Ledger:
    """An Idempotency-Key ledger on one SQLite or PostgreSQL database.

    `Ledger(path, **settings)` is safe to share between threads: the compiled
    component, engine and linker are shared by the whole process; each thread
    gets its own wasmtime Store + component instance and its own sqlite3
    connection to `path` (WAL, busy timeout), created on first use.

    `Ledger(connection, **settings)` runs on that one connection (dedicated to
    the ledger, no transaction left open); calls are serialised with a lock
    and sqlite3's own thread checks apply.

    `Ledger(pool, **settings)` runs on PostgreSQL through a
    `psycopg_pool.ConnectionPool` the caller built (its TLS, auth and pool
    settings apply; `close()` leaves it open); `Ledger.postgres(conninfo)`
    builds one. Each thread gets its own Store + instance; every batch
    borrows a pooled connection and runs as one READ COMMITTED transaction in
    one network round trip, with `busy_timeout_ms` as its `lock_timeout`.

    Settings (WIT `config`, defaults from the core): protected_methods,
    fingerprint_headers, replay_headers, pending_ttl_ms, retention_ms,
    body_cap_bytes, sweep_batch. Host settings: busy_timeout_ms (default
    5000), clock (callable returning Unix milliseconds), runtime.
    """

    def __init__(
        self,
        database: Union[str, "os.PathLike[str]", Any],
        *,
        busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
        clock: Optional[Callable[[], int]] = None,
        runtime: Optional[Runtime] = None,
        **settings: Any,
    ) -> None:
        unknown = sorted(set(settings) - set(SETTINGS))
        if unknown:
            raise TypeError(f"unknown Ledger setting(s): {', '.join(unknown)} (known: {', '.join(SETTINGS)})")
        self._runtime = runtime or Runtime.shared()
        self._clock = clock or _system_clock
        self._busy_timeout_ms = int(busy_timeout_ms)
        self._local = _PerThread()
        # Weak: when a thread ends, its threading.local slot and backend go,
        # and the backend's connection is closed by sqlite3 on collection
        # (servers that spawn a thread per request do not pile up files).
        self._backends: "weakref.WeakSet[SqliteBackend]" = weakref.WeakSet()
        self._backends_lock = threading.Lock()
        self._dialect = "sqlite"
        if isinstance(database, (str, bytes, os.PathLike)):
            self._path: Any = os.fsdecode(database)
            self._lock: Optional[threading.RLock] = None
            self._shared_backend: Optional[Backend] = None
        elif _is_postgres(database):
            from .postgres import PostgresBackend  # psycopg: the optional [postgres] extra

            if not isinstance(database, PostgresBackend):
                if not _is_sync_pool(database):
                    raise TypeError("Ledger needs a psycopg_pool.ConnectionPool (the ledger is synchronous), not an AsyncConnectionPool")
                database = PostgresBackend(database, busy_timeout_ms=self._busy_timeout_ms)
            self._path = None
            self._lock = None  # the backend is thread-safe: each batch borrows its own connection
            self._shared_backend = database
            self._dialect = "postgres"
        else:
            self._path = None
            self._lock = threading.RLock()
            self._shared_backend = SqliteBackend(connection=database)
        self._shared_slot: Optional[Slot] = None
        _LEDGERS.add(self)
        defaults = self._call_raw("protocol", "default-config")
        values = {name: field(defaults, name) for name in SETTINGS}
        for name, value in settings.items():
            if name in _LIST_SETTINGS:
                if isinstance(value, str) or not all(isinstance(v, str) for v in value):
                    raise TypeError(f"{name} must be a list of strings")
                values[name] = list(value)
            else:
                if isinstance(value, bool) or not isinstance(value, int):
                    raise TypeError(f"{name} must be an int")
                values[name] = value
        for name in ("pending_ttl_ms", "retention_ms"):
            if not 0 <= values[name] < 1 << 64:
                raise InvalidConfig(f"{name} out of range")
        for name in ("body_cap_bytes", "sweep_batch"):
            if not 0 <= values[name] < 1 << 32:
                raise InvalidConfig(f"{name} out of range")
        self._settings = values
        # The record carries the dialect the core plans its SQL in.
        self._config = record(**values, dialect=self._dialect)
        unwrap(self._call_raw("protocol", "validate-config", self._config))

    @classmethod
    def postgres(
        cls,
        conninfo: str = "",
        *,
        min_size: int = 1,
        max_size: int = 10,
        pool_timeout: float = 5.0,
        connect_kwargs: Optional[Mapping[str, Any]] = None,
        pool_options: Optional[Mapping[str, Any]] = None,
        busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
        clock: Optional[Callable[[], int]] = None,
        runtime: Optional[Runtime] = None,
        **settings: Any,
    ) -> "Ledger":
        """A ledger on PostgreSQL with a connection pool it owns (`close()`
        closes it). Needs the `postgres` extra (psycopg 3 + psycopg-pool).

        `conninfo`: a libpq URL or `key=value` string (libpq's PG*
        environment variables fill the gaps). `min_size` / `max_size`: pool
        size; `pool_timeout`: seconds a request waits for a free connection
        before the ledger answers 503 (busy). `connect_kwargs`: extra
        `psycopg.connect` arguments (e.g. `{"sslmode": "verify-full"}`,
        `{"options": "-c search_path=ledger"}`); `pool_options`: extra
        `psycopg_pool.ConnectionPool` arguments (max_idle, max_lifetime,
        check, ...). `busy_timeout_ms` is each batch's `lock_timeout`. The
        other settings are the ones `Ledger(...)` takes.

        For TLS client certificates, IAM tokens or any connection set-up of
        your own, build the `ConnectionPool` yourself and pass it to
        `Ledger(pool)`.
        """
        from .postgres import PostgresBackend, open_pool

        if isinstance(min_size, bool) or not isinstance(min_size, int) or min_size < 0:
            raise ValueError("min_size must be an int >= 0")
        if isinstance(max_size, bool) or not isinstance(max_size, int) or max_size < max(min_size, 1):
            raise ValueError("max_size must be an int >= max(min_size, 1)")
        options = dict(pool_options or {})

        def factory() -> Any:
            return open_pool(conninfo, min_size=min_size, max_size=max_size, timeout=pool_timeout, kwargs=connect_kwargs, **options)

        backend = PostgresBackend(pool_factory=factory, busy_timeout_ms=busy_timeout_ms)
        try:
            ledger = cls(backend, busy_timeout_ms=busy_timeout_ms, clock=clock, runtime=runtime, **settings)
            backend.pool  # open now: connections warm up in the background
        except BaseException:
            backend.close()
            raise
        return ledger

    # ----------------------------------------------------------------- plumbing

    @property
    def settings(self) -> dict[str, Any]:
        """The settings in force (WIT `config`, snake_case names)."""
        return {k: (list(v) if isinstance(v, list) else v) for k, v in self._settings.items()}

    @property
    def single_connection(self) -> bool:
        """True when built on one sqlite3 connection (calls serialised by a lock)."""
        return self._lock is not None

    @property
    def dialect(self) -> str:
        """The SQL dialect the core plans in: "sqlite" or "postgres"."""
        return self._dialect

    @property
    def pool(self) -> Any:
        """The `psycopg_pool.ConnectionPool` of a PostgreSQL ledger (None on SQLite)."""
        backend = self._shared_backend
        return getattr(backend, "pool", None) if self._dialect == "postgres" else None

    @property
    def runtime(self) -> Runtime:
        return self._runtime

    def now_ms(self) -> int:
        return int(self._clock())

    def _backend(self) -> Backend:
        if self._shared_backend is not None:
            return self._shared_backend
        backend = self._local.backend
        if backend is None:
            backend = SqliteBackend(path=self._path, busy_timeout_ms=self._busy_timeout_ms, connect_fn=_connect_any_thread)
            self._local.backend = backend
            with self._backends_lock:
                self._backends.add(backend)
        return backend

    def _call_raw(self, iface: str, name: str, *args: Any) -> Any:
        """Calls an export on this thread's instance; a trap discards the
        instance (the next call builds a fresh Store) and raises ComponentTrap."""
        if self._lock is not None:
            with self._lock:
                return self._call_on_slot(iface, name, args)
        return self._call_on_slot(iface, name, args)

    def _call_on_slot(self, iface: str, name: str, args: tuple[Any, ...]) -> Any:
        shared = self._lock is not None
        slot = self._shared_slot if shared else self._local.slot
        if slot is None:
            slot = Slot(self._runtime, self._backend())
            if shared:
                self._shared_slot = slot
            else:
                self._local.slot = slot
        try:
            return slot.call(iface, name, *args)
        except (wasmtime.WasmtimeError, wasmtime.Trap) as trap:
            self._discard(slot)
            log.error("[idempotency] component trapped in %s.%s: %s; the instance will be rebuilt", iface, name, trap)
            raise ComponentTrap(f"idempotency component trapped in {iface}.{name}: {trap}") from trap
        except BaseException:
            # A conversion error before or after the call, or an interrupt
            # re-raised from the import: the instance may be mid-call state;
            # rebuilding it is cheap and always safe.
            self._discard(slot)
            raise

    def _discard(self, slot: Slot) -> None:
        if self._lock is not None:
            if self._shared_slot is slot:
                self._shared_slot = None
        elif self._local.slot is slot:
            self._local.slot = None

    def _call(self, iface: str, name: str, *args: Any) -> Any:
        return unwrap(self._call_raw(iface, name, *args))

    def close(self) -> None:
        """Closes the connections this ledger opened, and the pool that
        `Ledger.postgres` built (call at shutdown, when no other thread is
        using the ledger). A connection or pool you passed in stays open."""
        with self._backends_lock:
            backends, self._backends = list(self._backends), weakref.WeakSet()
        for backend in backends:
            backend.close()
        if self._shared_backend is not None:
            self._shared_backend.close()
        self._local = _PerThread()
        self._shared_slot = None

    def __enter__(self) -> "Ledger":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # --------------------------------------------------------------- the API

    def migrate(self) -> None:
        """Creates the table and index if missing (idempotent)."""
        self._call("driven", "migrate", self._config)

    def schema(self) -> list[str]:
        """The migration SQL of this ledger's dialect, one statement per item
        (on PostgreSQL, run it once at deploy time: see the README)."""
        return list(self._call_raw("protocol", "schema", self._dialect))

    def admit(self, method: Union[str, bytes], path_and_query: Union[str, bytes], headers: HeadersLike = None) -> Admission:
        """How the core classifies a request (pass-through, 400, protected);
        pure, no ledger access. This is the key validation."""
        admission = self._call("protocol", "admit", self._config, _head(method, path_and_query, headers))
        return _admission(admission)

    def check_key(self, key: str) -> Optional[str]:
        """None when `key` is a valid Idempotency-Key, else the rejection
        reason ("key-required" or "key-invalid"), as the core decides it."""
        if not isinstance(key, str):
            raise TypeError("key must be a str")
        method = self._settings["protected_methods"][0]
        admission = self.admit(method, "/", [("Idempotency-Key", key)])
        return admission.reason if admission.kind == "reject" else None

    def fingerprint_prefix(self, method: Union[str, bytes], path_and_query: Union[str, bytes], headers: HeadersLike = None) -> str:
        """The canonical prefix (`UPPER(method) \\n path \\n H \\n`) from the core."""
        prefix: str = self._call("protocol", "fingerprint-prefix", self._config, _head(method, path_and_query, headers))
        return prefix

    def fingerprint(
        self, method: Union[str, bytes], path_and_query: Union[str, bytes], headers: HeadersLike = None, body: bytes = b""
    ) -> str:
        """SHA-256 hex of the core's prefix followed by the raw body, hashed
        natively (the body never enters the component). What `handle` uses."""
        prefix = self.fingerprint_prefix(method, path_and_query, headers)
        return _sha256_hex(prefix, _body(body))

    def fingerprint_in_component(
        self, method: Union[str, bytes], path_and_query: Union[str, bytes], headers: HeadersLike = None, body: bytes = b""
    ) -> str:
        """The same digest computed inside the component (the body crosses as
        list<u8>: slow for large bodies; for cross-checking)."""
        digest: str = self._call("protocol", "fingerprint", self._config, _head(method, path_and_query, headers), bytes(_body(body)))
        return digest

    def error_response(self, error: BaseException) -> Response:
        """The core's 5xx for a failed protocol call (503 + Retry-After for busy)."""
        wit = getattr(error, "_wit", None)
        if wit is None:
            wit = Variant("ledger", Variant("other", str(error) or type(error).__name__))
        try:
            return _response(self._call_raw("protocol", "error-response", wit))
        except Exception:
            log.exception("[idempotency] error-response failed; sending the fallback 500")
            return _FALLBACK_ERROR

    def fenced_out_message(self, ticket: Ticket) -> str:
        message: str = self._call_raw("protocol", "fenced-out-message", _wit_ticket(ticket))
        return message

    def decide(self, principal: str, key: str, fingerprint: str, now: Optional[int] = None) -> Decision:
        """The driven decision (claim, fenced takeover, lookup: one ledger
        round trip) for an already-fingerprinted request. Raises ProtocolError."""
        d = self._call(
            "driven", "decide", self._config, _principal(principal), _text(key, "key"), _text(fingerprint, "fingerprint"), self._now(now)
        )
        return _decision(d)

    def complete(self, ticket: Ticket, produced: Produced, now: Optional[int] = None) -> Completion:
        """The fenced completion write (one ledger round trip), without the
        logging and fallbacks of `finish`. Raises ProtocolError."""
        c = self._call("driven", "complete", self._config, _wit_ticket(ticket), _mutation_response(produced), self._now(now))
        return Completion(_response(field(c, "response")), bool(field(c, "fenced_out")))

    def begin(
        self,
        principal: str,
        method: Union[str, bytes],
        path_and_query: Union[str, bytes],
        headers: HeadersLike,
        body: Union[bytes, bytearray, memoryview, None],
        admission: Optional[Admission] = None,
    ) -> Begun:
        """Admission and decision: one ledger round trip for a protected
        request, none otherwise. Never raises for a ledger failure: that is
        a `Begun(result=...)` with the core's 5xx (fail closed).

        `admission`, when given, is this request's `admit(...)` result (a
        middleware that already classified the request saves a call)."""
        principal = _principal(principal)
        raw_body = _body(body)
        if admission is None or admission.kind != "protected":
            try:
                admission = _admission(self._call("protocol", "admit", self._config, _head(method, path_and_query, headers)))
            except IdempotencyError as error:
                return Begun(result=self._unavailable(error))
        if admission.kind == "pass-through":
            return Begun(pass_through=True)
        if admission.kind == "reject":
            assert admission.response is not None
            return Begun(result=Result.of(admission.response, Outcome.REJECTED, reason=admission.reason))
        assert admission.key is not None and admission.fingerprint_prefix is not None
        fingerprint = _sha256_hex(admission.fingerprint_prefix, raw_body)
        try:
            decision = self._call("driven", "decide", self._config, principal, admission.key, fingerprint, self.now_ms())
        except IdempotencyError as error:
            return Begun(result=self._unavailable(error))
        if decision.tag == "replay":
            return Begun(result=Result.of(_response(decision.payload), Outcome.REPLAYED))
        if decision.tag == "reject":
            return Begun(result=_rejected(decision.payload))
        return Begun(ticket=_ticket(decision.payload))

    def finish(self, ticket: Ticket, produced: Produced) -> Result:
        """Stores the mutation's response under `ticket` (the fenced
        completion write) and returns what the caller gets. A fenced-out
        completion is logged at ERROR level and flagged; a failed completion
        write is logged, reported in `error`, and the caller still gets the
        shaped response (the row stays pending)."""
        wit_ticket = _wit_ticket(ticket)
        produced_wit = _mutation_response(produced)
        now = self.now_ms()
        try:
            completion = self._call("driven", "complete", self._config, wit_ticket, produced_wit, now)
        except IdempotencyError as error:
            log.error(
                "[idempotency] completion not stored for principal=%r key=%r generation=%d: %s; the row stays pending",
                ticket.principal, ticket.key, ticket.generation, error,
            )
            try:
                plan = self._call("steps", "plan-completion", self._config, wit_ticket, produced_wit, now)
                response = _response(field(plan, "response"))
            except IdempotencyError:
                response = self.error_response(error)
            return Result.of(response, Outcome.EXECUTED, ticket=ticket, stored=False, error=error)
        response = _response(field(completion, "response"))
        fenced_out = bool(field(completion, "fenced_out"))
        if fenced_out:
            try:
                message = self.fenced_out_message(ticket)
            except Exception:
                message = f"[idempotency] fenced out: principal={ticket.principal!r} key={ticket.key!r} generation={ticket.generation}"
            log.error("%s", message)
        return Result.of(response, Outcome.EXECUTED, ticket=ticket, stored=not fenced_out, fenced_out=fenced_out)

    def handle(
        self,
        principal: str,
        method: Union[str, bytes],
        path_and_query: Union[str, bytes],
        headers: HeadersLike,
        body: Union[bytes, bytearray, memoryview, None],
        run_mutation: Callable[[], Produced],
    ) -> Result:
        """Runs `run_mutation()` at most once per (principal, Idempotency-Key):
        the whole SPEC. One ledger round trip to decide, one to complete.

        `run_mutation` returns a `MutationResponse` (or `(status, headers,
        body)`). If it raises, the row stays pending (a retry after the TTL
        takes over) and the exception propagates with the ticket attached as
        `exc.idempotency_ticket` (call `release(ticket)` only if you know
        nothing ran). Ledger failures before execution never raise: the
        result is the core's 5xx with `outcome=UNAVAILABLE`.
        """
        begun = self.begin(principal, method, path_and_query, headers, body)
        if begun.result is not None:
            return begun.result
        if begun.pass_through:
            produced = run_mutation()
            response = _plain_response(produced)
            return Result.of(response, Outcome.PASS_THROUGH)
        ticket = begun.ticket
        assert ticket is not None
        try:
            produced = run_mutation()
            _mutation_response(produced)  # validate before completing
        except BaseException as error:
            _attach_ticket(error, ticket)
            log.warning(
                "[idempotency] mutation raised for principal=%r key=%r generation=%d; the row stays pending",
                ticket.principal, ticket.key, ticket.generation,
            )
            raise
        return self.finish(ticket, produced)

    def release(self, ticket: Ticket) -> bool:
        """Deletes `ticket`'s pending row; only when you know the mutation did
        not run (SPEC 9). False when the ticket no longer owns the row."""
        return bool(self._call("driven", "release", self._config, _wit_ticket(ticket)))

    def sweep(self, now: Optional[int] = None) -> int:
        """One bounded sweep batch (rows last updated before now - retention);
        run it off the request path. Returns the number of rows deleted."""
        return int(self._call("driven", "sweep", self._config, self._now(now)))

    # ---------------------------------------------------------------- helpers

    def _now(self, now: Optional[int]) -> int:
        if now is None:
            return self.now_ms()
        if isinstance(now, bool) or not isinstance(now, int) or not -(1 << 63) <= now < 1 << 63:
            raise ValueError("now must be an int of Unix milliseconds")
        return now

    def _unavailable(self, error: IdempotencyError) -> Result:
        log.error("[idempotency] request not executed: %s", error)
        response = self.error_response(error)
        return Result.of(response, Outcome.UNAVAILABLE, error=error)


def _is_postgres(database: Any) -> bool:
    """A psycopg_pool pool or a PostgresBackend, told apart without
    importing psycopg when the caller never did."""
    for name, attrs in (("psycopg_pool", ("ConnectionPool", "AsyncConnectionPool")), (f"{__package__}.postgres", ("PostgresBackend",))):
        module = sys.modules.get(name)
        if module is not None and isinstance(database, tuple(getattr(module, a) for a in attrs)):
            return True
    return False


def _is_sync_pool(database: Any) -> bool:
    from psycopg_pool import ConnectionPool

    return isinstance(database, ConnectionPool)


def _connect_any_thread(path: Any, busy_timeout_ms: int) -> Any:
    # Each connection is only ever used by the thread that owns it (a
    # threading.local); check_same_thread=False only lets close() run elsewhere.
    return connect(path, busy_timeout_ms, check_same_thread=False)


def _attach_ticket(error: BaseException, ticket: Ticket) -> None:
    try:
        error.idempotency_ticket = ticket  # type: ignore[attr-defined]
        error.add_note(
            f"idempotency: the row for key {ticket.key!r} stays pending (generation {ticket.generation}); "
            "call Ledger.release(exc.idempotency_ticket) only if nothing ran"
        )
    except Exception:
        pass


def ticket_of(error: BaseException) -> Optional[Ticket]:
    """The ticket `handle` attached to a mutation's exception, if any."""
    ticket = getattr(error, "idempotency_ticket", None)
    return ticket if isinstance(ticket, Ticket) else None


def _sha256_hex(prefix: str, body: Union[bytes, memoryview]) -> str:
    hasher = hashlib.sha256(prefix.encode("utf-8"))
    hasher.update(body)
    return hasher.hexdigest()


def _text(value: Any, what: str) -> str:
    if isinstance(value, bytes):
        return value.decode("latin-1")
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str (or bytes, decoded as ISO-8859-1)")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"{what} is not encodable as UTF-8 (lone surrogate)") from None
    return value


def _principal(principal: Any) -> str:
    if not isinstance(principal, str):
        raise TypeError("principal must be a str (derived by your auth layer, never a client header)")
    return _text(principal, "principal")


def _body(body: Any) -> Union[bytes, memoryview]:
    if body is None:
        return b""
    if isinstance(body, (bytes, bytearray)):
        return bytes(body) if isinstance(body, bytearray) else body
    if isinstance(body, memoryview):
        return body
    raise TypeError("body must be the raw request bytes (bytes, bytearray or memoryview)")


def _headers(headers: HeadersLike) -> list[Any]:
    if headers is None:
        return []
    items: Iterable[Any] = headers.items() if isinstance(headers, Mapping) else headers
    out = []
    for pair in items:
        name, value = pair
        out.append(record(name=_text(name, "header name"), value=_text(value, "header value")))
    return out


def _head(method: Any, path_and_query: Any, headers: HeadersLike) -> Any:
    return record(method=_text(method, "method"), path_and_query=_text(path_and_query, "path_and_query"), headers=_headers(headers))


def _response(r: Any) -> Response:
    body = field(r, "body")
    return Response(
        int(field(r, "status")),
        [(field(h, "name"), field(h, "value")) for h in field(r, "headers")],
        b"" if body is None else body.encode("utf-8"),
        body is not None,
    )


def _rejected(rejection: Any) -> Result:
    return Result.of(_response(field(rejection, "response")), Outcome.REJECTED, reason=field(rejection, "reason"))


def _decision(d: Any) -> Decision:
    if d.tag == "execute":
        return Decision("execute", ticket=_ticket(d.payload))
    if d.tag == "replay":
        return Decision("replay", response=_response(d.payload))
    return Decision("reject", response=_response(field(d.payload, "response")), reason=field(d.payload, "reason"))


def _admission(a: Any) -> Admission:
    if a.tag == "pass-through":
        return Admission("pass-through")
    if a.tag == "reject":
        return Admission("reject", reason=field(a.payload, "reason"), response=_response(field(a.payload, "response")))
    return Admission("protected", key=field(a.payload, "key"), fingerprint_prefix=field(a.payload, "fingerprint_prefix"))


def _ticket(t: Any) -> Ticket:
    return Ticket(field(t, "principal"), field(t, "key"), field(t, "fingerprint"), int(field(t, "generation")), int(field(t, "created_at")))


def _wit_ticket(t: Ticket) -> Any:
    if not isinstance(t, Ticket):
        raise TypeError("expected a Ticket")
    for n in ("generation", "created_at"):
        v = getattr(t, n)
        if isinstance(v, bool) or not isinstance(v, int) or not -(1 << 63) <= v < 1 << 63:
            raise ValueError(f"ticket.{n} must be a 64-bit int")
    return record(
        principal=_text(t.principal, "ticket.principal"),
        key=_text(t.key, "ticket.key"),
        fingerprint=_text(t.fingerprint, "ticket.fingerprint"),
        generation=t.generation,
        created_at=t.created_at,
    )


def _unpack(produced: Produced) -> tuple[int, Sequence[Any], Any]:
    if isinstance(produced, (MutationResponse, Response, Result)):
        return produced.status, produced.headers, produced.body
    if isinstance(produced, tuple) and len(produced) == 3:
        return produced
    raise TypeError("the mutation must return a MutationResponse or a (status, headers, body) tuple")


def _mutation_response(produced: Produced) -> Any:
    status, headers, body = _unpack(produced)
    if isinstance(status, bool) or not isinstance(status, int) or not 0 <= status <= 0xFFFF:
        raise ValueError(f"mutation status must be an int in 0..65535, got {status!r}")
    # `response-body` is untagged in wasmtime-py: a str is `text`, bytes `bytes`.
    wit_body: Union[str, bytes]
    if isinstance(body, str):
        wit_body = _text(body, "response body")
    elif isinstance(body, (bytes, bytearray, memoryview)):
        raw = bytes(body)
        try:
            # Cheap: a string crosses as one copy, list<u8> element by element.
            wit_body = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            wit_body = _invalid_utf8_evidence(raw, error)
    elif body is None:
        wit_body = ""
    else:
        raise TypeError("mutation body must be str or bytes")
    return record(status=status, headers=_headers(headers), body=wit_body)


def _invalid_utf8_evidence(raw: bytes, error: UnicodeDecodeError) -> bytes:
    """Bytes the core will judge exactly as it judges `raw`.

    The core answers every body that is not UTF-8 the same way whatever its
    length or content (unstorable: 500 without a body, unless the status is
    one that never carries a body, where the body is ignored). Converting a
    large `list<u8>` costs ~2 ms per KiB in wasmtime-py, so only the invalid
    sequence itself crosses when it is invalid on its own; otherwise the
    whole body does.
    """
    evidence = raw[error.start : max(error.end, error.start + 1)]
    try:
        evidence.decode("utf-8")
    except UnicodeDecodeError:
        return evidence
    return raw


def _plain_response(produced: Produced) -> Response:
    status, headers, body = _unpack(produced)
    if isinstance(body, str):
        body = body.encode("utf-8")
    elif body is None:
        body = b""
    return Response(int(status), [(str(n), str(v)) for n, v in headers], bytes(body))
