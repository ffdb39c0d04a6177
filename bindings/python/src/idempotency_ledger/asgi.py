"""ASGI middleware (Starlette, FastAPI, any ASGI 3 app).

    app.add_middleware(IdempotencyMiddleware, ledger=ledger, principal=lambda scope: ..., include=["/orders"])

A loop over the core's exchange: it reads the body (at most its cap) before
the exchange starts when the request carries an Idempotency-Key and no
Content-Length over the cap, and gives a small one with the head, else when
the exchange asks (a chunked body never sits in memory past the cap; what is left
of a refused one is discarded, for at most LINGER_SECONDS, before the answer
that closes the connection, so the client is not reset before it reads
it), runs the app
when it asks, and sends what it answers: the core's response, or the app's
own response exactly as the app made it. Requests whose method the core does
not protect, and routes outside `include` / inside `exclude`, go straight to
the app. The ledger calls run on the event loop for a `Ledger(path)` file
(microseconds each), in a worker thread otherwise (`inline`, below).

FastAPI's request validation errors (`RequestValidationError`, its 422) are
the framework refusing the request before the endpoint ran: the middleware
tells the core so (`declined`), which releases the key.

Exactly once (docs/SPEC.md 10), per route: on the routes in
`transactional`, the handler runs inside a transaction on the ledger's
database whose writes commit with the stored answer or not at all; it finds
it in `scope["idempotency.transaction"]` (a `HandlerTransaction`; with
`transactions=SessionTransactions(engine)`, a SQLAlchemy session:
`idempotency_ledger.sqlalchemy.session_of(request)`). Every protected
handler finds its lease in `scope["idempotency.lease"]` (a `Lease`: `.lost`,
`await lease.until_lost()`).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Awaitable, Callable, MutableMapping, Optional, Sequence, Union

from . import _native, _telemetry
from ._http import _REQUIRED, DECLINED, Include, RouteSpec, Routes, describe, handler_result, mark_declined, mark_nothing_changed
from ._ledger import Ledger
from ._native import Exchange, PassThrough, Propagate, ReadBody, Respond, Response, RunHandler
from ._transaction import HandlerTransaction, Lease

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
PrincipalFn = Callable[[Scope], Union[Optional[str], Awaitable[Optional[str]]]]

__all__ = ["IdempotencyMiddleware", "asgi_path_and_query", "handler_transaction", "lease", "mark_declined", "mark_nothing_changed", "send_response"]

#: Where a protected handler finds its transaction and its lease.
TRANSACTION_KEY = "idempotency.transaction"
LEASE_KEY = "idempotency.lease"


def handler_transaction(scope: Scope) -> HandlerTransaction:
    """The transaction this request's handler writes in (a transactional route)."""
    found = scope.get(TRANSACTION_KEY)
    if not isinstance(found, HandlerTransaction):
        raise LookupError("no transaction is open for this request: is its route in transactional=...?")
    return found


def lease(scope: Scope) -> Optional[Lease]:
    """This request's lease while its handler runs under one (None otherwise)."""
    found = scope.get(LEASE_KEY)
    return found if isinstance(found, Lease) else None


