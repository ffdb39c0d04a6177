"""WSGI middleware (any PEP 3333 app: Django's or Flask's WSGI app too).

    app.wsgi_app = IdempotencyWSGIMiddleware(app.wsgi_app, ledger=ledger, principal=lambda environ: ..., include=["/orders"])

A loop over the core's exchange: it reads `wsgi.input` when the exchange
asks (in chunks, stopping past the cap), runs the app on those bytes (a
fresh `wsgi.input` with their `CONTENT_LENGTH`), and answers what the core
says: its own response, or the app's response exactly as the app made it.
Requests whose method the core does not protect, and routes outside
`include` / inside `exclude`, go straight to the app.

A body without `Content-Length` is read only when the server ends the
stream itself (`wsgi.input_terminated`: gunicorn, Werkzeug's server); under
a server that does not (wsgiref), a chunked body cannot be read safely and
the core answers 411. A body that ends before its `Content-Length` is the
core's 400. The path and query are taken verbatim from `RAW_URI` /
`REQUEST_URI` when the server provides them (gunicorn, uWSGI); otherwise
they are rebuilt from `SCRIPT_NAME` + `PATH_INFO` (re-quoted) and
`QUERY_STRING`.

Exactly once (docs/SPEC.md 10), per route: on the routes in
`transactional`, the app runs inside a transaction on the ledger's database
(`environ["idempotency.transaction"]`, a `HandlerTransaction`; with
`transactions=SessionTransactions(engine)`, a SQLAlchemy session:
`idempotency_ledger.sqlalchemy.session_of(environ)`); every protected app
call finds its lease in `environ["idempotency.lease"]` (`.lost`).
"""

from __future__ import annotations

import io
from typing import Any, Callable, Collection, Iterable, Literal, Optional, Sequence, Union
from urllib.parse import quote

from . import _telemetry
from ._http import _REQUIRED, DECLINED, Include, RouteSpec, Routes, describe, handler_result, mark_declined, mark_nothing_changed, status_line
from ._ledger import Ledger
from ._native import Exchange, PassThrough, Propagate, ReadBody, Respond, Response, RunHandler
from ._transaction import HandlerTransaction, Lease

Environ = dict[str, Any]
StartResponse = Callable[..., Any]
PrincipalFn = Callable[[Environ], Optional[str]]
CHUNK = 64 * 1024

__all__ = [
    "IdempotencyWSGIMiddleware",
    "mark_declined",
    "mark_nothing_changed",
    "read_body",
    "wsgi_headers",
    "wsgi_path_and_query",
]


def wsgi_path_and_query(environ: Environ) -> str:
    raw = environ.get("RAW_URI") or environ.get("REQUEST_URI")
    if raw:
        return str(raw)
    path = quote(environ.get("SCRIPT_NAME", "") + environ.get("PATH_INFO", ""), safe="/;=,:@!$&'()*+~", encoding="latin-1")
    query = environ.get("QUERY_STRING", "")
    return path + ("?" + query if query else "")


def wsgi_headers(environ: Environ, names: Optional[Collection[str]] = None) -> list[tuple[str, str]]:
    """The request's headers from the environ, lower-cased; with `names`
    (lower-case), only those (a ledger's `request-headers`: the others never
    reach the core)."""
    headers = []
    for key, value in environ.items():
        if key.startswith("HTTP_"):
            name = key[5:].replace("_", "-").lower()
        elif key in ("CONTENT_TYPE", "CONTENT_LENGTH") and value != "":
            name = key.replace("_", "-").lower()
        else:
            continue
        if names is None or name in names:
            headers.append((name, str(value)))
    return headers


def content_length(environ: Environ) -> Optional[int]:
    try:
        n = int(environ.get("CONTENT_LENGTH") or "")
    except ValueError:
        return None
    return n if n >= 0 else None


#: `read_body` found more than `cap` bytes (and stopped reading).
TOO_LARGE: Literal["too-large"] = "too-large"


BodyProblem = Literal["length-unknown", "incomplete", "consumed"]


def read_body(environ: Environ, cap: int) -> Union[bytes, BodyProblem, Literal["too-large"]]:
    """The request body from `wsgi.input`, at most `cap` bytes: the bytes, or
    `TOO_LARGE` once they pass `cap`, or the WIT `body-problem` that keeps
    them from being read (`length-unknown`, `incomplete`)."""
    stream = environ.get("wsgi.input")
    length = content_length(environ)
    if length is None:
        if "HTTP_TRANSFER_ENCODING" not in environ or stream is None:
            return b""  # no body
        if not environ.get("wsgi.input_terminated"):
            return "length-unknown"  # the server would block past the body's end
    elif stream is None:
        return "incomplete" if length else b""
    chunks: list[bytes] = []
    total = 0
    while length is None or total < length:
        try:
            chunk = stream.read(CHUNK if length is None else min(CHUNK, length - total))
        except OSError:
            return "incomplete"
        if not chunk:
            if length is not None:
                return "incomplete"  # the stream ended before Content-Length
            break
        total += len(chunk)
        if total > cap:
            return TOO_LARGE
        chunks.append(bytes(chunk))
    return b"".join(chunks)


