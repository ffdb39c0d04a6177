"""Flask extension: Idempotency-Key protection for every view, or only the
views you decorate.

    from idempotency_ledger.flask import Idempotency

    idempotency = Idempotency(app, ledger=ledger, principal=lambda: current_user_id())
    # or Idempotency(app, ledger=..., principal=..., protect="decorated") and
    @app.post("/orders")
    @idempotency.protect
    def create_order(): ...

The principal callable runs inside the request context (flask-login's
`current_user`, `g.user`, a verified token); None gets the core's 401. The
body is read in chunks up to the core's request body cap (its 413 as soon as
it is passed, or before reading for a `Content-Length` over it). A view that
changed nothing calls `idempotency_ledger.flask.nothing_changed()`.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable, Optional, Sequence, TypeVar, cast

from ._http import NOTHING_CHANGED, RouteSpec, Routes
from ._ledger import Ledger
from ._types import IdempotencyError, MutationResponse, Response, Ticket
from .wsgi import _TOO_LARGE, read_capped, wsgi_headers, wsgi_path_and_query

log = logging.getLogger("idempotency_ledger")

F = TypeVar("F", bound=Callable[..., Any])

__all__ = ["Idempotency", "nothing_changed"]

_TICKET = "_idempotency_ticket"


def nothing_changed() -> None:
    """Marks the current request's mutation as having changed nothing."""
    from flask import request  # type: ignore[import-untyped,unused-ignore]

    request.environ[NOTHING_CHANGED] = True


def _flask_response(result: Any, null_body: frozenset[int] = frozenset()) -> Any:
    from flask import Response as FlaskResponse  # type: ignore[import-untyped,unused-ignore]

    body = b"" if result.status in null_body else result.body
    headers = [(n, v) for n, v in result.headers if n.lower() != "content-length"]
    response = FlaskResponse(body, status=result.status)
    response.headers.clear()
    for name, value in headers:
        response.headers.add(name, value)
    if result.status not in (204, 304):
        response.headers["Content-Length"] = str(len(body))
    return response


class Idempotency:
    """The extension. protect="all" (default) guards every view whose method
    the core protects (and path `include` / `exclude` select); "decorated"
    guards only views wrapped with `@idempotency.protect`."""

    def __init__(
        self,
        app: Any = None,
        *,
        ledger: Ledger,
        principal: Callable[[], Optional[str]],
        include: Optional[Sequence[RouteSpec]] = None,
        exclude: Optional[Sequence[RouteSpec]] = None,
        protect: str = "all",
    ) -> None:
        if protect not in ("all", "decorated"):
            raise ValueError('protect is "all" or "decorated"')
        self.ledger = ledger
        self.principal = principal
        self.routes = Routes(include, exclude)
        self.mode = protect
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Any) -> None:
        app.extensions["idempotency_ledger"] = self
        if self.mode == "all":
            app.before_request(self._before)
            app.after_request(self._after)
            app.teardown_request(self._teardown)

    # ------------------------------------------------------------ the steps

    def _begin(self) -> Any:
        """None to run the view, or a response to send instead."""
        from flask import g, request  # type: ignore[import-untyped,unused-ignore]

        ledger = self.ledger
        if request.method.upper() not in ledger.protected_methods or not self.routes(request.path):
            return None
        environ = request.environ
        principal = self.principal()
        path = wsgi_path_and_query(environ)
        headers = wsgi_headers(environ)
        try:
            admission = ledger.admit(request.method, path, headers, principal)
        except IdempotencyError as error:
            log.error("[idempotency] request not admitted: %s", error)
            return _flask_response(ledger.error_response(error))
        if admission.kind == "pass-through":
            return None
        if admission.kind == "reject":
            return _flask_response(admission.response)
        body = read_capped(request.stream, request.content_length, bool(environ.get("wsgi.input_terminated")), ledger.request_body_cap_bytes)
        if body is _TOO_LARGE:
            return _flask_response(ledger.body_too_large())
        # The view reads the same bytes (request.get_data() and request.json use this cache).
        request._cached_data = body
        begun = ledger.begin(principal, request.method, path, headers, body)
        if begun.result is not None:
            return _flask_response(begun.result)
        if begun.ticket is not None:
            setattr(g, _TICKET, begun.ticket)
        return None

    def _finish(self, response: Any) -> Any:
        from flask import g, request  # type: ignore[import-untyped,unused-ignore]

        ticket: Optional[Ticket] = g.pop(_TICKET, None)
        if ticket is None:
            return response
        body = response.get_data()
        produced = MutationResponse(response.status_code, list(response.headers.items()), body)
        if request.environ.get(NOTHING_CHANGED):
            self.ledger.abandon(ticket, None, nothing_changed=True)
            return response
        return _flask_response(self.ledger.finish(ticket, produced))

    def _abandon(self, error: Optional[BaseException]) -> None:
        from flask import g  # type: ignore[import-untyped,unused-ignore]

        ticket: Optional[Ticket] = g.pop(_TICKET, None)
        if ticket is not None:
            self.ledger.abandon(ticket, error or RuntimeError("the view did not produce a response"))

    # ------------------------------------------------------------ hooks

    def _before(self) -> Any:
        return self._begin()

    def _after(self, response: Any) -> Any:
        return self._finish(response)

    def _teardown(self, error: Optional[BaseException]) -> None:
        self._abandon(error)

    def protect(self, view: F) -> F:
        """Guards one view (with protect="decorated")."""

        @functools.wraps(view)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            from flask import make_response  # type: ignore[import-untyped,unused-ignore]

            early = self._begin()
            if early is not None:
                return early
            try:
                response = make_response(view(*args, **kwargs))
            except BaseException as error:
                self._abandon(error)
                raise
            return self._finish(response)

        return cast(F, guarded)


_ = Response
