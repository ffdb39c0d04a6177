"""Django middleware and view decorator, configured from settings:

    MIDDLEWARE = [
        ...,
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "idempotency_ledger.django.IdempotencyMiddleware",   # after your auth
        ...,
    ]
    IDEMPOTENCY = {
        "DATABASE": "/var/lib/app/idempotency.sqlite",   # or "postgresql://..." (or a Ledger)
        "INCLUDE": ["/api/orders"],            # required: path prefixes (regexes, callables), or "*"
        "EXCLUDE": ["/api/orders/import"],
        "SETTINGS": {"pending_ttl_ms": 60_000, "profile": "ietf"},   # the core's settings, snake_case
        "PRINCIPAL": "myapp.auth.principal",   # dotted path or callable: request -> str | None
        "MIGRATE": True,                       # create the table at start (default True for SQLite)
        "USING": "default",                    # without "DATABASE": the ledger on DATABASES["default"]
        "TRANSACTIONAL": ["/api/orders"],      # exactly once: these views run in transaction.atomic(using=USING)
    }

or, per view, without the middleware: `@idempotent` (`INCLUDE` not needed),
`@idempotent(transactional=True)` for exactly once.

Exactly once (docs/SPEC.md 10.2): for a transactional view the middleware
opens `transaction.atomic(using=USING)` once the core won the key for the
request, the view writes through Django's connection (the ORM, or
`connection.cursor()`) inside it, and the core's fenced completion runs in
that same atomic block through Django's connection; the block commits when
the exchange says commit, and rolls back otherwise (a takeover superseded
this owner, the view raised, `nothing_changed(request)`, a failed
completion or commit). The ledger must live in that database: with
"USING" and no "DATABASE", it is built on DATABASES[USING] (the SQLite file,
or the PostgreSQL server). The view finds its transaction and lease as
`request.idempotency_transaction` and `request.idempotency_lease`.

A loop over the core's exchange in Django's middleware hooks: `process_view`
(the URL resolved, so an unknown route stays Django's 404) starts it and
reads the body through Django's `request.body` (exactly the bytes the view
will see); `process_exception` tells it a view raised (Django then renders
its 500, unstored) or that Django refused the request body (its 400: the key
is released); `process_response` hands it the view's response. The first
caller gets the response exactly as Django made it.

Under Django's WSGI handler a request without `Content-Length` reaches the
view with an empty body even when the server read a chunked one (Django
ticket #35838): such a request gets the core's 411 instead of a fingerprint
of bytes the client never sent. Under Django's ASGI handler the chunked body
is complete and is fingerprinted.

The default principal is the authenticated user's username
(`request.user.get_username()`), None for an anonymous user: the core's 401.
A view that changed nothing calls `nothing_changed(request)`.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Optional

from ._http import _REQUIRED, DECLINED, NOTHING_CHANGED, Routes, describe, handler_result
from ._ledger import Ledger
from ._native import BatchFailure, Exchange, PassThrough, Propagate, ReadBody, Respond, Response, RunHandler
from ._transaction import HandlerTransaction, Lease, database_failure, format_placeholders

try:
    from django.utils.deprecation import MiddlewareMixin  # type: ignore[import-untyped,unused-ignore]
except ImportError:  # pragma: no cover - the module is only imported with Django installed
    MiddlewareMixin = object

__all__ = ["AtomicTransaction", "IdempotencyMiddleware", "idempotent", "ledger_from_settings", "mark_declined", "nothing_changed"]

_LEDGERS: dict[str, Ledger] = {}
#: The request attribute holding its exchange while the view runs.
_EXCHANGE = "idempotency_exchange"


def nothing_changed(request: Any) -> None:
    """Marks this request's view as having changed nothing: its response is
    sent unstored and the key released."""
    request.META[NOTHING_CHANGED] = True


def mark_declined(request: Any) -> None:
    """Marks this request as refused by the framework before the view ran
    (a parsing or validation step of your own)."""
    request.META[DECLINED] = True


def _import(path: str) -> Any:
    from django.utils.module_loading import import_string  # type: ignore[import-untyped,unused-ignore]

    return import_string(path)


def _default_principal(request: Any) -> Optional[str]:
    user = getattr(request, "user", None)
    if user is None or not getattr(user, "is_authenticated", False):
        return None
    return str(user.get_username())


def _database_of(alias: str) -> str:
    """Where DATABASES[alias] lives, as the ledger opens it: the SQLite
    file, or a libpq connection string for PostgreSQL (psycopg's conninfo)."""
    from django.conf import settings  # type: ignore[import-untyped,unused-ignore]

    db = settings.DATABASES[alias]
    engine = str(db.get("ENGINE", ""))
    if engine.endswith("sqlite3"):
        name = str(db.get("NAME") or "")
        if not name or name == ":memory:" or name.startswith("file:"):
            raise ValueError(f"DATABASES[{alias!r}] is not a SQLite file the ledger can share")
        return name
    if "postgresql" in engine:
        from psycopg.conninfo import make_conninfo

        keys = {"dbname": db.get("NAME"), "user": db.get("USER"), "password": db.get("PASSWORD"), "host": db.get("HOST"), "port": db.get("PORT")}
        options = {k: v for k, v in (db.get("OPTIONS") or {}).items() if isinstance(v, (str, int)) and not isinstance(v, bool)}
        return str(make_conninfo("", **{k: v for k, v in keys.items() if v not in (None, "")}, **options))
    raise TypeError(f"the ledger speaks SQLite and PostgreSQL; DATABASES[{alias!r}] is {engine}")


def ledger_from_settings(config: dict[str, Any]) -> Ledger:
    """The ledger `settings.IDEMPOTENCY` names (one per database and
    settings in a process: the middleware and every decorated view share
    it): "DATABASE", or without it the database of DATABASES[USING]."""
    database = config.get("DATABASE")
    if isinstance(database, Ledger):
        return database
    if database is None and config.get("USING"):
        database = _database_of(str(config["USING"]))
    if database is None:
        raise TypeError('settings.IDEMPOTENCY needs "DATABASE" (a SQLite path, a postgresql:// URL or a Ledger) or "USING" (an alias of DATABASES)')
    settings = dict(config.get("SETTINGS") or {})
    cache_key = json.dumps([str(database), settings, config.get("MAX_CONNECTIONS")], sort_keys=True, default=str)
    if cache_key in _LEDGERS:
        return _LEDGERS[cache_key]
    if isinstance(database, str) and (database.startswith(("postgres://", "postgresql://")) or "dbname=" in database):
        ledger = Ledger.postgres(database, max_size=int(config.get("MAX_CONNECTIONS", 10)), **settings)
        if config.get("MIGRATE", False):
            ledger.migrate()
    else:
        ledger = Ledger(database, **settings)
        if config.get("MIGRATE", True):
            ledger.migrate()
    _LEDGERS[cache_key] = ledger
    return ledger


def _django_response(response: Response, request: Any, close: bool) -> Any:
    """The core's response as a Django response, with exactly its headers."""
    from django.core.handlers.asgi import ASGIRequest  # type: ignore[import-untyped,unused-ignore]
    from django.http import HttpResponse  # type: ignore[import-untyped,unused-ignore]

    made = HttpResponse(content=response.body, status=response.status)
    for name in list(made.headers):
        del made.headers[name]
    for name, value in response.headers:
        made.headers[name] = value
    if close and isinstance(request, ASGIRequest):  # a WSGI app may not send hop-by-hop headers
        made.headers["Connection"] = "close"
    return made


def _declined_exceptions() -> tuple[type[BaseException], ...]:
    """Django refusing the request body while the view reads it: too large,
    too many fields or files, an unparsable multipart body (its 400s)."""
    from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent  # type: ignore[import-untyped,unused-ignore]
    from django.http.multipartparser import MultiPartParserError  # type: ignore[import-untyped,unused-ignore]

    return (RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent, MultiPartParserError)


class AtomicTransaction:
    """A transactional view's transaction: `transaction.atomic(using=...)`,
    with the core's completion run through Django's connection inside it
    (a transaction object: `begin`, `execute`, `commit`, `rollback`)."""

    def __init__(self, using: str = "default") -> None:
        self.using = using
        self.connection: Any = None
        self._atomic: Any = None

    def begin(self) -> None:
        from django.db import DatabaseError, connections, transaction  # type: ignore[import-untyped,unused-ignore]

        atomic = transaction.atomic(using=self.using)
        try:
            atomic.__enter__()
        except DatabaseError as error:
            raise database_failure(error) from error
        self._atomic = atomic
        self.connection = connections[self.using]

    def execute(self, statements: Any) -> list[tuple[list[Any], int]]:
        from django.db import DatabaseError  # type: ignore[import-untyped,unused-ignore]

        connection = self.connection
        if connection is None or self._atomic is None:
            raise BatchFailure("host", None, "no transaction is open")
        dialect = "sqlite" if connection.vendor == "sqlite" else "postgres"
        results: list[tuple[list[Any], int]] = []
        try:
            with connection.cursor() as cursor:
                for sql, params in statements:
                    text, ordered = format_placeholders(sql, params, dialect)
                    cursor.execute(text, ordered)
                    rows = [tuple(row) for row in cursor.fetchall()] if cursor.description is not None else []
                    verb = sql.lstrip()[:6].upper()
                    results.append((rows, 0 if verb == "SELECT" else max(int(cursor.rowcount), 0)))
        except DatabaseError as error:
            raise database_failure(error) from error
        return results

    def commit(self) -> None:
        from django.db import DatabaseError  # type: ignore[import-untyped,unused-ignore]

        atomic, self._atomic = self._atomic, None
        if atomic is None:
            raise BatchFailure("host", None, "no transaction is open")
        try:
            atomic.__exit__(None, None, None)  # Django commits (and rolls back itself if the commit fails)
        except DatabaseError as error:
            raise database_failure(error, broken="outcome-unknown") from error

    def rollback(self) -> None:
        from django.db import transaction  # type: ignore[import-untyped,unused-ignore]

        atomic, self._atomic = self._atomic, None
        if atomic is None:
            return
        try:
            transaction.set_rollback(True, using=self.using)
            atomic.__exit__(None, None, None)
        except Exception:
            pass  # the server rolls back when the connection goes


class IdempotencyMiddleware(MiddlewareMixin):  # type: ignore[misc]
    """Idempotency-Key protection for Django views (settings.IDEMPOTENCY)."""

    def __init__(
        self,
        get_response: Callable[[Any], Any],
        *,
        ledger: Optional[Ledger] = None,
        principal: Any = None,
        include: Any = None,
        transactional: Any = None,
    ) -> None:
        super().__init__(get_response)
        from django.conf import settings  # type: ignore[import-untyped,unused-ignore]

        config = dict(getattr(settings, "IDEMPOTENCY", {}) or {})
        self.ledger = ledger or ledger_from_settings(config)
        chosen = principal if principal is not None else config.get("PRINCIPAL", _default_principal)
        self.principal: Callable[[Any], Optional[str]] = _import(chosen) if isinstance(chosen, str) else chosen
        choice = include if include is not None else config.get("INCLUDE", _REQUIRED)
        if choice is _REQUIRED:
            raise TypeError(
                'settings.IDEMPOTENCY needs "INCLUDE": the routes to protect, e.g. "INCLUDE": ["/orders"] '
                '(path prefixes, compiled regexes or callables), or "INCLUDE": "*" to protect every view; '
                "or decorate views with idempotency_ledger.django.idempotent instead of installing the middleware"
            )
        self.routes = Routes(choice, config.get("EXCLUDE"), "IdempotencyMiddleware")
        chosen_tx = transactional if transactional is not None else config.get("TRANSACTIONAL")
        self.transactional = None if chosen_tx in (None, False) else Routes("*" if chosen_tx is True else chosen_tx, None, "IdempotencyMiddleware")
        self.using = str(config.get("USING") or "default")
        if self.transactional is not None and config.get("DATABASE") is not None and not config.get("USING"):
            raise TypeError(
                'settings.IDEMPOTENCY: transactional views need "USING" (the alias of DATABASES their atomic block opens on, '
                'which must be the ledger\'s database: leave "DATABASE" out to build the ledger on it)'
            )
        self.declines = _declined_exceptions()

    def process_view(self, request: Any, view_func: Any, view_args: Any, view_kwargs: Any) -> Any:
        if getattr(request, _EXCHANGE, None) is not None or not self.ledger.protects(request.method) or not self.routes(request.path):
            return None
        meta = request.META
        path = meta.get("RAW_URI") or meta.get("REQUEST_URI") or request.get_full_path()
        names = self.ledger._read_header_names  # the others never reach the core
        headers = [(name.lower(), str(value)) for name, value in request.headers.items() if name.lower() in names]
        transactional = self.transactional is not None and self.transactional(request.path)
        given = AtomicTransaction(self.using) if transactional else None
        route = getattr(getattr(request, "resolver_match", None), "route", None) or None
        exchange = self.ledger.start(self.principal(request), request.method, path, headers, transactional=transactional, transaction=given, route=route)
        action: Any = exchange.action
        while isinstance(action, ReadBody):
            action = self._read(exchange, request, action.cap)
        if isinstance(action, RunHandler):
            setattr(request, _EXCHANGE, exchange)
            request.idempotency_lease = Lease(exchange, action.renew_every_ms)
            request.idempotency_transaction = HandlerTransaction(exchange, action.renew_every_ms) if action.transaction else None
            return None
        if isinstance(action, Respond) and action.response is not None:
            return _django_response(action.response, request, action.close)
        assert isinstance(action, PassThrough), action
        return None

    @staticmethod
    def _read(exchange: Exchange, request: Any, cap: int) -> Any:
        from django.core.handlers.wsgi import WSGIRequest  # type: ignore[import-untyped,unused-ignore]
        from django.http import RawPostDataException, UnreadablePostError  # type: ignore[import-untyped,unused-ignore]

        meta = request.META
        try:
            length: Optional[int] = int(meta.get("CONTENT_LENGTH") or "")
        except ValueError:
            length = None
        if length is None and "HTTP_TRANSFER_ENCODING" in meta and isinstance(request, WSGIRequest):
            return exchange.body_unreadable("length-unknown")  # Django's WSGI request would read b""
        try:
            body = request.body
        except RawPostDataException:
            return exchange.body_unreadable("consumed")  # request.POST / read() before this middleware
        except UnreadablePostError:
            return exchange.body_unreadable("incomplete")
        except BaseException:
            exchange.close()  # Django refused the body itself (RequestDataTooBig: its 400); nothing reserved
            raise
        if len(body) > cap:
            return exchange.body_too_large()  # a chunked body under ASGI, read whole by Django
        if length is not None and len(body) < length:
            return exchange.body_unreadable("incomplete")
        return exchange.body(body)

    def process_exception(self, request: Any, exception: Exception) -> None:
        exchange: Optional[Exchange] = getattr(request, _EXCHANGE, None)
        if exchange is None or exchange.done:
            return None
        if isinstance(exception, self.declines):
            exchange.declined()  # Django's 400 goes out unstored; the key is released
        else:
            exchange.raised(describe(exception))  # Django renders its 500, unstored
        return None

    def process_response(self, request: Any, response: Any) -> Any:
        exchange: Optional[Exchange] = getattr(request, _EXCHANGE, None)
        if exchange is None:
            return response
        setattr(request, _EXCHANGE, None)
        if exchange.done:
            return response  # ended in process_exception: Django's own answer, unstored
        result = handler_result(request.META)
        if result == "answered":
            if getattr(response, "streaming", False):
                content = b"".join(response.streaming_content)
                response.streaming_content = [content]
            else:
                content = response.content
            action = exchange.answered(response.status_code, list(response.items()), content)
        else:
            action = exchange.declined() if result == "declined" else exchange.nothing_changed()
        if isinstance(action, Respond):
            return response if action.response is None else _django_response(action.response, request, action.close)
        assert isinstance(action, Propagate), action
        return _django_response(action.response, request, False)


def idempotent(view: Any = None, *, transactional: bool = False) -> Any:
    """Protects one view, whatever `INCLUDE` says (settings.IDEMPOTENCY's
    DATABASE or USING, SETTINGS and PRINCIPAL apply); the middleware need
    not be installed. `@idempotent(transactional=True)`: the view runs in
    `transaction.atomic(using=USING)` and its writes commit with the stored
    answer (exactly once)."""
    from django.utils.decorators import decorator_from_middleware_with_args  # type: ignore[import-untyped,unused-ignore]

    decorate = decorator_from_middleware_with_args(IdempotencyMiddleware)(include="*", transactional=True if transactional else None)
    return decorate if view is None else decorate(view)
