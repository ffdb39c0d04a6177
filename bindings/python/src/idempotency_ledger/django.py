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
    }

or, per view, without the middleware: `@idempotent` (`INCLUDE` not needed).

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
from ._native import Exchange, PassThrough, Propagate, ReadBody, Respond, Response, RunHandler

try:
    from django.utils.deprecation import MiddlewareMixin  # type: ignore[import-untyped,unused-ignore]
except ImportError:  # pragma: no cover - the module is only imported with Django installed
    MiddlewareMixin = object

__all__ = ["IdempotencyMiddleware", "idempotent", "ledger_from_settings", "mark_declined", "nothing_changed"]

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


def ledger_from_settings(config: dict[str, Any]) -> Ledger:
    """The ledger `settings.IDEMPOTENCY` names (one per database and
    settings in a process: the middleware and every decorated view share it)."""
    database = config.get("DATABASE")
    if isinstance(database, Ledger):
        return database
    if database is None:
        raise TypeError('settings.IDEMPOTENCY needs "DATABASE": a SQLite path, a postgresql:// URL or a Ledger')
    settings = dict(config.get("SETTINGS") or {})
    cache_key = json.dumps([str(database), settings, config.get("MAX_CONNECTIONS")], sort_keys=True, default=str)
    if cache_key in _LEDGERS:
        return _LEDGERS[cache_key]
    if isinstance(database, str) and database.startswith(("postgres://", "postgresql://")):
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


class IdempotencyMiddleware(MiddlewareMixin):  # type: ignore[misc]
    """Idempotency-Key protection for Django views (settings.IDEMPOTENCY)."""

    def __init__(self, get_response: Callable[[Any], Any], *, ledger: Optional[Ledger] = None, principal: Any = None, include: Any = None) -> None:
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
        self.declines = _declined_exceptions()

    def process_view(self, request: Any, view_func: Any, view_args: Any, view_kwargs: Any) -> Any:
        if getattr(request, _EXCHANGE, None) is not None or not self.ledger.protects(request.method) or not self.routes(request.path):
            return None
        meta = request.META
        path = meta.get("RAW_URI") or meta.get("REQUEST_URI") or request.get_full_path()
        headers = [(name.lower(), str(value)) for name, value in request.headers.items()]
        exchange = self.ledger.start(self.principal(request), request.method, path, headers)
        action: Any = exchange.action
        while isinstance(action, ReadBody):
            action = self._read(exchange, request, action.cap)
        if isinstance(action, RunHandler):
            setattr(request, _EXCHANGE, exchange)
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


def idempotent(view: Any) -> Any:
    """Protects one view, whatever `INCLUDE` says (settings.IDEMPOTENCY's
    DATABASE, SETTINGS and PRINCIPAL apply); the middleware need not be
    installed."""
    from django.utils.decorators import decorator_from_middleware_with_args  # type: ignore[import-untyped,unused-ignore]

    return decorator_from_middleware_with_args(IdempotencyMiddleware)(include="*")(view)
