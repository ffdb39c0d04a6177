"""Django middleware, configured from settings:

    MIDDLEWARE = [
        ...,
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "idempotency_ledger.django.IdempotencyMiddleware",   # after your auth
        ...,
    ]
    IDEMPOTENCY = {
        "DATABASE": "/var/lib/app/idempotency.sqlite",   # or "postgresql://..." (or a Ledger)
        "SETTINGS": {"pending_ttl_ms": 60_000, "profile": "ietf"},   # the core's settings, snake_case
        "PRINCIPAL": "myapp.auth.principal",   # dotted path or callable: request -> str | None
        "INCLUDE": ["/api/"],                  # optional path prefixes (or regexes, callables)
        "EXCLUDE": ["/api/webhooks/"],
        "MIGRATE": True,                       # create the table at start (default True for SQLite)
    }

The default principal is the authenticated user's username
(`request.user.get_username()`), None for an anonymous user: the core then
answers 401. A view that changed nothing calls
`idempotency_ledger.django.nothing_changed(request)` and its response is sent
without being stored (the reservation is released).
"""

from __future__ import annotations

import io
import logging
from typing import Any, Callable, Optional

from ._http import NOTHING_CHANGED, Routes, status_line
from ._ledger import Ledger
from ._types import IdempotencyError, MutationResponse, Response, Result
from .wsgi import _TOO_LARGE, read_capped

log = logging.getLogger("idempotency_ledger")

__all__ = ["IdempotencyMiddleware", "ledger_from_settings", "nothing_changed"]

_LEDGERS: dict[int, Ledger] = {}


def nothing_changed(request: Any) -> None:
    """Marks this request's mutation as having changed nothing."""
    request.META[NOTHING_CHANGED] = True


def _import(path: str) -> Any:
    from django.utils.module_loading import import_string  # type: ignore[import-untyped,unused-ignore]

    return import_string(path)


def _default_principal(request: Any) -> Optional[str]:
    user = getattr(request, "user", None)
    if user is None or not getattr(user, "is_authenticated", False):
        return None
    return str(user.get_username())


def ledger_from_settings(config: dict[str, Any]) -> Ledger:
    database = config.get("DATABASE")
    if isinstance(database, Ledger):
        return database
    if database is None:
        raise ValueError('settings.IDEMPOTENCY needs "DATABASE": a SQLite path, a postgresql:// URL or a Ledger')
    settings = dict(config.get("SETTINGS") or {})
    if isinstance(database, str) and database.startswith(("postgres://", "postgresql://")):
        ledger = Ledger.postgres(database, max_size=int(config.get("MAX_CONNECTIONS", 10)), **settings)
        if config.get("MIGRATE", False):
            ledger.migrate()
    else:
        ledger = Ledger(database, **settings)
        if config.get("MIGRATE", True):
            ledger.migrate()
    return ledger


def _response(result: Any, null_body: frozenset[int] = frozenset()) -> Any:
    from django.http import HttpResponse  # type: ignore[import-untyped,unused-ignore]

    body = b"" if result.status in null_body else result.body
    response = HttpResponse(content=body, status=result.status)
    for name in list(response.headers):
        del response.headers[name]
    for name, value in result.headers:
        if name.lower() != "content-length":
            response.headers[name] = value
    return response


class IdempotencyMiddleware:
    """Idempotency-Key protection for Django views (settings.IDEMPOTENCY)."""

    def __init__(self, get_response: Callable[[Any], Any], *, ledger: Optional[Ledger] = None, principal: Any = None) -> None:
        from django.conf import settings  # type: ignore[import-untyped,unused-ignore]

        config = dict(getattr(settings, "IDEMPOTENCY", {}) or {})
        self.get_response = get_response
        self.ledger = ledger or ledger_from_settings(config)
        chosen = principal if principal is not None else config.get("PRINCIPAL", _default_principal)
        self.principal: Callable[[Any], Optional[str]] = _import(chosen) if isinstance(chosen, str) else chosen
        self.routes = Routes(config.get("INCLUDE"), config.get("EXCLUDE"))

    def __call__(self, request: Any) -> Any:
        ledger = self.ledger
        if request.method.upper() not in ledger.protected_methods or not self.routes(request.path):
            return self.get_response(request)
        meta = request.META
        principal = self.principal(request)
        path = meta.get("RAW_URI") or meta.get("REQUEST_URI") or request.get_full_path()
        headers = [(name.lower(), str(value)) for name, value in request.headers.items()]
        try:
            admission = ledger.admit(request.method, path, headers, principal)
        except IdempotencyError as error:
            log.error("[idempotency] request not admitted: %s", error)
            return _response(ledger.error_response(error))
        if admission.kind == "pass-through":
            return self.get_response(request)
        if admission.kind == "reject":
            return _response(admission.response)
        try:
            length: Optional[int] = int(meta.get("CONTENT_LENGTH") or "")
        except ValueError:
            length = None
        body = read_capped(request, length, bool(meta.get("wsgi.input_terminated")), ledger.request_body_cap_bytes)
        if body is _TOO_LARGE:
            return _response(ledger.body_too_large())
        # The view reads the same bytes (Django caches the body here).
        request._body = body
        request._stream = io.BytesIO(body)
        request._read_started = False
        begun = ledger.begin(principal, request.method, path, headers, body)
        if begun.result is not None:
            return _response(begun.result)
        if begun.pass_through:
            return self.get_response(request)
        ticket = begun.ticket
        assert ticket is not None
        try:
            response = self.get_response(request)
            content = b"".join(response.streaming_content) if getattr(response, "streaming", False) else response.content
            produced = MutationResponse(response.status_code, list(response.items()), content)
        except BaseException as error:
            ledger.abandon(ticket, error)
            raise
        if meta.get(NOTHING_CHANGED):
            ledger.abandon(ticket, None, nothing_changed=True)
            return _response(Response(produced.status, list(produced.headers), content), ledger.null_body_statuses)
        result: Result = ledger.finish(ticket, produced)
        return _response(result)


_ = status_line