async def _to_thread(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    try:
        import anyio.to_thread
    except ImportError:  # plain asyncio
        import asyncio

        return await asyncio.get_running_loop().run_in_executor(None, functools.partial(fn, *args, **kwargs))
    return await anyio.to_thread.run_sync(functools.partial(fn, *args, **kwargs))


def asgi_path_and_query(scope: Scope) -> str:
    """The request target as received: `raw_path` (when the server gives it)
    plus `?query_string`, read as ISO-8859-1."""
    raw = scope.get("raw_path")
    if raw is None:
        from urllib.parse import quote

        raw = quote(scope.get("root_path", "") + scope.get("path", ""), safe="/;=,:@!$&'()*+~").encode("latin-1", "replace")
    query = scope.get("query_string") or b""
    target = bytes(raw) + (b"?" + bytes(query) if query else b"")
    return target.decode("latin-1")


async def send_response(send: Send, response: Response, close: bool = False) -> None:
    """Sends a response the core made, as it is (the server frames it);
    `close`: the core asked to close the connection after it."""
    headers = [(n.encode("latin-1"), v.encode("latin-1")) for n, v in response.headers]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    await send({"type": "http.response.body", "body": response.body, "more_body": False})


class _Captured:
    """The app's response, held until the core says what to send."""

    def __init__(self) -> None:
        self.start: Optional[Message] = None
        self.chunks: list[bytes] = []

    async def send(self, message: Message) -> None:
        kind = message.get("type")
        if kind == "http.response.start":
            self.start = message
        elif kind == "http.response.body":
            self.chunks.append(bytes(message.get("body", b"")))

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)

    async def replay(self, send: Send, close: bool) -> None:
        assert self.start is not None
        start = dict(self.start)
        if close:
            start["headers"] = [*start.get("headers", []), (b"connection", b"close")]
        await send(start)
        await send({"type": "http.response.body", "body": self.body, "more_body": False})


_TOO_LARGE = object()
_GONE = object()


def _reads_first(headers: list[tuple[str, str]], cap: int) -> bool:
    """Whether the body is read before the exchange starts: the request
    carries a key (so the core never passes it through untouched, and a
    handler that reads the body gets it replayed) and no Content-Length
    over the cap (which the core answers 413 without the body)."""
    keyed = False
    for name, value in headers:
        lowered = name.lower()
        if lowered == "idempotency-key" and value:
            keyed = True
        elif lowered == "content-length" and not (value.strip().isascii() and value.strip().isdigit() and int(value) <= cap):
            return False
    return keyed


async def _read_capped(receive: Receive, cap: int) -> Any:
    """The body; `_TOO_LARGE` as soon as more than `cap` bytes arrived;
    `_GONE` when the client disconnected first."""
    chunks: list[bytes] = []
    total = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return _GONE
        if message["type"] != "http.request":
            continue
        chunk = message.get("body", b"")
        if chunk:
            total += len(chunk)
            if total > cap:
                return _TOO_LARGE
            chunks.append(bytes(chunk))
        if not message.get("more_body", False):
            return b"".join(chunks)


#: How long a request whose answer closes the connection keeps discarding
#: what the client still sends, at most (see `_discard_rest`).
LINGER_SECONDS = 5.0


async def _discard_rest(receive: Receive) -> None:
    """Reads and discards what is left of a request body the exchange
    refused (its answer closes the connection), holding one message at a
    time, for at most LINGER_SECONDS. The server closes the connection after
    that answer; closing it while the client is still sending makes the
    kernel answer the client's data with a reset, which can wipe the answer
    from the client's receive buffer (a chunked upload over the cap would
    then see no 413). After the answer the server no longer delivers the
    body, so the rest is read first."""

    async def drain() -> None:
        while True:
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                return

    try:
        import anyio
    except ImportError:  # plain asyncio
        import asyncio

        try:
            await asyncio.wait_for(drain(), LINGER_SECONDS)
        except asyncio.TimeoutError:
            pass
        return
    with anyio.move_on_after(LINGER_SECONDS):
        await drain()


