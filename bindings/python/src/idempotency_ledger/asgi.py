"""ASGI middleware (Starlette, FastAPI, any ASGI 3 app).

    app.add_middleware(IdempotencyMiddleware, ledger=ledger, principal=lambda scope: ...)

Unprotected methods (GET, HEAD, OPTIONS by default) go straight to the app:
no body buffering, no ledger access. A protected request's body is read once
(raw bytes, for the fingerprint) and replayed to the app; the blocking ledger
calls (decide, complete, sweep) run in a worker thread, never on the event
loop. The app's response is buffered so it can be stored; what the client
gets is the core's shaped response (status, body, allowlisted headers), which
is exactly what a retry replays.

The principal comes from `principal(scope)` (sync or async), which you
supply from your authentication layer; it is never read from a client header.
When it returns None the request goes to the app untouched (no idempotency).
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
from typing import Any, Awaitable, Callable, MutableMapping, Optional, Union

from ._ledger import Ledger, _attach_ticket
from ._types import IdempotencyError, MutationResponse, Response, Result

log = logging.getLogger("idempotency_ledger")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
PrincipalFn = Callable[[Scope], Union[Optional[str], Awaitable[Optional[str]]]]

_NO_CONTENT_LENGTH = frozenset({204, 304})


async def _run_sync(fn: Callable[..., Any], *args: Any) -> Any:
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


async def send_response(send: Send, response: Union[Result, Response]) -> None:
    """Sends a ledger response as it is, with a Content-Length."""
    status, body = response.status, response.body
    headers = [(n.encode("latin-1"), v.encode("latin-1")) for n, v in response.headers if n.lower() != "content-length"]
    if status not in _NO_CONTENT_LENGTH and status >= 200:
        headers.append((b"content-length", str(len(body)).encode("ascii")))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class IdempotencyMiddleware:
    """Idempotency-Key protection for an ASGI app.

    ledger: a `Ledger` (migrated) shared by all requests.
    principal: `principal(scope) -> str | None` (sync or async), from your auth.
    sweep_every: run one bounded sweep after every N-th protected request,
    after its response was sent (0 disables; call `ledger.sweep()` yourself).
    """

    def __init__(self, app: Any, *, ledger: Ledger, principal: PrincipalFn, sweep_every: int = 100) -> None:
        if not callable(principal):
            raise TypeError("principal must be a callable taking the ASGI scope")
        self.app = app
        self.ledger = ledger
        self.principal = principal
        self.sweep_every = int(sweep_every)
        self._count = 0
        self._count_lock = threading.Lock()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        method = scope["method"]
        path = asgi_path_and_query(scope)
        headers = [(bytes(n).decode("latin-1"), bytes(v).decode("latin-1")) for n, v in scope.get("headers", [])]
        # Pure and cheap (no ledger access, no I/O), so it runs inline: an
        # unprotected request costs one component call and nothing else. A
        # ledger on one shared connection serialises calls with a lock that
        # a batch may hold up to the busy timeout: never wait for it here.
        try:
            if self.ledger.single_connection:
                admission = await _run_sync(self.ledger.admit, method, path, headers)
            else:
                admission = self.ledger.admit(method, path, headers)
        except IdempotencyError as error:  # fail closed: nothing runs
            log.error("[idempotency] request not classified: %s", error)
            await send_response(send, self.ledger.error_response(error))
            return
        if admission.kind == "pass-through":
            await self.app(scope, receive, send)
            return
        principal = self.principal(scope)
        if inspect.isawaitable(principal):
            principal = await principal
        if principal is None:  # unauthenticated: untouched, the app's auth answers
            await self.app(scope, receive, send)
            return
        if admission.kind == "reject":
            assert admission.response is not None
            await send_response(send, admission.response)
            return

        body, disconnected = await _read_body(receive)
        if disconnected:
            return
        begun = await _run_sync(self.ledger.begin, principal, method, path, headers, body, admission)
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
            _attach_ticket(error, ticket)
            log.warning(
                "[idempotency] app raised for principal=%r key=%r generation=%d; the row stays pending",
                ticket.principal, ticket.key, ticket.generation,
            )
            raise
        produced = MutationResponse(captured.status, captured.headers, b"".join(captured.chunks))
        result = await _run_sync(self.ledger.finish, ticket, produced)
        await send_response(send, result)
        await self._maybe_sweep()

    async def _maybe_sweep(self) -> None:
        if self.sweep_every <= 0:
            return
        with self._count_lock:
            self._count += 1
            due = self._count % self.sweep_every == 0
        if due:
            try:
                await _run_sync(self.ledger.sweep)
            except Exception:
                log.exception("[idempotency] sweep failed")


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


async def _read_body(receive: Receive) -> tuple[bytes, bool]:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b"", True
        if message["type"] == "http.request":
            chunks.append(bytes(message.get("body", b"")))
            if not message.get("more_body", False):
                return b"".join(chunks), False


def _replay_receive(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
