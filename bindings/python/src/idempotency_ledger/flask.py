"""Flask extension: Idempotency-Key protection for the routes you name, or
the views you decorate.

    from idempotency_ledger.flask import Idempotency

    idempotency = Idempotency(app, ledger=ledger, principal=lambda: current_user_id(), include=["/orders"])
    # or include=[] and, per view:
    @app.post("/orders")
    @idempotency.protect
    def create_order(): ...

A loop over the core's exchange in Flask's hooks: `before_request` starts
it and reads the body through Flask's own `request.get_data()` (the bytes
the view will see, capped at the core's limit), `after_request` hands it the
view's response, and Flask's `got_request_exception` signal tells it a view
raised. The first caller gets the view's response exactly as Flask made it;
the core's answers (replays, 409, 413, ...) replace it otherwise.

The principal callable runs inside the request context (flask-login's
`current_user`, `g.user`, a verified token); None gets the core's 401. A
body `request.get_json()` cannot parse (Flask's 400) is the framework
refusing the request: the key is released (`declined`). A view that changed
nothing calls `idempotency_ledger.flask.nothing_changed()`.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence, TypeVar

from ._http import _REQUIRED, DECLINED, NOTHING_CHANGED, Include, RouteSpec, Routes, describe, handler_result
from ._ledger import Ledger
from ._native import Exchange, Propagate, ReadBody, Respond, Response, RunHandler
from .wsgi import wsgi_headers, wsgi_path_and_query

F = TypeVar("F", bound=Callable[..., Any])

__all__ = ["Idempotency", "declined", "nothing_changed"]

#: The exchange of the current request, in `flask.g`.
_EXCHANGE = "idempotency_exchange"
_PROTECTED = "_idempotency_protected"


def nothing_changed() -> None:
    """Marks the current request's view as having changed nothing: its
    response is sent unstored and the key released."""
    from flask import request  # type: ignore[import-untyped,unused-ignore]

    request.environ[NOTHING_CHANGED] = True


def declined() -> None:
    """Marks the current request as refused by the framework before the view
    ran (a parsing or validation error handler of your own)."""
    from flask import request  # type: ignore[import-untyped,unused-ignore]

    request.environ[DECLINED] = True


def _flask_response(response: Response) -> Any:
    """The core's response as a Flask response, with exactly its headers
    (Werkzeug frames it)."""
    from flask import Response as FlaskResponse  # type: ignore[import-untyped,unused-ignore]

    made = FlaskResponse(response.body, status=response.status)
    made.headers.clear()
    for name, value in response.headers:
        made.headers.add(name, value)
    return made


class Idempotency:
    """The extension.

    include: the routes to protect (path prefixes, compiled regexes or
    callables), or "*" for every route the app serves, or [] to protect only
    the views decorated with `@idempotency.protect`. exclude: routes left out.
    """

    def __init__(
        self,
        app: Any = None,
        *,
        ledger: Ledger,
        principal: Callable[[], Optional[str]],
        include: Include = _REQUIRED,  # type: ignore[assignment]
        exclude: Optional[Sequence[RouteSpec]] = None,
    ) -> None:
        self.ledger = ledger
        self.principal = principal
        self.routes = Routes(include, exclude, "Idempotency")
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Any) -> None:
        from flask import got_request_exception  # type: ignore[import-untyped,unused-ignore]

        app.extensions["idempotency_ledger"] = self
        app.before_request(self._before)
        app.after_request(self._after)
        app.teardown_request(self._teardown)
        got_request_exception.connect(self._raised, app, weak=False)

    def protect(self, view: F) -> F:
        """Protects one view, whatever `include` says (apply it under the
        route decorator)."""
        setattr(view, _PROTECTED, True)
        return view

    # ------------------------------------------------------------ the hooks

    def _selected(self) -> bool:
        from flask import current_app, request  # type: ignore[import-untyped,unused-ignore]

        if request.url_rule is None or not self.ledger.protects(request.method):
            return False  # no route: Flask's 404 / 405
        view = current_app.view_functions.get(request.endpoint or "")
        return getattr(view, _PROTECTED, False) or self.routes(request.path)

    def _before(self) -> Any:
        """Starts the exchange and feeds it the body: None to run the view,
        or the core's response to send instead."""
        from flask import g, request  # type: ignore[import-untyped,unused-ignore]

        if not self._selected():
            return None
        environ = request.environ
        rule = request.url_rule
        exchange = self.ledger.start(self.principal(), request.method, wsgi_path_and_query(environ), wsgi_headers(environ, self.ledger._read_header_names), route=rule.rule if rule is not None else None)
        action: Any = exchange.action
        while isinstance(action, ReadBody):
            action = self._read(exchange, request, action.cap)
        if isinstance(action, RunHandler):
            setattr(g, _EXCHANGE, exchange)
            _mark_json_failures(request)
            return None
        if isinstance(action, Respond) and action.response is not None:
            return _flask_response(action.response)
        return None  # pass-through

    @staticmethod
    def _read(exchange: Exchange, request: Any, cap: int) -> Any:
        from werkzeug.exceptions import ClientDisconnected, RequestEntityTooLarge

        environ = request.environ
        if request.content_length is None and "HTTP_TRANSFER_ENCODING" in environ and not environ.get("wsgi.input_terminated"):
            return exchange.body_unreadable("length-unknown")  # Werkzeug would hand the view an empty body
        limit = request.max_content_length
        # One byte past the cap: Werkzeug stops a delimited-by-the-server
        # body at the limit without a word, so a longer one reads as cap + 1.
        request.max_content_length = cap + 1 if limit is None else min(limit, cap + 1)
        try:
            data = request.get_data(cache=True)
        except ClientDisconnected:
            return exchange.body_unreadable("incomplete")
        except RequestEntityTooLarge:
            if limit is not None and limit <= cap:
                exchange.close()  # Flask's own limit: its 413, nothing reserved
                raise
            return exchange.body_too_large()
        finally:
            request.max_content_length = limit
        if len(data) > cap:
            return exchange.body_too_large()
        if request.content_length is not None and len(data) < request.content_length:
            return exchange.body_unreadable("consumed")  # read before this hook: the view would get less
        return exchange.body(data)

    def _after(self, response: Any) -> Any:
        from flask import g, request  # type: ignore[import-untyped,unused-ignore]

        exchange: Optional[Exchange] = g.pop(_EXCHANGE, None)
        if exchange is None or exchange.done:
            return response  # not protected, or ended by a raised view (Flask's 500, unstored)
        result = handler_result(request.environ)
        if result == "answered":
            action = exchange.answered(response.status_code, list(response.headers.items()), response.get_data())
        else:
            action = exchange.declined() if result == "declined" else exchange.nothing_changed()
        if isinstance(action, Respond):
            return response if action.response is None else _flask_response(action.response)
        assert isinstance(action, Propagate), action
        return _flask_response(action.response)

    def _raised(self, sender: Any, exception: BaseException, **extra: Any) -> None:
        from flask import g  # type: ignore[import-untyped,unused-ignore]

        exchange: Optional[Exchange] = g.get(_EXCHANGE)
        if exchange is not None and not exchange.done:
            exchange.raised(describe(exception))  # the core's abandon; Flask renders its 500

    def _teardown(self, error: Optional[BaseException]) -> None:
        from flask import g  # type: ignore[import-untyped,unused-ignore]

        exchange: Optional[Exchange] = g.pop(_EXCHANGE, None)
        if exchange is not None and not exchange.done:
            exchange.raised(describe(error) if error is not None else "the request ended before the view's response reached the ledger")


def _mark_json_failures(request: Any) -> None:
    """`request.get_json()` on a body it cannot parse is Flask refusing the
    request (its 400): marked declined through the request's own hook."""
    failed = request.on_json_loading_failed

    def on_json_loading_failed(e: Optional[ValueError]) -> Any:
        request.environ[DECLINED] = True
        return failed(e)

    request.on_json_loading_failed = on_json_loading_failed