def _replay_receive(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def _routed(scope: Scope) -> bool:
    """With include="*": whether a route of the Starlette app serves this
    method and path (otherwise the framework answers: its 404 or 405). True
    for an app without a Starlette router."""
    routes = getattr(getattr(scope.get("app"), "router", None), "routes", None)
    if routes is None:
        return True
    from starlette.routing import Match

    return any(route.matches(scope)[0] is Match.FULL for route in routes)


def _route_template(scope: Scope) -> Optional[str]:
    """The path template of the Starlette route serving this request (the
    telemetry's `http.route`), or None."""
    routes = getattr(getattr(scope.get("app"), "router", None), "routes", None)
    if not routes:
        return None
    from starlette.routing import Match

    for route in routes:
        if route.matches(scope)[0] is Match.FULL:
            path = getattr(route, "path", None)
            return path if isinstance(path, str) else None
    return None


class _Declines:
    """Marks FastAPI's request validation errors as declined: wraps the
    app's handler for `RequestValidationError` (FastAPI's default or yours)
    in the `ExceptionMiddleware` below this middleware, through its public
    `add_exception_handler`, once."""

    def __init__(self, app: Any) -> None:
        self.below = app
        self.installed = False

    def install(self, scope: Scope) -> None:
        self.installed = True
        try:
            from fastapi.exceptions import RequestValidationError
            from starlette.concurrency import run_in_threadpool
            from starlette.middleware.exceptions import ExceptionMiddleware
        except ImportError:
            return
        handlers = getattr(scope.get("app"), "exception_handlers", None)
        original = handlers.get(RequestValidationError) if isinstance(handlers, dict) else None
        node, depth = self.below, 0
        while node is not None and not isinstance(node, ExceptionMiddleware) and depth < 64:
            node, depth = getattr(node, "app", None), depth + 1
        if original is None or not isinstance(node, ExceptionMiddleware):
            return

        async def declined(request: Any, exc: Exception) -> Any:
            mark_declined(request.scope)
            if inspect.iscoroutinefunction(original):
                return await original(request, exc)
            return await run_in_threadpool(original, request, exc)

        node.add_exception_handler(RequestValidationError, declined)


class IdempotencyMiddleware:
    """Idempotency-Key protection for an ASGI app.

    ledger: a `Ledger` (migrated) shared by all requests.
    principal: `principal(scope) -> str | None` (sync or async), from your
    auth (a middleware outside this one); None gets the core's 401.
    include: the routes to protect: path prefixes, compiled regexes or
    callables, or "*" for every route the app serves. exclude: routes left
    out of `include`.
    inline: run the ledger calls on the event loop (True) or in a worker
    thread (False). The default (None) runs them on the loop for a SQLite
    file the ledger opened itself (`Ledger(path)`) with `wait_ms` 0 and no
    `transactional` routes: each call is microseconds of local work, less
    than the hop to a thread and back, and waits only when another process
    holds SQLite's write lock (at most `busy_timeout_ms`); otherwise (a
    PostgreSQL or callback ledger, `wait_ms` sleeps, a handler's transaction
    holding the lock while the loop would wait for it) in a worker thread.
    transactional: the routes (as `include`, or "*") whose handler runs in a
    transaction on the ledger's database (exactly once); transactions:
    `transactions(scope)` makes the request's transaction object (e.g.
    `SessionTransactions(engine)`), else the ledger's own connection is used.
    route: `route(scope)`, the route template the telemetry reports as
    `http.route` (default: the Starlette route's path, when there is one).
    """

    def __init__(
        self,
        app: Any,
        *,
        ledger: Ledger,
        principal: PrincipalFn,
        include: Include = _REQUIRED,  # type: ignore[assignment]
        exclude: Optional[Sequence[RouteSpec]] = None,
        inline: Optional[bool] = None,
        transactional: Optional[Include] = None,
        transactions: Optional[Callable[[Scope], Any]] = None,
        route: Optional[Callable[[Scope], Optional[str]]] = None,
    ) -> None:
        if not callable(principal):
            raise TypeError("principal must be a callable taking the ASGI scope")
        self.route = route or _route_template
        self.app = app
        self.ledger = ledger
        self.principal = principal
        self.routes = Routes(include, exclude, "IdempotencyMiddleware")
        self.transactional = None if transactional is None else Routes(transactional, None, "IdempotencyMiddleware(transactional=...)")
        self.transactions = transactions
        if inline is None:
            inline = getattr(ledger, "_local_file", False) and ledger.config.wait_ms == 0 and transactional is None
        self.inline = bool(inline)
        self._declines = _Declines(app)
        self._cap = ledger.config.request_body_cap_bytes

    async def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self.inline:
            return fn(*args, **kwargs)
        return await _to_thread(fn, *args, **kwargs)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http" or not self.routes(scope.get("path", "")) or (self.routes.everything and not _routed(scope)):
            await self.app(scope, receive, send)
            return
        if not self.ledger.protects(scope["method"]):
            if self.ledger._telemetry:
                _telemetry.passed_through(scope["method"], lambda: self.route(scope))
            await self.app(scope, receive, send)
            return
        if not self._declines.installed:
            self._declines.install(scope)
        principal = self.principal(scope)
        if inspect.isawaitable(principal):
            principal = await principal
        # Only the headers the exchange reads are converted (the others never reach it).
        names = self.ledger._read_headers
        headers = [(bytes(n).decode("latin-1"), bytes(v).decode("latin-1")) for n, v in scope.get("headers", []) if bytes(n).lower() in names]
        transactional = self.transactional is not None and self.transactional(scope.get("path", ""))
        given = self.transactions(scope) if transactional and self.transactions is not None else None
        # A keyed request's body is read before the exchange starts and, when small, given with the
        # head (one call, and one hop to a worker thread, fewer); otherwise it waits for ReadBody.
        read = await _read_capped(receive, self._cap) if _reads_first(headers, self._cap) else None
        small = isinstance(read, bytes) and len(read) <= _native.BODY_AT_START_MAX_BYTES
        exchange = await self._call(
            self.ledger.start, principal, scope["method"], asgi_path_and_query(scope), headers,
            transactional=transactional, transaction=given, route=lambda: self.route(scope), body=read if small else None,
        )
        try:
            await self._run(exchange, scope, receive, send, read)
        finally:
            exchange.close()  # gives the ledger back if the request ended early (cancelled)

    async def _run(self, exchange: Exchange, scope: Scope, receive: Receive, send: Send, read: Any = None) -> None:
        """`read`: the body (or `_TOO_LARGE`, `_GONE`) when it was read before the exchange started."""
        action: Any = exchange.action
        body = read if isinstance(read, bytes) else b""
        unread = read is None or read is _TOO_LARGE  # until the body was read to its end (or the client left)
        captured = _Captured()
        while True:
            if isinstance(action, ReadBody):
                if read is None:
                    read = await _read_capped(receive, action.cap)
                if read is _TOO_LARGE:
                    action = await self._call(exchange.body_too_large)
                elif read is _GONE:
                    unread = False
                    action = await self._call(exchange.body_unreadable, "incomplete")
                else:
                    unread = False
                    body = read
                    action = await self._call(exchange.body, body)
            elif isinstance(action, RunHandler):
                scope.pop(DECLINED, None)
                scope[LEASE_KEY] = Lease(exchange, action.renew_every_ms)
                if action.transaction:
                    scope[TRANSACTION_KEY] = HandlerTransaction(exchange, action.renew_every_ms)
                try:
                    with _telemetry.current(exchange.recording):
                        await self.app(scope, _replay_receive(body, receive), captured.send)
                    if captured.start is None:
                        raise RuntimeError("the ASGI app returned without sending a response")
                except Exception as error:
                    action = await self._call(exchange.raised, describe(error))
                    if isinstance(action, Propagate):
                        raise
                    continue
                except BaseException as error:  # cancelled: told at once, on this thread
                    exchange.raised(describe(error))
                    raise
                result = handler_result(scope)
                if result == "answered":
                    status, raw = int(captured.start["status"]), captured.start.get("headers", [])
                    action = await self._call(exchange.answered, status, [(bytes(n), bytes(v)) for n, v in raw], captured.body)
                else:
                    action = await self._call(exchange.declined if result == "declined" else exchange.nothing_changed)
            elif isinstance(action, Respond):
                if action.close and unread:
                    await _discard_rest(receive)
                if action.response is None:
                    await captured.replay(send, action.close)
                else:
                    await send_response(send, action.response, action.close)
                return
            elif isinstance(action, PassThrough):
                await self.app(scope, receive if read is None else _replay_receive(body, receive), send)
                return
            else:  # Propagate without an exception to re-raise: the core's 500
                assert isinstance(action, Propagate)
                await send_response(send, action.response)
                return