class _Captured:
    """A WSGI app's response, held until the core says what to send."""

    def __init__(self) -> None:
        self.status: Optional[str] = None
        self.headers: list[tuple[str, str]] = []
        self.body = b""

    def run(self, app: Any, environ: Environ) -> None:
        written: list[bytes] = []

        def capture(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[[bytes], None]:
            if exc_info is not None and self.status is not None:
                raise exc_info[1].with_traceback(exc_info[2])
            self.status, self.headers = status, list(headers)
            return written.append

        iterable = app(environ, capture)
        try:
            chunks = [bytes(chunk) for chunk in iterable]
        finally:
            close = getattr(iterable, "close", None)
            if close is not None:
                close()
        if self.status is None:
            raise RuntimeError("the WSGI app returned without calling start_response")
        self.body = b"".join(written + chunks)

    def send(self, start_response: StartResponse) -> list[bytes]:
        assert self.status is not None
        start_response(self.status, self.headers)
        return [self.body]


def send_response(start_response: StartResponse, response: Response) -> list[bytes]:
    """Sends a response the core made, as it is (the server frames it)."""
    start_response(status_line(response.status), response.headers)
    return [response.body]


class IdempotencyWSGIMiddleware:
    """Idempotency-Key protection for a WSGI app.

    ledger: a `Ledger` (migrated) shared by all requests and threads.
    principal: `principal(environ) -> str | None` from your auth layer (never
    a client header); None gets the core's 401.
    include: the routes to protect (path prefixes, compiled regexes or
    callables), or "*" for every route; exclude: routes left out.
    transactional: the routes whose app call runs in a transaction on the
    ledger's database (exactly once); transactions: `transactions(environ)`
    makes the request's transaction object, else the ledger's own is used.
    route: `route(environ)`, the route template the telemetry reports as
    `http.route` (WSGI has none of its own).
    """

    def __init__(
        self,
        app: Any,
        *,
        ledger: Ledger,
        principal: PrincipalFn,
        include: Include = _REQUIRED,  # type: ignore[assignment]
        exclude: Optional[Sequence[RouteSpec]] = None,
        transactional: Optional[Include] = None,
        transactions: Optional[Callable[[Environ], Any]] = None,
        route: Optional[Callable[[Environ], Optional[str]]] = None,
    ) -> None:
        if not callable(principal):
            raise TypeError("principal must be a callable taking the WSGI environ")
        self.route = route
        self.app = app
        self.ledger = ledger
        self.principal = principal
        self.routes = Routes(include, exclude, "IdempotencyWSGIMiddleware")
        self.transactional = None if transactional is None else Routes(transactional, None, "IdempotencyWSGIMiddleware(transactional=...)")
        self.transactions = transactions

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        method = environ.get("REQUEST_METHOD", "GET")
        path = environ.get("SCRIPT_NAME", "") + environ.get("PATH_INFO", "")
        if not self.routes(path):
            return self.app(environ, start_response)  # type: ignore[no-any-return]
        route = None if self.route is None else (lambda: self.route(environ))  # type: ignore[misc]
        if not self.ledger.protects(method):
            if self.ledger._telemetry:
                _telemetry.passed_through(method, route)
            return self.app(environ, start_response)  # type: ignore[no-any-return]
        transactional = self.transactional is not None and self.transactional(path)
        given = self.transactions(environ) if transactional and self.transactions is not None else None
        headers = wsgi_headers(environ, self.ledger._read_header_names)
        exchange = self.ledger.start(self.principal(environ), method, wsgi_path_and_query(environ), headers, transactional=transactional, transaction=given, route=route)
        with exchange:
            return self._run(exchange, environ, start_response)

    def _run(self, exchange: Exchange, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        action: Any = exchange.action
        captured = _Captured()
        while True:
            if isinstance(action, ReadBody):
                body = read_body(environ, action.cap)
                if body == TOO_LARGE:
                    action = exchange.body_too_large()
                elif body == "length-unknown" or body == "incomplete" or body == "consumed":
                    action = exchange.body_unreadable(body)
                else:
                    environ["wsgi.input"] = io.BytesIO(body)
                    environ["CONTENT_LENGTH"] = str(len(body))
                    environ.pop("HTTP_TRANSFER_ENCODING", None)  # the app reads the body as one known length
                    action = exchange.body(body)
            elif isinstance(action, RunHandler):
                environ.pop(DECLINED, None)
                environ["idempotency.lease"] = Lease(exchange, action.renew_every_ms)
                if action.transaction:
                    environ["idempotency.transaction"] = HandlerTransaction(exchange, action.renew_every_ms)
                try:
                    with _telemetry.current(exchange.recording):
                        captured.run(self.app, environ)
                except BaseException as error:
                    action = exchange.raised(describe(error))
                    if isinstance(action, Propagate):
                        raise
                    continue
                result = handler_result(environ)
                if result == "answered":
                    assert captured.status is not None
                    action = exchange.answered(int(captured.status.split(" ", 1)[0]), captured.headers, captured.body)
                else:
                    action = exchange.declined() if result == "declined" else exchange.nothing_changed()
            elif isinstance(action, Respond):
                return captured.send(start_response) if action.response is None else send_response(start_response, action.response)
            elif isinstance(action, PassThrough):
                return self.app(environ, start_response)  # type: ignore[no-any-return]
            else:  # Propagate without an exception to re-raise: the core's 500
                assert isinstance(action, Propagate)
                return send_response(start_response, action.response)
