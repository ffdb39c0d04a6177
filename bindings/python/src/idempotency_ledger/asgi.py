"""ASGI middleware (Starlette, FastAPI, any ASGI 3 app).

    app.add_middleware(IdempotencyMiddleware, ledger=ledger, principal=lambda scope: ...)

Requests whose method the core does not protect (and paths outside
`include` / inside `exclude`) go straight to the app: no buffering, no ledger
access. For a protected request:

- the principal comes from `principal(scope)` (sync or async), from YOUR
  auth; None gets the core's 401 (`principal-required`), never a silent pass;
- the core admits it (key, principal, a `Content-Length` over the request
  body cap: its 413 before a byte is read);
- the body is counted while it is received, and the core's 413 goes out as
  soon as it passes the cap (a chunked body never sits in memory past it);
- the decision and completion run in a worker thread (they wait on the
  database: the event loop never blocks on them), the app runs on the loop;
- the app's response is buffered so it can be stored; the client gets the
  core's shaped response, exactly what a retry replays.
"""

from __future__ import annotations

import functools
import inspect
import logging
from typing import Any, Awaitable, Callable, MutableMapping, Optional, Sequence, Union

from ._http import NOTHING_CHANGED, RouteSpec, Routes, mark_nothing_changed
from ._ledger import Ledger
from ._types import IdempotencyError, MutationResponse, Response, Result

log = logging.getLogger("idempotency_ledger")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
PrincipalFn = Callable[[Scope], Union[Optional[str], Awaitable[Optional[str]]]]

__all__ = ["IdempotencyMiddleware", "asgi_path_and_query", "mark_nothing_changed", "send_response"]


async def _to_thread(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        import anyio.to_thread
    except ImportError:  # plain asyncio
        import asyncio

        return await asyncio.get_running_loop().run_in_executor(None, functools.partial(fn, *args))
    return await anyio.to_thread.run_sync(functools.partial(fn, *args))


def asgi_path_and_query(scope: Scope) -> str:
    """The request target as received: `raw_path` (when the server gives it)
    plus `?query_string`, decoded as ISO-8859-1."""
    raw = scope.get("raw_path")
    if raw is None:
        from urllib.parse import quote

        raw = quote(scope.get("root_path", "") + scope.get("path", ""), safe="/;=,:@!$&'()*+~").encode("latin-1", "replace")
    query = scope.get("query_string") or b""
    target = bytes(raw) + (b"?" + bytes(query) if query else b"")
    return target.decode("latin-1")


async def send_response(send: Send, response: Union[Result, Response], null_body: frozenset[int] = frozenset()) -> None:
    """Sends a response as it is, with a Content-Length (none for 1xx, 204, 304)."""
    status, body = response.status, response.body
    if status in null_body:
        body = b""
    headers = [(n.encode("latin-1"), v.encode("latin-1")) for n, v in response.headers if n.lower() != "content-length"]
    if status not in (204, 304) and status >= 200:
        headers.append((b"content-length", str(len(body)).encode("ascii")))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class IdempotencyMiddleware:
    """Idempotency-Key protection for an ASGI app.

    ledger: a `Ledger` (migrated) shared by all requests.
    principal: `principal(scope) -> str | None` (sync or async), from your auth.
    include / exclude: path prefixes, regexes or callables selecting the
    protected routes (default: every route).
    inline: run the ledger calls on the event loop instead of a worker
    thread (default False; see the README's measurements before turning it
    on: only a SQLite ledger without `wait_ms` never waits long).
    """

    def __init__(
        self,
        app: Any,
        *,
        ledger: Ledger,
        principal: PrincipalFn,
        include: Optional[Sequence[RouteSpec]] = None,
        exclude: Optional[Sequence[RouteSpec]] = None,
        inline: bool = False,
    ) -> None:
        if not callable(principal):
            raise TypeError("principal must be a callable taking the ASGI scope")
        self.app = app
        self.ledger = ledger
        self.principal = principal
        self.routes = Routes(include, exclude)
        self.inline = inline

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        if self.inline:
            return fn(*args)
        return await _to_thread(fn, *args)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        ledger = self.ledger
        if scope.get("type") != "http" or scope["method"].upper() not in ledger.protected_methods or not self.routes(scope.get("path", "")):
            await self.app(scope, receive, send)
            return
        principal = self.principal(scope)
        if inspect.isawaitable(principal):
            principal = await principal
        method = scope["method"]
        path = asgi_path_and_query(scope)
        headers = [(bytes(n).decode("latin-1"), bytes(v).decode("latin-1")) for n, v in scope.get("headers", [])]
        try:
            admission = ledger.admit(method, path, headers, principal)
        except IdempotencyError as error:  # a bad principal: fail closed
            log.error("[idempotency] request not admitted: %s", error)
            await send_response(send, ledger.error_response(error))
            return
        if admission.kind == "pass-through":
            await self.app(scope, receive, send)
            return
        if admission.kind == "reject":
            assert admission.response is not None
            await send_response(send, admission.response)
            return

        body = await _read_capped(receive, ledger.request_body_cap_bytes)
        if body is None:  # the client went away
            return
        if body is _TOO_LARGE:
            await send_response(send, ledger.body_too_large())
            return
        assert isinstance(body, bytes)
        begun = await self._call(ledger.begin, principal, method, path, headers, body)
        if begun.result is not None:
            await send_response(send, begun.result)
            return
        if begun.pass_through:
            await self.app(scope, _replay_receive(body, receive), send)
            return
        ticket = begun.ticket
        assert ticket is not None
        captured = _Captured()
        try:
            await self.app(scope, _replay_receive(body, receive), captured.send)
            if captured.status is None:
                raise RuntimeError("the ASGI app returned without sending a response")
        except BaseException as error:
            await self._call(ledger.abandon, ticket, error)
            raise
        produced = MutationResponse(captured.status, captured.headers, b"".join(captured.chunks))
        if scope.get(NOTHING_CHANGED):
            await self._call(functools.partial(ledger.abandon, ticket, None, nothing_changed=True))
            await send_response(send, produced_response(produced), ledger.null_body_statuses)
            return
        result = await self._call(ledger.finish, ticket, produced)
        await send_response(send, result)


def produced_response(produced: MutationResponse) -> Response:
    body = produced.body.encode("utf-8") if isinstance(produced.body, str) else bytes(produced.body)
    return Response(produced.status, list(produced.headers), body)


class _Captured:
    def __init__(self) -> None:
        self.status: Optional[int] = None
        self.headers: list[tuple[str, str]] = []
        self.chunks: list[bytes] = []

    async def send(self, message: Message) -> None:
        kind = message.get("type")
        if kind == "http.response.start":
            self.status = int(message["status"])
            self.headers = [(bytes(n).decode("latin-1"), bytes(v).decode("latin-1")) for n, v in message.get("headers", [])]
        elif kind == "http.response.body":
            self.chunks.append(bytes(message.get("body", b"")))


_TOO_LARGE = object()


async def _read_capped(receive: Receive, cap: int) -> Any:
    """The body, or _TOO_LARGE as soon as more than `cap` bytes arrived, or
    None when the client disconnected."""
    chunks: list[bytes] = []
    total = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
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


def _replay_receive(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
